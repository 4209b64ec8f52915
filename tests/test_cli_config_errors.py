"""Issue 34, point 3, driven as the command line: a wrong-typed YAML value is one line naming the file, the key, the
value and the type; a subcommand's usage error prints that subcommand's usage; ``eval`` and ``train`` suggest the
closest env id as ``rllm_gym.make`` does and give the same mistake the same exit status; lists print as text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "train" / "configs" / "test_tiny.yaml"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "CUDA_VISIBLE_DEVICES": ""}
TRAIN = ("-m", "rllm_gym.cli", "train")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=ENV, timeout=180, cwd=REPO)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("max_steps: ten", "max_steps: 'ten' is not an integer"),
        ("learning_rate: abc", "learning_rate: 'abc' is not a number"),
        ("max_steps: 2.5", "max_steps: 2.5 is not an integer"),
        ("eval_greedy: maybe", "eval_greedy: 'maybe' is not true or false"),
        ("env: rllm/FrozenLake-v0", "env: 'rllm/FrozenLake-v0' is not a list of strings: write [rllm/FrozenLake-v0]"),
    ],
)
@pytest.mark.parametrize("entry", [TRAIN, ("-m", "rllm_gym.train.grpo")], ids=["rllm-gym-train", "python-m"])
def test_a_wrong_typed_yaml_value_is_one_line_naming_file_key_value_and_type(tmp_path, line, message, entry):
    config = tmp_path / "run.yaml"
    config.write_text(TINY.read_text() + f"{line}\n")
    result = run(*entry, "--config", str(config), "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"rllm-gym train: error: {config}: {message}"]
    assert not (tmp_path / "out").exists()


def test_yaml_numbers_written_as_text_still_load(tmp_path):
    """PyYAML reads 1e-3 (no dot) as a string: it is a number all the same, as argparse read it before."""
    config = tmp_path / "run.yaml"
    config.write_text(TINY.read_text().replace("learning_rate: 1.0e-3", "learning_rate: 1e-3"))
    from rllm_gym.train.config import load_config

    loaded, _ = load_config(["--config", str(config)])
    assert loaded.learning_rate == 0.001


def test_a_flag_of_the_wrong_type_is_one_line_not_the_whole_usage(tmp_path):
    result = run(*TRAIN, "--config", str(TINY), "--max_steps", "ten", "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("rllm-gym train: error: argument --max_steps") and "invalid int value: 'ten'" in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "--tsks", "3"], "rllm-gym eval: error: unrecognized argument --tsks; did you mean --tasks?"),
        (["eval", "--tasks", "x"], "rllm-gym eval: error: argument --tasks: invalid int value: 'x'"),
        (["view", "/nonexistent.jsonl"], "rllm-gym view: error: /nonexistent.jsonl is not a file"),
        (["view", "x.jsonl", "--brif"], "rllm-gym view: error: unrecognized argument --brif; did you mean --brief?"),
    ],
)
def test_a_subcommand_error_prints_that_subcommands_usage(args, message):
    result = run("-m", "rllm_gym.cli", *args)
    assert result.returncode == 2
    assert result.stderr.startswith(f"usage: rllm-gym {args[0]} ")
    assert "{list,train,eval,view}" not in result.stderr  # not the top-level usage
    assert result.stderr.strip().splitlines()[-1].startswith(message)


@pytest.mark.parametrize(
    ("eval_args", "train_args", "message"),
    [
        (
            ["--env", "rllm/FrozenLak-v0"],
            ["--env", "rllm/FrozenLak-v0"],
            "Environment 'rllm/FrozenLak-v0' doesn't exist. Did you mean 'rllm/FrozenLake-v0'? Registered ids: "
            "rllm/FrozenLake-v0, rllm/Math-v0",
        ),
        (["--tsks", "3"], ["--max_stepz", "3"], "did you mean"),
        (["--model", "/nonexistent/model"], ["--model", "/nonexistent/model"], "/nonexistent/model"),
    ],
    ids=["unknown-env", "unknown-flag", "missing-model"],
)
def test_the_same_mistake_has_the_same_exit_status_in_eval_and_train(tmp_path, eval_args, train_args, message):
    evaluated = run("-m", "rllm_gym.cli", "eval", *eval_args)
    trained = run(*TRAIN, "--config", str(TINY), "--output_dir", str(tmp_path / "out"), *train_args)
    assert evaluated.returncode == trained.returncode == 2
    assert message in evaluated.stderr and message in trained.stderr
    for result in (evaluated, trained):
        assert "['" not in result.stderr and "Traceback" not in result.stderr  # lists as text, no reprs


def test_a_taken_output_has_the_same_exit_status_in_eval_and_train(tmp_path):
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_text("{}\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text("{}")
    evaluated = run("-m", "rllm_gym.cli", "eval", "--out", str(episodes))
    trained = run(*TRAIN, "--config", str(TINY), "--output_dir", str(run_dir))
    assert evaluated.returncode == trained.returncode == 2
    assert "pass --resume" in evaluated.stderr and "pass --resume true" in trained.stderr


def test_an_unknown_yaml_key_is_named_as_text(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(TINY.read_text() + "max_stepz: 3\nwarm_up: 1\n")
    result = run(*TRAIN, "--config", str(config))
    assert result.returncode == 2
    assert f"{config}: unknown fields max_stepz, warm_up (did you mean max_steps?)" in result.stderr
