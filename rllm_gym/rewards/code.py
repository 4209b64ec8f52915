"""Code grading: run the last fenced code block of a reply against a task's tests, inside :mod:`rllm_gym.sandbox`.

Three test formats, the ones the common data sets use, all given in the task dict:

* **stdin/stdout** (APPS, TACO, CodeContests, LiveCodeBench): ``tests=[{"input": "1 2\\n", "output": "3\\n"}, ...]``
  or TACO's ``{"inputs": [...], "outputs": [...]}``. The program's raw output comes back from the sandbox and is
  compared here, token by token (whitespace differences are ignored).
* **function call** (TACO/LeetCode): the same plus ``fn_name``; each input is the argument list, each output the
  return value (TACO's one-element wrapper ``[value]`` is accepted too). A ``class Solution`` method is found as well.
* **assert** (HumanEval, MBPP): ``test`` holding ``def check(candidate)`` plus ``entry_point``, or ``test_list``
  holding assert statements (with optional ``test_setup_code``, and ``test_imports``, which run before the solution
  and before the asserts, as in MBPP); each assert is one test.

**The verdict is decided outside the process that runs model code.** Function and assert tests run as a pair
(:meth:`rllm_gym.sandbox.Sandbox.run_pair`): the test code runs in a sandboxed harness process of its own and every
call of the solution's function is forwarded to the solution's sandboxed process, from which only a plain-data return
value comes back (None, bool, int, float, complex, str, bytes and lists, tuples, dicts and sets of those; anything
else fails the test as ``not_plain_data``). Expected values never enter the solution's process: call-test results are
compared here, assert tests in the harness. Nothing the solution prints, returns as an exit code or does at exit
counts.

**The task's code stays the task's.** In assert tests, names the task defines (a HumanEval prompt's helpers, the test
code, MBPP setup) resolve to the task's definitions; only the entry point and names the task never defines call the
solution, whose program gets the prompt's helpers it does not define itself. **Exceptions cannot steer the tests:** a
builtin ``Exception`` raised by the solution reaches the test as that builtin, while ``StopIteration``, the
``BaseException`` family, other names and calls without a plain-data answer fail the test even if its code catches
them (see :mod:`rllm_gym.sandbox.channel`). **Public tests run apart:** with ``public_tests`` (the first tests, the
ones feedback may quote), function and assert tests run them in a paired run of their own, before the hidden ones, so
what is reported of them never depends on a hidden input; a test without a report says so. **Any value gets a
verdict:** comparison and quoting (:mod:`rllm_gym.rewards._code_compare`) never raise, whatever the solution returns.

**Strict comparison.** ints, strs and bytes compare exactly, ``bool`` is not an ``int``, and a float tolerance
(``float_tolerance``, relative and absolute, default ``1e-6``; a task may set its own ``float_tolerance``) applies only
where the expected value is a float: in stdin/stdout tests, where the expected token is a float literal (has ``.``,
an exponent, or is ``inf``/``nan``), so an expected ``1000000`` is not matched by ``1000001`` or ``1000000.0``.
Containers compare element-wise by the same rules (a tuple may stand for an expected JSON list). Assert-style tests
keep the data set's own Python comparisons, run in the harness.

Reward: 1.0 when every test passes, else 0.0 (or the fraction passed with ``fraction=True``); per-test results are in
``metadata["tests"]``, each with a ``status``: ``ok``, ``wrong_answer``, ``runtime_error``, ``killed``, ``timeout``,
``memory_limit``, ``output_limit`` or ``not_plain_data``. When the sandbox itself fails (``sandbox_error``, an
infrastructure fault that model code cannot cause), or the task's test code cannot run whatever the reply
(``harness_error``: its setup or an assert fails before calling the solution, or it passes the solution an argument
that is not plain data, such as a lambda), the reply is NOT graded: the result has ``is_correct=None``,
``reward=0.0`` and ``metadata["graded"] = False`` with the error, so trainers can drop or retry the sample instead of
learning from it.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from rllm_gym.rewards._code_compare import DEFAULT_FLOAT_TOLERANCE, clean_text, outputs_match, values_match
from rllm_gym.rewards._code_harness import Plan, task_code
from rllm_gym.sandbox import (
    DEFAULT_LIMITS,
    ExecutionStatus,
    PairResult,
    Sandbox,
    SandboxLimits,
    SandboxResult,
    default_sandbox,
)
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


def extract_code(text: str) -> str | None:
    """The body of the last fenced code block (```` ```python ... ``` ````) in ``text``, or None when it has none."""
    if not isinstance(text, str):
        return None
    blocks = _FENCE.findall(text)
    return blocks[-1][1] if blocks else None


@dataclass
class TestCase:
    """One test: ``kind`` is ``"stdio"``, ``"call"`` or ``"assert"``; ``input``/``expected`` depend on the kind.

    ``fn_name``: the function under test (a call test's, a HumanEval entry point). ``setup``: the tests' own code
    (a HumanEval ``check``, MBPP setup); ``task_code``: the task's code the prompt shows (a HumanEval prompt's
    helpers). Names either defines stay the task's in the tests.
    """

    __test__ = False  # not a pytest test class

    kind: str
    input: Any = None
    expected: Any = None
    setup: str = ""
    fn_name: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    task_code: str = ""
    imports: str = ""  # MBPP's test_imports: run before the solution too


def _mbpp_imports(imports: Any) -> str:
    """MBPP's ``test_imports`` (``["import math"]``) as source: MBPP runs them before the solution and its asserts,
    so both of ours get them (a solution may use ``math`` without importing it, an assert may call ``math.isclose``).
    """
    if imports is None:
        return ""
    if isinstance(imports, str):
        imports = [imports] if imports.strip() else []
    if not isinstance(imports, list) or not all(isinstance(line, str) for line in imports):
        raise ValueError(
            f"task['test_imports'] must be a list of import statements such as ['import math'], got {imports!r:.200}"
        )
    for line in imports:
        try:
            body = ast.parse(line).body
        except SyntaxError:
            body = []
        if not body or not all(isinstance(node, (ast.Import, ast.ImportFrom)) for node in body):
            raise ValueError(f"task['test_imports'] must hold import statements only, got {line!r:.200}")
    return "\n".join(imports)


def _check_python(source: str, name: str) -> None:
    """A task's test code must compile: broken, it would fail every reply alike, which says nothing of any."""
    try:
        compile(source, name, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        detail = f"{exc.msg} at line {exc.lineno}" if isinstance(exc, SyntaxError) and exc.lineno else str(exc)
        raise ValueError(f"{name} is not valid Python ({detail}): fix the task") from None


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
        imports = _mbpp_imports(task_info.get("test_imports"))
        for index, source in enumerate(asserts):
            _check_python(source, f"task['test_list'][{index}]")
        for key in ("test_imports_code", "test_setup_code"):
            _check_python(str(task_info.get(key) or ""), f"task[{key!r}]")
        setup = "\n".join(
            [imports, *(str(task_info.get(key) or "") for key in ("test_imports_code", "test_setup_code"))]
        )
        return [TestCase("assert", input=a, setup=setup, imports=imports) for a in asserts]
    if "test" in task_info and "entry_point" in task_info:  # HumanEval
        test, entry = task_info["test"], task_info["entry_point"]
        if not isinstance(test, str) or not isinstance(entry, str) or not entry:
            raise ValueError(
                "task['test'] must be the source of `def check(candidate)` and task['entry_point'] a name"
            )
        _check_python(test, "task['test']")
        if not entry.isidentifier():
            raise ValueError(f"task['entry_point'] must be a Python name such as 'has_close_elements', got {entry!r}")
        code = task_code(task_info.get("prompt"), entry)
        return [TestCase("assert", input=f"check({entry})", setup=test, fn_name=entry, task_code=code)]
    tests = task_info.get("tests")
    if tests is None:
        raise ValueError(
            "a code task needs tests: 'tests' (a list of {'input', 'output'} or {'inputs': [...], 'outputs': [...]}), "
            "'test_list' (MBPP asserts) or 'test' + 'entry_point' (HumanEval)"
        )
    if isinstance(tests, str):  # TACO/APPS ship input_output as a JSON string
        try:
            tests = json.loads(tests)
        except ValueError as exc:
            raise ValueError(f"task['tests'] is a string but not JSON ({exc}): pass a list, a dict or JSON") from None
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
        if not str(fn_name).isidentifier():  # no solution could define it: every reply would fail
            raise ValueError(f"task['fn_name'] must be a Python name such as 'twoSum', got {fn_name!r}")
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


class CodeReward:
    """Grades replies to code tasks; ``CodeReward(...)(task_info, action)`` is a :class:`RewardFunction`.

    Args:
        fraction: reward = fraction of tests passed instead of all-or-nothing.
        stop_on_first_failure: skip the remaining tests after the first failing one (faster; the skipped tests are
            absent from ``metadata["tests"]`` and count as failed for ``fraction``). Default None: stop exactly
            when the reward is all-or-nothing (``not fraction``), where the rest cannot change it; with
            ``fraction`` every test runs. :class:`~rllm_gym.envs.code.CodeEnv` has the same default.
        timeout: wall-clock seconds per test (per paired run of call/assert tests: ``timeout`` x number of tests, at
            most 60 s; each call to the solution gets ``timeout`` of it, and the first call past it fails every later
            test at once, so a solution that never returns costs ``timeout`` once, not once per test). memory_mb:
            memory limit per process. Both follow :class:`~rllm_gym.sandbox.SandboxLimits` (its defaults and its
            rules). A stdin/stdout run may print twice its expected output (at least the sandbox's default of 1 MiB), a
            paired run every call test's report at its budget (512 KiB of JSON per return value). sandbox: a
            :class:`Sandbox` (default: the shared one, strict). float_tolerance: relative and absolute tolerance where
            an expected value is a float (default 1e-6; a task's own ``float_tolerance`` wins). hidden_run_class: the
            sandbox's ``run_class`` of the runs of hidden tests: ``"verdict"`` (default: only the reward comes out of
            them), ``"visible"`` where their results are shown to the model (Code-v0's ``feedback="full"``). Public
            tests run as ``"visible"``; the two classes never run at the same time (:mod:`rllm_gym.sandbox`).
    """

    def __init__(
        self,
        fraction: bool = False,
        stop_on_first_failure: bool | None = None,
        timeout: float = DEFAULT_LIMITS.timeout,
        memory_mb: int = DEFAULT_LIMITS.memory_mb,
        sandbox: Sandbox | None = None,
        float_tolerance: float = DEFAULT_FLOAT_TOLERANCE,
        hidden_run_class: str = "verdict",
    ):
        SandboxLimits(timeout=timeout, memory_mb=memory_mb, owner="CodeReward")
        if sandbox is not None and not isinstance(sandbox, Sandbox):
            raise ValueError(
                f"CodeReward sandbox must be a rllm_gym.sandbox.Sandbox or None (shared), got {sandbox!r}"
            )
        _check_tolerance("CodeReward float_tolerance", float_tolerance)
        if hidden_run_class not in ("verdict", "visible"):
            raise ValueError(f"CodeReward hidden_run_class must be 'verdict' or 'visible', got {hidden_run_class!r}")
        self.hidden_run_class = hidden_run_class
        self.fraction = bool(fraction)
        self.stop = not self.fraction if stop_on_first_failure is None else bool(stop_on_first_failure)
        self.timeout, self.memory_mb, self.sandbox = float(timeout), memory_mb, sandbox
        self.float_tolerance = float(float_tolerance)

    def _plan(self, task_info: dict[str, Any], action: str, public_tests: int | None) -> Plan | RewardOutput:
        tests = parse_tests(task_info)
        tol = task_info.get("float_tolerance", self.float_tolerance)
        _check_tolerance("task['float_tolerance']", tol)
        public = task_info.get("public_tests", 0) if public_tests is None else public_tests
        if isinstance(public, bool) or not isinstance(public, int) or not 0 <= public <= len(tests):
            raise ValueError(f"public_tests must be an int from 0 to {len(tests)} (the tests), got {public!r}")
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
        # A lone surrogate cannot be written as UTF-8 source: it stands for the replacement character it shows as.
        return Plan(clean_text(code), tests, self.stop, float(tol), public=public, call_time_limit=self.timeout)

    def _kwargs(self, plan: Plan, count: int, end: int) -> dict[str, Any]:
        """A run's arguments; ``end``: one past the index of its last test (public tests are the first ones)."""
        timeout = min(60.0, self.timeout * count) if plan.paired else self.timeout
        run_class = "visible" if end <= plan.public else self.hidden_run_class
        kwargs = {"timeout": timeout, "memory_mb": self.memory_mb, "cpu_time_s": timeout, "run_class": run_class}
        return {**kwargs, "max_output_bytes": plan.output_cap(count)} if plan.paired else kwargs

    def _score(self, plan: Plan, runs: list[SandboxResult], records: list[dict[str, Any]]) -> RewardOutput:
        failures = [r for r in runs if r.status is ExecutionStatus.SANDBOX_ERROR]
        broken = [r for r in records if r["status"] == "harness_error"]
        if failures or broken:
            error = f"sandbox_error: {failures[0].error}" if failures else f"harness_error: {broken[0]['error']}"
            return RewardOutput(
                reward=0.0,
                is_correct=None,
                metadata={"graded": False, "error": error, "tests": [], "total": len(plan.tests)},
            )
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

    def _score_pairs(self, plan: Plan, pairs: list[tuple[range, PairResult]]) -> RewardOutput:
        runs = [run for _, pair in pairs for run in (pair.harness, pair.solution)]
        records = [record for indices, pair in pairs for record in plan.judge_pair(pair, indices)]
        if self.stop:  # a call harness runs every test of its slice: keep the records to the first failure
            first = next((i for i, record in enumerate(records) if not record["passed"]), len(records))
            records = records[: first + 1]
        return self._score(plan, runs, records)

    def _stopped(self, plan: Plan, indices: range, pair: PairResult) -> bool:
        """Whether the slices after this one are not run: a sandbox failure, or a failure with stop-on-failure."""
        if ExecutionStatus.SANDBOX_ERROR in (pair.harness.status, pair.solution.status):
            return True
        return self.stop and not all(record["passed"] for record in plan.judge_pair(pair, indices))

    def _grading(self, plan: Plan) -> Generator[list[_Job], list[Any], RewardOutput]:
        """The grading of ``plan`` as batches of sandbox runs: it yields a batch (runs that may go at once), is sent
        their results in order, and returns the reward. :meth:`__call__` and :meth:`acall` only differ in how they
        wait for a batch (:func:`_drive`, :func:`_adrive`)."""
        if plan.paired:
            # One slice after the other: the public tests' run ends before the solution sees a hidden input.
            pairs: list[tuple[range, PairResult]] = []
            for indices in plan.segments():
                job = _Job(plan.solution(), self._kwargs(plan, len(indices), indices.stop), plan.harness(indices))
                pairs += zip([indices], (yield [job]), strict=True)
                if self._stopped(plan, *pairs[-1]):
                    break
            return self._score_pairs(plan, pairs)
        jobs = []
        for i, test in enumerate(plan.tests):
            kwargs = {**self._kwargs(plan, 1, i + 1), "stdin": test.input, "max_output_bytes": _stdout_cap(test)}
            jobs.append(_Job(plan.code, kwargs))
        results: list[SandboxResult] = []
        if self.stop:
            for job in jobs:
                results += yield [job]
                if not self._passed(plan, results):
                    break
        else:
            results = yield jobs
        return self._score(plan, results, plan.judge_stdio(results))

    def __call__(self, task_info: dict[str, Any], action: str, *, public_tests: int | None = None) -> RewardOutput:
        """Grade ``action``. ``public_tests``: how many of the first tests feedback may quote (default: the task's
        ``public_tests``, else 0); function and assert tests run them in a paired run of their own, before and
        apart from the hidden ones, so nothing about them was computed after the solution saw a hidden input."""
        plan = self._plan(task_info, action, public_tests)
        if isinstance(plan, RewardOutput):
            return plan
        return _drive(self._grading(plan), self.sandbox or default_sandbox())

    async def acall(self, task_info: dict[str, Any], action: str, *, public_tests: int | None = None) -> RewardOutput:
        """The same grading, awaited without blocking the event loop."""
        plan = self._plan(task_info, action, public_tests)
        if isinstance(plan, RewardOutput):
            return plan
        return await _adrive(self._grading(plan), self.sandbox or default_sandbox())

    @staticmethod
    def _passed(plan: Plan, results: list[SandboxResult]) -> bool:
        last = results[-1]
        if last.status is not ExecutionStatus.OK:
            return False
        return outputs_match(last.stdout, plan.tests[len(results) - 1].expected, plan.tol)


class _Job(NamedTuple):
    """One sandbox run of a grading: a program and its run's arguments; with a harness, a paired run."""

    code: str
    kwargs: dict[str, Any]
    harness: str | None = None


def _drive(grading: Generator[list[_Job], list[Any], RewardOutput], sandbox: Sandbox) -> RewardOutput:
    """Run a grading's batches on ``sandbox``, each batch's runs submitted at once, and return its reward."""
    try:
        jobs = next(grading)
        while True:
            futures = [
                sandbox.submit(job.code, **job.kwargs)
                if job.harness is None
                else sandbox.submit_pair(job.code, job.harness, **job.kwargs)
                for job in jobs
            ]
            results = [sandbox.wait(future) for future in futures]
            jobs = grading.send(results)
    except StopIteration as done:
        return done.value


async def _adrive(grading: Generator[list[_Job], list[Any], RewardOutput], sandbox: Sandbox) -> RewardOutput:
    """:func:`_drive` without blocking the event loop."""
    try:
        jobs = next(grading)
        while True:
            runs = (
                sandbox.arun(job.code, **job.kwargs)
                if job.harness is None
                else sandbox.arun_pair(job.code, job.harness, **job.kwargs)
                for job in jobs
            )
            jobs = grading.send(list(await asyncio.gather(*runs)))
    except StopIteration as done:
        return done.value


def _stdout_cap(test: TestCase) -> int:
    """A stdin/stdout run's output cap: the sandbox's default, or twice the expected output where that is larger, so
    that a correct program's long output is compared, not cut as ``output_limit``."""
    return max(DEFAULT_LIMITS.max_output_bytes, 2 * len(test.expected.encode("utf-8", "surrogatepass")) + 4096)


def _check_tolerance(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{name} must be a number in [0, 1) such as 1e-6, got {value!r}")


def code_reward_fn(task_info: dict[str, Any], action: str) -> RewardOutput:
    """Grade ``action`` (a model reply) against ``task_info``'s tests: 1.0 when all pass; see :class:`CodeReward`."""
    return CodeReward()(task_info, action)


async def acode_reward_fn(task_info: dict[str, Any], action: str, **options: Any) -> RewardOutput:
    """:func:`code_reward_fn` for asyncio; ``options`` are :class:`CodeReward`'s arguments."""
    return await CodeReward(**options).acall(task_info, action)
