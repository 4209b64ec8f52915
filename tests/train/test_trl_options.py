"""Every TRL GRPOConfig field is reachable from the YAML and the command line (validated, with help), and a nan loss
never goes by without a reason."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rllm_gym.train.config import TRL_FIELDS, load_config
from rllm_gym.train.console import ConsoleLog

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "train" / "configs" / "test_tiny.yaml"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "CUDA_VISIBLE_DEVICES": ""}
ASKED_FOR = ("gradient_accumulation_steps", "max_grad_norm", "weight_decay", "num_iterations", "epsilon")


def test_the_options_users_reach_for_first_are_fields_or_trl_flags():
    assert set(ASKED_FOR) | {"save_total_limit", "bf16"} <= set(TRL_FIELDS)
    config, _ = load_config(["--warmup_ratio", "0.1"])
    assert config.warmup_ratio == 0.1 and config.trl_args == {}


@pytest.mark.slow
def test_trl_options_from_yaml_and_flags_reach_the_trainer(tmp_path):
    config_file = tmp_path / "run.yaml"
    config_file.write_text(TINY.read_text() + "weight_decay: 0.01\nsave_total_limit: 1\nnum_iterations: 2\n")
    (tmp_path / "frozenlake_demo_maps.jsonl").write_text((TINY.parent / "frozenlake_demo_maps.jsonl").read_text())
    output_dir = tmp_path / "run"
    command = [sys.executable, "-m", "rllm_gym.train.grpo", "--config", str(config_file)]
    command += ["--output_dir", str(output_dir), "--save_steps", "1", "--gradient_accumulation_steps", "2"]
    command += ["--max_grad_norm", "0.5", "--epsilon", "0.3", "--bf16", "false", "--warmup_ratio", "0.1"]
    result = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)
    assert result.returncode == 0, result.stderr
    assert [path.name for path in output_dir.glob("checkpoint-*")] == ["checkpoint-3"]  # save_total_limit: 1
    args = torch.load(output_dir / "checkpoint-3" / "training_args.bin", weights_only=False)
    assert (args.gradient_accumulation_steps, args.max_grad_norm, args.weight_decay) == (2, 0.5, 0.01)
    assert (args.num_iterations, args.epsilon, args.bf16, args.warmup_steps) == (2, 0.3, False, 0.1)
    # prompts_per_step stays per optimizer step: 2 prompts x 2 rollouts in 2 micro-batches of 2.
    assert args.per_device_train_batch_size == 2
    recorded = json.loads((output_dir / "summary.json").read_text())["config"]["trl_args"]  # a dict, not JSON text
    assert recorded["gradient_accumulation_steps"] == 2 and recorded["weight_decay"] == 0.01


@pytest.mark.parametrize(
    ("args", "message", "status"),
    [
        (["--max_grad_nrom", "1"], "unknown flag --max_grad_nrom (did you mean --max_grad_norm?)", 2),
        (["--gradient_accumulation_steps", "3"], "must divide among 1 processes x 3 gradient accumulation steps", 1),
        (["--trl_args", '{"max_grad_nrom": 1}'], "trl_args: 'max_grad_nrom' is not a GRPOConfig field", 2),
        (["--warmup_ratio", "1.5"], "warmup_ratio must be in [0, 1), got 1.5", 2),
    ],
)
def test_bad_trl_options_are_named(args, message, status, tmp_path, capsys):
    from rllm_gym.train.grpo import cli

    assert cli(["--config", str(TINY), "--output_dir", str(tmp_path / "run"), *args]) == status
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_help_lists_trl_fields_with_their_help():
    result = subprocess.run(
        [sys.executable, "-m", "rllm_gym.train.grpo", "--help"], capture_output=True, text=True, env=ENV, timeout=120
    )
    assert result.returncode == 0
    assert result.stdout.startswith("usage: grpo.py ")  # the script's name, which its __main__ block hands on
    assert "--max_grad_norm" in result.stdout and "(TRL) Maximum gradient norm" in result.stdout
    assert "--warmup_ratio" in result.stdout and "--max_error_steps" in result.stdout


def test_a_nan_loss_is_explained(tmp_path, caplog):
    console = ConsoleLog(tmp_path)

    class State:
        global_step, is_world_process_zero = 4, True

    with caplog.at_level(logging.WARNING, logger="rllm_gym"):
        console.on_log(None, State(), None, logs={"reward": 0.0, "loss": float("nan"), "grad_norm": float("inf")})
    assert "step 4: the loss is nan: the gradients overflowed (grad_norm is not finite)" in caplog.text
