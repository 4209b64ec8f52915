"""rllm/Code-v0: the built-in tasks (reference solutions pass, wrong ones fail), feedback turns, loaders."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import pickle
import re
import zlib

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
    env = CodeEnv(max_revisions=2, feedback="full")
    task = {"id": "add", "prompt": "Add two numbers.", "tests": [{"input": "2 3\n", "output": "5\n"}]}
    env.reset(options={"task": task})
    obs, reward, terminated, _, info = env.step(_fence("print(6)\n"))
    assert (reward, terminated, info["revisions_left"]) == (0.0, False, 2)
    assert "Input:\n2 3\n" in obs and "Expected:\n5\n" in obs and "Got:\n6\n" in obs and "2 revision(s) left" in obs
    obs, reward, terminated, _, info = env.step(_fence("raise ValueError('nope')\n"))
    assert not terminated and "ValueError: nope" in obs and info["attempt"] == 2
    obs, reward, terminated, _, info = env.step(_fence("print(sum(map(int, input().split())))\n"))
    assert (reward, terminated, info["is_correct"]) == (1.0, True, True)


ADD = {
    "id": "add",
    "prompt": "Add two numbers.",
    "tests": [{"input": "2 3\n", "output": "5\n"}, {"input": "40 2\n", "output": "42\n"}],
}


def test_feedback_never_quotes_a_hidden_test_so_a_policy_cannot_copy_or_carry_it_out():
    env = CodeEnv(max_revisions=4)
    env.reset(options={"task": ADD})
    leaks = ("2 3", "5", "40", "42")
    for attempt in (
        "print(6)\n",  # a wrong answer: the expected output must not come back
        "print(input())\n",  # echoes the hidden input: what it printed must not come back
        "raise ValueError('leak:' + input())\n",  # carries the hidden input out in an error message
        "import sys\nsys.stderr.write(input())\nsys.exit(3)\n",
    ):
        obs, reward, terminated, _, info = env.step(_fence(attempt))
        assert not terminated and reward == 0.0, obs
        assert obs.startswith("A hidden test failed."), obs
        assert not any(leak in obs.split("\n\nRevise")[0] for leak in leaks), obs
        assert info["tests"][0]["input"] == "2 3\n"  # the full record stays in info, for logs
    # A policy that hard-codes what it could learn gets nothing more.
    obs, reward, terminated, _, _ = env.step(_fence("print(5)\n"))
    assert terminated and reward == 0.0 and "1 of 2 tests passed" in obs


def test_public_tests_are_quoted_and_hidden_ones_only_named():
    env = CodeEnv(max_revisions=2)
    env.reset(options={"task": {**ADD, "public_tests": 1}})
    obs = env.step(_fence("print(6)\n"))[0]
    assert "Input:\n2 3\n" in obs and "Expected:\n5\n" in obs and "Got:\n6\n" in obs
    obs = env.step(_fence("print(5)\n"))[0]
    assert obs.startswith("All 1 public test(s) passed, but a hidden test failed.")
    assert "42" not in obs and "40" not in obs and "wrong answer" not in obs


def test_an_mbpp_prompt_shows_one_assert_and_feedback_hides_the_others():
    task = {
        "id": "mbpp-sq",
        "text": "Write a function sq that squares a number.",
        "test_list": ["assert sq(2) == 4", "assert sq(3) == 9", "assert sq(-4) == 16"],
    }
    env = CodeEnv(max_revisions=1)
    obs, _ = env.reset(options={"task": task})
    assert "Define the function this test calls:\nassert sq(2) == 4" in obs
    assert "sq(3)" not in obs and "sq(-4)" not in obs
    # Hard-coding the shown assert passes it, and no more.
    obs, reward, terminated, _, info = env.step(_fence("def sq(x):\n    return 4\n"))
    assert (reward, terminated, info["passed"]) == (0.0, False, 1)
    assert "hidden test failed" in obs and "sq(3)" not in obs and "9" not in obs


@pytest.mark.parametrize(
    ("task", "message"),
    [
        ({**ADD, "public_tests": 3}, "public_tests (how many of the first tests the model may see) must be an int"),
        ({**ADD, "public_tests": True}, "must be an int from 0 to 2, got True"),
        (
            {"id": "m", "text": "t", "test_list": ["assert f(1) == 1"], "public_tests": 0},
            "an MBPP prompt shows at least one assert",
        ),
    ],
)
def test_bad_public_tests_name_the_field(task, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        normalize_task(task)


def test_unknown_feedback_mode_names_the_choices():
    with pytest.raises(ValueError, match=re.escape("CodeEnv feedback must be one of ('public', 'full')")):
        CodeEnv(feedback="all")


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


def _compressed(cases: list[dict]) -> str:
    """LiveCodeBench's private_test_cases form: base64 of zlib of a pickle of JSON text."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch /tmp/rllm-gym-pwned",))


