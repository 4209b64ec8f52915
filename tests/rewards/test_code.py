"""Code grading: code extraction, output comparison, the three test formats, options and sandbox failures."""

from __future__ import annotations

import re

import pytest

from rllm_gym.rewards import RewardFunction
from rllm_gym.rewards.code import (
    CodeReward,
    acode_reward_fn,
    code_reward_fn,
    extract_code,
    outputs_match,
    parse_tests,
    values_match,
)
from rllm_gym.sandbox import Sandbox

ADD_STDIO = {"tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4", "output": "6"}]}
ADD_CODE = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"


def test_extract_code_takes_the_last_fenced_block():
    reply = "First try:\n```python\nprint(1)\n```\nBetter:\n```py\nprint(2)\n```\nDone."
    assert extract_code(reply) == "print(2)\n"
    assert extract_code("```\nx = 1\n```") == "x = 1\n"
    assert extract_code("no code at all") is None
    assert extract_code(None) is None


def test_outputs_match_tolerates_whitespace_and_float_noise():
    assert outputs_match("1 2\n3  \n\n", "1 2 3")
    assert outputs_match("0.3333333\n", "0.33333333333")
    assert not outputs_match("0.34", "0.33")
    assert not outputs_match("1 2", "1 2 3")
    assert not outputs_match("YES", "yes")


def test_stdio_tests_all_pass_and_per_test_results_are_kept():
    result = code_reward_fn(ADD_STDIO, ADD_CODE)
    assert result.reward == 1.0 and result.is_correct is True
    assert result.metadata["passed"] == 2 and [t["passed"] for t in result.metadata["tests"]] == [True, True]
    assert result.metadata["tests"][0]["got"] == "3\n"


def test_wrong_answer_and_fraction():
    wrong = "```python\na, b = map(int, input().split())\nprint(a + b if a == 1 else 0)\n```"
    assert code_reward_fn(ADD_STDIO, wrong).reward == 0.0
    partial = CodeReward(fraction=True)(ADD_STDIO, wrong)
    assert partial.reward == 0.5 and partial.is_correct is False
    assert partial.metadata["tests"][1] == {
        "input": "10 -4",
        "expected": "6",
        "status": "wrong_answer",
        "passed": False,
        "got": "0\n",
    }


def test_stop_on_first_failure_skips_the_rest():
    tests = {"tests": [{"input": str(i), "output": str(i)} for i in range(5)]}
    result = CodeReward(stop_on_first_failure=True)(tests, "```python\nprint(0)\n```")
    assert result.reward == 0.0 and len(result.metadata["tests"]) == 2 and result.metadata["total"] == 5


@pytest.mark.parametrize("sync", [True, False])
def test_one_stop_on_first_failure_default_for_the_reward_and_the_env(sync):
    """Default: stop where the reward is all-or-nothing, run every test for ``fraction``; CodeEnv the same."""
    import asyncio

    from rllm_gym.envs.code import CodeEnv

    stdio = {"tests": [{"input": str(i), "output": str(i)} for i in range(5)]}
    calls = {"fn_name": "f", "tests": {"inputs": [[i] for i in range(5)], "outputs": list(range(5))}}
    for task, reply in ((stdio, "```python\nprint(0)\n```"), (calls, "```python\ndef f(x):\n    return 0\n```")):
        for options, graded in (({}, 2), ({"fraction": True}, 5)):
            grader = CodeReward(**options)
            result = grader(task, reply) if sync else asyncio.run(grader.acall(task, reply))
            assert len(result.metadata["tests"]) == graded and result.metadata["total"] == 5, (task, options)
            assert result.reward == (0.2 if options else 0.0)
            assert CodeEnv(**options).grader.stop == grader.stop == (not options)


