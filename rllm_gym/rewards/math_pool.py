"""The math-verify worker processes behind :class:`~rllm_gym.rewards.math.MathGrader`: math-verify times itself out
with ``signal.alarm``, which only works in a main thread, so it runs in long-lived worker processes
(``_math_worker.py``, beside this file) that the caller can kill. :class:`MathVerifyPool` grades one answer per
worker with a hard wall-clock limit, tells an answer's timeout from a worker the host starved (the infrastructure's
failure), and :func:`shared_pool` is the process-wide pool every grader uses unless given its own (a forked child
gets its own). ``rllm_gym.rewards.math`` re-exports both.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["MathVerifyPool", "infrastructure_failed", "shared_pool"]

_WORKER = str(Path(__file__).with_name("_math_worker.py"))
# Run the worker file without putting its folder (or the cwd) on sys.path: this folder's math.py would shadow the
# standard library's math module, and the worker needs nothing from rllm-gym.
_LAUNCH = "import sys, runpy; del sys.path[0]; runpy.run_path(sys.argv[1], run_name='__main__')"
_STARTUP_TIMEOUT = 120.0  # importing sympy on a loaded 2-core machine can take seconds


_WORKER_EXITED = "error: the math-verify worker exited"
_WORKER_STARVED = "error: the math-verify worker was starved"
# A timeout counts as the answer's only when the worker really computed for this share of the limit; less means the
# host did not run it (a loaded machine, a stopped process), which is the infrastructure's failure.
_MIN_CPU_SHARE = 0.25
_STARVED_WALL_FACTOR = 3.0  # a starved worker waits this many time limits in all before it is given up
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(pid: int) -> float | None:
    """The CPU time (user + system) process ``pid`` has used, from ``/proc`` (None where there is none)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    except (OSError, ValueError, IndexError):
        return None


def infrastructure_failed(outcome: str) -> bool:
    """Whether a :meth:`MathVerifyPool.verify` outcome is the infrastructure's failure (the worker exited, or the host
    starved it), not the answer's."""
    return outcome == _WORKER_EXITED or outcome.startswith(_WORKER_STARVED)


