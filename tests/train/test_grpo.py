import json
import re
from pathlib import Path

import pytest

from rllm_gym.train.grpo import TrainConfig, load_config, main

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "train" / "configs" / "test_tiny.yaml"


def test_yaml_then_cli_overrides(tmp_path):
    config_file = tmp_path / "run.yaml"
    config_file.write_text("max_steps: 7\nlearning_rate: 0.01\nagent_args: {system_prompt: hi}\n")
    config, config_dir = load_config(["--config", str(config_file), "--max_steps", "3"])
    assert config.max_steps == 3  # the CLI wins
    assert config.learning_rate == 0.01  # the YAML wins over the default
    assert json.loads(config.agent_args) == {"system_prompt": "hi"}
    assert config_dir == tmp_path


def test_unknown_yaml_field_is_named(tmp_path):
    config_file = tmp_path / "run.yaml"
    config_file.write_text("max_stepz: 7\n")
    with pytest.raises(ValueError, match=re.escape("unknown fields ['max_stepz']; see TrainConfig")):
        load_config(["--config", str(config_file)])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"env": ["rllm/FrozenLak-v0"]}, "env ['rllm/FrozenLak-v0'] is not a registered single-agent id"),
        ({"env_weights": [1.0, 2.0]}, "env_weights has 2 entries for 1 envs"),
        ({"num_generations": 1}, "num_generations must be >= 2"),
        ({"estimator": "ppo"}, "estimator must be one of"),
        ({"agent_args": "{oops"}, "agent_args must be a JSON object"),
        ({"use_vllm": True, "vllm_mode": "server"}, "vllm_mode must be 'colocate' for multi-turn rollouts"),
    ],
)
def test_bad_config_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TrainConfig(**kwargs)


def test_lora_run_trains_an_adapter(tmp_path):
    summary = main(["--config", str(TINY), "--output_dir", str(tmp_path / "run"), "--lora", "true", "--lora_r", "4"])
    assert summary["config"]["lora"] is True
    assert (tmp_path / "run" / "final" / "adapter_config.json").is_file()