class _PeakPairs(Sandbox):
    """Counts paired runs in flight at once, sync (futures) and async."""

    active = peak = 0

    def _enter(self) -> None:
        self.active += 1
        self.peak = max(self.peak, self.active)

    def submit_pair(self, *args, **kwargs):
        self._enter()
        future = super().submit_pair(*args, **kwargs)
        future.add_done_callback(lambda _: setattr(self, "active", self.active - 1))
        return future

    async def arun_pair(self, *args, **kwargs):
        self._enter()
        try:
            return await super().arun_pair(*args, **kwargs)
        finally:
            self.active -= 1


@pytest.mark.parametrize("sync", [True, False])
def test_public_tests_run_before_the_hidden_ones_even_when_all_tests_run(sync):
    import asyncio

    task = {"fn_name": "f", "tests": {"inputs": [[1], [2], [3]], "outputs": [1, 2, 3]}, "public_tests": 1}
    reply = "```python\nimport time\ndef f(x):\n    time.sleep(0.2)\n    return x\n```"
    with _PeakPairs(max_parallel=4) as box:
        grader = CodeReward(fraction=True, sandbox=box)  # every test runs: nothing to stop the hidden slice
        result = grader(task, reply) if sync else asyncio.run(grader.acall(task, reply))
        assert result.reward == 1.0 and result.metadata["passed"] == 3
        assert box.peak == 1  # the public slice's paired run ended before the hidden one started


def test_function_call_tests_taco_style_and_solution_class():
    task = {"fn_name": "add", "tests": {"inputs": [[1, 2], [0.1, 0.2]], "outputs": [[3], 0.3]}}
    assert code_reward_fn(task, "```python\ndef add(a, b):\n    return a + b\n```").reward == 1.0
    leetcode = "```python\nclass Solution:\n    def add(self, a, b):\n        return a + b\n```"
    assert code_reward_fn(task, leetcode).reward == 1.0
    bad = code_reward_fn(task, "```python\ndef add(a, b):\n    return a - b\n```")
    assert bad.reward == 0.0 and bad.metadata["tests"][0]["got"] == "-1"


def test_assert_tests_mbpp_and_humaneval():
    mbpp = {"test_list": ["assert sq(2) == 4", "assert sq(3) == 9"]}
    assert code_reward_fn(mbpp, "```python\ndef sq(x):\n    return x * x\n```").reward == 1.0
    result = CodeReward(fraction=True)(mbpp, "```python\ndef sq(x):\n    return 4\n```")
    assert result.reward == 0.5 and result.metadata["tests"][1]["error"].startswith("AssertionError")
    humaneval = {"test": "def check(candidate):\n    assert candidate([1, 2]) == 3\n", "entry_point": "total"}
    assert code_reward_fn(humaneval, "```python\ndef total(xs):\n    return sum(xs)\n```").reward == 1.0
    assert code_reward_fn(humaneval, "```python\ndef total(xs):\n    return 0\n```").reward == 0.0


def test_mbpp_test_imports_reach_the_asserts_and_the_solution():
    """MBPP runs ``test_imports`` before the solution and its asserts: an assert may call ``math.isclose`` and a
    solution may use ``math`` it never imported (as MBPP's own harness lets it)."""
    mbpp = {
        "test_list": [
            "assert math.isclose(area(1), 3.141592653589793)",
            "assert math.isclose(area(2), 12.566370614359172)",
        ],
        "test_imports": ["import math"],
    }
    assert code_reward_fn(mbpp, "```python\nimport math\ndef area(r):\n    return math.pi * r * r\n```").reward == 1.0
    assert code_reward_fn(mbpp, "```python\ndef area(r):\n    return math.pi * r * r\n```").reward == 1.0
    assert code_reward_fn(mbpp, "```python\ndef area(r):\n    return 3.14 * r * r\n```").reward == 0.0
    assert (
        code_reward_fn(
            {**mbpp, "test_imports": "from math import isclose"}, "```python\ndef area(r):\n    return 1\n```"
        ).reward
        == 0.0
    )
    with pytest.raises(
        ValueError, match=re.escape("task['test_imports'] must hold import statements only, got 'x = 1'")
    ):
        code_reward_fn({**mbpp, "test_imports": ["x = 1"]}, "```python\ndef area(r):\n    return 1\n```")
    with pytest.raises(ValueError, match=re.escape("task['test_imports'] must be a list of import statements")):
        code_reward_fn({**mbpp, "test_imports": [3]}, "```python\ndef area(r):\n    return 1\n```")


