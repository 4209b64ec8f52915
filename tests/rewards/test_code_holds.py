"""Code grading against the next attacker (issue 29): one hostile reply per weakness, beside honest replies that pass.

1. the task's helpers stay the task's (HumanEval/32 ``poly``, /38 ``encode_cyclic``);
2. an exception the solution raises cannot steer the test code (``StopIteration`` ending ``all(map(f, xs))``);
3. feedback on a public test carries nothing from the hidden tests;
4. the observation says "failed" for every hidden failure mode;
5. any value, any text gets a per-test verdict (big ints against floats, nested big ints, lone surrogates).
"""

from __future__ import annotations

import json

import pytest

from rllm_gym.envs.code import CodeEnv
from rllm_gym.rewards.code import CodeReward
from rllm_gym.sandbox import ExecutionStatus
from rllm_gym.types import RewardOutput

# What a graded test may end as: how its run ended (never the sandbox's own failure) or how its answer compared.
STATUSES = {status.value for status in ExecutionStatus} - {"sandbox_error"} | {"wrong_answer", "not_plain_data"}


@pytest.fixture(scope="module")
def grader(strict_sandbox):
    return CodeReward(sandbox=strict_sandbox, timeout=2.0)


def _fence(code: str) -> str:
    return f"My solution:\n```python\n{code}\n```\n"


def _grade(grader: CodeReward, task: dict, code: str) -> RewardOutput:
    """Grade ``code`` and check the verdict: graded, known statuses, bool ``passed``, loggable as UTF-8."""
    result = grader(task, _fence(code))
    meta = result.metadata
    statuses = {record["status"] for record in meta["tests"]}
    assert meta["graded"] is True and result.is_correct in (True, False) and statuses <= STATUSES, meta
    assert all(type(record["passed"]) is bool for record in meta["tests"]), meta
    json.dumps(meta, ensure_ascii=False).encode("utf-8")  # no lone surrogate in the record
    return result


# 1. The task's code stays the task's

POLY_PROMPT = '''import math


def poly(xs: list, x: float):
    """Evaluates the polynomial with coefficients xs at x."""
    return sum([coeff * math.pow(x, i) for i, coeff in enumerate(xs)])


def find_zero(xs: list):
    """xs are the coefficients of a polynomial of even degree whose largest coefficient is non-zero: return one zero.
    """
'''
POLY_TEST = """

METADATA = {}


def check(candidate):
    import math
    import random
    rng = random.Random(42)
    import copy
    for _ in range(30):
        ncoeff = 2 * rng.randint(1, 4)
        coeffs = []
        for _ in range(ncoeff):
            coeff = rng.randint(-10, 10)
            if coeff == 0:
                coeff = 1
            coeffs.append(coeff)
        solution = candidate(copy.deepcopy(coeffs))
        assert math.fabs(poly(coeffs, solution)) < 1e-4
"""
POLY_TASK = {"prompt": POLY_PROMPT, "test": POLY_TEST, "entry_point": "find_zero"}
POLY_BODY = """
    begin, end = -1.0, 1.0
    while poly(xs, begin) * poly(xs, end) > 0:
        begin *= 2.0
        end *= 2.0
    while end - begin > 1e-10:
        center = (begin + end) / 2.0
        if poly(xs, center) * poly(xs, begin) > 0:
            begin = center
        else:
            end = center
    return begin
"""

CYCLIC_PROMPT = '''

def encode_cyclic(s: str):
    """Returns the string encoded by cycling groups of three characters."""
    groups = [s[(3 * i):min((3 * i + 3), len(s))] for i in range((len(s) + 2) // 3)]
    groups = [(group[1:] + group[0]) if len(group) == 3 else group for group in groups]
    return "".join(groups)


def decode_cyclic(s: str):
    """Takes a string encoded with encode_cyclic and returns the decoded string."""
'''
CYCLIC_TEST = """

METADATA = {}


def check(candidate):
    from random import randint, choice
    import string

    letters = string.ascii_lowercase
    for _ in range(30):
        str = ''.join(choice(letters) for i in range(randint(10, 20)))
        encoded_str = encode_cyclic(str)
        assert candidate(encoded_str) == str
"""
CYCLIC_TASK = {"prompt": CYCLIC_PROMPT, "test": CYCLIC_TEST, "entry_point": "decode_cyclic"}
CYCLIC_HONEST = "def decode_cyclic(s: str):\n    return encode_cyclic(encode_cyclic(s))\n"

