"""Code grading: run the last fenced code block of a reply against a task's tests, inside :mod:`rllm_gym.sandbox`.

Three test formats, the ones the common data sets use, all given in the task dict:

* **stdin/stdout** (APPS, TACO, CodeContests, LiveCodeBench): ``tests=[{"input": "1 2\\n", "output": "3\\n"}, ...]``
  or TACO's ``{"inputs": [...], "outputs": [...]}``. The program's raw output comes back from the sandbox and is
  compared here, token by token (whitespace differences are ignored).
* **function call** (TACO/LeetCode): the same plus ``fn_name``; each input is the argument list, each output the
  return value (TACO's one-element wrapper ``[value]`` is accepted too). A ``class Solution`` method is found as well.
* **assert** (HumanEval, MBPP): ``test`` holding ``def check(candidate)`` plus ``entry_point``, or ``test_list``
  holding assert statements (with optional ``test_setup_code``); each assert is one test.

**The verdict is decided outside the process that runs model code.** Function and assert tests run as a pair
(:meth:`rllm_gym.sandbox.Sandbox.run_pair`): the test code runs in a sandboxed harness process of its own and every
call of the solution's function is forwarded to the solution's sandboxed process, from which only a plain-data return
value comes back (None, bool, int, float, str, bytes and lists, tuples, dicts and sets of those; anything else fails
the test as ``not_plain_data``). Expected values never enter the solution's process: call-test results are compared
here, assert tests in the harness. Nothing the solution prints, returns as an exit code or does at exit counts.

**Strict comparison.** ints, strs and bytes compare exactly, ``bool`` is not an ``int``, and a float tolerance
(``float_tolerance``, relative and absolute, default ``1e-6``; a task may set its own ``float_tolerance``) applies only
where the expected value is a float: in stdin/stdout tests, where the expected token is a float literal (has ``.``,
an exponent, or is ``inf``/``nan``), so an expected ``1000000`` is not matched by ``1000001`` or ``1000000.0``.
Containers compare element-wise by the same rules (a tuple may stand for an expected JSON list). Assert-style tests
keep the data set's own Python comparisons, run in the harness.

Reward: 1.0 when every test passes, else 0.0 (or the fraction passed with ``fraction=True``); per-test results are in
``metadata["tests"]``, each with a ``status``: ``ok``, ``wrong_answer``, ``runtime_error``, ``killed``, ``timeout``,
``memory_limit``, ``output_limit`` or ``not_plain_data``. When the sandbox itself fails (``sandbox_error``, an
infrastructure fault that model code cannot cause) the reply is NOT graded: the result has ``is_correct=None``,
``reward=0.0`` and ``metadata["graded"] = False`` with the error, so trainers can drop or retry the sample instead of
learning from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from rllm_gym.sandbox import ExecutionStatus, PairResult, Sandbox, SandboxResult, _channel, default_sandbox
from rllm_gym.types import RewardOutput

__all__ = [
    "CodeReward",
    "TestCase",
    "acode_reward_fn",
    "code_reward_fn",
    "extract_code",
    "outputs_match",
    "parse_tests",
    "values_match",
]

_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n`]*\n(.*?)```", re.DOTALL)
_INTEGER = re.compile(r"[+-]?\d+\Z")
_QUOTE = 300  # characters of an input/expected/got quoted in the per-test results
DEFAULT_FLOAT_TOLERANCE = 1e-6


def extract_code(text: str) -> str | None:
    """The body of the last fenced code block (```` ```python ... ``` ````) in ``text``, or None when it has none."""
    if not isinstance(text, str):
        return None
    blocks = _FENCE.findall(text)
    return blocks[-1][1] if blocks else None


def _number(token: str) -> float | None:
    try:
        return float(token)
    except ValueError:
        return None


def _is_float_literal(token: str) -> bool:
    return _INTEGER.match(token) is None and _number(token) is not None


def _close(got: float, expected: float, tol: float) -> bool:
    if math.isnan(expected):
        return math.isnan(got)
    return math.isclose(got, expected, rel_tol=tol, abs_tol=tol)


def outputs_match(got: str, expected: str, tol: float = DEFAULT_FLOAT_TOLERANCE) -> bool:
    """Whether printed output matches the expected output, token by token, ignoring whitespace.

    A token must equal the expected one exactly, except where the expected token is a float literal: then any
    number within ``tol`` (relative and absolute) matches.
    """
    got_tokens, expected_tokens = got.split(), expected.split()
    if got_tokens == expected_tokens:
        return True
    if len(got_tokens) != len(expected_tokens):
        return False
    for a, b in zip(got_tokens, expected_tokens, strict=True):
        if a == b:
            continue
        x = _number(a)
        if not _is_float_literal(b) or x is None or not _close(x, float(b), tol):
            return False
    return True


def _typed(items: Any) -> set[tuple[type, Any]]:
    """Keys or members with their exact types: ``{1}`` and ``{True}`` differ."""
    return {(type(item), item) for item in items}


def values_match(got: Any, expected: Any, tol: float = DEFAULT_FLOAT_TOLERANCE) -> bool:
    """Whether a returned plain value equals the expected one under the strict rules of the module docstring."""
    kind = type(expected)
    if kind is bool or type(got) is bool:
        return type(got) is kind and got == expected
    if kind is float:
        return type(got) in (int, float) and _close(float(got), expected, tol)
    if kind in (int, str, bytes, type(None)):
        return type(got) is kind and got == expected
    if kind in (list, tuple):
        return (
            type(got) in (list, tuple)
            and len(got) == len(expected)
            and all(values_match(a, b, tol) for a, b in zip(got, expected, strict=True))
        )
    if kind is dict:
        return (
            type(got) is dict
            and _typed(got) == _typed(expected)
            and all(values_match(got[k], expected[k], tol) for k in expected)
        )
    if kind in (set, frozenset):
        return type(got) in (set, frozenset) and _typed(got) == _typed(expected)
    return False


@dataclass
class TestCase:
    """One test: ``kind`` is ``"stdio"``, ``"call"`` or ``"assert"``; ``input``/``expected`` depend on the kind."""

    __test__ = False  # not a pytest test class

    kind: str
    input: Any = None
    expected: Any = None
    setup: str = ""
    fn_name: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def parse_tests(task_info: dict[str, Any]) -> list[TestCase]:
    """The task's tests in a format of the module docstring; a bad task raises ValueError naming the field."""
    if not isinstance(task_info, dict):
        raise ValueError(f"a code task must be a dict, got {type(task_info).__name__}")
    if "test_list" in task_info:  # MBPP
        asserts = task_info["test_list"]
        if not isinstance(asserts, list) or not asserts or not all(isinstance(a, str) for a in asserts):
            raise ValueError(
                "task['test_list'] must be a non-empty list of assert statements such as ['assert f(1) == 2']"
            )
        setup = "\n".join(str(task_info.get(key) or "") for key in ("test_imports_code", "test_setup_code"))
        return [TestCase("assert", input=a, setup=setup) for a in asserts]
    if "test" in task_info and "entry_point" in task_info:  # HumanEval
        test, entry = task_info["test"], task_info["entry_point"]
        if not isinstance(test, str) or not isinstance(entry, str) or not entry:
            raise ValueError(
                "task['test'] must be the source of `def check(candidate)` and task['entry_point'] a name"
            )
        return [TestCase("assert", input=f"check({entry})", setup=test)]
    tests = task_info.get("tests")
    if tests is None:
        raise ValueError(
            "a code task needs tests: 'tests' (a list of {'input', 'output'} or {'inputs': [...], 'outputs': [...]}), "
            "'test_list' (MBPP asserts) or 'test' + 'entry_point' (HumanEval)"
        )
    if isinstance(tests, str):
        tests = json.loads(tests)  # TACO/APPS ship input_output as a JSON string
    fn_name = task_info.get("fn_name")
    if isinstance(tests, dict):
        fn_name = tests.get("fn_name", fn_name)
        inputs, outputs = tests.get("inputs"), tests.get("outputs")
        if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs) or not inputs:
            raise ValueError("task['tests'] as a dict needs equal-length non-empty lists 'inputs' and 'outputs'")
        pairs = list(zip(inputs, outputs, strict=False))
    elif (
        isinstance(tests, list)
        and tests
        and all(isinstance(t, dict) and "input" in t and "output" in t for t in tests)
    ):
        pairs = [(t["input"], t["output"]) for t in tests]
    else:
        raise ValueError(f"task['tests'] must be a non-empty list of {{'input', 'output'}} dicts, got {tests!r:.200}")
    if fn_name:
        return [
            TestCase(
                "call",
                input=list(args) if isinstance(args, (list, tuple)) else [args],
                expected=out,
                fn_name=str(fn_name),
            )
            for args, out in pairs
        ]
    for args, out in pairs:
        if not isinstance(args, str) or not isinstance(out, str):
            raise ValueError(
                "stdin/stdout tests need string 'input' and 'output'; for function tests set task['fn_name']"
            )
    return [TestCase("stdio", input=args, expected=out) for args, out in pairs]


# Harness programs: trusted test code that runs in a sandboxed process of its own and calls the solution through
# ``_rllm_channel`` (see rllm_gym.sandbox._channel). Each reports one line per test, after a marker.

_CALL_HARNESS = """
import json as _json
import _rllm_channel as _ch
def _report(index, **fields):
    print({mark!r} + _json.dumps(dict(index=index, **fields)), flush=True)
_function = _ch.remote({fn!r})
for _index, _args in enumerate(_json.loads({cases!r})):
    try:
        _got = _function(*_args)
    except _ch.RemoteError as _exc:
        _report(_index, status=_exc.status, error=str(_exc)[:300])
    except Exception as _exc:
        _report(_index, status="runtime_error", error=(type(_exc).__name__ + ": " + str(_exc))[:300])
    else:
        _report(_index, status="ok", got=_ch.encode(_got))
"""

_ASSERT_HARNESS = """
import builtins as _builtins
import json as _json
import _rllm_channel as _ch
def _report(index, **fields):
    print({mark!r} + _json.dumps(dict(index=index, **fields)), flush=True)
class _Namespace(dict):
    # A name the tests use but do not define is the solution's: calling it calls the solution's function.
    def __missing__(self, name):
        if name in _builtins.__dict__:
            return _builtins.__dict__[name]
        if name.startswith("__"):
            raise KeyError(name)
        self[name] = _ch.remote(name)
        return self[name]
_tests = _Namespace(__name__="__tests__", __builtins__=_builtins)
_setup, _cases, _stop = _json.loads({payload!r})
try:
    exec(compile(_setup, "<test setup>", "exec"), _tests)
    _setup_error = None
except BaseException as _exc:
    _setup_error = "the tests' setup failed: " + type(_exc).__name__ + ": " + str(_exc)[:300]
for _index, _source in enumerate(_cases):
    if _setup_error is not None:
        _report(_index, status="runtime_error", error=_setup_error)
        continue
    try:
        exec(compile(_source, "<test>", "exec"), _tests)
    except AssertionError as _exc:
        _report(_index, status="wrong_answer", error=("AssertionError: " + str(_exc))[:300])
    except _ch.RemoteError as _exc:
        _report(_index, status=_exc.status, error=str(_exc)[:300])
    except Exception as _exc:
        _report(_index, status="runtime_error", error=(type(_exc).__name__ + ": " + str(_exc))[:300])
    else:
        _report(_index, status="ok")
        continue
    if _stop:
        break
"""


