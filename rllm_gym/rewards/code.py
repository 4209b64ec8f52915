"""Code grading: run the last fenced code block of a reply against a task's tests, inside :mod:`rllm_gym.sandbox`.

Three test formats, the ones the common data sets use, all given in the task dict:

* **stdin/stdout** (APPS, TACO, CodeContests, LiveCodeBench): ``tests=[{"input": "1 2\\n", "output": "3\\n"}, ...]``
  or TACO's ``{"inputs": [...], "outputs": [...]}``. Output comparison ignores whitespace differences (tokens are
  compared) and accepts numbers within ``1e-6`` relative or absolute tolerance.
* **function call** (TACO/LeetCode): the same plus ``fn_name``; each input is the argument list, each output the
  return value (TACO's one-element wrapper ``[value]`` is accepted too). A ``class Solution`` method is found as well.
* **assert** (HumanEval, MBPP): ``test`` holding ``def check(candidate)`` plus ``entry_point``, or ``test_list``
  holding assert statements (with optional ``test_setup_code``); each assert is one test.

Reward: 1.0 when every test passes, else 0.0 (or the fraction passed with ``fraction=True``); per-test results are in
``metadata["tests"]``. When the sandbox itself fails (``sandbox_error``) the reply is NOT graded: the result has
``is_correct=None``, ``reward=0.0`` and ``metadata["graded"] = False`` with the error, so trainers can drop or retry
the sample instead of learning from an infrastructure failure.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from rllm_gym.sandbox import ExecutionStatus, Sandbox, SandboxResult, default_sandbox
from rllm_gym.types import RewardOutput

__all__ = [
    "CodeReward",
    "TestCase",
    "acode_reward_fn",
    "code_reward_fn",
    "extract_code",
    "outputs_match",
    "parse_tests",
]

_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n`]*\n(.*?)```", re.DOTALL)
_MARK = "@@RLLM_TEST_RESULT@@"
_QUOTE = 300  # characters of an input/expected/got quoted in the per-test results


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


def outputs_match(got: str, expected: str, tol: float = 1e-6) -> bool:
    """Whether printed output matches the expected output, ignoring whitespace and tiny float differences."""
    got_tokens, expected_tokens = got.split(), expected.split()
    if got_tokens == expected_tokens:
        return True
    if len(got_tokens) != len(expected_tokens):
        return False
    for a, b in zip(got_tokens, expected_tokens, strict=False):
        if a == b:
            continue
        x, y = _number(a), _number(b)
        if x is None or y is None or not math.isclose(x, y, rel_tol=tol, abs_tol=tol):
            return False
    return True


def _values_match(got: Any, expected: Any, tol: float = 1e-6) -> bool:
    if isinstance(got, bool) or isinstance(expected, bool):
        return got == expected
    if isinstance(got, (int, float)) and isinstance(expected, (int, float)):
        return math.isclose(got, expected, rel_tol=tol, abs_tol=tol)
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(_values_match(a, b, tol) for a, b in zip(got, expected, strict=False))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(_values_match(got[k], expected[k], tol) for k in got)
    return got == expected


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


# Programs that run a batch of call/assert tests in one sandbox run and report each result on its own line.

_DRIVER = """
import json as _json, sys as _sys
def _rllm_report(index, ok, got=None, error=None):
    print({mark!r} + _json.dumps({{"index": index, "ok": ok, "got": got, "error": error}}, default=repr), flush=True)
def _rllm_find(name):
    if name in globals():
        return globals()[name]
    if "Solution" in globals() and hasattr(Solution, name):
        return getattr(Solution(), name)
    raise NameError("the solution defines no function named " + repr(name))
_rllm_cases = _json.loads({cases!r})
for _rllm_i, _rllm_case in enumerate(_rllm_cases):
    try:
        if _rllm_case["kind"] == "call":
            _rllm_got = _rllm_find(_rllm_case["fn"])(*_rllm_case["args"])
            _rllm_report(_rllm_i, None, got=_json.loads(_json.dumps(_rllm_got, default=repr)))
        else:
            exec(_rllm_case["source"], globals())
            _rllm_report(_rllm_i, True)
    except BaseException as _rllm_exc:
        _rllm_report(_rllm_i, False, error=type(_rllm_exc).__name__ + ": " + str(_rllm_exc)[:300])
        if {stop!r}:
            break