def test_crashing_and_looping_code_fails_its_tests():
    crash = code_reward_fn(ADD_STDIO, "```python\nraise SystemExit(2)\n```")
    assert crash.reward == 0.0 and crash.metadata["tests"][0]["status"] == "runtime_error"
    loop = CodeReward(timeout=0.5)(ADD_STDIO, "```python\nwhile True:\n    pass\n```")
    assert loop.reward == 0.0 and loop.metadata["tests"][0]["status"] == "timeout"


def test_reply_without_code_is_wrong_but_graded():
    result = code_reward_fn(ADD_STDIO, "The answer is 3.")
    assert result.reward == 0.0 and result.is_correct is False and result.metadata["graded"] is True
    assert "no fenced code block" in result.metadata["error"]


def test_sandbox_failure_is_not_scored_as_wrong():
    class BrokenSandbox(Sandbox):
        def start(self) -> None:
            raise RuntimeError("zygote cannot start here")

    result = CodeReward(sandbox=BrokenSandbox())(ADD_STDIO, ADD_CODE)
    assert result.is_correct is None and result.metadata["graded"] is False
    assert result.metadata["error"] == "sandbox_error: zygote cannot start here"


async def test_async_grading_matches_sync():
    result = await acode_reward_fn(ADD_STDIO, ADD_CODE, fraction=True)
    assert result.reward == 1.0 and result.is_correct is True


def test_bad_tasks_name_the_field():
    with pytest.raises(ValueError, match=re.escape("a code task needs tests: 'tests'")):
        parse_tests({"prompt": "x"})
    with pytest.raises(ValueError, match=re.escape("task['test_list'] must be a non-empty list of assert statements")):
        parse_tests({"test_list": []})
    with pytest.raises(ValueError, match=re.escape("stdin/stdout tests need string 'input' and 'output'")):
        parse_tests({"tests": [{"input": [1], "output": 2}]})
    with pytest.raises(ValueError, match=re.escape("task['tests'] is a string but not JSON (Expecting property name")):
        parse_tests({"tests": '{"inputs": [1], outputs: [2]}'})


def test_code_reward_fn_is_a_reward_function():
    assert isinstance(code_reward_fn, RewardFunction) and isinstance(CodeReward(), RewardFunction)


def test_comparison_is_strict_where_the_expected_value_is_exact():
    assert not outputs_match("1000001", "1000000") and not outputs_match("1000000.0", "1000000")
    assert outputs_match("0.3333333", "0.33333333333") and outputs_match("1e3", "1000.0")
    assert not outputs_match("1e-5", "2e-5") and outputs_match("nan", "nan")
    assert not values_match(True, 1) and not values_match(1, True) and not values_match(1.0, 1)
    assert values_match(1, 1.0) and values_match(0.30000000000000004, 0.3) and not values_match(0.31, 0.3)
    assert not values_match(b"x", "x") and values_match((1, [2]), [1, [2]]) and not values_match([1, 2], [1, 2, 3])
    assert not values_match({1: 2}, {"1": 2}) and values_match({"a": 0.1 + 0.2}, {"a": 0.3})
    assert values_match(0.5 + 1e-8, 0.5, tol=1e-6) and not values_match(0.5 + 1e-4, 0.5, tol=1e-6)