# An MBPP task whose setup defines a helper and a constant the asserts use.
SETUP_TASK = {
    "test_setup_code": "LIMIT = 3\ndef reference(x):\n    return [i * i for i in range(x)]\n",
    "test_list": [f"assert squares({n}) == reference({n})[:LIMIT]" for n in (2, 5, 7)],
}


@pytest.mark.parametrize(
    ("task", "hostile"),
    [
        (POLY_TASK, "def poly(xs, x):\n    return 0.0\n\ndef find_zero(xs):\n    return 0.0\n"),
        (POLY_TASK, "import math\nmath.fabs = lambda x: 0.0\ndef find_zero(xs):\n    return 0.0\n"),
        (CYCLIC_TASK, "def encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n"),
        (SETUP_TASK, "def reference(x):\n    return 0\n\nLIMIT = 0\n\ndef squares(x):\n    return 0\n"),
    ],
    ids=["poly", "poly-patched-math", "encode_cyclic", "mbpp-setup"],
)
def test_a_solution_cannot_replace_the_tasks_helpers(grader, task, hostile):
    result = _grade(grader, task, hostile)
    assert result.reward == 0.0 and result.is_correct is False, result.metadata


@pytest.mark.parametrize(
    ("task", "honest"),
    [
        (POLY_TASK, POLY_PROMPT + POLY_BODY),  # the prompt repeated, then the body: its own poly is the task's copy
        (POLY_TASK, "def find_zero(xs):" + POLY_BODY),  # calls the task's poly without defining it
        (CYCLIC_TASK, CYCLIC_PROMPT + "    return encode_cyclic(encode_cyclic(s))\n"),
        (CYCLIC_TASK, CYCLIC_HONEST),
        (SETUP_TASK, "def squares(x):\n    return [i * i for i in range(min(x, 3))]\n"),
    ],
    ids=["poly-with-prompt", "poly-calls-task-helper", "cyclic-with-prompt", "cyclic-calls-task-helper", "mbpp"],
)
def test_honest_solutions_still_pass_and_may_call_the_tasks_helpers(grader, task, honest):
    result = _grade(grader, task, honest)
    assert result.reward == 1.0 and result.is_correct is True, result.metadata


# 2. The solution's exceptions cannot steer the test code

EVEN_TASKS = {
    "humaneval": {
        "prompt": "def is_even(x):\n    '''Whether x is even.'''\n",
        "test": "def check(candidate):\n"
        "    assert all(map(candidate, [2, 4, 6]))\n"
        "    assert not any(map(candidate, [1, 3, 5]))\n",
        "entry_point": "is_even",
    },
    "mbpp": {"test_list": ["assert all(map(is_even, [2, 4, 6]))", "assert not any(map(is_even, [1, 3]))"]},
    "mbpp-comprehension": {"test_list": ["assert [is_even(x) for x in [2, 3]] == [True, False]"]},
    # A test that expects an exception: only the exception it names may pass it.
    "raises": {
        "test": "def check(candidate):\n"
        "    assert candidate(2) is True\n"
        "    try:\n"
        "        candidate(-1)\n"
        "    except ValueError:\n"
        "        pass\n"
        "    else:\n"
        "        raise AssertionError('no ValueError for a negative number')\n",
        "entry_point": "is_even",
    },
}
RAISES = {
    "StopIteration": "raise StopIteration",
    "StopAsyncIteration": "raise StopAsyncIteration",
    "GeneratorExit": "raise GeneratorExit",
    "SystemExit": "raise SystemExit(0)",
    "KeyboardInterrupt": "raise KeyboardInterrupt",
    "BaseException": "raise BaseException('base')",
    "fake-StopIteration": "class StopIteration(Exception):\n        pass\n    raise StopIteration",
    "fake-ValueError-base": "class ValueError(BaseException):\n        pass\n    raise ValueError",
    "odd-str": "class E(Exception):\n        def __str__(self):\n            raise E()\n    raise E()",
    "odd-metaclass": (
        "class M(type):\n"
        "        __mro__ = property(lambda cls: 1 / 0)\n"
        "        __name__ = property(lambda cls: 1 / 0)\n"
        "    class E(Exception, metaclass=M):\n"
        "        pass\n"
        "    raise E()"
    ),
    "odd-eq-repr-del": (
        "class E(Exception):\n"
        "        __eq__ = lambda self, other: True\n"
        "        __hash__ = lambda self: 0\n"
        "        __repr__ = lambda self: 'x' * 10**7\n"
        "        __str__ = lambda self: 'y' * 10**7\n"
        "        __del__ = lambda self: print('ok')\n"
        "    raise E()"
    ),
}


