"""The trusted test programs of code grading and the reading of their reports (:mod:`rllm_gym.rewards.code`).

A paired run (:meth:`rllm_gym.sandbox.Sandbox.run_pair`) runs one of the harness programs below in a sandboxed
process of its own; it calls the solution through ``_rllm_channel`` (:mod:`rllm_gym.sandbox.channel`) and prints one
report line per test after a random marker. :class:`Plan` builds the programs for a slice of the task's tests and
turns reports (or their absence) into per-test records.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from rllm_gym.rewards._code_compare import clean_text, outputs_match, quote, show, values_match
from rllm_gym.sandbox import DEFAULT_LIMITS, ExecutionStatus, PairResult, SandboxResult, channel

__all__ = ["Plan", "task_code"]

_CALL_HARNESS = """
import json as _json
import _rllm_channel as _ch
_mark, _fn, _cases, _budget, _limit = _json.loads({payload!r})
def _report(index, **fields):
    print(_mark + _json.dumps(dict(index=index, **fields)), flush=True)
_function = _ch.remote(_fn, _limit)
for _index, _args in _cases:
    del _ch.failures[:]
    try:
        _got = _function(*_args)
    except _ch.RemoteError as _exc:
        _report(_index, status=_exc.status, error=str(_exc)[:300])
    except Exception as _exc:
        _report(_index, status="runtime_error", error=(type(_exc).__name__ + ": " + str(_exc))[:300])
    else:
        _got = _json.dumps(_ch.encode(_got))
        if len(_got) > _budget:
            _report(_index, status="output_limit", error="the return value takes %d bytes as JSON, more than the "
                    "%d a test's report may hold" % (len(_got), _budget))
        else:
            print(_mark + '{{"index": %d, "status": "ok", "got": %s}}' % (_index, _got), flush=True)
"""

# The task's code (a HumanEval prompt's helpers) and the tests' setup run first, in the tests' namespace: every name
# they define is the task's. Only the entry point, and names the task never defines, call the solution.
_ASSERT_HARNESS = """
import builtins as _builtins
import json as _json
import _rllm_channel as _ch
_mark, _task_code, _setup, _entry, _cases, _stop, _limit = _json.loads({payload!r})
def _report(index, **fields):
    print(_mark + _json.dumps(dict(index=index, **fields)), flush=True)
class _Namespace(dict):
    def __missing__(self, name):
        if name in _builtins.__dict__:
            return _builtins.__dict__[name]
        if name.startswith("__"):
            raise KeyError(name)
        self[name] = _ch.remote(name, _limit)
        return self[name]
_tests = _Namespace(__name__="__tests__", __builtins__=_builtins)
try:
    exec(compile(_task_code, "<task>", "exec"), _tests)
    exec(compile(_setup, "<test setup>", "exec"), _tests)
    _setup_error = None
except BaseException as _exc:
    # Without a call to the solution, the task's own code failed: no reply can pass, so none is graded.
    _setup_error = ("runtime_error" if _ch.calls else "harness_error",
                    "the tests' setup failed: " + type(_exc).__name__ + ": " + str(_exc)[:300])
if _entry:
    _tests[_entry] = _ch.remote(_entry, _limit)
for _index, _source in _cases:
    if _setup_error is not None:
        _report(_index, status=_setup_error[0], error=_setup_error[1])
        continue
    del _ch.failures[:]
    del _ch.calls[:]
    try:
        exec(compile(_source, "<test>", "exec"), _tests)
    except AssertionError as _exc:
        _outcome = ("wrong_answer", "AssertionError: " + str(_exc))
    except _ch.RemoteError as _exc:
        _outcome = (_exc.status, str(_exc))
    except BaseException as _exc:
        _outcome = ("runtime_error", type(_exc).__name__ + ": " + str(_exc))
    else:
        _outcome = ("ok", "")
    if _ch.failures:  # a call failed: whatever the test code did with its exception, the test fails
        _outcome = (_ch.failures[0][0], "a call to the solution failed: " + _ch.failures[0][1])
    elif _outcome[0] != "ok" and not _ch.calls:  # the test failed before it called the solution: the task's fault
        _outcome = ("harness_error", "the test failed without calling the solution: " + _outcome[1])
    if _outcome[0] == "ok":
        _report(_index, status="ok")
        continue
    _report(_index, status=_outcome[0], error=_outcome[1][:300])
    if _stop:
        break