@pytest.mark.parametrize(
    ("got", "expected"),
    [
        ({(True, 2): "a"}, {(1, 2): "a"}),
        ({(1, 2): "a"}, {(True, 2): "a"}),
        ({frozenset({True}): 0}, {frozenset({1}): 0}),
        ({(1, (2, False)): 0}, {(1, (2, 0)): 0}),
        ({(1, 2)}, {(True, 2)}),
        ({frozenset({(1.0, 2)})}, {frozenset({(1, 2)})}),
        (frozenset({(0, "x")}), frozenset({(False, "x")})),
        ([{(True,): 1}], [{(1,): 1}]),
    ],
)
def test_true_is_not_one_at_any_depth_of_keys_and_members(got, expected):
    assert not values_match(got, expected)
    assert values_match(expected, expected) and values_match(got, got)


def test_float_tolerance_is_a_task_option():
    task = {"tests": [{"input": "", "output": "0.5\n"}]}
    reply = "```python\nprint(0.50001)\n```"
    assert code_reward_fn(task, reply).reward == 0.0
    assert code_reward_fn({**task, "float_tolerance": 1e-3}, reply).reward == 1.0
    assert CodeReward(float_tolerance=1e-3)(task, reply).reward == 1.0
    with pytest.raises(ValueError, match=re.escape("task['float_tolerance'] must be a number in [0, 1)")):
        code_reward_fn({**task, "float_tolerance": "loose"}, reply)


def test_function_tests_judge_outside_the_solution_process():
    task = {"fn_name": "answer", "tests": {"inputs": [[1], [2]], "outputs": [10, 20]}}
    forged = (
        "```python\nimport sys\nclass Yes(int):\n    def __eq__(self, other):\n        return True\n"
        "def answer(x):\n    return Yes(0)\n```"
    )
    result = code_reward_fn(task, forged)
    assert result.reward == 0.0 and result.metadata["tests"][0]["status"] == "not_plain_data"
    printer = (
        "```python\nimport json, os\nfor i in range(2):\n"
        "    print('@@rllm-test-' + json.dumps({'index': i, 'status': 'ok', 'got': 10 * (i + 1)}))\nos._exit(0)\n```"
    )
    assert code_reward_fn(task, printer).reward == 0.0
    honest = "```python\ndef answer(x):\n    return 10 * x\n```"
    assert code_reward_fn(task, honest).reward == 1.0


@pytest.mark.parametrize(
    ("task", "error"),
    [
        (  # the test passes what cannot cross to the solution's process: a lambda
            {"test": "def check(candidate):\n    assert candidate(lambda x: x + 1, 2) == 3\n", "entry_point": "apply"},
            "the test passes an argument that is not plain data: a builtins.function is not plain data",
        ),
        (  # MBPP's setup fails before any call to the solution
            {"test_list": ["assert apply(abs, 2) == 2"], "test_setup_code": "import no_such_module_here"},
            "the tests' setup failed: ModuleNotFoundError: No module named 'no_such_module_here'",
        ),
        (  # an assert that needs an import the task forgot: it fails before it calls the solution
            {"test_list": ["assert math.isclose(apply(abs, -2), 2)"]},
            "the test failed without calling the solution: AttributeError: 'function' object has no attribute",
        ),
    ],
    ids=["lambda_argument", "setup_fails", "missing_import"],
)
def test_a_task_whose_tests_cannot_run_is_not_graded(task, error):
    """Every reply, right or wrong, would score 0: the task's fault, not the reply's, so it is not graded."""
    right = "```python\ndef apply(f, x):\n    return f(x)\n```"
    for reply in (right, "```python\ndef apply(f, x):\n    return 0\n```"):
        result = CodeReward(timeout=2.0)(task, reply)
        meta = result.metadata
        assert result.is_correct is None and meta["graded"] is False and meta["tests"] == [], meta
        assert meta["error"].startswith("harness_error: ") and error in meta["error"], meta