class MathVerifyPool:
    """Long-lived math-verify worker processes; :meth:`verify` is thread-safe and has a hard time limit.

    At most ``max_workers`` answers are graded at once; more callers wait for a free worker. A worker that runs
    past the time limit is killed (a new one is started on demand), so a pathological answer costs one worker for
    ``time_limit`` seconds and nothing else. Workers are started lazily and stopped by :meth:`close` or at exit.
    """

    def __init__(self, max_workers: int = 2):
        if not isinstance(max_workers, int) or isinstance(max_workers, bool) or max_workers < 1:
            raise ValueError(f"MathVerifyPool max_workers must be a positive int, got {max_workers!r}")
        self.max_workers = max_workers
        self._slots = threading.BoundedSemaphore(max_workers)
        self._lock = threading.Lock()
        self._idle: list[subprocess.Popen[bytes]] = []
        self.workers_killed = 0

    def _start_worker(self) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-u", "-c", _LAUNCH, _WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        # Warm the worker up (imports, sympy caches) outside any answer's time limit.
        verdict, outcome = self._ask(process, {"gold": "1", "answer": "1", "timeout": 5}, _STARTUP_TIMEOUT)
        if outcome != "ok" or not verdict:
            self._kill(process)
            raise RuntimeError(f"the math-verify worker did not start ({outcome}); is math-verify installed?")
        return process

    def _kill(self, process: subprocess.Popen[bytes]) -> None:
        process.kill()
        process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()

    @staticmethod
    def _ask(process: subprocess.Popen[bytes], request: dict[str, Any], limit: float) -> tuple[bool, str]:
        assert process.stdin is not None
        try:
            process.stdin.write((json.dumps(request) + "\n").encode())
            process.stdin.flush()
        except (BrokenPipeError, OSError):
            return False, _WORKER_EXITED
        return MathVerifyPool._read(process, limit)

    @staticmethod
    def _read(process: subprocess.Popen[bytes], limit: float) -> tuple[bool, str]:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], limit)
        if not ready:
            return False, "timeout"
        line = process.stdout.readline()
        if not line:
            return False, _WORKER_EXITED
        reply = json.loads(line)
        return bool(reply["verdict"]), "ok" if reply["error"] is None else f"error: {reply['error']}"

    @staticmethod
    def _wait_while_starved(
        process: subprocess.Popen[bytes], time_limit: float, cpu_before: float
    ) -> tuple[bool, str]:
        """After ``time_limit`` seconds without a reply: wait on while the worker has used less than a quarter of the
        limit in CPU time, up to ``_STARVED_WALL_FACTOR`` times the limit in all; a worker still starved then is the
        infrastructure's failure (``_WORKER_STARVED``), one that computed that long is the answer's ``timeout``."""
        waited, used = time_limit, 0.0
        while waited < _STARVED_WALL_FACTOR * time_limit:
            cpu = _cpu_seconds(process.pid)
            if cpu is None:
                return False, "timeout"  # no CPU accounting here: the wall clock decides
            used = cpu - cpu_before
            if used >= _MIN_CPU_SHARE * time_limit:
                return False, "timeout"
            step = min(time_limit / 4, _STARVED_WALL_FACTOR * time_limit - waited)
            verdict, outcome = MathVerifyPool._read(process, step)
            if outcome != "timeout":
                return verdict, outcome
            waited += step
        return False, f"{_WORKER_STARVED}: {used:.2f} s of CPU in {waited:.3g} s"

    def verify(self, gold: str, answer: str, time_limit: float) -> tuple[bool, str]:
        """``(verdict, outcome)``: outcome is ``"ok"``, ``"timeout"`` or ``"error: ..."`` (then verdict is False).

        A worker past ``time_limit`` is killed. It is the answer's ``timeout`` only when the worker used at least a
        quarter of the limit in CPU time: a worker the host starved (a loaded machine, a stopped process) gets up to
        three times the limit in wall-clock time to use it, and is then the infrastructure's failure like a worker
        that exited: ``"error: the math-verify worker was starved: ..."``. One answer costs at most
        ``3 * time_limit``.
        """
        with self._slots:
            with self._lock:
                process = self._idle.pop() if self._idle else None
            if process is None or process.poll() is not None:
                process = self._start_worker()
            # math-verify's own alarm is set past the longest wait, so this process's clock always decides
            budget = max(1, math.ceil(_STARVED_WALL_FACTOR * time_limit) + 1)
            request = {"gold": gold, "answer": answer, "timeout": budget}
            cpu_before = _cpu_seconds(process.pid)
            verdict, outcome = self._ask(process, request, time_limit)
            if outcome == "timeout" and cpu_before is not None:
                verdict, outcome = self._wait_while_starved(process, time_limit, cpu_before)
            overdue = outcome == "timeout" or outcome.startswith(_WORKER_STARVED)
            if overdue or process.poll() is not None:
                self._kill(process)
                self.workers_killed += overdue
            else:
                with self._lock:
                    self._idle.append(process)
            return verdict, outcome

    def close(self) -> None:
        """Stop every idle worker (workers busy in another thread stop when they are handed back)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for process in idle:
            self._kill(process)


_shared_pool: MathVerifyPool | None = None
_shared_pool_lock = threading.Lock()


def shared_pool() -> MathVerifyPool:
    """The process-wide pool every :class:`MathGrader` uses unless it is given its own; a forked child gets its own."""
    global _shared_pool
    with _shared_pool_lock:
        if _shared_pool is None:
            _shared_pool = MathVerifyPool(max_workers=2)
        return _shared_pool


def _close_shared_pool() -> None:
    # Looks the pool up at exit rather than binding one at creation: a forked child that exits normally runs the
    # atexit handlers it inherited, and must close only its own workers, never the parent's.
    if _shared_pool is not None:
        _shared_pool.close()


def _forget_shared_pool_after_fork() -> None:
    # A forked child inherits the parent's pool object, whose workers' pipes it would then share: a request from the
    # child could read the parent's reply. Dropping the reference (not closing it) leaves those workers to the
    # parent; the child starts its own on first use. The lock is new because another parent thread may have held it
    # at the fork, and in the child nothing would ever release it.
    global _shared_pool, _shared_pool_lock
    _shared_pool = None
    _shared_pool_lock = threading.Lock()


atexit.register(_close_shared_pool)
os.register_at_fork(after_in_child=_forget_shared_pool_after_fork)
