"""Isolated execution of untrusted, model-written Python: limits, namespaces and a warm fork server.

``run_python(code, stdin=..., timeout=...)`` runs a program and returns a :class:`SandboxResult` whose ``status`` says
how it ended (``ok``, ``runtime_error``, ``timeout``, ``memory_limit``, ``output_limit``, ``sandbox_error``) and
whose ``isolation`` lists what was in effect. ``await arun_python(...)`` is the same without blocking the event loop;
any number may run at once (the sandbox queues them past ``max_parallel``).

How: a small warm interpreter (the "zygote", :mod:`rllm_gym.sandbox._zygote`, standard library only, started with a
scrubbed environment) forks one child per run, which is ~5x cheaper than starting ``python -c``. Isolation layers,
each listed in ``SandboxResult.isolation`` only when it is really in effect:

* ``rlimits``: CPU time, address space (``memory_mb``), file size, open files, no core dumps, and the process count
  (``max_processes``) when the run has its own uid (root is exempt from ``RLIMIT_NPROC``);
* ``tmpdir``: a fresh working directory, removed afterwards (a size-capped tmpfs of its own under namespaces);
* ``scrubbed_env``: the code sees only ``PATH``, ``LANG``, ``HOME``/``TMPDIR`` (its workdir) and the ``env`` passed in,
  never the host's variables (no ``*_KEY``/``*_TOKEN``), neither in ``os.environ`` nor in ``/proc/self/environ``;
* ``session_kill``: the run is its own session; it is killed as a whole on timeout and after it ends;
* ``netns``/``ipcns``: an empty network namespace (not even loopback is up), so no connection leaves the sandbox;
* ``readonly_fs``: a mount namespace where every mount is read-only: nothing outside the workdir can be written,
  through any file API; ``hidepid_proc``: ``/proc`` shows no other user's processes;
* ``pidns``: each run is PID 1's child in its own PID namespace, so nothing it starts outlives it;
* ``unprivileged_uid``: the code runs as a fresh uid of its own, without capabilities or ``no_new_privs`` escapes,
  so it cannot signal, trace or read the host's processes;
* ``seccomp``: a deny list (ptrace, mount, unshare, bpf, io_uring, non-UNIX sockets, ...) on x86-64.

Where the OS refuses a layer (not root, not Linux) the run still happens with what is left, and ``isolation`` says
so. A failure of the sandbox itself is ``sandbox_error``: graders must never score it as a wrong answer.
"""

from __future__ import annotations

import asyncio
import atexit
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

__all__ = ["ExecutionStatus", "Sandbox", "SandboxResult", "arun_python", "default_sandbox", "run_python"]

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


class ExecutionStatus(str, Enum):
    """How a run ended. Grading outcomes (passed, wrong answer) live in :mod:`rllm_gym.rewards.code`."""

    OK = "ok"  # exited with status 0
    RUNTIME_ERROR = "runtime_error"  # non-zero exit status or killed by a signal (traceback in stderr)
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
    if reply.get("verdict") == "timeout":
        return ExecutionStatus.TIMEOUT, None
    if reply.get("verdict") == "output_limit":
        return ExecutionStatus.OUTPUT_LIMIT, None
    if reply.get("wait_status") is None:
        return ExecutionStatus.SANDBOX_ERROR, None
    exit_code = os.waitstatus_to_exitcode(reply["wait_status"])
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
    return ExecutionStatus.RUNTIME_ERROR, exit_code


def _positive(name: str, value: Any, minimum: float = 0.0) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > minimum:
        raise ValueError(f"sandbox argument {name!r} must be a number > {minimum}, got {value!r}")


