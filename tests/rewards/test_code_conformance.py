"""Conformance of code grading: every code task the project ships, and every test format the grader accepts.

For each shipped task the reference solution passes and a do-nothing solution fails; for each format (stdin/stdout
lists, TACO dicts and JSON strings, function calls incl. ``class Solution``, HumanEval ``check``, MBPP asserts with
setup code, LiveCodeBench rows) a reference passes, a wrong and an empty solution fail. Replies are graded
concurrently (``CodeReward.acall`` under ``asyncio.gather``) to keep the run short.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from rllm_gym.envs.code import builtin_code_tasks, normalize_task
from rllm_gym.envs.tool import builtin_tasks as builtin_tool_tasks
from rllm_gym.rewards.code import CodeReward
from rllm_gym.types import RewardOutput

_TEST_KEYS = ("tests", "test_list", "test", "input_output", "public_test_cases")


@pytest.fixture(scope="module")
def grader(strict_sandbox):
    return CodeReward(sandbox=strict_sandbox, timeout=5.0)


def _fence(code: str) -> str:
    return f"```python\n{code}\n```"


def _shipped_tasks() -> list[dict]:
    """The 43 built-in code tasks, and any tool task that carries code tests (none today)."""
    tool_tasks = [normalize_task(t) for t in builtin_tool_tasks() if any(key in t for key in _TEST_KEYS)]
    return builtin_code_tasks() + tool_tasks


async def _grade_all(grader: CodeReward, jobs: list[tuple[dict, str]]) -> list[RewardOutput]:
    results = await asyncio.gather(*(grader.acall(task, _fence(code)) for task, code in jobs))
    for result in results:
        assert result.metadata["graded"] is True, result.metadata  # a sandbox failure is never a verdict here
    return list(results)


def _first_failure(result: RewardOutput) -> dict:
    return next((t for t in result.metadata["tests"] if not t["passed"]), result.metadata)


def test_the_shipped_tasks_are_all_there_with_references():
    tasks = _shipped_tasks()
    assert len(tasks) >= 43 and len({t["id"] for t in tasks}) == len(tasks)
    assert all(isinstance(t.get("reference_solution"), str) and t["reference_solution"].strip() for t in tasks)


async def test_every_shipped_reference_solution_passes(grader):
    tasks = _shipped_tasks()
    results = await _grade_all(grader, [(t, t["reference_solution"]) for t in tasks])
    failing = {t["id"]: _first_failure(r) for t, r in zip(tasks, results, strict=True) if r.reward != 1.0}
    assert not failing, failing
    assert all(r.is_correct is True and r.metadata["passed"] == r.metadata["total"] > 0 for r in results)


def _do_nothing(task: dict) -> list[str]:
    name = task.get("fn_name") or task.get("entry_point")
    replies = ["pass\n", "print()\n", "import sys\nsys.exit(0)\n"]
    if name:
        replies += [
            f"def {name}(*args, **kwargs):\n    pass\n",
            f"class Solution:\n    def {name}(self, *a):\n        pass\n",
        ]
    return replies


async def test_every_shipped_task_fails_a_do_nothing_solution(grader):
    jobs = [(task, reply) for task in _shipped_tasks() for reply in _do_nothing(task)]
    results = await _grade_all(grader, jobs)
    passing = [(task["id"], reply) for (task, reply), r in zip(jobs, results, strict=True) if r.reward != 0.0]
    assert not passing, passing
    assert all(r.is_correct is False for r in results)


# The accepted formats: (task, reference solution, wrong solution)

_HUMANEVAL_ROW = {
    "task_id": "HumanEval/999",
    "prompt": "from typing import List\n\n\ndef below_zero(ops: List[int]) -> bool:\n"
    '    """Whether the balance dips."""\n',
    "canonical_solution": "    balance = 0\n    for op in ops:\n        balance += op\n        if balance < 0:\n"
    "            return True\n    return False\n",
    "test": "METADATA = {'author': 'jt'}\n\n\ndef check(candidate):\n    assert candidate([]) is False\n"
    "    assert candidate([1, 2, -4, 5]) is True\n    assert candidate([1, -1, 2, -2]) is False\n",
    "entry_point": "below_zero",
}
_MBPP_ROW = {
    "task_id": 999,
    "text": "Write a function to find the shared elements of two lists.",
    "code": "def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b)))\n",
    "test_list": [
        "assert similar_elements((3, 4, 5, 6), (5, 7, 4, 10)) == (4, 5)",
        "assert similar_elements((1, 2, 3, 4), (5, 4, 3, 7)) == (3, 4)",
        "assert as_set(similar_elements((11, 12, 14, 13), (17, 15, 14, 13))) == {13, 14}",
    ],
    "test_setup_code": "def as_set(values):\n    return set(values)\n",
}
_LCB_STDIN = {
    "question_title": "sum",
    "question_content": "Print the sum of the numbers on the line.",
    "public_test_cases": json.dumps([{"input": "1 2 3\n", "output": "6\n", "testtype": "stdin"}]),
}
_LCB_FUNCTIONAL = {
    "question_content": "Return the largest element.",
    "public_test_cases": json.dumps(
        [
            {"input": "[3, 1, 2]", "output": "3", "testtype": "functional"},
            {"input": "[-5, -9]", "output": "-5", "testtype": "functional"},
        ]
    ),
    "metadata": {"func_name": "largest"},
}
_BIG = 2**20000  # 6021 digits: past Python's default int/str conversion limit (4300)


def _decimal(value: int) -> str:
    """``value`` in decimal, built without tripping the interpreter's int/str digit limit."""
    chunks = []
    while value:
        value, chunk = divmod(value, 10**1000)
        chunks.append(chunk)
    return str(chunks[-1]) + "".join(f"{chunk:01000d}" for chunk in reversed(chunks[:-1]))