def test_livecodebench_private_cases_are_graded_and_stay_hidden():
    row = {
        "question_content": "Print the input doubled.",
        "public_test_cases": json.dumps([{"input": "2\n", "output": "4\n", "testtype": "stdin"}]),
        "private_test_cases": _compressed([{"input": "21\n", "output": "42\n", "testtype": "stdin"}]),
        "metadata": "{}",
    }
    task = normalize_task(row)
    assert task["public_tests"] == 1 and len(task["tests"]) == 2
    grader = CodeReward()
    assert grader(task, _fence("print(4)\n")).reward == 0.0  # the example from the statement is not enough
    assert grader(task, _fence("print(2 * int(input()))\n")).reward == 1.0
    env = CodeEnv(max_revisions=1)
    env.reset(options={"task": row})
    obs = env.step(_fence("print(4)\n"))[0]
    assert obs.startswith("All 1 public test(s) passed, but a hidden test failed.") and "42" not in obs


def test_a_livecodebench_pickle_that_would_run_code_is_refused(tmp_path):
    hostile = base64.b64encode(zlib.compress(pickle.dumps(_Boom()))).decode()
    row = {"question_content": "x", "public_test_cases": "[]", "private_test_cases": hostile}
    with pytest.raises(ValueError, match=re.escape("private_test_cases is neither JSON nor LiveCodeBench's")):
        normalize_task(row)
    assert not os.path.exists("/tmp/rllm-gym-pwned")


def test_bad_arguments_name_the_field(tmp_path):
    with pytest.raises(ValueError, match=re.escape("CodeEnv max_revisions must be an int >= 0")):
        CodeEnv(max_revisions=-1)
    with pytest.raises(ValueError, match=re.escape("code task #0 needs a problem statement")):
        normalize_task({"tests": [{"input": "", "output": ""}]})
    with pytest.raises(FileNotFoundError, match=re.escape("does not exist: pass a .jsonl or .json file")):
        load_code_tasks(tmp_path / "missing.jsonl")


def test_whose_failure_it_is_says_info_infra_failed():
    """A sandbox that cannot start is the infrastructure's failure (the engine retries, the trainer leaves it out);
    a reply that fails its tests is the model's."""
    from rllm_gym.sandbox import Sandbox

    class BrokenSandbox(Sandbox):
        def start(self) -> None:
            raise RuntimeError("zygote cannot start here")

    task = TASKS[0]
    broken = CodeEnv(tasks=[task], sandbox=BrokenSandbox())
    broken.reset(options={"task": task})
    _, reward, terminated, _, info = broken.step(_fence(task["reference_solution"]))
    assert (reward, terminated, info["graded"], info["infra_failed"]) == (0.0, True, False, True)
    env = CodeEnv(tasks=[task])
    env.reset(options={"task": task})
    _, reward, _, _, info = env.step(_wrong(task))
    assert (reward, info["graded"], info["infra_failed"]) == (0.0, True, False)


def test_a_functional_livecodebench_case_that_is_not_json_names_the_task():
    row = {
        "question_content": "Add two numbers.",
        "public_test_cases": json.dumps([{"input": "1\nnot json", "output": "3", "testtype": "functional"}]),
        "metadata": json.dumps({"func_name": "add"}),
    }
    with pytest.raises(ValueError, match=re.escape("code task #0: a functional LiveCodeBench case needs JSON text")):
        normalize_task(row)
