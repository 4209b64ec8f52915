"""``rllm_gym/cli.py``, driven as the command line: ``list`` prints the registry, ``train`` is the trainer with its
flags and messages, a subcommand's usage error prints that subcommand's usage, ``eval`` and ``train`` give the same
mistake the same exit status, and ``--log-level`` is a checked flag of every command. ``eval`` itself is
tests/test_cli_eval.py; the trainer's config errors are tests/train/test_config_cli.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rllm_gym import registry
from rllm_gym.cli import main
from rllm_gym.registry import ENV_SPECS, EnvSpec, default_agent, env_ids

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "train" / "configs" / "test_tiny.yaml"
CLI = ("-m", "rllm_gym.cli")
TRAIN = (*CLI, "train")


# list ----------------------------------------------------------------------------------------------------------------


def test_list_prints_one_line_per_registered_env(run_python):
    result = run_python(*CLI, "list")
    assert result.returncode == 0, result.stderr
    header, *lines = result.stdout.splitlines()
    assert header.split() == ["id", "default", "agent", "extras", "description"]
    assert len(lines) == len(ENV_SPECS)
    for spec, line in zip(ENV_SPECS, lines, strict=True):
        assert line.startswith(f"{spec.id} ") and line.endswith(spec.description)
    frozen = lines[env_ids().index("rllm/FrozenLake-v0")]
    assert frozen.split()[:3] == ["rllm/FrozenLake-v0", "FrozenLakeAgent", "-"]
    judge = lines[env_ids().index("rllm/SolverJudge-v0")]
    assert judge.split()[:4] == ["rllm/SolverJudge-v0", "solver=SolverAgent", "judge=JudgeAgent", "-"]


def test_list_json_gives_the_registry_with_full_agent_paths(run_python):
    result = run_python(*CLI, "list", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [row["id"] for row in rows] == env_ids()
    for spec, row in zip(ENV_SPECS, rows, strict=True):
        agent = default_agent(row["id"])
        if row["multi_agent"]:
            assert row["agent"] == {role: f"{cls.__module__}:{cls.__qualname__}" for role, cls in agent.items()}
        else:
            assert row["agent"] == f"{agent.__module__}:{agent.__qualname__}"
        assert row["description"] == spec.description != ""
        assert row["extras"] == list(spec.extras)
        assert row["install"] == (f'pip install "rllm-gym[{",".join(spec.extras)}]"' if spec.extras else None)


def test_list_shows_extras_and_falls_back_to_the_module_docstring(monkeypatch, capsys):
    extra = EnvSpec("my/Lake-v0", "rllm_gym.envs.frozenlake:FrozenLakeEnv", agent=None, extras=("vllm", "serve"))
    monkeypatch.setattr(registry, "ENV_SPECS", (*ENV_SPECS, extra))
    assert main(["list"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.split()[:3] == ["my/Lake-v0", "-", "vllm,serve"]
    assert line.endswith("FrozenLake as a text environment: the reference env that every other rllm-gym env copies.")
    assert main(["list", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)[-1]
    assert row["agent"] is None and row["install"] == 'pip install "rllm-gym[vllm,serve]"'


# train ---------------------------------------------------------------------------------------------------------------


def test_train_runs_the_trainer_with_its_flags(tmp_path, run_python):
    output_dir = tmp_path / "run"
    result = run_python(*TRAIN, "--config", str(TINY), "--output_dir", str(output_dir), "--max_steps", "1")
    assert result.returncode == 0, result.stderr
    assert [line.split()[:2] for line in result.stdout.splitlines() if line.startswith("step ")] == [["step", "1"]]
    assert json.loads((output_dir / "summary.json").read_text())["termination_reasons"]
    assert (output_dir / "final").is_dir()


def test_train_fails_exactly_as_the_trainer_module_does(tmp_path, run_python):
    args = ["--config", str(TINY), "--output_dir", str(tmp_path / "run"), "--max_stepz", "1"]
    ours = run_python(*TRAIN, *args)
    theirs = run_python("-m", "rllm_gym.train.grpo", *args)
    assert ours.returncode == theirs.returncode == 2  # a usage error, as in rllm-gym eval
    assert ours.stderr.splitlines()[-1] == theirs.stderr.splitlines()[-1]
    assert "rllm-gym train: error: unknown flag --max_stepz (did you mean --max_steps?)" in ours.stderr
    assert not (tmp_path / "run").exists()


def test_train_help_is_the_trainers(run_python):
    result = run_python(*TRAIN, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: rllm-gym train")
    assert "--max_steps" in result.stdout and "--gradient_accumulation_steps" in result.stdout
    top = run_python(*CLI, "--help")
    assert "GRPO training: python -m rllm_gym.train.grpo with the same flags" in " ".join(top.stdout.split())


# usage errors, the same in every subcommand --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "--tsks", "3"], "rllm-gym eval: error: unrecognized argument --tsks; did you mean --tasks?"),
        (["eval", "--tasks", "x"], "rllm-gym eval: error: argument --tasks: invalid int value: 'x'"),
        (["view", "/nonexistent.jsonl"], "rllm-gym view: error: /nonexistent.jsonl is not a file"),
        (["view", "x.jsonl", "--brif"], "rllm-gym view: error: unrecognized argument --brif; did you mean --brief?"),
    ],
)
def test_a_subcommand_error_prints_that_subcommands_usage(args, message, run_python):
    result = run_python(*CLI, *args)
    assert result.returncode == 2
    assert result.stderr.startswith(f"usage: rllm-gym {args[0]} ")
    assert "{list,train,eval,view}" not in result.stderr  # not the top-level usage
    assert result.stderr.strip().splitlines()[-1].startswith(message)


def test_view_of_a_missing_file_is_a_usage_error_in_process(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["view", "/nonexistent/episodes.jsonl"])
    assert exit_info.value.code == 2
    assert "rllm-gym view: error: /nonexistent/episodes.jsonl is not a file" in capsys.readouterr().err


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
def test_the_same_mistake_has_the_same_exit_status_in_eval_and_train(
    tmp_path, eval_args, train_args, message, run_python
):
    evaluated = run_python(*CLI, "eval", *eval_args)
    trained = run_python(*TRAIN, "--config", str(TINY), "--output_dir", str(tmp_path / "out"), *train_args)
    assert evaluated.returncode == trained.returncode == 2
    assert message in evaluated.stderr and message in trained.stderr
    for result in (evaluated, trained):
        assert "['" not in result.stderr and "Traceback" not in result.stderr  # lists as text, no reprs


def test_a_taken_output_has_the_same_exit_status_in_eval_and_train(tmp_path, run_python):
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_text("{}\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text("{}")
    evaluated = run_python(*CLI, "eval", "--out", str(episodes))
    trained = run_python(*TRAIN, "--config", str(TINY), "--output_dir", str(run_dir))
    assert evaluated.returncode == trained.returncode == 2
    assert "pass --resume" in evaluated.stderr and "pass --resume true" in trained.stderr


def test_log_level_is_a_flag_of_every_command_and_is_checked(run_python):
    result = run_python(*CLI, "view", "--log-level", "loud", "x.jsonl")
    assert result.returncode == 2
    assert "argument --log-level: invalid choice: 'loud'" in result.stderr