class Sandbox:
    """A warm zygote process and the runs it serves. Thread- and fork-safe; cheap to keep for the whole program.

    Args:
        max_parallel: runs executing at once (more are queued, and their timeout starts when they start).
        isolate: False skips the namespace, uid and seccomp layers (rlimits, workdir, env scrubbing stay): for
            debugging only.
    """

    def __init__(self, max_parallel: int | None = None, isolate: bool = True):
        max_parallel = max_parallel if max_parallel is not None else max(4, 2 * (os.cpu_count() or 1))
        if isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or not 1 <= max_parallel <= 256:
            raise ValueError(f"Sandbox max_parallel must be an int in [1, 256], got {max_parallel!r}")
        self.max_parallel, self.isolate = max_parallel, bool(isolate)
        self.isolation: list[str] = []
        self._lock = threading.Lock()
        self._owner = os.getpid()
        self._ids = itertools.count()
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._outbox: queue.Queue[bytes | None] = queue.Queue()
        self._futures: dict[int, tuple[concurrent.futures.Future, dict[str, Any]]] = {}
        self._log: Any = None

    # Zygote life cycle

    def start(self) -> None:
        """Start the zygote now (otherwise the first run does); raises RuntimeError when it cannot start."""
        with self._lock:
            if self._owner != os.getpid():  # a forked copy must not share the parent's zygote socket
                self.__init__(self.max_parallel, self.isolate)
            if self._proc is not None and self._proc.poll() is None and self._sock is not None:
                return
            self._spawn()

    def _spawn(self) -> None:
        host, child = socket.socketpair()
        # A random uid range per zygote: runs of two zygotes never share a uid (RLIMIT_NPROC counts per uid).
        config = {
            "max_parallel": self.max_parallel,
            "uid_base": 1_000_000 + secrets.randbelow(8_000_000) * 256,
            "isolate": self.isolate,
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
            raise RuntimeError(
                f"the sandbox zygote failed to start: {hello and hello.get('error')} {self._log_tail()}"
            )
        host.settimeout(None)
        self.isolation = list(hello["isolation"])
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

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _writer(self, sock: socket.socket, outbox: queue.Queue) -> None:
        while (data := outbox.get()) is not None:
            try:
                sock.sendall(data)
            except OSError:
                return

    def _reader(self, sock: socket.socket, proc: subprocess.Popen) -> None:
        while True:
            try:
                reply = _read_frame(sock)
            except (OSError, ValueError):
                reply = None
            if reply is None:
                break
            with self._lock:
                entry = self._futures.pop(reply["id"], None)
            if entry is not None:
                future, request = entry
                status, exit_code = _classify(reply, request)
                future.set_result(
                    SandboxResult(
                        status=status,
                        stdout=reply["stdout"],
                        stderr=reply["stderr"],
                        exit_code=exit_code,
                        duration_s=reply["duration_s"],
                        isolation=list(self.isolation),
                        truncated=reply["truncated"],
                        max_rss_mb=None if reply["max_rss_kb"] is None else reply["max_rss_kb"] / 1024,
                        error=reply["error"],
                    )
                )
        # The zygote is gone: every run still waiting is an infrastructure failure, and the next run restarts it.
        with self._lock:
            if self._sock is sock:
                self._sock = None
            waiting = [entry for key, entry in self._futures.items() if entry[1]["zygote"] is proc]
            for key in [key for key, entry in self._futures.items() if entry[1]["zygote"] is proc]:
                del self._futures[key]
        message = f"the sandbox zygote exited (code {proc.poll()}) during the run {self._log_tail()}".strip()
        for future, _ in waiting:
            future.set_result(_sandbox_error(message, self.isolation))

    # Runs

    def submit(self, code: str, **kwargs: Any) -> concurrent.futures.Future:
        """Queue a run (same arguments as :func:`run_python`); the future's result is a :class:`SandboxResult`."""
        request = _request(code, **kwargs)
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            self.start()
        except (RuntimeError, OSError) as exc:
            future.set_result(_sandbox_error(str(exc)))
            return future
        with self._lock:
            request["id"] = next(self._ids)
            payload = json.dumps(request).encode()
            request["zygote"] = self._proc
            self._futures[request["id"]] = (future, request)
            self._outbox.put(_FRAME.pack(len(payload)) + payload)
        return future

    def run(self, code: str, **kwargs: Any) -> SandboxResult:
        """Run one program and wait for it; see :func:`run_python`."""
        future = self.submit(code, **kwargs)
        try:
            return future.result(timeout=kwargs.get("timeout", 5.0) + _GUARD_S)
        except concurrent.futures.TimeoutError:
            return _sandbox_error("the sandbox zygote did not answer in time", self.isolation)

    async def arun(self, code: str, **kwargs: Any) -> SandboxResult:
        """Run one program without blocking the event loop; see :func:`run_python`."""
        if self._sock is None or self._owner != os.getpid():
            await asyncio.to_thread(self._start_quietly)
        future = asyncio.wrap_future(self.submit(code, **kwargs))
        try:
            return await asyncio.wait_for(future, kwargs.get("timeout", 5.0) + _GUARD_S)
        except asyncio.TimeoutError:
            return _sandbox_error("the sandbox zygote did not answer in time", self.isolation)

    def _start_quietly(self) -> None:
        with contextlib.suppress(RuntimeError, OSError):  # submit() turns the failure into a sandbox_error result
            self.start()


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
    """The process-wide sandbox that :func:`run_python` and :func:`arun_python` use (one per process after a fork)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Sandbox()
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