FORMATS = {
    "stdio_list": (
        {"tests": [{"input": "3 4\n", "output": "7\n"}, {"input": "-1 1\n", "output": "0\n"}]},
        "a, b = map(int, input().split())\nprint(a + b)\n",
        "a, b = map(int, input().split())\nprint(a * b)\n",
    ),
    "stdio_taco_dict": (
        {"tests": {"inputs": ["2\nab\ncd\n", "1\nxyz\n"], "outputs": ["ba\ndc\n", "zyx\n"]}},
        "for _ in range(int(input())):\n    print(input()[::-1])\n",
        "for _ in range(int(input())):\n    print(input())\n",
    ),
    "stdio_taco_json_string": (
        {"tests": json.dumps({"inputs": ["5\n", "0\n"], "outputs": ["120\n", "1\n"]})},
        "import math\nprint(math.factorial(int(input())))\n",
        "print(int(input()))\n",
    ),
    "stdio_taco_input_output_row": (
        normalize_task({"question": "Print n squared.", "input_output": {"inputs": ["4\n"], "outputs": ["16\n"]}}),
        "n = int(input())\nprint(n * n)\n",
        "print(4)\nprint(4)\n",
    ),
    "stdio_floats_and_lines": (
        {"tests": [{"input": "1 3\n", "output": "0.333333333\nYES\n"}]},
        "a, b = map(int, input().split())\nprint(f'{a / b:.9f}')\nprint('YES')\n",
        "a, b = map(int, input().split())\nprint(f'{a / b:.2f}')\nprint('YES')\n",
    ),
    "stdio_big_integer": (
        {"tests": [{"input": "20000\n", "output": _decimal(_BIG) + "\n"}]},
        "import sys\nsys.set_int_max_str_digits(0)\nprint(2 ** int(input()))\n",
        "import sys\nsys.set_int_max_str_digits(0)\nprint(2 ** int(input()) + 1)\n",
    ),
    "call_taco_dict": (
        {"fn_name": "add", "tests": {"inputs": [[1, 2], [-3, 3]], "outputs": [3, 0]}},
        "def add(a, b):\n    return a + b\n",
        "def add(a, b):\n    return a - b\n",
    ),
    "call_taco_wrapped_outputs": (
        {"fn_name": "add", "tests": {"inputs": [[1, 2], [0.1, 0.2]], "outputs": [[3], [0.3]]}},
        "def add(a, b):\n    return a + b\n",
        "def add(a, b):\n    return a * b\n",
    ),
    "call_fn_name_in_tests": (
        {"tests": {"fn_name": "head", "inputs": [[[1, 2, 3]], [["x"]]], "outputs": [1, "x"]}},
        "def head(xs):\n    return xs[0]\n",
        "def head(xs):\n    return xs[-1]\n",
    ),
    "call_list_of_dicts": (
        {
            "fn_name": "join",
            "tests": [{"input": [["a", "b"], "-"], "output": "a-b"}, {"input": [[], ","], "output": ""}],
        },
        "def join(parts, sep):\n    return sep.join(parts)\n",
        "def join(parts, sep):\n    return ''.join(parts)\n",
    ),
    "call_class_solution": (
        {"fn_name": "twoSum", "tests": {"inputs": [[[2, 7, 11, 15], 9], [[3, 2, 4], 6]], "outputs": [[0, 1], [1, 2]]}},
        "from typing import List\n\nclass Solution:\n"
        "    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
        "        seen = {}\n        for i, x in enumerate(nums):\n            if target - x in seen:\n"
        "                return [seen[target - x], i]\n            seen[x] = i\n",
        "class Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]\n",
    ),
    "call_nested_containers_and_strings": (
        {
            "fn_name": "group",
            "tests": {
                "inputs": [[["eat", "tea", "tan", "ate"]], [["é", "ü"]]],
                "outputs": [{"aet": ["eat", "tea", "ate"], "ant": ["tan"]}, {"é": ["é"], "ü": ["ü"]}],
            },
        },
        "def group(words):\n    out = {}\n    for w in words:\n"
        "        out.setdefault(''.join(sorted(w)), []).append(w)\n    return out\n",
        "def group(words):\n    return {w: [w] for w in words}\n",
    ),
    "call_big_integer": (
        {"fn_name": "power", "tests": {"inputs": [[2, 20000], [3, 5]], "outputs": [_BIG, 243]}},
        "def power(a, b):\n    return a ** b\n",
        "def power(a, b):\n    return a ** b + 1\n",
    ),
    # JSON has no tuples: a function returning (1, 2) where the data set wrote [1, 2] is right.
    "call_tuple_for_list": (
        {"fn_name": "pair", "tests": {"inputs": [[1, 2]], "outputs": [[1, 2]]}},
        "def pair(a, b):\n    return (a, b)\n",
        "def pair(a, b):\n    return (b, a)\n",
    ),
    "humaneval_check": (
        {
            "test": "import math\n\n\ndef _close(a, b):\n    return math.isclose(a, b)\n\n\ndef check(candidate):\n"
            "    assert _close(candidate([1.0, 2.0, 3.0]), 2.0)\n    assert candidate([5]) == 5\n",
            "entry_point": "mean",
        },
        "import statistics\n\ndef mean(xs):\n    return statistics.mean(xs)\n",
        "def mean(xs):\n    return xs[0]\n",
    ),
    "humaneval_row": (
        normalize_task(_HUMANEVAL_ROW),
        normalize_task(_HUMANEVAL_ROW)["reference_solution"],
        "def below_zero(ops):\n    return min(ops or [0]) < 0\n",
    ),
    "humaneval_exceptions": (
        {
            "test": "def check(candidate):\n    try:\n        candidate(-1)\n    except ValueError:\n        pass\n"
            "    else:\n        assert False, 'no ValueError'\n    assert candidate(4) == 2\n",
            "entry_point": "root",
        },
        "def root(x):\n    if x < 0:\n        raise ValueError('negative')\n    return int(x ** 0.5)\n",
        "def root(x):\n    return int(abs(x) ** 0.5)\n",
    ),
    "mbpp_test_list_with_setup": (
        {"test_list": _MBPP_ROW["test_list"], "test_setup_code": _MBPP_ROW["test_setup_code"]},
        _MBPP_ROW["code"],
        "def similar_elements(a, b):\n    return tuple(sorted(set(a) | set(b)))\n",
    ),
    "mbpp_row": (
        normalize_task(_MBPP_ROW),
        _MBPP_ROW["code"],
        "def similar_elements(a, b):\n    return ()\n",
    ),
    "livecodebench_stdin": (
        normalize_task(_LCB_STDIN),
        "print(sum(map(int, input().split())))\n",
        "print(max(map(int, input().split())))\n",
    ),
    "livecodebench_functional": (
        normalize_task(_LCB_FUNCTIONAL),
        "class Solution:\n    def largest(self, nums):\n        return max(nums)\n",
        "class Solution:\n    def largest(self, nums):\n        return min(nums)\n",
    ),
}


