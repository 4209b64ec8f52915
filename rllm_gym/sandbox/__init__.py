"""Isolated execution of untrusted, model-written Python: limits, namespaces, a memory cgroup and a warm fork server.

``run_python(code, stdin=..., timeout=...)`` runs a program and returns a :class:`SandboxResult` whose ``status`` says
how it ended (``ok``, ``runtime_error``, ``killed``, ``timeout``, ``memory_limit``, ``output_limit``,
``sandbox_error``) and whose ``isolation`` lists what was in effect. ``await arun_python(...)`` is the same without
blocking the event loop; any number may run at once (the sandbox queues them past ``max_parallel``).
``Sandbox.run_pair(solution, harness)`` runs trusted test code (the harness) and model code (the solution) as two
such runs joined by a channel that carries calls and plain-data return values only (:mod:`rllm_gym.sandbox._channel`):
the verdict of a function test is never decided in the process that runs model code.

How: a small warm interpreter (the "zygote", :mod:`rllm_gym.sandbox._zygote`, standard library only, started with a
scrubbed environment) forks one child per run, which is several times cheaper than starting ``python -c``. Isolation
layers, each listed in ``SandboxResult.isolation`` only when it is really in effect:

* ``rlimits``: CPU time, address space (``memory_mb``), file size, open files, no core dumps, and the process count
  (``max_processes``) when the run has its own uid (root is exempt from ``RLIMIT_NPROC``);
* ``tmpdir``: a fresh working directory, gone afterwards: with ``minimal_fs`` a private size-capped tmpfs on
  ``/sandbox`` (also ``HOME``, ``TMPDIR`` and, through links, ``/tmp`` and ``/dev/shm``) that no other run can see;
* ``scrubbed_env``: the code sees only ``PATH``, ``LANG``, ``HOME``/``TMPDIR`` (its workdir) and the ``env`` passed in,
  never the host's variables (no ``*_KEY``/``*_TOKEN``), neither in ``os.environ`` nor in ``/proc/self/environ``;
* ``session_kill``: the run is its own session; it is killed as a whole on timeout and after it ends;
* ``minimal_fs`` and ``readonly_fs``: the run's root is a new read-only tree holding ``/usr``, the interpreter and
  its virtual environment, a synthetic ``/etc`` (passwd, group, hosts), ``/dev/null``-style nodes, its own ``/proc``
  and ``/tmp``: the project's source and data files (the package folders are covered even inside site-packages), the
  user's home, the host's working directory and other runs' files do not exist for it;
* ``netns``/``ipcns``: each run has its own empty network namespace (no interface up, no abstract unix socket shared
  with another run) and IPC namespace (SysV shared memory, semaphores, message queues, POSIX message queues), which
  die with it;
* ``pidns`` and ``private_proc``: each run is pid 1's child in its own PID namespace, so nothing it starts outlives it,
  and its ``/proc`` shows only its own processes; its supervisor (pid 1) stays root, out of the code's reach;
* ``unprivileged_uid``: the code runs as a fresh uid of its own, without capabilities or ``no_new_privs`` escapes,
  so it cannot signal, trace or read the host's processes or its supervisor;
* ``seccomp`` (x86-64): EPERM for new namespaces (``unshare``, ``setns``, ``clone`` with any ``CLONE_NEW*`` flag;
  ``clone3`` gets ENOSYS so libc falls back to ``clone``), ``mount``/``umount2``/``pivot_root``/``chroot`` and the new
  mount API, ``ptrace``, ``process_vm_*``, ``bpf``, ``keyctl``, ``perf_event_open``, ``userfaultfd``, ``kexec_*``,
  modules, ``io_uring`` and non-UNIX sockets;
* ``memory_cgroup``: ``memory_mb`` is also the limit of a memory cgroup (v1 ``memory.limit_in_bytes`` +
  ``memory.memsw``, or v2 ``memory.max``) that counts every page the run touches: anonymous, tmpfs, ``/dev/shm``,
  memfd, SysV shared memory; where no cgroup can be made, ``memory_rules`` says that seccomp refuses ``memfd_create``
  and ``shmget`` instead and ``/dev/shm`` is the capped tmpfs.

``strict=True`` (the default) refuses to run code when a layer of :data:`REQUIRED_LAYERS` is missing
(:class:`SandboxUnavailableError` names it); ``strict=False`` (or ``RLLM_GYM_SANDBOX_STRICT=0`` for the shared
sandbox) runs with what the OS allows (not root, not Linux) and ``isolation`` says so. A failure of the sandbox
itself is ``sandbox_error``: graders must never score it as a wrong answer, and nothing the code does can cause it.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import itertools
import json
import os
import queue
import secrets
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

__all__ = [
    "REQUIRED_LAYERS",
    "ExecutionStatus",
    "PairResult",
    "Sandbox",
    "SandboxResult",
    "SandboxUnavailableError",
    "arun_python",
    "default_sandbox",
    "run_python",
]

_FRAME = struct.Struct("!I")
_ZYGOTE = Path(__file__).with_name("_zygote.py")
_BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
}
_STARTUP_TIMEOUT_S = 30.0
_GUARD_S = 30.0  # how long past its own timeout we wait for the zygote before calling the run a sandbox error
REQUIRED_LAYERS = (
    "rlimits",
    "tmpdir",
    "scrubbed_env",
    "session_kill",
    "minimal_fs",
    "readonly_fs",
    "netns",
    "ipcns",
    "pidns",
    "private_proc",
    "unprivileged_uid",
    "seccomp",
    "memory_cgroup|memory_rules",
)
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


def _sandbox_error(message: str, isolation: list[str] | None = None) -> SandboxResult:
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


def _result(reply: dict[str, Any], request: dict[str, Any], isolation: list[str], fds: list[int]) -> SandboxResult:
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


def _positive(name: str, value: Any, minimum: float = 0.0) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > minimum:
        raise ValueError(f"sandbox argument {name!r} must be a number > {minimum}, got {value!r}")


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
    """

    def __init__(
        self,
        max_parallel: int | None = None,
        isolate: bool = True,
        strict: bool = True,
        packages: list[str] | None = None,
        preload: list[str] | None = None,
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
        self.isolation: list[str] = []
        self._lock = threading.Lock()
        self._owner = os.getpid()
        self._ids = itertools.count()
        self._proc: subprocess.Popen | None = None
        self._view_base: str | None = None
        self._sock: socket.socket | None = None
        self._cgroup: str | None = None
        self._outbox: queue.Queue[tuple[bytes, list[int]] | None] = queue.Queue()
        self._futures: dict[int, tuple[concurrent.futures.Future, dict[str, Any]]] = {}
        self._log: Any = None

    @property
    def in_flight(self) -> int:
        """Runs submitted and not answered yet (queued in the zygote or running): what a caller's backpressure
        keeps bounded."""
        return len(self._futures)

    # Zygote life cycle

    def start(self) -> None:
        """Start the zygote now (otherwise the first run does); raises RuntimeError when it cannot start and
        :class:`SandboxUnavailableError` when it is strict and a required layer is missing."""
        with self._lock:
            if self._owner != os.getpid():  # a forked copy must not share the parent's zygote socket
                self.__init__(self.max_parallel, self.isolate, self.strict, self.packages, self.preload)
            if self._proc is not None and self._proc.poll() is None and self._sock is not None:
                return
            self._spawn()

    def _spawn(self) -> None:
        self._remove_view_base()  # a zygote that died before
        host, child = socket.socketpair()
        # An empty folder of the host's where the zygote, in its own mount namespace, assembles its view's root.
        self._view_base = tempfile.mkdtemp(prefix="rllm-sandbox-view-")
        # A random uid range per zygote: runs of two zygotes never share a uid (RLIMIT_NPROC counts per uid).
        config = {
            "max_parallel": self.max_parallel,
            "uid_base": 1_000_000 + secrets.randbelow(8_000_000) * 512,
            "isolate": self.isolate,
            "hidden": _project_folders(),
            "packages": self.packages,
            "view_base": self._view_base,
            "preload": self.preload,
        }
        argv = [sys.executable, "-I", str(_ZYGOTE), str(child.fileno()), json.dumps(config)]
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (the zygote's stderr, kept for error messages)
        try:
            self._proc = subprocess.Popen(
                argv,
                pass_fds=(child.fileno(),),
                env=dict(_BASE_ENV),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._log,
                start_new_session=True,
                cwd="/",
            )
        finally:
            child.close()
        host.settimeout(_STARTUP_TIMEOUT_S)
        try:
            hello = _read_frame(host)
        except (OSError, ValueError) as exc:
            hello = {"hello": False, "error": f"{type(exc).__name__}: {exc}"}
        if not hello or not hello.get("hello"):
            self._proc.kill()
            self._proc.wait()
            self._remove_view_base()
            raise RuntimeError(
                f"the sandbox zygote failed to start: {hello and hello.get('error')} {self._log_tail()}"
            )
        host.settimeout(None)
        self.isolation = list(hello["isolation"])
        self._cgroup = hello.get("cgroup")
        missing = [layer for layer in REQUIRED_LAYERS if not set(layer.split("|")) & set(self.isolation)]
        if self.strict and missing:
            host.close()
            self._proc.wait()
            self._remove_view_base()
            raise SandboxUnavailableError(
                f"the sandbox cannot isolate model code here: missing layers {missing} (in effect: {self.isolation})."
                " It needs Linux, root (or a container with CAP_SYS_ADMIN) and x86-64 for seccomp; pass "
                "Sandbox(strict=False) or set RLLM_GYM_SANDBOX_STRICT=0 to run with weaker isolation at your own risk"
            )
        self._sock = host
        self._outbox = queue.Queue()
        threading.Thread(target=self._reader, args=(host, self._proc), name="sandbox-reader", daemon=True).start()
        threading.Thread(target=self._writer, args=(host, self._outbox), name="sandbox-writer", daemon=True).start()

    def _log_tail(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read()[-2000:].decode(errors="replace")

    def close(self) -> None:
        """Stop the zygote; runs in flight end as sandbox errors."""
        with self._lock:
            if self._sock is not None:
                self._outbox.put(None)
                self._sock.shutdown(socket.SHUT_RDWR)
                self._sock = None
            if self._proc is not None:
                try:
                    self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
                self._proc = None
            if self._cgroup is not None:  # the zygote empties it; only the host still sees it by path
                _remove_cgroup(self._cgroup)
                self._cgroup = None
            self._remove_view_base()

    def _remove_view_base(self) -> None:
        """The view's mounts lived in the zygote's mount namespace: on the host the folder is empty."""
        if self._view_base is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self._view_base)
            self._view_base = None

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

    def _reader(self, sock: socket.socket, proc: subprocess.Popen) -> None:
        frames = _FrameReader(sock)
        while True:
            try:
                reply, fds = frames.read()
            except (OSError, ValueError):
                reply, fds = None, []
            if reply is None:
                break
            with self._lock:
                entry = self._futures.pop(reply["id"], None)
            if entry is None or len(fds) != 2 * (1 + ("solution" in reply)):
                for fd in fds:
                    os.close(fd)
                continue
            future, request = entry
            result = _result(reply, request, self.isolation, fds[:2])
            if "solution" in reply:
                result = PairResult(result, _result(reply["solution"], request, self.isolation, fds[2:]))
            future.set_result(result)
        # The zygote is gone: every run still waiting is an infrastructure failure, and the next run restarts it.
        with self._lock:
            if self._sock is sock:
                self._sock = None
            waiting = [entry for key, entry in self._futures.items() if entry[1]["zygote"] is proc]
            for key in [key for key, entry in self._futures.items() if entry[1]["zygote"] is proc]:
                del self._futures[key]
        message = f"the sandbox zygote exited (code {proc.poll()}) during the run {self._log_tail()}".strip()
        for future, request in waiting:
            error = _sandbox_error(message, self.isolation)
            future.set_result(PairResult(error, error) if request.get("pair") else error)

    # Runs

    def _submit(self, request: dict[str, Any], harness: str | None = None) -> concurrent.futures.Future:
        # The run's data travels as memfds the zygote passes on unread (see _zygote.py): the solution's payload,
        # then, for a pair, the harness's (the tests), so that no run's data sits in the memory runs are forked from.
        payload = {key: request.pop(key) for key in ("code", "stdin", "files")}
        fds = [_memfd("rllm-run", json.dumps(payload))]
        if harness is not None:
            fds.append(_memfd("rllm-harness", json.dumps({"code": harness, "stdin": "", "files": {}})))
            request["pair"] = True
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            self.start()
        except SandboxUnavailableError:
            for fd in fds:
                os.close(fd)
            raise
        except (RuntimeError, OSError) as exc:
            for fd in fds:
                os.close(fd)
            error = _sandbox_error(str(exc))
            future.set_result(PairResult(error, error) if request.get("pair") else error)
            return future
        with self._lock:
            request["id"] = next(self._ids)
            request["nfds"] = len(fds)
            payload = json.dumps(request).encode()
            request["zygote"] = self._proc
            self._futures[request["id"]] = (future, request)
            self._outbox.put((_FRAME.pack(len(payload)) + payload, fds))
        return future

    def submit(self, code: str, **kwargs: Any) -> concurrent.futures.Future:
        """Queue a run (same arguments as :func:`run_python`); the future's result is a :class:`SandboxResult`."""
        return self._submit(_request(code, **kwargs))

    def submit_pair(self, solution: str, harness: str, **kwargs: Any) -> concurrent.futures.Future:
        """Queue a paired run (see :meth:`run_pair`); the future's result is a :class:`PairResult`."""
        if not isinstance(harness, str):
            raise TypeError(f"sandbox harness must be a str, got {type(harness).__name__}")
        return self._submit(_request(solution, **kwargs), harness)

    def run(self, code: str, **kwargs: Any) -> SandboxResult:
        """Run one program and wait for it; see :func:`run_python`."""
        return self._wait(self.submit(code, **kwargs), kwargs.get("timeout", 5.0), pair=False)

    def run_pair(self, solution: str, harness: str, **kwargs: Any) -> PairResult:
        """Run model code (``solution``) and trusted test code (``harness``) as two sandboxed processes.

        The solution's program runs as ``__main__``, then serves calls; the harness imports ``_rllm_channel`` and
        calls ``_rllm_channel.remote("name")(*args)``, which returns the solution's plain-data result or raises
        ``_rllm_channel.RemoteError`` (the builtin exception of the same name when the solution's function raised
        an ordinary one; see ``_channel.failures``). Both runs get the keyword arguments of :func:`run_python`
        (``stdin`` goes to the solution); the solution is stopped when the harness ends.
        """
        return self._wait(self.submit_pair(solution, harness, **kwargs), kwargs.get("timeout", 5.0), pair=True)

    def _wait(self, future: concurrent.futures.Future, timeout: float, pair: bool) -> Any:
        try:
            return future.result(timeout=timeout + _GUARD_S)
        except concurrent.futures.TimeoutError:
            error = _sandbox_error("the sandbox zygote did not answer in time", self.isolation)
            return PairResult(error, error) if pair else error

    async def arun(self, code: str, **kwargs: Any) -> SandboxResult:
        """Run one program without blocking the event loop; see :func:`run_python`."""
        await self._astart()
        return await self._await(self.submit(code, **kwargs), kwargs.get("timeout", 5.0), pair=False)

    async def arun_pair(self, solution: str, harness: str, **kwargs: Any) -> PairResult:
        """:meth:`run_pair` without blocking the event loop."""
        await self._astart()
        future = self.submit_pair(solution, harness, **kwargs)
        return await self._await(future, kwargs.get("timeout", 5.0), pair=True)

    async def _astart(self) -> None:
        if self._sock is None or self._owner != os.getpid():
            await asyncio.to_thread(self._start_quietly)

    async def _await(self, future: concurrent.futures.Future, timeout: float, pair: bool) -> Any:
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout + _GUARD_S)
        except TimeoutError:
            error = _sandbox_error("the sandbox zygote did not answer in time", self.isolation)
            return PairResult(error, error) if pair else error

    def _start_quietly(self) -> None:
        with contextlib.suppress(RuntimeError, OSError):  # submit() reports the failure (or raises, when strict)
            self.start()


def _project_folders() -> list[str]:
    """The folders of this project's packages: the sandbox's view covers them wherever they are installed."""
    import importlib.util

    folders = []
    for name in ("rllm_gym", "rllm_gym.envs", "rllm_gym.agents", "rllm_gym.train"):
        spec = importlib.util.find_spec(name)
        for location in (spec.submodule_search_locations or []) if spec else []:
            folders.append(os.path.realpath(location))
    return sorted(set(folders))


def _remove_cgroup(path: str) -> None:
    with contextlib.suppress(OSError):
        for entry in os.listdir(path):
            if entry.startswith("slot-"):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(path, entry))
        os.rmdir(path)


def _memfd(name: str, text: str) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        data = text.encode("utf-8")
        while data:
            data = data[os.write(fd, data) :]
    except BaseException:
        os.close(fd)
        raise
    return fd


class _FrameReader:
    """Length-prefixed JSON frames from the zygote, each with the fds (``nfds``) sent along with it."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buffer, self.fds = sock, bytearray(), collections.deque()

    def read(self) -> tuple[dict[str, Any] | None, list[int]]:
        while True:
            if len(self.buffer) >= 4:
                (size,) = _FRAME.unpack_from(self.buffer)
                if len(self.buffer) >= 4 + size:
                    message = json.loads(self.buffer[4 : 4 + size])
                    del self.buffer[: 4 + size]
                    count = message.get("nfds", 0)
                    return message, [self.fds.popleft() for _ in range(count) if self.fds]
            data, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 20, 64)
            self.fds.extend(fds)
            if not data:
                for fd in self.fds:
                    os.close(fd)
                return None, []
            self.buffer += data


def _read_frame(sock: socket.socket) -> dict[str, Any] | None:
    header = _recv_exactly(sock, 4)
    if header is None:
        return None
    body = _recv_exactly(sock, _FRAME.unpack(header)[0])
    return None if body is None else json.loads(body)


def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks, missing = [], size
    while missing:
        chunk = sock.recv(min(missing, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


def _request(
    code: str,
    *,
    stdin: str = "",
    timeout: float = 5.0,
    memory_mb: int = 512,
    cpu_time_s: float | None = None,
    max_output_bytes: int = 1 << 20,
    file_size_mb: int = 16,
    max_processes: int = 32,
    files: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    argv: list[str] | None = None,
    filename: str = "main.py",
) -> dict[str, Any]:
    if not isinstance(code, str):
        raise TypeError(f"sandbox code must be a str, got {type(code).__name__}")
    if not isinstance(stdin, str):
        raise TypeError(f"sandbox stdin must be a str, got {type(stdin).__name__}")
    _positive("timeout", timeout)
    _positive("memory_mb", memory_mb, 16)
    _positive("max_output_bytes", max_output_bytes)
    _positive("file_size_mb", file_size_mb)
    _positive("max_processes", max_processes)
    cpu_time_s = timeout if cpu_time_s is None else cpu_time_s
    _positive("cpu_time_s", cpu_time_s)
    for label, mapping in (("files", files), ("env", env)):
        if mapping is not None and (
            not isinstance(mapping, dict) or not all(isinstance(v, str) for v in [*mapping, *mapping.values()])
        ):
            raise TypeError(f"sandbox {label} must be a dict of str -> str, got {mapping!r:.100}")
    if argv is not None and (not isinstance(argv, (list, tuple)) or isinstance(argv, str)):
        raise TypeError(f"sandbox argv must be a list of arguments such as ['--n', '3'], got {argv!r:.100}")
    files = dict(files or {})
    for name in [*files, filename]:
        if not isinstance(name, str) or not name or "/" in name or name in {".", ".."}:
            raise ValueError(
                f"sandbox file names must be plain names inside the workdir such as 'data.txt', got {name!r}"
            )
    return {
        "code": code,
        "stdin": stdin,
        "timeout": float(timeout),
        "memory_mb": int(memory_mb),
        "cpu_time_s": float(cpu_time_s),
        "max_output_bytes": int(max_output_bytes),
        "file_size_mb": int(file_size_mb),
        "max_processes": int(max_processes),
        "files": files,
        "env": {**_BASE_ENV, **(env or {})},
        "argv": [str(arg) for arg in argv or []],
        "filename": filename,
    }


_default: Sandbox | None = None
_default_lock = threading.Lock()


def default_sandbox() -> Sandbox:
    """The process-wide sandbox that :func:`run_python` and :func:`arun_python` use (one per process after a fork).

    Strict unless the environment variable ``RLLM_GYM_SANDBOX_STRICT`` is ``0``.
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = Sandbox(strict=os.environ.get("RLLM_GYM_SANDBOX_STRICT", "1") != "0")
            atexit.register(_default.close)
        return _default


def run_python(
    code: str,
    *,
    stdin: str = "",
    timeout: float = 5.0,
    memory_mb: int = 512,
    cpu_time_s: float | None = None,
    max_output_bytes: int = 1 << 20,
    file_size_mb: int = 16,
    max_processes: int = 32,
    files: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    argv: list[str] | None = None,
    sandbox: Sandbox | None = None,
) -> SandboxResult:
    """Run untrusted Python source as ``__main__`` in the sandbox and wait for it.

    Args:
        code: the program. stdin: fed to its standard input. timeout: wall-clock seconds.
        memory_mb: address-space limit. cpu_time_s: CPU-time limit (default: ``timeout``).
        max_output_bytes: cap per stream; past it the run is killed (``output_limit``, ``truncated=True``).
        file_size_mb: largest file it may write (the workdir holds twice that). max_processes: processes it may run.
        files: extra ``{name: text}`` written into its working directory. env: extra environment variables.
        argv: its ``sys.argv[1:]``. sandbox: a :class:`Sandbox` to use instead of :func:`default_sandbox`.

    Bad arguments raise ``ValueError``/``TypeError``; everything that goes wrong at run time is in the result.
    """
    kwargs = {
        "stdin": stdin,
        "timeout": timeout,
        "memory_mb": memory_mb,
        "cpu_time_s": cpu_time_s,
        "max_output_bytes": max_output_bytes,
        "file_size_mb": file_size_mb,
        "max_processes": max_processes,
        "files": files,
        "env": env,
        "argv": argv,
    }
    return (sandbox or default_sandbox()).run(code, **kwargs)


async def arun_python(code: str, *, sandbox: Sandbox | None = None, **kwargs: Any) -> SandboxResult:
    """:func:`run_python` for asyncio: awaits the run without blocking the loop. Takes the same keyword arguments."""
    _request(code, **kwargs)  # bad arguments raise here, in the caller's frame
    return await (sandbox or default_sandbox()).arun(code, **kwargs)
