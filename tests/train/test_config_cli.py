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
MAPS = REPO / "train" / "configs" / "frozenlake_demo_maps.jsonl"


def tiny_text() -> str:
    """test_tiny.yaml's text with its task file named by an absolute path, for a copy of it in another folder."""
    return TINY.read_text().replace("[frozenlake_demo_maps.jsonl]", f"[{MAPS}]")


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
    config.write_text(tiny_text() + f"{line}\n")
    result = run_python(*entry, "--config", str(config), "--output_dir", str(tmp_path / "out"), timeout=180)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"rllm-gym train: error: {config}: {message}"]
    assert not (tmp_path / "out").exists()


def test_yaml_numbers_written_as_text_still_load(tmp_path):
    """PyYAML reads 1e-3 (no dot) as a string: it is a number all the same, as argparse read it before."""
    config = tmp_path / "run.yaml"
    config.write_text(tiny_text().replace("learning_rate: 1.0e-3", "learning_rate: 1e-3"))
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
    config.write_text(tiny_text() + "max_stepz: 3\nwarmup_ration: 1\n")
    result = run_python(*TRAIN, "--config", str(config), "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 2
    expected = "unknown fields max_stepz (did you mean max_steps?), warmup_ration (did you mean warmup_ratio?)"
    assert f"{config}: {expected}" in result.stderr  # a suggestion for each


def test_every_mistake_of_a_yaml_is_named_at_once(tmp_path, run_python):
    """Two values of the wrong type, then two values a check refuses: each run names both, one line each."""
    config = tmp_path / "run.yaml"
    config.write_text(tiny_text() + "max_steps: ten\nlearning_rate: abc\n")
    result = run_python(*GRPO, "--config", str(config), "--output_dir", str(tmp_path / "out"), timeout=180)
    assert result.returncode == 2
    assert sorted(result.stderr.strip().splitlines()) == [
        f"rllm-gym train: error: {config}: learning_rate: 'abc' is not a number",
        f"rllm-gym train: error: {config}: max_steps: 'ten' is not an integer",
    ]
    config.write_text(tiny_text() + "num_generations: 1\ntemperature: -1\n")
    result = run_python(*GRPO, "--config", str(config), "--output_dir", str(tmp_path / "out"), timeout=180)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and "num_generations must be >= 2" in lines[0] and "temperature must be >= 0" in lines[1]
    assert not (tmp_path / "out").exists()


def test_a_typo_in_a_yaml_is_named_before_the_output_folder_is_refused(tmp_path, run_python):
    """The config is validated first: a folder that holds a run does not hide a mistake of the YAML."""
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "run.json").write_text("{}")
    config = tmp_path / "run.yaml"
    config.write_text(tiny_text() + "max_stepz: 3\n")
    result = run_python(*GRPO, "--config", str(config), "--output_dir", str(taken), timeout=180)
    assert result.returncode == 2
    assert "unknown field max_stepz (did you mean max_steps?)" in result.stderr and "holds" not in result.stderr
    good = run_python(*GRPO, "--config", str(TINY), "--output_dir", str(taken), timeout=60)
    assert good.returncode == 2 and str(taken) in good.stderr  # a good config is refused the folder, at once


@pytest.mark.parametrize("key", ["tasks", "eval_tasks"])
def test_a_missing_task_file_is_named_before_the_imports_and_leaves_no_folder(tmp_path, run_python, key):
    config = tmp_path / "run.yaml"
    config.write_text(tiny_text() + f"{key}: [nowhere.jsonl]\n")
    result = run_python(*GRPO, "--config", str(config), "--output_dir", str(tmp_path / "out"), timeout=120)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"rllm-gym train: error: {key}: nowhere.jsonl: no such file (looked for nowhere.jsonl and")
    assert str(tmp_path / "nowhere.jsonl") in line
    assert not (tmp_path / "out").exists()
    check = (
        "import sys; from rllm_gym.train.run_dir import exit_status_before_imports as check; "
        f"print(check(['--config', {str(config)!r}]), 'torch' in sys.modules, 'trl' in sys.modules)"
    )
    said = run_python("-c", check, timeout=60)
    assert said.stdout.split() == ["2", "False", "False"]  # said before torch and TRL load (~20 s)


def test_the_types_read_before_the_imports_are_train_configs_own():
    import typing

    from rllm_gym.train.config import TrainConfig
    from rllm_gym.train.config_file import train_config_hints

    assert train_config_hints() == typing.get_type_hints(TrainConfig)


def test_an_unknown_yaml_field_names_the_closest_one(tmp_path, run_python):
    config = tmp_path / "run.yaml"
    config.write_text("max_step: 3\n")
    result = run_python(*GRPO, "--config", str(config), cwd=tmp_path, timeout=120)  # never the checkout's runs/
    assert result.returncode == 2
    assert f"{config}: unknown field max_step (did you mean max_steps?)" in result.stderr


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
