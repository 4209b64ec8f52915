"""The trainer's config errors, driven as the command line (``rllm-gym train`` and ``python -m
rllm_gym.train.grpo``): a wrong-typed YAML value or flag is one line naming the file, the key, the value and the type;
an unknown YAML key names the closest one; bad inputs end in seconds with one line naming them before a model loads;
a malformed JSONL line is named, and ``--debug true`` shows the traceback."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "train" / "configs" / "test_tiny.yaml"
TRAIN = ("-m", "rllm_gym.cli", "train")
GRPO = ("-m", "rllm_gym.train.grpo")


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
@pytest.mark.parametrize("entry", [TRAIN, GRPO], ids=["rllm-gym-train", "python-m"])
def test_a_wrong_typed_yaml_value_is_one_line_naming_file_key_value_and_type(
    tmp_path, line, message, entry, run_python
):
    config = tmp_path / "run.yaml"
    config.write_text(TINY.read_text() + f"{line}\n")
    result = run_python(*entry, "--config", str(config), "--output_dir", str(tmp_path / "out"), timeout=180)
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


def test_a_flag_of_the_wrong_type_is_one_line_not_the_whole_usage(tmp_path, run_python):
    result = run_python(*TRAIN, "--config", str(TINY), "--max_steps", "ten", "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("rllm-gym train: error: argument --max_steps") and "invalid int value: 'ten'" in line


def test_an_unknown_yaml_key_is_named_as_text(tmp_path, run_python):
    config = tmp_path / "run.yaml"
    config.write_text(TINY.read_text() + "max_stepz: 3\nwarm_up: 1\n")
    result = run_python(*TRAIN, "--config", str(config))
    assert result.returncode == 2
    assert f"{config}: unknown fields max_stepz, warm_up (did you mean max_steps?)" in result.stderr


def test_an_unknown_yaml_field_names_the_closest_one(tmp_path, run_python):
    config = tmp_path / "run.yaml"
    config.write_text("max_step: 3\n")
    result = run_python(*GRPO, "--config", str(config), timeout=120)
    assert result.returncode == 2
    assert f"{config}: unknown fields max_step (did you mean max_steps?)" in result.stderr


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
    from rllm_gym.train.grpo import cli  # in-process: the subprocess tests here drive the same function

    start = time.monotonic()
    assert cli(["--config", str(TINY), "--output_dir", str(tmp_path / "run"), *args]) == 2  # usage, as in eval
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("rllm-gym train: error: ") and message in line
    assert time.monotonic() - start < 10 and not (tmp_path / "run").exists()


def test_training_names_the_malformed_line_and_debug_shows_the_traceback(tmp_path, run_python):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a", "map": ["SFG"]}\n\n{"id": "b", oops}\n')
    common = (*GRPO, "--config", str(TINY), "--output_dir", str(tmp_path / "run"), "--tasks", str(tasks))
    result = run_python(*common, timeout=120)
    assert result.returncode == 1
    assert f"tasks: {tasks}:3 is not JSON" in result.stderr and "Traceback" not in result.stderr
    debug = run_python(*common, "--debug", "true", timeout=120)
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr
