"""The :class:`Sandbox`: the host's handle on one warm zygote process (``_zygote.py``, started as a script) and the
runs it serves; requests go out on a writer thread, replies come back on a reader thread that resolves futures.

A run goes to the zygote only once the process's :data:`~rllm_gym.sandbox._gate.GATE` admits its class, and at most
``max_parallel`` at a time, so its timeout and the host's watchdog both count from when it really starts."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import itertools
import json
import os
import queue
import socket
import subprocess
import threading
import time
from typing import Any

from rllm_gym.sandbox import _gate
from rllm_gym.sandbox._result import PairResult, SandboxResult, SandboxUnavailableError, failure, result_of
from rllm_gym.sandbox._spawn import ZygoteProcess
from rllm_gym.sandbox._wire import FRAME, FrameReader, build_request, memfd
from rllm_gym.slots import slot_lent

_GUARD_S = 30.0  # how long past its own timeout we wait for the zygote before calling the run a sandbox error
_sandbox_ids = itertools.count()


class Sandbox:
    """A warm zygote process and the runs it serves. Thread- and fork-safe; cheap to keep for the whole program.

    Args:
        max_parallel: runs executing at once (more are queued, and their timeout starts when they start); a
            :meth:`run_pair` counts as one.
        isolate: False skips the namespace, view, uid, cgroup and seccomp layers (rlimits, workdir, env scrubbing
            stay): for debugging and for measuring what isolation costs; needs ``strict=False``.
        strict: refuse to run code (:class:`SandboxUnavailableError`) unless every layer of
            :data:`REQUIRED_LAYERS` is in effect.
        packages: the third-party packages the code may import: None (default) for every package installed in the
            interpreter's environment, or a list of top-level import names (``[]``: the standard library only).
            The project's own packages are never visible.
        preload: modules the zygote imports once (inside its view, before any run) so that every run forks with
            them loaded: for trusted scoring code with a slow import (``["reasoning_gym"]``: ~1 s a run -> a fork).
            A run cannot change what the next one gets (each is a fork of the zygote). Runs inherit their address
            space, so ``memory_mb`` must leave room for it.
        read_view: False (default, for model-written code): where the kernel has Landlock, a run's program opens
            no file outside its own working folder (layer ``landlock``), so it imports only what the zygote
            holds: the whole standard library, ``preload`` and the ``packages`` listed (imported by the zygote).
            True lets runs read the view's files, as trusted scorers that load their own data files lazily need
            (reasoning-gym's).

    ``landlock_abi`` (once started): the kernel's Landlock ABI in force for runs, 0 where it is not (a warning says
    so once); ``isolation`` lists ``landlock`` when it is.
    """

    def __init__(
        self,
        max_parallel: int | None = None,
        isolate: bool = True,
        strict: bool = True,
        packages: list[str] | None = None,
        preload: list[str] | None = None,
        read_view: bool = False,
    ):
        max_parallel = max_parallel if max_parallel is not None else max(4, 2 * (os.cpu_count() or 1))
        if isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or not 1 <= max_parallel <= 256:
            raise ValueError(f"Sandbox max_parallel must be an int in [1, 256], got {max_parallel!r}")
        if strict and not isolate:
            raise ValueError("Sandbox(isolate=False) runs code without isolation: pass strict=False as well")
        if packages is not None and (
            isinstance(packages, str) or not all(isinstance(p, str) and p.isidentifier() for p in packages)
        ):
            raise ValueError(
                f"Sandbox packages must be None or a list of import names such as ['numpy'], got {packages!r}"
            )
        self.max_parallel, self.isolate, self.strict = max_parallel, bool(isolate), bool(strict)
        self.packages = None if packages is None else list(packages)
        if preload is not None and (
            isinstance(preload, str)
            or not all(isinstance(m, str) and m.replace(".", "_").isidentifier() for m in preload)
        ):
            raise ValueError(
                f"Sandbox preload must be None or a list of module names such as ['sympy'], got {preload!r}"
            )
        self.preload = list(preload or [])
        self.read_view = bool(read_view)
        self.isolation: list[str] = []
        self.landlock_abi = 0
        self._lock = threading.Lock()
        self._owner = os.getpid()
        self._ids = itertools.count()
        self._zygote: ZygoteProcess | None = None
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._outbox: queue.Queue[tuple[bytes, list[int]] | None] = queue.Queue()
        self._futures: dict[int, _Pending] = {}  # submitted and not answered: queued, ready, sent
        self._ready: collections.deque[_Pending] = collections.deque()  # admitted by the gate, not sent yet
        self._running = 0  # sent to the zygote and not answered
        self._ended = 0  # over, with a result the gate has not released yet
        self._name = f"{os.getpid()}-{next(_sandbox_ids)}"

    @property
    def in_flight(self) -> int:
        """Runs submitted and not over yet (waiting for their class's turn, or running): what a caller's backpressure
        keeps bounded. A verdict run whose result only waits for its release level is over (see :meth:`wait`)."""
        return len(self._futures) - self._ended

    @property
    def schedule(self) -> list[dict[str, Any]]:
        """The gate's records of this sandbox's recent runs, oldest first: ``id``, ``run_class``, ``admitted_seq`` and
        ``released_seq`` (one count for every run of the process: two runs overlapped when their ranges cross),
        ``admitted_at``, ``finished_at``, ``released_at`` (``time.monotonic()``) and ``level_s`` (the release level a
        verdict or exclusive run waited for; None for a visible one). See :mod:`rllm_gym.sandbox._gate`."""
        return [record for record in list(_gate.GATE.history) if record.get("sandbox") == self._name]

    # Zygote life cycle

    @property
    def _view_base(self) -> str | None:
        return None if self._zygote is None else self._zygote.view_base

    def start(self) -> None:
        """Start the zygote now (otherwise the first run does); raises RuntimeError when it cannot start and
        :class:`SandboxUnavailableError` when it is strict and a required layer is missing."""
        with self._lock:
            if self._owner != os.getpid():  # a forked copy must not share the parent's zygote socket
                self.__init__(
                    self.max_parallel, self.isolate, self.strict, self.packages, self.preload, self.read_view
                )
            if self._proc is not None and self._proc.poll() is None and self._sock is not None:
                return
            if self._zygote is not None:  # one that died before: what it left on the host goes
                self._zygote.stop()
                self._zygote = None
            options = {
                "max_parallel": self.max_parallel,
                "isolate": self.isolate,
                "packages": self.packages,
                "preload": self.preload,
                "read_view": self.read_view,
            }
            zygote = ZygoteProcess.start(options, self.strict)
            self._zygote, self._proc, self._sock = zygote, zygote.proc, zygote.sock
            self.isolation, self.landlock_abi = zygote.isolation, zygote.landlock_abi
            self._outbox = queue.Queue()
            reader = threading.Thread(target=self._reader, args=(zygote,), name="sandbox-reader", daemon=True)
            reader.start()
            writer = threading.Thread(target=self._writer, args=(zygote.sock, self._outbox), name="sandbox-writer")
            writer.daemon = True
            writer.start()

    def close(self) -> None:
        """Stop the zygote; runs in flight end as sandbox errors."""
        with self._lock:
            if self._sock is not None:
                self._outbox.put(None)
                self._sock = None
            if self._zygote is not None:
                self._zygote.stop()
                self._zygote = None
            self._proc = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _writer(self, sock: socket.socket, outbox: queue.Queue) -> None:
        while (item := outbox.get()) is not None:
            data, fds = item
            try:
                if fds:  # the fds travel with the frame's first bytes
                    sent = socket.send_fds(sock, [data], fds)
                    sock.sendall(data[sent:])
                else:
                    sock.sendall(data)
            except OSError:
                return
            finally:
                for fd in fds:
                    os.close(fd)

    def _reader(self, zygote: ZygoteProcess) -> None:
        sock, proc = zygote.sock, zygote.proc
        frames = FrameReader(sock)
        while True:
            try:
                reply, fds = frames.read()
            except (OSError, ValueError):
                reply, fds = None, []
            if reply is None:
                break
            with self._lock:
                entry = self._futures.get(reply["id"])
                if entry is not None and entry.state == "sent":
                    entry.state, self._running = "ending", self._running - 1
                else:
                    entry = None
            if entry is None or len(fds) != 2 * (1 + ("solution" in reply)):
                for fd in fds:
                    os.close(fd)
                if entry is not None:
                    pair = bool(entry.request.get("pair"))
                    self._complete(entry, failure("the zygote's reply came without its outputs", None, pair))
                continue
            request = entry.request
            result = result_of(reply, request, self.isolation, fds[:2])
            if "solution" in reply:
                result = PairResult(result, result_of(reply["solution"], request, self.isolation, fds[2:]))
            self._complete(entry, result)
        # The zygote is gone: every run bound to it is an infrastructure failure, and the next run restarts it. A run
        # still waiting for its class's turn gets its failure when its turn comes (the gate's order holds for it too).
        message = f"the sandbox zygote exited (code {proc.poll()}) during the run {zygote.log_tail()}".strip()
        ending = []
        with self._lock:
            if self._sock is sock:
                self._sock = None
            for entry in list(self._futures.values()):
                if entry.request["zygote"] is not proc or entry.state in ("ending", "doomed"):
                    continue
                if entry.state == "sent":
                    self._running -= 1
                elif entry.state == "ready":
                    self._ready.remove(entry)
                entry.result = failure(message, self.isolation, bool(entry.request.get("pair")))
                if entry.state == "queued":
                    entry.state = "doomed"
                else:
                    entry.state = "ending"
                    ending.append(entry)
        for entry in ending:
            self._close_fds(entry)
            self._complete(entry, entry.result)

    # Runs

    def _submit(self, request: dict[str, Any], harness: str | None, run_class: str) -> concurrent.futures.Future:
        # The run's data travels as memfds the zygote passes on unread (see _zygote.py): the solution's payload,
        # then, for a pair, the harness's (the tests), so that no run's data sits in the memory runs are forked from.
        payload = {key: request.pop(key) for key in ("code", "stdin", "files")}
        fds = [memfd("rllm-run", json.dumps(payload))]
        if harness is not None:
            fds.append(memfd("rllm-harness", json.dumps({"code": harness, "stdin": "", "files": {}})))
            request["pair"] = True
        gate = _gate.GATE
        future = RunFuture(held=gate.enabled and run_class != "visible")
        try:
            self.start()
        except SandboxUnavailableError:
            for fd in fds:
                os.close(fd)
            raise
        except (RuntimeError, OSError) as exc:
            for fd in fds:
                os.close(fd)
            future.set_result(failure(str(exc), None, bool(request.get("pair"))))
            return future
        with self._lock:
            request["id"] = next(self._ids)
            request["nfds"] = len(fds)
            payload = json.dumps(request).encode()
            request["zygote"] = self._proc
            entry = _Pending(future, request, FRAME.pack(len(payload)) + payload, fds, gate)
            label = {"sandbox": self._name, "id": request["id"]}
            entry.ticket = _gate.Ticket(run_class, lambda: self._admitted(entry), label)
            self._futures[request["id"]] = entry
        gate.enter(entry.ticket)
        return future

    def _admitted(self, entry: _Pending) -> None:
        """The gate's turn for this run: it goes to the zygote as soon as fewer than ``max_parallel`` are there."""
        with self._lock:
            doomed = entry.state == "doomed"
            if doomed:
                entry.state = "ending"
            else:
                entry.state = "ready"
                self._ready.append(entry)
        if doomed:
            self._close_fds(entry)
            self._complete(entry, entry.result)
        self._pump()

    def _pump(self) -> None:
        stranded = []
        with self._lock:
            while self._ready and self._running < self.max_parallel:
                entry = self._ready.popleft()
                if self._sock is None:  # closed, or its zygote died since the run was admitted
                    entry.state = "ending"
                    stranded.append(entry)
                    continue
                entry.state, entry.request["zygote"] = "sent", self._proc
                self._running += 1
                self._outbox.put((entry.frame, entry.fds))  # the writer closes the fds once sent
                entry.fds = []
                watchdog_at = time.monotonic() + entry.request["timeout"] + _GUARD_S
                entry.gate.call_at(watchdog_at, lambda entry=entry: self._expire(entry))
        for entry in stranded:
            self._close_fds(entry)
            pair = bool(entry.request.get("pair"))
            self._complete(entry, failure("the sandbox zygote is gone", self.isolation, pair))

    def _expire(self, entry: _Pending) -> None:
        """The host's watchdog: the zygote has not answered well past the run's timeout."""
        with self._lock:
            if entry.state != "sent":
                return
            entry.state, self._running = "ending", self._running - 1
        pair = bool(entry.request.get("pair"))
        self._complete(entry, failure("the sandbox zygote did not answer in time", self.isolation, pair))

    def _complete(self, entry: _Pending, result: Any) -> None:
        """Hand ``result`` over when the gate releases the run (at once for a visible run), then send the next."""
        with self._lock:
            self._ended += 1

        def deliver() -> None:
            with self._lock:
                self._futures.pop(entry.request["id"], None)
                self._ended -= 1
                entry.state = "done"
            entry.future.set_result(result)

        entry.gate.finish(entry.ticket, deliver)
        entry.future.ended.set()  # after the gate's record of its end
        self._pump()

    @staticmethod
    def _close_fds(entry: _Pending) -> None:
        for fd in entry.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        entry.fds = []

    def _queue(self, code: str, kwargs: dict[str, Any], harness: str | None = None, pair: bool = False) -> Any:
        """Check the arguments (in the caller's frame) and queue the run; returns its future and its timeout."""
        if pair and not isinstance(harness, str):
            raise TypeError(f"sandbox harness must be a str, got {type(harness).__name__}")
        run_class = _gate.check_run_class(kwargs.pop("run_class", None))
        request = build_request(code, **kwargs)
        return self._submit(request, harness, run_class), request["timeout"]

    def submit(self, code: str, **kwargs: Any) -> concurrent.futures.Future:
        """Queue a run (same arguments as :func:`run_python`); the future's result is a :class:`SandboxResult`."""
        return self._queue(code, kwargs)[0]

    def submit_pair(self, solution: str, harness: str, **kwargs: Any) -> concurrent.futures.Future:
        """Queue a paired run (see :meth:`run_pair`); the future's result is a :class:`PairResult`."""
        return self._queue(solution, kwargs, harness, pair=True)[0]

    def run(self, code: str, **kwargs: Any) -> SandboxResult:
        """Run one program and wait for it; see :func:`run_python`."""
        return self.wait(*self._queue(code, kwargs), pair=False)

    def run_pair(self, solution: str, harness: str, **kwargs: Any) -> PairResult:
        """Run model code (``solution``) and trusted test code (``harness``) as two sandboxed processes.

        The solution's program runs (as a module named ``__solution__``, so its ``if __name__ == "__main__":``
        block does not), then serves calls; the harness imports ``_rllm_channel`` and
        calls ``_rllm_channel.remote("name")(*args)``, which returns the solution's plain-data result or raises
        ``_rllm_channel.RemoteError`` (the builtin exception of the same name when the solution's function raised
        an ordinary one; see :mod:`rllm_gym.sandbox.channel`). Both runs get the keyword arguments of
        :func:`run_python` (``stdin`` goes to the solution); the solution is stopped when the harness ends.
        """
        return self.wait(*self._queue(solution, kwargs, harness, pair=True), pair=True)

    def wait(self, future: concurrent.futures.Future, timeout: float | None = None, pair: bool = False) -> Any:
        """The result of a :meth:`submit` (or, with ``pair``, :meth:`submit_pair`) future. It always comes: a run
        the zygote has not answered 30 s past its ``timeout`` (counted from when it started, not while it waited for
        its class's turn) ends as a ``sandbox_error``. ``timeout`` and ``pair`` are kept for callers of the
        earlier signature and change nothing.

        A run whose result waits for its release level (a verdict or exclusive run) lends the calling thread's place
        (:func:`rllm_gym.slots.slot_lent`) from now, when it was submitted, to its release: the engine's env thread
        pool runs another env call meanwhile, and this one takes a place back when its result comes. Not when the
        run ends: a place freed then would let the run's duration (its hidden input's) decide when other episodes'
        work starts, and so reach a later visible run's clock past the release grid."""
        if isinstance(future, RunFuture) and future.held and not future.done():
            with slot_lent():
                future.result()
        return future.result()

    async def arun(self, code: str, **kwargs: Any) -> SandboxResult:
        """Run one program without blocking the event loop; see :func:`run_python`."""
        await self._astart()
        return await self._await(*self._queue(code, kwargs), pair=False)

    async def arun_pair(self, solution: str, harness: str, **kwargs: Any) -> PairResult:
        """:meth:`run_pair` without blocking the event loop."""
        await self._astart()
        return await self._await(*self._queue(solution, kwargs, harness, pair=True), pair=True)

    async def _astart(self) -> None:
        if self._sock is None or self._owner != os.getpid():
            await asyncio.to_thread(self._start_quietly)

    async def _await(self, future: concurrent.futures.Future, timeout: float, pair: bool) -> Any:
        return await asyncio.wrap_future(future)  # the host's watchdog answers a run the zygote does not

    def _start_quietly(self) -> None:
        with contextlib.suppress(RuntimeError, OSError):  # submit() reports the failure (or raises, when strict)
            self.start()


class RunFuture(concurrent.futures.Future):
    """A run's future. ``held``: its result waits for its release level (a verdict or exclusive run, the gate on).
    ``ended`` is set once the run is over (its process ended, or it failed), before its result is."""

    def __init__(self, held: bool = False) -> None:
        super().__init__()
        self.held = held
        self.ended = threading.Event()

    def set_result(self, result: Any) -> None:
        self.ended.set()
        super().set_result(result)


class _Pending:
    """A run between its submission and its result: ``state`` is ``queued`` (waiting for the gate), ``doomed`` (its
    zygote died while it waited: it fails when its turn comes), ``ready`` (admitted, waiting for a free place among
    ``max_parallel``), ``sent``, ``ending`` (its result is known, the gate may still hold it) or ``done``."""

    __slots__ = ("fds", "frame", "future", "gate", "request", "result", "state", "ticket")

    def __init__(self, future: RunFuture, request: dict, frame: bytes, fds: list[int], gate: Any):
        self.future, self.request, self.frame, self.fds, self.gate = future, request, frame, fds, gate
        self.ticket: Any = None
        self.state, self.result = "queued", None