def _quote(value: Any) -> str:
    try:
        text = value if isinstance(value, str) else json.dumps(value, default=repr)
    except ValueError:  # an int past Python's 4300-digit printing limit
        text = f"<a value holding an int too long to print ({type(value).__name__})>"
    return text if len(text) <= _QUOTE else text[:_QUOTE] + "..."


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return _quote(lines[-1]) if lines else ""


@dataclass
class _Plan:
    """What to run for one reply, and how to turn the sandbox results into per-test results."""

    code: str
    tests: list[TestCase]
    stop: bool
    tol: float
    mark: str = field(default_factory=lambda: f"@@rllm-test-{secrets.token_hex(8)}@@")

    @property
    def paired(self) -> bool:
        return self.tests[0].kind != "stdio"

    def harness(self) -> str:
        """The trusted test program of a paired run: the tests' arguments or asserts, never the solution."""
        if self.tests[0].kind == "call":
            cases = json.dumps([t.input for t in self.tests])
            return _CALL_HARNESS.format(mark=self.mark, fn=self.tests[0].fn_name, cases=cases)
        setup = "\n".join(dict.fromkeys(t.setup for t in self.tests if t.setup))
        payload = json.dumps([setup, [t.input for t in self.tests], self.stop])
        return _ASSERT_HARNESS.format(mark=self.mark, payload=payload)

    def judge_stdio(self, results: list[SandboxResult]) -> list[dict[str, Any]]:
        records = []
        for test, result in zip(self.tests, results, strict=False):
            record = {"input": _quote(test.input), "expected": _quote(test.expected)}
            if result.status is ExecutionStatus.OK:
                passed = outputs_match(result.stdout, test.expected, self.tol)
                record.update(passed=passed, status="ok" if passed else "wrong_answer", got=_quote(result.stdout))
            else:
                error = result.error or _last_line(result.stderr) or f"the program ended with {result.status.value}"
                record.update(passed=False, status=result.status.value, error=error)
            records.append(record)
        return records

    def judge_pair(self, pair: PairResult) -> list[dict[str, Any]]:
        reports: dict[int, dict[str, Any]] = {}
        for line in pair.harness.stdout.splitlines():
            if line.startswith(self.mark):
                with contextlib.suppress(ValueError, TypeError):
                    report = json.loads(line[len(self.mark) :])
                    reports[int(report["index"])] = report
        records = []
        for index, test in enumerate(self.tests):
            record: dict[str, Any] = {"input": _quote(test.input)}
            if test.kind == "call":
                record["expected"] = _quote(test.expected)
            report = reports.get(index)
            if report is None:  # the harness ended (timeout, the solution's memory...) before reaching this test
                status = pair.harness.status
                status = pair.solution.status if status is ExecutionStatus.OK else status
                status = ExecutionStatus.RUNTIME_ERROR if status is ExecutionStatus.OK else status
                error = _last_line(pair.harness.stderr) or _last_line(pair.solution.stderr) or "no report"
                record.update(passed=False, status=status.value, error=error)
            elif report["status"] != "ok":
                record.update(passed=False, status=report["status"], error=report.get("error", ""))
                if report["status"] == "runtime_error" and "ended before answering" in record["error"]:
                    self._blame_solution(record, pair.solution)
            elif test.kind == "call":
                self._compare(record, test, report)
            else:
                record.update(passed=True, status="ok")
            records.append(record)
            if self.stop and not record["passed"]:
                break
        return records

    @staticmethod
    def _blame_solution(record: dict[str, Any], solution: SandboxResult) -> None:
        """A call found the solution's process gone: say how it ended (its crash, memory, time)."""
        if solution.status is not ExecutionStatus.OK:
            record["status"] = solution.status.value
        tail = _last_line(solution.stderr)
        if tail:
            record["error"] = f"the solution's process ended: {tail}"

    def _compare(self, record: dict[str, Any], test: TestCase, report: dict[str, Any]) -> None:
        try:
            got = _channel.decode(report.get("got"))
        except _channel.RemoteError as exc:
            record.update(passed=False, status="not_plain_data", error=str(exc))
            return
        expected = test.expected
        ok = values_match(got, expected, self.tol) or (
            type(expected) is list and len(expected) == 1 and values_match(got, expected[0], self.tol)
        )
        try:
            shown = repr(got)
        except ValueError:  # an int past Python's 4300-digit printing limit
            shown = f"<an int of {got.bit_length()} bits>"
        record.update(passed=ok, status="ok" if ok else "wrong_answer", got=_quote(shown))


