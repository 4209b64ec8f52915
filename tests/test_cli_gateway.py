"""``rllm-gym gateway`` serving sessions, and ``rllm-gym eval --agent-program/--reward-fn``, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import openai
import pytest

from tests.conftest import QUIET_ENV, REPO

CALCULATOR = "rllm_gym.agents.openai_calculator"


@pytest.mark.slow  # ~20-30 s on 2 cores
def test_eval_runs_an_agent_program_end_to_end(run_python, tmp_path):
    out = tmp_path / "episodes.jsonl"
    done = run_python(
        "-m", "rllm_gym.cli", "eval", "--agent-program", f"{CALCULATOR}:solve", "--reward-fn", f"{CALCULATOR}:reward",
        "--tasks", "2", "--n", "2", "--json", "--out", str(out), "--timeout", "120",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert (summary["tasks"], summary["n"]) == (2, 2)
    episodes = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(e["id"] for e in episodes) == ["seed-0:0", "seed-0:1", "seed-1:0", "seed-1:1"]
    for episode in episodes:
        (trajectory,) = episode["trajectories"]
        assert episode["termination_reason"] == "env_done" and trajectory["input"]["task"] in (0, 1)
        assert trajectory["reward"] in (0.0, 1.0) and trajectory["steps"]
        step = trajectory["steps"][0]
        assert len(step["response_ids"]) == len(step["logprobs"]) > 0
        assert step["info"]["tools"][0]["function"]["name"] == "add"


KEEPS_ASKING = """
import openai

def run(task, base_url):
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    for _ in range(20):
        client.chat.completions.create(model="p", messages=[{"role": "user", "content": "more"}], max_tokens=2)
"""


@pytest.mark.slow  # ~15 s on 2 cores
def test_eval_max_turns_caps_an_agent_programs_calls(run_python, tmp_path):
    (tmp_path / "keeps_asking.py").write_text(KEEPS_ASKING)
    out = tmp_path / "episodes.jsonl"
    done = run_python(
        "-m", "rllm_gym.cli", "eval", "--agent-program", "keeps_asking:run", "--max-turns", "3", "--tasks", "2",
        "--n", "1", "--out", str(out), "--json", env={**QUIET_ENV, "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    episodes = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["termination_reason"] for e in episodes] == ["max_turns_exceeded"] * 2
    assert [len(e["trajectories"][0]["steps"]) for e in episodes] == [3, 3]


def test_eval_agent_program_usage_errors_name_the_flag(run_python):
    cases = [
        (["--reward-fn", f"{CALCULATOR}:reward"], "--reward-fn scores an --agent-program's output"),
        (["--agent-program", "no_such_module_q:solve"], "--agent-program no_such_module_q:solve: cannot import"),
        (["--agent-program", f"{CALCULATOR}:solve", "--reward-fn", "x"], "--reward-fn must be 'module:function'"),
    ]
    for flags, message in cases:
        done = run_python("-m", "rllm_gym.cli", "eval", *flags)
        assert done.returncode == 2 and message in done.stderr, done.stderr


def test_gateway_usage_errors_name_the_flag_before_loading_a_model(run_python):
    cases = [
        (["--temperature", "nan"], "--temperature must be a finite number >= 0 (0 = greedy), got nan"),
        (["--temperature", "inf"], "--temperature must be a finite number >= 0 (0 = greedy), got inf"),
        (["--max-context-tokens", "0"], "--max-context-tokens must be >= 1 (or left out: the model's), got 0"),
    ]
    for flags, message in cases:
        done = run_python("-m", "rllm_gym.cli", "gateway", "--port", "0", *flags)
        assert done.returncode == 2 and message in done.stderr, done.stderr


def test_the_gateway_command_serves_sessions_until_stopped():
    command = [sys.executable, "-m", "rllm_gym.cli", "gateway", "--port", "0", "--max-tokens", "8"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    server = subprocess.Popen(command, env=QUIET_ENV, cwd=REPO, **pipes)
    try:
        line = server.stdout.readline()
        assert line.startswith("rllm-gym gateway: listening on http://127.0.0.1:"), line + server.stderr.read()
        url = line.split()[-1]
        opened = httpx.post(f"{url}/sessions", json={"task": {"q": "hi"}}).json()
        client = openai.OpenAI(base_url=opened["base_url"], api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}])
        trajectory = httpx.get(f"{url}/sessions/{opened['id']}").json()
        assert trajectory["task"] == {"q": "hi"} and len(trajectory["steps"]) == 1
        assert reply.usage.completion_tokens == len(trajectory["steps"][0]["response_ids"]) <= 8
        assert httpx.get(f"{url}/sessions/{'x' * 43}").status_code == 404
    finally:
        server.terminate()
        server.wait(timeout=30)
