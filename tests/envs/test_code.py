"""rllm/Code-v0: the built-in tasks (reference solutions pass, wrong ones fail), feedback turns, loaders."""

from __future__ import annotations

import asyncio
import json
import re

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import rllm_gym  # noqa: F401  (registers the ids)
from rllm_gym.envs.code import CodeEnv, builtin_code_tasks, load_code_tasks, normalize_task
from rllm_gym.rewards.code import CodeReward

TASKS = builtin_code_tasks()


def _fence(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}```\n"


def _wrong(task: dict) -> str:
    if task.get("fn_name"):
        return _fence(f"def {task['fn_name']}(*args):\n    return 'wrong-sentinel'\n")
    return _fence("print('wrong-sentinel')\n")


def test_builtin_set_is_varied_and_complete():
    assert len(TASKS) >= 40 and len({t["id"] for t in TASKS}) == len(TASKS)
    assert all(t["reference_solution"] and t["tests"] for t in TASKS)
    assert sum(bool(t.get("fn_name")) for t in TASKS) >= 10 and sum(not t.get("fn_name") for t in TASKS) >= 20


async def test_every_builtin_task_reference_passes_and_wrong_fails():
    grader = CodeReward(stop_on_first_failure=True)
    right = await asyncio.gather(*(grader.acall(t, _fence(t["reference_solution"])) for t in TASKS))
    wrong = await asyncio.gather(*(grader.acall(t, _wrong(t)) for t in TASKS))
    assert {t["id"]: r.reward for t, r in zip(TASKS, right, strict=False)} == {t["id"]: 1.0 for t in TASKS}
    assert {t["id"]: (r.reward, r.is_correct) for t, r in zip(TASKS, wrong, strict=False)} == {
        t["id"]: (0.0, False) for t in TASKS
    }


def test_check_env_passes():
    check_env(CodeEnv(), skip_render_check=True)


def test_single_turn_episode():
    env = gym.make("rllm/Code-v0")
    obs, info = env.reset(options={"task": TASKS[0]})
    assert obs.startswith(TASKS[0]["prompt"]) and "standard input" in obs and info["task"]["id"] == TASKS[0]["id"]
    obs, reward, terminated, truncated, info = env.step(_fence(TASKS[0]["reference_solution"]))
    assert (reward, terminated, truncated, info["is_correct"], info["graded"]) == (1.0, True, False, True, True)
    assert obs == f"All {info['total']} tests passed."


def test_multi_turn_feedback_then_revision():
    env = CodeEnv(max_revisions=2)
    task = {"id": "add", "prompt": "Add two numbers.", "tests": [{"input": "2 3\n", "output": "5\n"}]}
    env.reset(options={"task": task})
    obs, reward, terminated, _, info = env.step(_fence("print(6)\n"))
    assert (reward, terminated, info["revisions_left"]) == (0.0, False, 2)
    assert "Input:\n2 3\n" in obs and "Expected:\n5\n" in obs and "Got:\n6\n" in obs and "2 revision(s) left" in obs
    obs, reward, terminated, _, info = env.step(_fence("raise ValueError('nope')\n"))
    assert not terminated and "ValueError: nope" in obs and info["attempt"] == 2
    obs, reward, terminated, _, info = env.step(_fence("print(sum(map(int, input().split())))\n"))
    assert (reward, terminated, info["is_correct"]) == (1.0, True, True)


def test_revisions_run_out():
    env = CodeEnv(max_revisions=1)
    env.reset(options={"task": TASKS[0]})
    assert env.step("no code")[2] is False
    obs, reward, terminated, _, _info = env.step("still none")
    assert terminated and reward == 0.0 and "No revisions left" in obs
    with pytest.raises(RuntimeError, match=re.escape("call reset() first")):
        env.step("again")


def test_seeded_reset_is_deterministic():
    a, b = CodeEnv(), CodeEnv()
    assert [a.reset(seed=s)[0] for s in range(5)] == [b.reset(seed=s)[0] for s in range(5)]


def test_loaders_read_taco_humaneval_mbpp_and_livecodebench(tmp_path):
    rows = [
        {"question": "Double it.", "input_output": json.dumps({"inputs": ["2\n"], "outputs": ["4\n"]})},
        {
            "task_id": "HumanEval/0",
            "prompt": "def inc(x):\n",
            "canonical_solution": "    return x + 1\n",
            "test": "def check(candidate):\n    assert candidate(1) == 2\n",
            "entry_point": "inc",
        },
        {
            "task_id": 7,
            "text": "Write sq.",
            "code": "def sq(x):\n    return x * x\n",
            "test_list": ["assert sq(3) == 9"],
        },
        {
            "question_content": "Echo.",
            "public_test_cases": json.dumps([{"input": "hi\n", "output": "hi\n", "testtype": "stdin"}]),
        },
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    tasks = load_code_tasks(path)
    assert [t["id"] for t in tasks] == ["code-0", "HumanEval/0", "7", "code-3"]
    grader = CodeReward()
    assert grader(tasks[0], _fence("print(2 * int(input()))\n")).reward == 1.0
    assert grader(tasks[1], _fence(tasks[1]["reference_solution"])).reward == 1.0
    assert grader(tasks[2], _fence(tasks[2]["reference_solution"])).reward == 1.0
    assert grader(tasks[3], _fence("print(input())\n")).reward == 1.0
    json_path = tmp_path / "tasks.json"
    json_path.write_text(json.dumps(rows[:1]))
    assert load_code_tasks(json_path)[0]["tests"] == {"inputs": ["2\n"], "outputs": ["4\n"]}


def test_bad_arguments_name_the_field(tmp_path):
    with pytest.raises(ValueError, match=re.escape("CodeEnv max_revisions must be an int >= 0")):
        CodeEnv(max_revisions=-1)
    with pytest.raises(ValueError, match=re.escape("code task #0 needs a problem statement")):
        normalize_task({"tests": [{"input": "", "output": ""}]})
    with pytest.raises(FileNotFoundError, match=re.escape("does not exist: pass a .jsonl or .json file")):
        load_code_tasks(tmp_path / "missing.jsonl")