@pytest.mark.parametrize("raised", list(RAISES))
@pytest.mark.parametrize("fmt", list(EVEN_TASKS))
def test_an_exception_from_the_solution_fails_the_test_whatever_the_test_code_does_with_it(grader, fmt, raised):
    hostile = f"def is_even(x):\n    {RAISES[raised]}\n"
    result = _grade(grader, EVEN_TASKS[fmt], hostile)
    assert result.reward == 0.0 and result.is_correct is False, result.metadata
    failing = next(r for r in result.metadata["tests"] if not r["passed"])
    assert failing["status"] == "runtime_error" and failing["error"], failing


@pytest.mark.parametrize("base", ["Exception", "BaseException", "ArithmeticError"])
def test_a_class_that_borrows_a_builtins_name_is_not_that_builtin(grader, base):
    hostile = (
        f"class ValueError({base}):\n    pass\n\n"
        "def is_even(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x % 2 == 0\n"
    )
    result = _grade(grader, EVEN_TASKS["raises"], hostile)
    assert result.reward == 0.0, result.metadata
    assert result.metadata["tests"][0]["status"] == "runtime_error" and result.metadata["tests"][0]["error"]


EXPECTS = {
    "ValueError": "except ValueError:",
    "Exception": "except Exception:",
    "LookupError": "except LookupError:",
}
SUBCLASSES = {
    "ValueError": [
        "raise UnicodeDecodeError('utf-8', b'\\xff', 0, 1, 'invalid start byte')",
        "import json\n    json.loads('{')",
        "class Negative(ValueError):\n        pass\n    raise Negative(x)",
    ],
    "Exception": ["class Negative(Exception):\n        pass\n    raise Negative(x)", "raise KeyError(x)"],
    "LookupError": ["raise KeyError(x)", "class Missing(IndexError):\n        pass\n    raise Missing(x)"],
}


@pytest.mark.parametrize(
    ("base", "raising"), [(base, raising) for base, raisings in SUBCLASSES.items() for raising in raisings]
)
def test_an_exception_that_subclasses_the_expected_one_passes(grader, base, raising):
    task = {
        **EVEN_TASKS["raises"],
        "test": EVEN_TASKS["raises"]["test"].replace("except ValueError:", EXPECTS[base]),
    }
    body = raising.replace("\n", "\n    ")
    solution = f"def is_even(x):\n    if x < 0:\n        {body}\n    return x % 2 == 0\n"
    result = _grade(grader, task, solution)
    assert result.reward == 1.0, (solution, result.metadata)


@pytest.mark.parametrize("fmt", list(EVEN_TASKS))
def test_an_honest_predicate_still_passes(grader, fmt):
    honest = "def is_even(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x % 2 == 0\n"
    result = _grade(grader, EVEN_TASKS[fmt], honest)
    assert result.reward == 1.0, result.metadata


def test_a_caught_exception_of_the_solution_still_fails_the_test(grader):
    """A test that swallows every exception cannot turn a failing call into a pass."""
    task = {
        "test": "def check(candidate):\n"
        "    for x in [2, 4]:\n"
        "        try:\n"
        "            assert candidate(x) is True\n"
        "        except BaseException:\n"
        "            break\n",
        "entry_point": "is_even",
    }
    for body in ("raise KeyboardInterrupt", "raise StopIteration", "import os\n    os._exit(0)", "return object()"):
        result = _grade(grader, task, f"def is_even(x):\n    {body}\n")
        assert result.reward == 0.0, (body, result.metadata)
    assert _grade(grader, task, "def is_even(x):\n    return x % 2 == 0\n").reward == 1.0


# 3. Feedback carries nothing derived from hidden tests

HIDDEN_INPUTS = [987654, 876543, 765432, 654321]
LEAK_TASK = {
    "id": "leak",
    "prompt": "Return x plus one.",
    "fn_name": "inc",
    "tests": {"inputs": [[1], *[[x] for x in HIDDEN_INPUTS]], "outputs": [2, *[x + 1 for x in HIDDEN_INPUTS]]},
    "public_tests": 1,
}
# Each remembers every input it is called with and tries to put the hidden ones into what the public test reports.
LEAKERS = {
    # the public call's report is too big to parse, so it used to be filled in from the solution's stderr
    "huge-public-report": (
        "import sys\nseen = []\n"
        "def inc(x):\n"
        "    seen.append(x)\n"
        "    if len(seen) == 1:\n"
        "        return 'a' * 3_000_000\n"
        "    for _ in range(50):\n"
        "        sys.stderr.write('LEAK ' + repr(seen) + '\\n')\n"
        "    sys.stderr.flush()\n"
        "    return 0\n"
    ),
    # the public call crashes the process late, after a background thread has heard the hidden calls
    "crash-after-hidden": (
        "import os, sys, threading, time\nseen = []\n"
        "def inc(x):\n"
        "    seen.append(x)\n"
        "    sys.stderr.write('LEAK ' + repr(seen) + '\\n')\n"
        "    sys.stderr.flush()\n"
        "    if len(seen) == 1:\n"
        "        return 'a' * 3_000_000\n"
        "    if len(seen) == 5:\n"
        "        os._exit(1)\n"
        "    return 0\n"
    ),
}


@pytest.mark.parametrize("name", list(LEAKERS))
@pytest.mark.parametrize("stop", [True, False])
def test_public_feedback_holds_nothing_from_hidden_inputs(strict_sandbox, name, stop):
    env = CodeEnv([LEAK_TASK], max_revisions=2, sandbox=strict_sandbox, timeout=2.0, stop_on_first_failure=stop)
    env.reset(options={"task": LEAK_TASK})
    observation, reward, terminated, _, info = env.step(_fence(LEAKERS[name]))
    assert reward == 0.0 and not terminated, observation
    for value in HIDDEN_INPUTS:
        for text in (str(value), str(value + 1), f"{value:,}"):
            assert text not in observation, observation
    assert "Input:" in observation  # the public test is quoted: its report, or that it has none
    assert info["tests"][0]["status"] in STATUSES
    env.close()


def test_a_public_test_without_a_report_is_said_to_have_none(strict_sandbox):
    env = CodeEnv([LEAK_TASK], max_revisions=1, sandbox=strict_sandbox, timeout=2.0)
    env.reset(options={"task": LEAK_TASK})
    observation, *_ = env.step(_fence(LEAKERS["huge-public-report"]))
    assert "LEAK" not in observation and "report" in observation, observation


# 4. Hidden statuses are not a channel

SIGNALLERS = {
    "wrong_answer": "return 0",
    "runtime_error": "raise ValueError('x')",
    "timeout": "while True:\n            pass",
    "memory_limit": "x = []\n        while True:\n            x.append(bytearray(64 << 20))",
    "killed": "import os, signal\n        os.kill(os.getpid(), signal.SIGKILL)",
    "not_plain_data": "return object()",
}


def test_every_hidden_failure_reads_the_same(strict_sandbox):
    env = CodeEnv([LEAK_TASK], max_revisions=1, sandbox=strict_sandbox, timeout=1.0, memory_mb=256)
    observations, statuses = set(), set()
    for body in SIGNALLERS.values():
        env.reset(options={"task": LEAK_TASK})
        code = f"def inc(x):\n    if x > 1:\n        {body}\n    return x + 1\n"
        observation, reward, terminated, _, info = env.step(_fence(code))
        assert reward == 0.0 and not terminated
        observations.add(observation)
        statuses.add(next(t["status"] for t in info["tests"] if not t["passed"]))
    assert len(observations) == 1, observations
    assert "hidden test failed" in observations.pop()
    assert len(statuses) >= 4, statuses  # the detail stays in info, for the user
    env.close()


