"""Inputs are checked before a model loads: a missing --model folder, an unknown flag, a malformed JSONL line and
wrong agent or env arguments each end in seconds with one line that names them, without a traceback (--debug shows
it). Driven as the command line, for ``rllm-gym eval`` and the trainer."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "train" / "configs" / "test_tiny.yaml"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "CUDA_VISIBLE_DEVICES": ""}


def run(*args: str, cwd: Path = REPO) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=ENV, timeout=120, cwd=cwd)
    return result, time.monotonic() - start


def eval_cli(*args: str, cwd: Path = REPO):
    return run("-m", "rllm_gym.cli", "eval", *args, cwd=cwd)


def train_cli(tmp_path: Path, *args: str):
    return run("-m", "rllm_gym.train.grpo", "--config", str(TINY), "--output_dir", str(tmp_path / "run"), *args)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "runs/demo_cpu/fnial"], "--model runs/demo_cpu/fnial: no such folder (the nearest existing one"),
        (["--taks", "3"], "rllm-gym eval: error: unrecognized argument --taks; did you mean --tasks?"),
        (
            ["--agent-args", '{"system_promt": ""}'],
            "agent_args: FrozenLakeAgent takes no argument 'system_promt' (did you mean 'system_prompt'?); it accepts "
            "enable_thinking, max_history_turns, name, observation_template, system_prompt",
        ),
        (["--env-args", '{"sise": 4}'], "env_args: rllm/FrozenLake-v0 (FrozenLakeEnv) takes no argument 'sise' (did"),
    ],
)
def test_eval_rejects_bad_inputs_at_once_naming_them(args, message, tmp_path):
    result, seconds = eval_cli(*args, "--tasks", "1", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert seconds < 30  # no model load, no network


def test_eval_names_the_malformed_line_of_a_data_file(tmp_path):
    data = tmp_path / "tasks.jsonl"
    data.write_text('{"id": "a", "map": ["SFG"]}\n{"id": "b", oops}\n')
    result, _ = eval_cli("--data", str(data), "--tasks", "2")
    assert result.returncode == 1
    assert f"--data {data}:2 is not JSON" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max_stepz", "3"], "unknown flag --max_stepz (did you mean --max_steps?)"),
        (["--model", "runs/demo_cpu/fnial"], "model runs/demo_cpu/fnial: no such folder"),
        (["--agent_args", '{"system_promt": ""}'], "agent_args: FrozenLakeAgent takes no argument 'system_promt'"),
        (["--env_args", '{"sise": 4}'], "env_args: rllm/FrozenLake-v0 (FrozenLakeEnv) takes no argument 'sise'"),
    ],
)
def test_training_rejects_bad_inputs_at_once_naming_them(args, message, tmp_path, capsys):
    from rllm_gym.train.grpo import cli  # in-process: the subprocess tests below drive the same function

    start = time.monotonic()
    assert cli(["--config", str(TINY), "--output_dir", str(tmp_path / "run"), *args]) == 2  # usage, as in eval
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("rllm-gym train: error: ") and message in line
    assert time.monotonic() - start < 10 and not (tmp_path / "run").exists()


def test_training_names_the_malformed_line_and_debug_shows_the_traceback(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a", "map": ["SFG"]}\n\n{"id": "b", oops}\n')
    result, _ = train_cli(tmp_path, "--tasks", str(tasks))
    assert result.returncode == 1
    assert f"tasks: {tasks}:3 is not JSON" in result.stderr and "Traceback" not in result.stderr
    debug, _ = train_cli(tmp_path, "--tasks", str(tasks), "--debug", "true")
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr


def test_an_unknown_yaml_field_names_the_closest_one(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("max_step: 3\n")
    result, _ = run("-m", "rllm_gym.train.grpo", "--config", str(config))
    assert result.returncode == 2
    assert f"{config}: unknown fields max_step (did you mean max_steps?)" in result.stderr
