"""The checks of asynchronous generation's fields, and the combinations max_staleness >= 1 refuses with a reason."""

from __future__ import annotations

import re

import pytest

from rllm_gym.train.config import TrainConfig, load_config
from rllm_gym.train.config_file import ConfigError

REFUSED = "max_staleness: 1 (asynchronous generation) is not supported"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_staleness": -1}, "max_staleness must be >= 0 (0 = synchronous), got -1"),
        ({"async_is_cap": 1.0}, "async_is_cap must be > 1 (2.0 recommended), got 1.0"),
        ({"async_is_level": "row"}, "async_is_level must be 'token' or 'sequence', got 'row'"),
        ({"async_is_mode": "ppo"}, "async_is_mode must be 'clip', 'truncate', 'mask' or 'off', got 'ppo'"),
        ({"async_trainer_threads": "all"}, "async_trainer_threads must be 'share' or 'fixed', got 'all'"),
        ({"async_is_level": "sequence"}, "async_is_level: sequence applies to async_is_mode truncate and mask"),
        ({"max_staleness": 1, "use_vllm": True, "vllm_mode": "server"}, f"{REFUSED} with vllm_mode: server"),
        ({"max_staleness": 1, "trl_args": {"num_iterations": 2}}, f"{REFUSED} with num_iterations > 1"),
        ({"max_staleness": 1, "trl_args": {"steps_per_generation": 2}}, f"{REFUSED} with steps_per_generation"),
        ({"max_staleness": 1, "loss_type": "vespo"}, f"{REFUSED} with loss_type vespo"),
        ({"max_staleness": 1, "trl_args": {"top_p": 0.9}}, f"{REFUSED} on the CPU generation worker with top_p/top_k"),
        ({"max_staleness": 1, "trl_args": {"top_k": 20}}, f"{REFUSED} on the CPU generation worker with top_p/top_k"),
    ],
)
def test_bad_async_settings_and_refused_combinations_are_named(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TrainConfig(**kwargs)


def test_several_processes_and_deepspeed_are_not_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # as accelerate launch sets it: a worker per process
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")  # the worker gets the gathered weights
    assert TrainConfig(max_staleness=2, env=["rllm/SolverJudge-v0"], agent_program="json:dumps").max_staleness == 2
    assert TrainConfig(max_staleness=2, use_vllm=True, lora=True).use_vllm  # an engine per process (tests/vllm)


def test_the_settings_are_flags_and_a_refusal_names_the_flag():
    config, _ = load_config(["--max_staleness", "2", "--async_is_mode", "truncate", "--async_is_level", "sequence"])
    assert (config.max_staleness, config.async_is_mode, config.async_is_level) == (2, "truncate", "sequence")
    assert TrainConfig(max_staleness=1).async_is_mode == "clip"  # the documented default
    assert TrainConfig(max_staleness=1).async_trainer_threads == "share"
    config, _ = load_config(["--max_staleness", "1", "--async_trainer_threads", "fixed"])
    assert config.async_trainer_threads == "fixed"
    with pytest.raises(ConfigError, match=re.escape("max_staleness: 2 (asynchronous generation) is not supported")):
        load_config(["--max_staleness", "2", "--use_vllm", "true", "--vllm_mode", "server"])
    config, _ = load_config(["--max_staleness", "1", "--use_vllm", "true", "--lora", "true"])  # tests/vllm runs it
    assert (config.max_staleness, config.use_vllm, config.lora) == (1, True, True)