def _entry(task: dict) -> str | None:
    tests = task.get("tests")
    return (
        task.get("fn_name") or (tests.get("fn_name") if isinstance(tests, dict) else None) or task.get("entry_point")
    )


@pytest.mark.parametrize("fmt", list(FORMATS))
async def test_each_accepted_format_passes_its_reference_and_fails_the_rest(grader, fmt):
    task, reference, wrong = FORMATS[fmt]
    name = _entry(task)
    empty = f"def {name}(*args):\n    return None\n" if name else "pass\n"
    good, bad, nothing = await _grade_all(grader, [(task, reference), (task, wrong), (task, empty)])
    assert good.reward == 1.0 and good.is_correct is True, _first_failure(good)
    assert bad.reward == 0.0 and bad.is_correct is False, bad.metadata
    assert nothing.reward == 0.0 and nothing.is_correct is False, nothing.metadata
    assert good.metadata["total"] == bad.metadata["total"] == nothing.metadata["total"] > 0
    assert all(t["status"] == "ok" for t in good.metadata["tests"]), good.metadata["tests"]


async def test_fraction_counts_each_assert_and_each_call(grader):
    fraction = CodeReward(fraction=True, sandbox=grader.sandbox)
    mbpp = {"test_list": ["assert sq(2) == 4", "assert sq(3) == 9", "assert sq(4) == 16", "assert sq(0) == 0"]}
    calls = {"fn_name": "sq", "tests": {"inputs": [[2], [3], [4], [0]], "outputs": [4, 9, 16, 0]}}
    half = "def sq(x):\n    return x * x if x % 2 == 0 else 0\n"
    results = await asyncio.gather(fraction.acall(mbpp, _fence(half)), fraction.acall(calls, _fence(half)))
    for result in results:
        assert result.reward == 0.75 and result.metadata["passed"] == 3 and result.metadata["total"] == 4
        assert [t["passed"] for t in result.metadata["tests"]] == [True, False, True, True]