def test_a_setup_that_calls_the_solution_fails_by_the_solutions_doing():
    task = {"test_list": ["assert VALUE == 4"], "test_setup_code": "VALUE = double(2)"}
    assert code_reward_fn(task, "```python\ndef double(x):\n    return 2 * x\n```").reward == 1.0
    result = code_reward_fn(task, "```python\ndef double(x):\n    raise ValueError('no')\n```")
    assert result.is_correct is False and result.metadata["graded"] is True
    assert result.metadata["tests"][0]["status"] == "runtime_error"


def test_test_code_that_is_not_python_names_the_field():
    with pytest.raises(ValueError, match=re.escape("task['test_list'][1] is not valid Python ('(' was never closed")):
        parse_tests({"test_list": ["assert f(1) == 2", "assert f(1 == 2"]})
    with pytest.raises(ValueError, match=re.escape("task['test_setup_code'] is not valid Python")):
        parse_tests({"test_list": ["assert f(1) == 2"], "test_setup_code": "x = = 1"})
    with pytest.raises(ValueError, match=re.escape("task['test'] is not valid Python (invalid syntax at line 2)")):
        parse_tests({"test": "def check(candidate):\n    assert candidate(1) = 2\n", "entry_point": "f"})
    with pytest.raises(ValueError, match=re.escape("task['entry_point'] must be a Python name")):
        parse_tests({"test": "def check(candidate):\n    pass\n", "entry_point": "f(1)"})
    with pytest.raises(ValueError, match=re.escape("task['fn_name'] must be a Python name such as 'twoSum'")):
        parse_tests({"fn_name": "Solution.twoSum", "tests": {"inputs": [[1]], "outputs": [1]}})


def test_complex_numbers_cross_as_plain_data():
    """MBPP's cmath tasks pass and return complex numbers: they cross exactly, and compare by value."""
    mbpp = {
        "test_list": [
            "assert angle_complex(0, 1j) == 1.5707963267948966",
            "assert polar_rect(3, 4) == ((5.0, 0.9272952180016122), (-2+2.4492935982947064e-16j))",
        ]
    }
    right = (
        "import cmath\n"
        "def angle_complex(a, b):\n    return cmath.phase(a + b)\n"
        "def polar_rect(x, y):\n    return cmath.polar(complex(x, y)), cmath.rect(2, cmath.pi)\n"
    )
    assert code_reward_fn(mbpp, f"```python\n{right}```").reward == 1.0
    wrong = right.replace("cmath.rect(2, cmath.pi)", "cmath.rect(2, 0)")
    assert CodeReward(fraction=True)(mbpp, f"```python\n{wrong}```").reward == 0.5
    call = {"fn_name": "root", "tests": [{"input": [-4], "output": 2j}]}
    assert code_reward_fn(call, "```python\ndef root(x):\n    return x ** 0.5\n```").reward == 1.0
    assert code_reward_fn(call, "```python\ndef root(x):\n    return 2\n```").reward == 0.0
    assert values_match(2j, 2j) and values_match(1 + 0j, 1.0) is False and values_match(1, 1 + 0j)


def test_large_return_values_over_many_tests_are_all_reported():
    """Each call test's report may hold half a megabyte: four of them exceed the sandbox's default output cap of
    1 MiB, which cut the later tests' reports and failed a correct solution as ``output_limit``."""
    size = 60_000
    task = {"fn_name": "upto", "tests": {"inputs": [[size + i] for i in range(4)], "outputs": []}}
    task["tests"]["outputs"] = [list(range(size + i)) for i in range(4)]
    result = CodeReward(timeout=2.0, fraction=True)(task, "```python\ndef upto(n):\n    return list(range(n))\n```")
    assert [record["status"] for record in result.metadata["tests"]] == ["ok"] * 4
    assert result.reward == 1.0 and result.is_correct is True


