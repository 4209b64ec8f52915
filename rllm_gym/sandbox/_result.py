"""What a run returns: its :class:`ExecutionStatus`, the :class:`SandboxResult` (and a pair's :class:`PairResult`), and
how the zygote's reply becomes one (:func:`result_of`), the run's output read from the memfds it passed back."""

from __future__ import annotations

import os
import signal
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

_CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT, signal.SIGSYS}


class SandboxUnavailableError(RuntimeError):
    """A strict sandbox cannot give the isolation it requires here; the message names the missing layers."""


class ExecutionStatus(str, Enum):
    """How a run ended. Grading outcomes (passed, wrong answer) live in :mod:`rllm_gym.rewards.code`."""

    OK = "ok"  # exited with status 0
    RUNTIME_ERROR = "runtime_error"  # non-zero exit status or a crash (SIGSEGV, SIGABRT...; traceback in stderr)
    KILLED = "killed"  # ended by a signal the code sent itself or one of its processes (SIGKILL, SIGTERM...)
    TIMEOUT = "timeout"  # wall-clock ``timeout`` or CPU-time limit reached
    MEMORY_LIMIT = "memory_limit"  # address-space limit reached (MemoryError, or killed while at the limit)
    OUTPUT_LIMIT = "output_limit"  # stdout/stderr past ``max_output_bytes``, or a file past ``file_size_mb``
    SANDBOX_ERROR = "sandbox_error"  # the sandbox itself failed: an infrastructure error, never the code's fault


@dataclass(frozen=True)
class SandboxResult:
    """The outcome of one run: status, captured output (each stream capped), exit code and the isolation in effect.

    ``exit_code`` is the process's exit status, negative for a signal (``-9``), None when the sandbox killed it or
    failed. ``error`` explains a ``sandbox_error``.
    """

    status: ExecutionStatus
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    duration_s: float = 0.0
    isolation: list[str] = field(default_factory=list)
    truncated: bool = False
    max_rss_mb: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is ExecutionStatus.OK

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status.value}


def sandbox_error(message: str, isolation: list[str] | None = None) -> SandboxResult:
    return SandboxResult(ExecutionStatus.SANDBOX_ERROR, error=message, isolation=list(isolation or []))


def _classify(reply: dict[str, Any], request: dict[str, Any]) -> tuple[ExecutionStatus, int | None]:
    if reply.get("error"):
        return ExecutionStatus.SANDBOX_ERROR, None
    verdict = reply.get("verdict")
    if verdict == "stopped":  # a pair's solution, stopped by the sandbox once its harness was done
        return ExecutionStatus.OK, None
    if verdict in ("timeout", "output_limit", "killed"):
        return ExecutionStatus(verdict), None
    if reply.get("wait_status") is None:
        return ExecutionStatus.SANDBOX_ERROR, None
    exit_code = os.waitstatus_to_exitcode(reply["wait_status"])
    if reply.get("oom"):
        return ExecutionStatus.MEMORY_LIMIT, exit_code  # the memory cgroup's limit: the kernel killed a process
    if exit_code == 0:
        return ExecutionStatus.OK, 0
    if exit_code == -signal.SIGXCPU:
        return ExecutionStatus.TIMEOUT, exit_code
    last_line = next((line for line in reversed(reply.get("stderr", "").splitlines()) if line.strip()), "")
    if last_line.startswith("MemoryError"):
        return ExecutionStatus.MEMORY_LIMIT, exit_code
    if "[Errno 27] File too large" in last_line or "[Errno 28] No space left" in last_line or exit_code == -25:
        return ExecutionStatus.OUTPUT_LIMIT, exit_code
    rss_kb = reply.get("max_rss_kb") or 0
    if exit_code < 0 and rss_kb >= 0.9 * request["memory_mb"] * 1024:
        return ExecutionStatus.MEMORY_LIMIT, exit_code  # a C allocation failed at the limit and took the process down
    if exit_code < 0 and -exit_code not in _CRASH_SIGNALS:
        return ExecutionStatus.KILLED, exit_code
    return ExecutionStatus.RUNTIME_ERROR, exit_code


def _read_output(fd: int, cap: int) -> str:
    """The first ``cap`` bytes of a run's stdout or stderr memfd, decoded; closes the fd."""
    try:
        return os.pread(fd, cap, 0).decode(errors="replace")
    finally:
        os.close(fd)


def result_of(reply: dict[str, Any], request: dict[str, Any], isolation: list[str], fds: list[int]) -> SandboxResult:
    stdout, stderr = (_read_output(fd, request["max_output_bytes"]) for fd in fds)
    reply = {**reply, "stdout": stdout, "stderr": stderr}
    status, exit_code = _classify(reply, request)
    return SandboxResult(
        status=status,
        stdout=stdout,
        stderr=stderr,
        exit_code=exit_code,
        duration_s=reply["duration_s"],
        isolation=list(isolation),
        truncated=reply["truncated"],
        max_rss_mb=None if reply["max_rss_kb"] is None else reply["max_rss_kb"] / 1024,
        error=reply["error"],
    )


@dataclass(frozen=True)
class PairResult:
    """The two halves of :meth:`Sandbox.run_pair`: the harness's run (its stdout is the test report) and the
    solution's (its stderr explains a crash before or while serving calls)."""

    harness: SandboxResult
    solution: SandboxResult


def failure(message: str, isolation: list[str] | None, pair: bool) -> SandboxResult | PairResult:
    """A sandbox error as the caller awaits it: a :class:`PairResult` of two for a pair, else one result."""
    error = sandbox_error(message, isolation)
    return PairResult(error, error) if pair else error
