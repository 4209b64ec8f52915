import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rllm_gym.cli import main
from rllm_gym.store import read_episodes


def run_cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "rllm_gym.cli", *args], capture_output=True, text=True, env=env, timeout=300, cwd=cwd
    )


def eval_args(model, out, tasks=12):
    return [
        "eval",
        "--env",
        "rllm/FrozenLake-v0",
        "--model",
        str(model),
        "--tasks",
        str(tasks),
        "--n",
        "1",
        "--max-turns",
        "2",
        "--max-tokens",
        "6",
        "--temperature",
        "0",
        "--n-parallel",
        "1",
        "--out",
        str(out),
    ]


def comparable(episode):
    data = episode.to_dict()
    data["metadata"].pop("attempts", None)
    for trajectory in data["trajectories"]:
        trajectory.pop("uid")
        for step in trajectory["steps"]:
            step.pop("id")
    return data


def test_eval_writes_episodes_and_prints_the_summary(tiny_model_dir, tmp_path):
    out = tmp_path / "episodes.jsonl"
    result = run_cli(*eval_args(tiny_model_dir, out, tasks=3), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["episodes"] == 3 and summary["tasks"] == 3 and summary["n"] == 1
    assert {"pass@1", "pass^1", "mean_reward", "mean_turns", "termination_reasons"} <= set(summary)
    episodes = list(read_episodes(out))
    assert sorted(e.id for e in episodes) == ["seed-0:0", "seed-1:0", "seed-2:0"]
    step = episodes[0].trajectories[0].steps[0]
    assert step.prompt_ids and step.response_ids and len(step.logprobs) == len(step.response_ids)

    view = run_cli("view", str(out), "--id", "seed-1:0")
    assert view.returncode == 0, view.stderr
    assert "seed-1:0" in view.stdout and "Current grid:" in view.stdout and "step 0: reward=" in view.stdout


def test_killed_eval_resumes_to_the_same_episodes_none_twice(tiny_model_dir, tmp_path):
    clean = tmp_path / "clean.jsonl"
    assert run_cli(*eval_args(tiny_model_dir, clean)).returncode == 0
    out = tmp_path / "killed.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "rllm_gym.cli", *eval_args(tiny_model_dir, out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not (out.exists() and out.read_text().count("\n") >= 3):
        assert process.poll() is None and time.monotonic() < deadline, "eval ended before it could be killed"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    written = out.read_text().count("\n")
    assert 3 <= written < 12, "the kill should land half-way"
    resumed = run_cli(*eval_args(tiny_model_dir, out), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    ids = [e.id for e in read_episodes(out)]
    assert len(ids) == len(set(ids)) == 12
    expected = {e.id: comparable(e) for e in read_episodes(clean)}
    assert {e.id: comparable(e) for e in read_episodes(out)} == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "--tasks", "0"], "--tasks must be >= 1, got 0"),
        (["eval", "--max-turns", "0"], "--max-turns must be >= 1, got 0"),
        (["eval", "--seed", "-1"], "--seed must be >= 0 (it seeds sampling and every env reset), got -1"),
        (["eval", "--policy", "openai"], "--policy openai needs --model"),
        (["eval", "--resume"], "--resume needs --out"),
    ],
)
def test_bad_arguments_are_named(args, message, capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(args)
    assert excinfo.value.code == 2
    assert message in capsys.readouterr().err


def test_max_steps_is_a_deprecated_alias_of_max_turns(capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(["eval", "--max-steps", "0"])  # reaches the --max-turns check: the alias stored into max_turns
    err = capsys.readouterr().err
    assert excinfo.value.code == 2
    assert "rllm-gym eval: --max-steps is deprecated and will be removed: use --max-turns" in err
    assert "--max-turns must be >= 1, got 0" in err


def test_existing_out_file_needs_resume(tmp_path, capsys):
    out = tmp_path / "e.jsonl"
    out.write_text('{"id": "x:0"}\n')
    with pytest.raises(SystemExit):
        main(["eval", "--out", str(out)])
    assert "pass --resume to continue it" in capsys.readouterr().err


def test_eval_runs_multi_agent_envs(tiny_model_dir, capsys):
    args = ["eval", "--env", "rllm/SolverJudge-v0", "--model", str(tiny_model_dir), "--tasks", "2", "--n", "2"]
    assert main([*args, "--max-tokens", "4", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 4 and summary["mean_turns"] == 3.0  # two solvers and a judge per episode


def test_unknown_env_is_named(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--env", "rllm/FrozenLak-v0"])
    assert (
        "Environment 'rllm/FrozenLak-v0' doesn't exist. Did you mean 'rllm/FrozenLake-v0'?" in capsys.readouterr().err
    )