@pytest.mark.parametrize(
    "opening",
    ["from __future__ import annotations\n", '"""Area of a circle."""\r\nfrom __future__ import annotations\r\n'],
    ids=["future_import", "docstring_and_future_import"],
)
def test_mbpp_test_imports_go_after_the_replys_future_imports(opening):
    """MBPP's ``test_imports`` run before the solution: put above its ``from __future__`` import, they made a
    correct reply a SyntaxError."""
    mbpp = {"test_list": ["assert area(1) == math.pi"], "test_imports": ["import math"]}
    reply = f"```python\n{opening}def area(r: float) -> float:\n    return math.pi * r * r\n```"
    result = code_reward_fn(mbpp, reply)
    assert result.reward == 1.0, result.metadata["tests"]


_MAIN_BLOCKS = {
    "own_unittest_main": (
        "import unittest\n"
        "class T(unittest.TestCase):\n    def test(self):\n        self.assertEqual(double(2), 4)\n"
        "if __name__ == '__main__':\n    unittest.main()\n"
    ),
    "demo_reading_stdin": "if __name__ == '__main__':\n    print(double(int(input())))\n",
    "sys_exit_main": "import sys\ndef main():\n    return 0\nif __name__ == '__main__':\n    sys.exit(main())\n",
}


@pytest.mark.parametrize("block", list(_MAIN_BLOCKS))
@pytest.mark.parametrize(
    "task",
    [
        {"test_list": ["assert double(2) == 4", "assert double(-7) == -14"]},
        {"test": "def check(candidate):\n    assert candidate(2) == 4\n", "entry_point": "double"},
        {"fn_name": "double", "tests": {"inputs": [[2], [-7]], "outputs": [4, -14]}},
    ],
    ids=["mbpp", "humaneval", "call"],
)
def test_a_main_block_does_not_run_in_function_tests(task, block):
    """As in the data sets' own harnesses, which import the solution: a reply's ``if __name__ == "__main__":``
    block (its own tests, a demo reading stdin) ended the process before it answered a call."""
    reply = f"```python\ndef double(x):\n    return 2 * x\n{_MAIN_BLOCKS[block]}```"
    result = CodeReward(timeout=2.0)(task, reply)
    assert result.reward == 1.0, result.metadata["tests"]


def test_a_main_block_still_runs_in_stdin_stdout_tests():
    reply = "```python\ndef main():\n    print(2 * int(input()))\nif __name__ == '__main__':\n    main()\n```"
    assert code_reward_fn({"tests": [{"input": "2\n", "output": "4\n"}]}, reply).reward == 1.0


def test_a_correct_program_with_more_than_a_mebibyte_of_output_passes():
    """The expected output is 1.6 MB: the sandbox's default cap of 1 MiB cut the correct program as ``output_limit``.
    Flooding still fails: the cap is twice the expected output."""
    count = 200_000
    task = {"tests": [{"input": f"{count}\n", "output": "\n".join(str(10**6 + i) for i in range(count)) + "\n"}]}
    right = "```python\nn = int(input())\nprint('\\n'.join(str(10**6 + i) for i in range(n)))\n```"
    result = CodeReward(timeout=5.0)(task, right)
    assert result.reward == 1.0, [(t["status"], t.get("error")) for t in result.metadata["tests"]]
    flood = "```python\nimport sys\nwhile True:\n    sys.stdout.write('1000000\\n' * 10000)\n```"
    result = CodeReward(timeout=5.0)(task, flood)
    assert result.reward == 0.0 and result.metadata["tests"][0]["status"] == "output_limit"


def test_an_argument_larger_than_a_call_may_carry_is_not_graded():
    """The solution's side refuses a request over the channel's 16 MiB frame and ends: a correct solution was failed
    as ``runtime_error`` for the size of the task's own input."""
    task = {"fn_name": "size", "tests": {"inputs": [["x" * (17 << 20)]], "outputs": [17 << 20]}}
    result = CodeReward(timeout=5.0)(task, "```python\ndef size(text):\n    return len(text)\n```")
    meta = result.metadata
    assert result.is_correct is None and meta["graded"] is False, meta
    assert meta["error"].startswith("harness_error: ") and "more than the 16777216 a call may" in meta["error"]