# 5. Any value, any text: a verdict

FLOAT_TASK = {"fn_name": "f", "tests": {"inputs": [[1], [2]], "outputs": [1.5, [[2.5]]]}}
BIG_TASK = {"fn_name": "f", "tests": {"inputs": [[1]], "outputs": [[[1, 2], {"a": [3]}]]}}


@pytest.mark.parametrize(
    ("task", "body"),
    [
        (FLOAT_TASK, "return 10 ** 400"),
        (FLOAT_TASK, "return -(10 ** 5000)"),
        (FLOAT_TASK, "return [[10 ** 400]] if x == 2 else 1.5"),
        (FLOAT_TASK, "return float('nan')"),
        (FLOAT_TASK, "return float('inf')"),
        (BIG_TASK, "return [[10 ** 5000, 2], {'a': [3]}]"),
        (BIG_TASK, "return [[1, 2], {'a': [10 ** 6000]}]"),
        (BIG_TASK, "return [[[[[[10 ** 5000]]]]]] * 1000"),
        (BIG_TASK, "return '\\ud800' * 100"),
        (BIG_TASK, "return {'\\udcff': b'\\xff\\xfe'}"),
        (BIG_TASK, "return 'x' * 5_000_000"),
        (BIG_TASK, "return list(range(400_000))"),
    ],
)
def test_any_returned_value_gets_a_verdict(grader, task, body):
    result = _grade(grader, task, f"def f(x):\n    {body}\n")
    assert result.reward == 0.0
    assert any(
        record["status"] != "ok" and record["error" if "error" in record else "got"]
        for record in result.metadata["tests"]
    )
    assert len(json.dumps(result.metadata)) < 64_000
    json.dumps(result.metadata, ensure_ascii=False).encode("utf-8")  # loggable: no lone surrogate in the record


def test_a_big_int_matches_a_float_only_when_it_is_that_float(grader):
    task = {"fn_name": "f", "tests": {"inputs": [[1]], "outputs": [1e300]}}
    assert _grade(grader, task, "def f(x):\n    return 10 ** 300\n").reward == 1.0
    assert _grade(grader, task, "def f(x):\n    return 10 ** 301\n").reward == 0.0


@pytest.mark.parametrize(
    "reply",
    [
        "def double(x):\n    return 2 * x  # \ud800 a lone surrogate\n",
        "def double(x):\n    s = '\udcff'\n    return 2 * x\n",
    ],
)
def test_a_lone_surrogate_in_the_reply_is_graded_not_an_infrastructure_fault(grader, reply):
    task = {"fn_name": "double", "tests": {"inputs": [[2], [3]], "outputs": [4, 6]}}
    assert _grade(grader, task, reply).reward == 1.0
    stdio = {"tests": [{"input": "2\n", "output": "4\n"}]}
    result = _grade(grader, stdio, "print('\ud800', int(input()) * 2)\n")
    assert result.reward == 0.0 and result.metadata["tests"][0]["status"] == "wrong_answer"


def test_invalid_utf8_and_surrogates_in_the_output_get_a_verdict(grader):
    stdio = {"tests": [{"input": "2\n", "output": "4\n"}]}
    for code in (
        "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe\\xed\\xa0\\x80 4')\n",
        "import sys\nsys.stderr.buffer.write(b'\\xff\\xed\\xa0\\x80')\nraise SystemExit(3)\n",
    ):
        result = _grade(grader, stdio, code)
        assert result.reward == 0.0


def test_env_step_never_raises_for_any_value(strict_sandbox):
    env = CodeEnv([FLOAT_TASK | {"prompt": "f"}], max_revisions=3, sandbox=strict_sandbox, timeout=2.0)
    env.reset(options={"task": FLOAT_TASK | {"prompt": "f"}})
    for body in ("return 10 ** 400", "return [[10 ** 5000]]", "return '\\ud800'"):
        observation, reward, _, _, info = env.step(_fence(f"def f(x):\n    {body}\n"))
        assert reward == 0.0 and info["graded"] is True and isinstance(observation, str)
        observation.encode("utf-8")
    env.close()