"""

# Appended to a solution whose task defines helpers: they are there for it to call, unless it defines its own.
_TASK_HELPERS = (
    "\nexec(compile({code!r}, '<task>', 'exec'), _rllm_task := {{'__name__': '__task__'}}); "
    "[globals().setdefault(_k, _v) for _k, _v in _rllm_task.items() if _k not in ({entry!r}, '__builtins__')]\n"
)


@functools.lru_cache(maxsize=256)
def task_code(prompt: Any, entry_point: str) -> str:
    """The task's own code in a HumanEval-style prompt: the prompt when it is Python that defines the entry point
    (a stub with a docstring) at top level, else ``""`` (a statement in prose)."""
    if not isinstance(prompt, str) or not prompt.strip():
        return ""
    try:
        tree = ast.parse(prompt)
    except (SyntaxError, ValueError):
        return ""
    defined = {
        node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    return prompt if entry_point in defined else ""


_LINE_END = re.compile(r"(?<=\n)|(?<=\r)(?!\n)")  # after each line break as Python's tokenizer counts them


def _with_imports(code: str, imports: str) -> str:
    """``code`` with MBPP's ``imports`` run first, but after its docstring and ``from __future__`` imports, which
    must open the module (a reply that starts with one is not a syntax error for it)."""
    try:
        body = ast.parse(code).body
    except (SyntaxError, ValueError):  # the reply's own error, reported as such either way
        return f"{imports}\n{code}"
    end = 0
    for position, node in enumerate(body):
        future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
        docstring = position == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if not (future or (docstring and isinstance(node.value.value, str))):
            break
        end = node.end_lineno or end
    if not end:
        return f"{imports}\n{code}"
    lines = _LINE_END.split(code)
    head, rest = "".join(lines[:end]), "".join(lines[end:])
    if not head.endswith(("\n", "\r")):  # the future import ends the reply, without a line break
        head += "\n"
    return f"{head}{imports}\n{rest}"


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return quote(lines[-1]) if lines else ""


@dataclass
class Plan:
    """What to run for one reply, and how to turn the sandbox results into per-test results.

    ``tests`` are :class:`rllm_gym.rewards.code.TestCase`; the first ``public`` of them are the ones feedback may
    quote, and a paired run of them never shares a process with the others.
    """

    code: str
    tests: list[Any]
    stop: bool
    tol: float
    public: int = 0
    # Bytes of JSON a call test's return value may take in the harness's report: a larger value fails its test as
    # ``output_limit``. The paired run's output cap (:meth:`output_cap`) holds every test's report at this size.
    report_budget: int = 1 << 19
    # Wall-clock seconds one call to the solution may take: a solution that loops forever costs this once, as the
    # call's test and every later one fail at once (None: only the paired run's own limit).
    call_time_limit: float | None = None
    mark: str = field(default_factory=lambda: f"@@rllm-test-{secrets.token_hex(8)}@@")

    @property
    def paired(self) -> bool:
        return self.tests[0].kind != "stdio"

    def output_cap(self, count: int) -> int:
        """The ``max_output_bytes`` of a paired run of ``count`` tests: room for each call test's report at its
        budget, so that a correct solution's large return values never cut the later tests' reports."""
        if self.tests[0].kind != "call":
            return DEFAULT_LIMITS.max_output_bytes
        return max(DEFAULT_LIMITS.max_output_bytes, count * (self.report_budget + len(self.mark) + 64))

    def segments(self) -> list[range]:
        """The slices of tests run as one paired run each: the public tests apart from the hidden ones."""
        total = len(self.tests)
        if 0 < self.public < total:
            return [range(0, self.public), range(self.public, total)]
        return [range(total)]

    def solution(self) -> str:
        """The program the solution's process runs: the reply's code, then the task's helpers it did not define."""
        first = self.tests[0]
        code = _with_imports(self.code, first.imports) if first.imports else self.code
        if first.kind != "assert" or not first.task_code:
            return code
        return code + _TASK_HELPERS.format(code=first.task_code, entry=first.fn_name)

    def harness(self, indices: range) -> str:
        """The trusted test program of a paired run over ``indices``: the tests' arguments or asserts, never the
        solution."""
        tests = [(index, self.tests[index]) for index in indices]
        if tests[0][1].kind == "call":
            cases = [(index, test.input) for index, test in tests]
            payload = json.dumps([self.mark, tests[0][1].fn_name, cases, self.report_budget, self.call_time_limit])
            return _CALL_HARNESS.format(payload=payload)
        setup = "\n".join(dict.fromkeys(test.setup for _, test in tests if test.setup))
        first = tests[0][1]
        cases = [(index, test.input) for index, test in tests]
        payload = [self.mark, first.task_code, setup, first.fn_name or "", cases, self.stop, self.call_time_limit]
        payload = json.dumps(payload)
        return _ASSERT_HARNESS.format(payload=payload)

    def judge_stdio(self, results: list[SandboxResult]) -> list[dict[str, Any]]:
        records = []
        for test, result in zip(self.tests, results, strict=False):
            record = {"input": quote(test.input), "expected": quote(test.expected)}
            if result.status is ExecutionStatus.OK:
                passed = outputs_match(result.stdout, test.expected, self.tol)
                record.update(passed=passed, status="ok" if passed else "wrong_answer", got=quote(result.stdout))
            else:
                error = result.error or _last_line(result.stderr) or f"the program ended with {result.status.value}"
                record.update(passed=False, status=result.status.value, error=error)
            records.append(record)
        return records

    def judge_pair(self, pair: PairResult, indices: range) -> list[dict[str, Any]]:
        reports: dict[int, dict[str, Any]] = {}
        for line in pair.harness.stdout.splitlines():
            if line.startswith(self.mark):
                with contextlib.suppress(ValueError, TypeError, KeyError, RecursionError):
                    report = json.loads(line[len(self.mark) :])
                    if type(report) is dict and type(report.get("status")) is str and report["index"] in indices:
                        reports[int(report["index"])] = report
        records = []
        for index in indices:
            test = self.tests[index]
            record: dict[str, Any] = {"input": quote(test.input)}
            if test.kind == "call":
                record["expected"] = quote(test.expected)
            report = reports.get(index)
            if report is None:  # the harness ended (timeout, the solution's memory...) before reporting this test
                record.update(passed=False, status=self._missing_status(pair).value, error=self._missing(pair))
            elif report["status"] != "ok":
                error = str(report.get("error", ""))
                record.update(passed=False, status=report["status"], error=clean_text(error[:300]))
                if report["status"] == "runtime_error" and "ended before answering" in error:
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
    def _missing_status(pair: PairResult) -> ExecutionStatus:
        status = pair.harness.status
        status = pair.solution.status if status is ExecutionStatus.OK else status
        return ExecutionStatus.RUNTIME_ERROR if status is ExecutionStatus.OK else status

    @staticmethod
    def _missing(pair: PairResult) -> str:
        """Why a test has no report, from how the harness ended: never from the solution's output, which may have
        been written after it saw other tests' inputs."""
        how = pair.harness.status.value
        if pair.harness.truncated:
            return f"no report for this test: the harness's reports were cut at the output limit ({how})"
        return f"no report for this test: the harness ended ({how}) before reporting it, or its report was malformed"

    @staticmethod
    def _blame_solution(record: dict[str, Any], solution: SandboxResult) -> None:
        """A call found the solution's process gone: say how it ended (its crash, memory, time)."""
        if solution.status is not ExecutionStatus.OK:
            record["status"] = solution.status.value
        tail = _last_line(solution.stderr)
        if tail:
            record["error"] = f"the solution's process ended: {tail}"

    def _compare(self, record: dict[str, Any], test: Any, report: dict[str, Any]) -> None:
        try:
            got = channel.decode(report.get("got"))
        except (channel.RemoteError, RecursionError) as exc:
            record.update(passed=False, status="not_plain_data", error=clean_text(str(exc)[:300]))
            return
        expected = test.expected
        ok = values_match(got, expected, self.tol) or (
            type(expected) is list and len(expected) == 1 and values_match(got, expected[0], self.tol)
        )
        record.update(passed=ok, status="ok" if ok else "wrong_answer", got=clean_text(show(got)))