"""


def _batch_program(code: str, tests: list[TestCase], stop: bool) -> str:
    cases = [
        {"kind": "call", "fn": t.fn_name, "args": t.input}
        if t.kind == "call"
        else {"kind": "assert", "source": t.input}
        for t in tests
    ]
    setup = "\n".join(dict.fromkeys(t.setup for t in tests if t.setup))
    return f"{code}\n\n{setup}\n" + _DRIVER.format(mark=_MARK, cases=json.dumps(cases), stop=stop)


def _quote(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=repr)
    return text if len(text) <= _QUOTE else text[:_QUOTE] + "..."


@dataclass
class _Plan:
    """What to run for one reply, and how to turn the sandbox results into per-test results."""

    code: str
    tests: list[TestCase]
    stop: bool

    def runs(self) -> list[tuple[str, str]]:
        """``(program, stdin)`` per sandbox run: one per stdio test, one for all call/assert tests."""
        if self.tests[0].kind == "stdio":
            return [(self.code, t.input) for t in self.tests]
        return [(_batch_program(self.code, self.tests, self.stop), "")]

    def judge(self, results: list[SandboxResult]) -> list[dict[str, Any]]:
        if self.tests[0].kind == "stdio":
            return [self._judge_stdio(t, r) for t, r in zip(self.tests, results, strict=False)]
        return self._judge_batch(results[0])

    def _judge_stdio(self, test: TestCase, result: SandboxResult) -> dict[str, Any]:
        record = {"input": _quote(test.input), "expected": _quote(test.expected), "status": result.status.value}
        if result.status is ExecutionStatus.OK:
            record.update(passed=outputs_match(result.stdout, test.expected), got=_quote(result.stdout))
        else:
            record.update(passed=False, error=result.error or _quote(result.stderr.strip().splitlines()[-1:] or ""))
        return record

    def _judge_batch(self, result: SandboxResult) -> list[dict[str, Any]]:
        reports: dict[int, dict[str, Any]] = {}
        for line in result.stdout.splitlines():
            if line.startswith(_MARK):
                report = json.loads(line[len(_MARK) :])
                reports[report["index"]] = report
        records = []
        for index, test in enumerate(self.tests):
            record: dict[str, Any] = {"input": _quote(test.input)}
            report = reports.get(index)
            if test.kind == "call":
                record["expected"] = _quote(test.expected)
            if report is None:  # the run died (timeout, crash at import, exit()) before reaching this test
                tail = result.stderr.strip().splitlines()[-1:] or [""]
                record.update(passed=False, status=result.status.value, error=result.error or _quote(tail[0]))
            elif report["error"] is not None:
                record.update(passed=False, status="runtime_error", error=report["error"])
            elif test.kind == "call":
                got, expected = report["got"], test.expected
                ok = _values_match(got, expected) or (
                    isinstance(expected, list) and len(expected) == 1 and _values_match(got, expected[0])
                )
                record.update(passed=ok, status="ok", got=_quote(got))
            else:
                record.update(passed=True, status="ok")
            records.append(record)
            if self.stop and not record["passed"]:
                break
        return records


class CodeReward:
    """Grades replies to code tasks; ``CodeReward(...)(task_info, action)`` is a :class:`RewardFunction`.

    Args:
        fraction: reward = fraction of tests passed instead of all-or-nothing.
        stop_on_first_failure: skip the remaining tests after the first failing one (faster; the skipped tests are
            absent from ``metadata["tests"]`` and count as failed for ``fraction``).
        timeout: wall-clock seconds per test (per batch of call/assert tests: ``timeout`` x number of tests, at most
            60 s). memory_mb: address-space limit per run. sandbox: a :class:`Sandbox` (default: the shared one).
    """

    def __init__(
        self,
        fraction: bool = False,
        stop_on_first_failure: bool = False,
        timeout: float = 5.0,
        memory_mb: int = 512,
        sandbox: Sandbox | None = None,
    ):
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout < math.inf:
            raise ValueError(f"CodeReward timeout must be a positive number of seconds, got {timeout!r}")
        if not isinstance(memory_mb, int) or isinstance(memory_mb, bool) or memory_mb <= 16:
            raise ValueError(f"CodeReward memory_mb must be an int > 16 (megabytes per run), got {memory_mb!r}")
        if sandbox is not None and not isinstance(sandbox, Sandbox):
            raise ValueError(
                f"CodeReward sandbox must be a rllm_gym.sandbox.Sandbox or None (shared), got {sandbox!r}"
            )
        self.fraction, self.stop = bool(fraction), bool(stop_on_first_failure)
        self.timeout, self.memory_mb, self.sandbox = float(timeout), memory_mb, sandbox

    def _plan(self, task_info: dict[str, Any], action: str) -> _Plan | RewardOutput:
        tests = parse_tests(task_info)
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
        return _Plan(code, tests, self.stop)

    def _kwargs(self, plan: _Plan) -> dict[str, Any]:
        batch = plan.tests[0].kind != "stdio"
        timeout = min(60.0, self.timeout * len(plan.tests)) if batch else self.timeout
        return {"timeout": timeout, "memory_mb": self.memory_mb}

    def _score(self, plan: _Plan, results: list[SandboxResult]) -> RewardOutput:
        failures = [r for r in results if r.status is ExecutionStatus.SANDBOX_ERROR]
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
        records = plan.judge(results)
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
                "isolation": results[0].isolation if results else [],
            },
        )

    def __call__(self, task_info: dict[str, Any], action: str) -> RewardOutput:
        plan = self._plan(task_info, action)
        if isinstance(plan, RewardOutput):
            return plan
        sandbox = self.sandbox or default_sandbox()
        runs, kwargs = plan.runs(), self._kwargs(plan)
        if self.stop and len(runs) > 1:
            results = []
            for program, stdin in runs:
                results.append(sandbox.run(program, stdin=stdin, **kwargs))
                if not self._passed(plan, results):
                    break
        else:
            results = [f.result() for f in [sandbox.submit(p, stdin=s, **kwargs) for p, s in runs]]
        return self._score(plan, results)

    async def acall(self, task_info: dict[str, Any], action: str) -> RewardOutput:
        """The same grading, awaited without blocking the event loop."""
        plan = self._plan(task_info, action)
        if isinstance(plan, RewardOutput):
            return plan
        sandbox = self.sandbox or default_sandbox()
        runs, kwargs = plan.runs(), self._kwargs(plan)
        if self.stop and len(runs) > 1:
            results = []
            for program, stdin in runs:
                results.append(await sandbox.arun(program, stdin=stdin, **kwargs))
                if not self._passed(plan, results):
                    break
        else:
            results = list(await asyncio.gather(*(sandbox.arun(p, stdin=s, **kwargs) for p, s in runs)))
        return self._score(plan, results)

    @staticmethod
    def _passed(plan: _Plan, results: list[SandboxResult]) -> bool:
        last = results[-1]
        if last.status is not ExecutionStatus.OK:
            return False
        return outputs_match(last.stdout, plan.tests[len(results) - 1].expected)


def code_reward_fn(task_info: dict[str, Any], action: str) -> RewardOutput:
    """Grade ``action`` (a model reply) against ``task_info``'s tests: 1.0 when all pass; see :class:`CodeReward`."""
    return CodeReward()(task_info, action)


async def acode_reward_fn(task_info: dict[str, Any], action: str, **options: Any) -> RewardOutput:
    """:func:`code_reward_fn` for asyncio; ``options`` are :class:`CodeReward`'s arguments."""
    return await CodeReward(**options).acall(task_info, action)