class CodeReward:
    """Grades replies to code tasks; ``CodeReward(...)(task_info, action)`` is a :class:`RewardFunction`.

    Args:
        fraction: reward = fraction of tests passed instead of all-or-nothing.
        stop_on_first_failure: skip the remaining tests after the first failing one (faster; the skipped tests are
            absent from ``metadata["tests"]`` and count as failed for ``fraction``).
        timeout: wall-clock seconds per test (per paired run of call/assert tests: ``timeout`` x number of tests,
            at most 60 s). memory_mb: memory limit per process. sandbox: a :class:`Sandbox` (default: the shared
            one, strict). float_tolerance: relative and absolute tolerance where an expected value is a float
            (default 1e-6; a task's own ``float_tolerance`` wins).
    """

    def __init__(
        self,
        fraction: bool = False,
        stop_on_first_failure: bool = False,
        timeout: float = 5.0,
        memory_mb: int = 512,
        sandbox: Sandbox | None = None,
        float_tolerance: float = DEFAULT_FLOAT_TOLERANCE,
    ):
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout < math.inf:
            raise ValueError(f"CodeReward timeout must be a positive number of seconds, got {timeout!r}")
        if not isinstance(memory_mb, int) or isinstance(memory_mb, bool) or memory_mb <= 16:
            raise ValueError(f"CodeReward memory_mb must be an int > 16 (megabytes per run), got {memory_mb!r}")
        if sandbox is not None and not isinstance(sandbox, Sandbox):
            raise ValueError(
                f"CodeReward sandbox must be a rllm_gym.sandbox.Sandbox or None (shared), got {sandbox!r}"
            )
        _check_tolerance("CodeReward float_tolerance", float_tolerance)
        self.fraction, self.stop = bool(fraction), bool(stop_on_first_failure)
        self.timeout, self.memory_mb, self.sandbox = float(timeout), memory_mb, sandbox
        self.float_tolerance = float(float_tolerance)

    def _plan(self, task_info: dict[str, Any], action: str) -> _Plan | RewardOutput:
        tests = parse_tests(task_info)
        tol = task_info.get("float_tolerance", self.float_tolerance)
        _check_tolerance("task['float_tolerance']", tol)
        code = extract_code(action)
        if code is None:
            return RewardOutput(
                reward=0.0,
                is_correct=False,
                metadata={
                    "graded": True,
                    "error": "no fenced code block (```python ... ```) in the reply",
                    "tests": [],
                    "passed": 0,
                    "total": len(tests),
                },
            )
        return _Plan(code, tests, self.stop, float(tol))

    def _kwargs(self, plan: _Plan) -> dict[str, Any]:
        timeout = min(60.0, self.timeout * len(plan.tests)) if plan.paired else self.timeout
        return {"timeout": timeout, "memory_mb": self.memory_mb, "cpu_time_s": timeout}

    def _score(self, plan: _Plan, results: list[SandboxResult] | PairResult) -> RewardOutput:
        runs = [results.harness, results.solution] if isinstance(results, PairResult) else results
        failures = [r for r in runs if r.status is ExecutionStatus.SANDBOX_ERROR]
        if failures:
            return RewardOutput(
                reward=0.0,
                is_correct=None,
                metadata={
                    "graded": False,
                    "error": f"sandbox_error: {failures[0].error}",
                    "tests": [],
                    "total": len(plan.tests),
                },
            )
        records = plan.judge_pair(results) if isinstance(results, PairResult) else plan.judge_stdio(results)
        passed = sum(r["passed"] for r in records)
        total = len(plan.tests)
        all_passed = passed == total
        reward = passed / total if self.fraction else float(all_passed)
        return RewardOutput(
            reward=reward,
            is_correct=all_passed,
            metadata={
                "graded": True,
                "passed": passed,
                "total": total,
                "tests": records,
                "isolation": runs[0].isolation if runs else [],
            },
        )

    def __call__(self, task_info: dict[str, Any], action: str) -> RewardOutput:
        plan = self._plan(task_info, action)
        if isinstance(plan, RewardOutput):
            return plan
        sandbox = self.sandbox or default_sandbox()
        kwargs = self._kwargs(plan)
        if plan.paired:
            return self._score(plan, sandbox.run_pair(plan.code, plan.harness(), **kwargs))
        if self.stop:
            results = []
            for test in plan.tests:
                results.append(sandbox.run(plan.code, stdin=test.input, **kwargs))
                if not self._passed(plan, results):
                    break
        else:
            futures = [sandbox.submit(plan.code, stdin=t.input, **kwargs) for t in plan.tests]
            results = [f.result() for f in futures]
        return self._score(plan, results)

    async def acall(self, task_info: dict[str, Any], action: str) -> RewardOutput:
        """The same grading, awaited without blocking the event loop."""
        plan = self._plan(task_info, action)
        if isinstance(plan, RewardOutput):
            return plan
        sandbox = self.sandbox or default_sandbox()
        kwargs = self._kwargs(plan)
        if plan.paired:
            return self._score(plan, await sandbox.arun_pair(plan.code, plan.harness(), **kwargs))
        if self.stop:
            results = []
            for test in plan.tests:
                results.append(await sandbox.arun(plan.code, stdin=test.input, **kwargs))
                if not self._passed(plan, results):
                    break
        else:
            runs = (sandbox.arun(plan.code, stdin=t.input, **kwargs) for t in plan.tests)
            results = list(await asyncio.gather(*runs))
        return self._score(plan, results)

    @staticmethod
    def _passed(plan: _Plan, results: list[SandboxResult]) -> bool:
        last = results[-1]
        if last.status is not ExecutionStatus.OK:
            return False
        return outputs_match(last.stdout, plan.tests[len(results) - 1].expected, plan.tol)


def _check_tolerance(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{name} must be a number in [0, 1) such as 1e-6, got {value!r}")


def code_reward_fn(task_info: dict[str, Any], action: str) -> RewardOutput:
    """Grade ``action`` (a model reply) against ``task_info``'s tests: 1.0 when all pass; see :class:`CodeReward`."""
    return CodeReward()(task_info, action)


async def acode_reward_fn(task_info: dict[str, Any], action: str, **options: Any) -> RewardOutput:
    """:func:`code_reward_fn` for asyncio; ``options`` are :class:`CodeReward`'s arguments."""
    return await CodeReward(**options).acall(task_info, action)
