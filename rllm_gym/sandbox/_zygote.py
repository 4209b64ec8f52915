"""The sandbox's warm fork server ("zygote"): a small standard-library-only process that forks one child per run.

The host (:mod:`rllm_gym.sandbox`) starts this file as a script with ``python -I`` and a scrubbed environment, so
that it never inherits the host's imports (forking a process with torch loaded costs ~10 ms) or its secrets. At start
it enters new network, IPC and mount namespaces where the OS allows, makes every mount read-only, hides other users'
processes in ``/proc`` and mounts a root-owned tmpfs on ``/tmp`` for the per-run working directories. Each run is
forked into a fresh PID namespace, as its own unprivileged uid, with rlimits and a seccomp filter applied; the
wall-clock timeout and the output cap are enforced here; the isolation layers themselves live in ``_isolation.py``
beside this file. Requests and results are length-prefixed JSON frames on a socket the host passes as ``argv[1]``.
"""

from __future__ import annotations

# Modules a typical solution imports (and the run's own): loaded once here, so each forked run gets them free.
import atexit  # noqa: F401
import bisect  # noqa: F401
import collections
import contextlib
import functools  # noqa: F401
import heapq  # noqa: F401
import itertools  # noqa: F401
import json
import math  # noqa: F401
import os
import re  # noqa: F401
import selectors
import signal
import socket
import string  # noqa: F401
import struct
import sys
import tempfile
import threading  # noqa: F401  (joined at the end of each run)
import time
import traceback
import types

_FRAME = struct.Struct("!I")
_ZYGOTE_PID = os.getpid()


def _load_isolation() -> types.ModuleType:
    """The sibling ``_isolation.py``, loaded by path and kept out of ``sys.modules``.

    ``python -I`` leaves this script's folder off ``sys.path``, and putting it there would reach every run's
    ``sys.path`` (and the folders the mount namespace exposes); out of ``sys.modules``, a run's own ``_isolation.py``
    still imports as itself.
    """
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_isolation.py")
    spec = importlib.util.spec_from_file_location("_isolation", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_isolation = _load_isolation()
_libc = _isolation.libc


# One run: the two forked processes


def _enter_run(req: dict, workdir: str, uid: int | None, seccomp: bytes | None) -> None:
    """In the run's first process: drop privileges, apply limits and the environment (inherited by the code)."""
    os.setsid()
    # Dispositions a fresh ``python`` would have.
    for sig, handler in (
        (signal.SIGCHLD, signal.SIG_DFL),
        (signal.SIGTERM, signal.SIG_DFL),
        (signal.SIGINT, signal.default_int_handler),
        (signal.SIGPIPE, signal.SIG_IGN),
    ):
        signal.signal(sig, handler)
    signal.set_wakeup_fd(-1)
    _isolation.drop_privileges(uid, seccomp, _ZYGOTE_PID)
    _isolation.apply_rlimits(req, uid)
    os.chdir(workdir)
    os.environ.clear()
    os.environ.update(req["env"])
    os.environ.update({"HOME": workdir, "TMPDIR": workdir, "PWD": workdir})


def _run_code(req: dict, workdir: str) -> int:
    """Execute the solution as ``__main__`` in this (forked) interpreter and return its exit code."""
    sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115 (they live as long as the run)
    sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115 (they live as long as the run)
    sys.stderr = sys.__stderr__ = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)  # noqa: SIM115 (they live as long as the run)
    path = os.path.join(workdir, req["filename"])
    sys.argv = [path, *req["argv"]]
    sys.path[0:0] = [workdir]
    main = types.ModuleType("__main__")
    main.__file__ = path
    sys.modules["__main__"] = main
    code = 0
    try:
        exec(compile(req["code"], path, "exec"), main.__dict__)
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException as exc:
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        code = 1
    try:
        import atexit
        import threading

        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException:
        os.write(2, traceback.format_exc().encode(errors="replace"))
        code = code or 120  # what CPython exits with when flushing stdout fails
    return code


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _run_child(
    req: dict, workdir: str, uid: int | None, seccomp: bytes | None, fds: tuple[int, int, int, int]
) -> None:
    """Body of the run's first process: pid 1 of its PID namespace when available, parent of the solution."""
    stdin_fd, out_w, err_w, status_w = fds
    try:
        _enter_run(req, workdir, uid, seccomp)
        for target, fd in ((0, stdin_fd), (1, out_w), (2, err_w)):
            os.dup2(fd, target)
        _close_fds_from(3, keep=status_w)
        pid = os.fork()
        if pid == 0:
            os.close(status_w)
            os._exit(_run_code(req, workdir))
        for fd in (0, 1, 2):
            os.close(fd)
        # As the namespace's init we also reap orphans; return the solution's own status.
        while True:
            reaped, status = os.waitpid(-1, 0)
            if reaped == pid:
                break
        os.write(status_w, json.dumps({"wait_status": status}).encode())
        os._exit(0)
    except BaseException as exc:
        try:
            os.write(status_w, json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
        finally:
            os._exit(0)


def _close_fds_from(first: int, keep: int) -> None:
    """Close every fd >= first but ``keep``: the zygote's socket and the other runs' pipes must not leak in."""
    # os.closerange loops over close() up to the limit when Python was built without close_range(): ~20 ms.
    if _libc is not None and _libc.syscall(436, first, keep - 1, 0) == 0 and _libc.syscall(436, keep + 1, ~0, 0) == 0:
        return
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = range(first, 4096)
    for fd in fds:
        if fd >= first and fd != keep:
            with contextlib.suppress(OSError):
                os.close(fd)


class Run:
    def __init__(self, req: dict, slot: int):
        self.req, self.slot = req, slot
        self.id = req["id"]
        self.pid: int | None = None
        self.workdir = ""
        self.mounted = False
        self.out = {"stdout": bytearray(), "stderr": bytearray(), "status": bytearray()}
        self.open: dict[int, str] = {}
        self.verdict: str | None = None  # "timeout" or "output_limit" when the zygote killed the run
        self.truncated = False
        self.start = time.monotonic()
        self.deadline = self.start + req["timeout"]
        self.reaped_status: int | None = None
        self.rusage = None
        self.reaped_at = 0.0


class Zygote:
    def __init__(self, sock: socket.socket, config: dict):
        self.sock = sock
        self.isolation: list[str] = ["rlimits", "tmpdir", "scrubbed_env", "session_kill"]
        isolate = config["isolate"]
        self.tmpfs_workdirs = isolate and _isolation.setup_namespaces(self.isolation)
        self.pidns_fd = _isolation.probe_pid_namespace() if isolate else None
        if self.pidns_fd is not None:
            self.isolation.append("pidns")
        self.uid_base = config["uid_base"] if isolate and os.geteuid() == 0 else None
        if self.uid_base is not None:
            self.isolation.append("unprivileged_uid")
        self.seccomp = _isolation.seccomp_program() if isolate and _libc is not None else None
        if self.seccomp is not None:
            self.isolation.append("seccomp")
        if _libc is not None:  # orphans of runs come back to us, not to the host's init
            _libc.prctl(_isolation.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self.max_parallel = config["max_parallel"]
        self.free_slots = list(range(self.max_parallel))
        self.pending: collections.deque[dict] = collections.deque()
        self.runs: dict[int, Run] = {}  # by pid
        self.selector = selectors.DefaultSelector()
        self.inbox = bytearray()

    # Protocol

    def send(self, message: dict) -> None:
        data = json.dumps(message).encode()
        self.sock.sendall(_FRAME.pack(len(data)) + data)

    def read_requests(self) -> bool:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            return False
        self.inbox += chunk
        while len(self.inbox) >= 4:
            (size,) = _FRAME.unpack_from(self.inbox)
            if len(self.inbox) < 4 + size:
                break
            req = json.loads(self.inbox[4 : 4 + size])
            del self.inbox[: 4 + size]
            self.pending.append(req)
        return True

    # Runs

    def start(self, req: dict) -> None:
        slot = self.free_slots.pop()
        run = Run(req, slot)
        uid = None if self.uid_base is None else self.uid_base + slot
        try:
            run.workdir = tempfile.mkdtemp(
                prefix="rllm-sandbox-", dir=_isolation.WORK_BASE if self.tmpfs_workdirs else None
            )
            if self.tmpfs_workdirs:
                _isolation.mount_workdir(run.workdir, req["file_size_mb"], uid)
                run.mounted = True
            elif uid is not None:
                os.chown(run.workdir, uid, uid)
            for name, text in {**req["files"], req["filename"]: req["code"]}.items():
                path = os.path.join(run.workdir, name)
                with open(path, "w", encoding="utf-8") as handle:
                    handle.write(text)
                if uid is not None:
                    os.chown(path, uid, uid)
            stdin_fd = os.memfd_create("stdin") if hasattr(os, "memfd_create") else _temp_fd()
            os.write(stdin_fd, req["stdin"].encode())
            os.lseek(stdin_fd, 0, os.SEEK_SET)
            (out_r, out_w), (err_r, err_w), (st_r, st_w) = os.pipe(), os.pipe(), os.pipe()
            pid = _isolation.fork_run(self.pidns_fd)
            if pid == 0:
                _run_child(req, run.workdir, uid, self.seccomp, (stdin_fd, out_w, err_w, st_w))
            run.pid = pid
            run.start = time.monotonic()
            run.deadline = run.start + req["timeout"]
            for fd in (stdin_fd, out_w, err_w, st_w):
                os.close(fd)
            for fd, name in ((out_r, "stdout"), (err_r, "stderr"), (st_r, "status")):
                os.set_blocking(fd, False)
                run.open[fd] = name
                self.selector.register(fd, selectors.EVENT_READ, run)
            self.runs[pid] = run
        except Exception as exc:
            self.finish(run, error=f"could not start the run: {type(exc).__name__}: {exc}")

    def on_output(self, fd: int, run: Run) -> None:
        name = run.open[fd]
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            self.close_fd(run, fd)
            return
        buffer = run.out[name]
        cap = run.req["max_output_bytes"] if name != "status" else 1 << 16
        room = cap - len(buffer)
        buffer += chunk[: max(room, 0)]
        if len(chunk) > room and name != "status":
            run.truncated = True
            self.kill(run, "output_limit")

    def close_fd(self, run: Run, fd: int) -> None:
        self.selector.unregister(fd)
        os.close(fd)
        del run.open[fd]

    def kill(self, run: Run, verdict: str) -> None:
        if run.verdict is None and run.reaped_status is None:
            run.verdict = verdict
        if run.reaped_status is None:
            os.kill(run.pid, signal.SIGKILL)  # pid 1 of the run's PID namespace: the kernel kills the rest
        self.sweep(run)

    def sweep(self, run: Run) -> None:
        """Kill whatever of this run is still alive: its session (process group) and, with a uid per run, that uid."""
        with contextlib.suppress(OSError):
            os.killpg(run.pid, signal.SIGKILL)
        if self.uid_base is not None and self.pidns_fd is None:
            helper = os.fork()
            if helper == 0:
                try:
                    os.setresuid(self.uid_base + run.slot, self.uid_base + run.slot, 0)
                    for _ in range(100):
                        os.kill(-1, signal.SIGKILL)  # as that uid: every process of this run and nothing else
                except OSError:
                    pass
                os._exit(0)
            os.waitpid(helper, 0)

    def reap(self) -> None:
        while True:
            try:
                pid, status, rusage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            run = self.runs.get(pid)
            if run is not None:
                run.reaped_status, run.rusage, run.reaped_at = status, rusage, time.monotonic()
                self.sweep(run)

    def check_done(self, run: Run, now: float) -> None:
        if run.reaped_status is None:
            return
        if run.open and now - run.reaped_at < 0.2:
            return  # a straggler may still hold a pipe: give it a moment, then it was swept anyway
        for fd in list(run.open):
            self._drain(run, fd)
        self.finish(run)

    def _drain(self, run: Run, fd: int) -> None:
        try:
            chunk = os.read(fd, 1 << 16)
            name = run.open[fd]
            room = run.req["max_output_bytes"] - len(run.out[name])
            run.out[name] += chunk[: max(room, 0)]
        except OSError:
            pass
        self.close_fd(run, fd)

    def finish(self, run: Run, error: str | None = None) -> None:
        for fd in list(run.open):
            self.close_fd(run, fd)
        if run.pid is not None:
            self.runs.pop(run.pid, None)
        if run.workdir:
            try:
                if run.mounted:
                    _isolation.unmount_workdir(run.workdir)
                    os.rmdir(run.workdir)
                else:
                    import shutil

                    shutil.rmtree(run.workdir, ignore_errors=True)
            except OSError as exc:
                error = error or f"could not remove the working directory: {exc}"
        self.free_slots.append(run.slot)
        result = {
            "id": run.id,
            "duration_s": time.monotonic() - run.start,
            "truncated": run.truncated,
            "verdict": run.verdict,
            "error": error,
            "wait_status": None,
            "max_rss_kb": None,
        }
        status_text = bytes(run.out["status"]).decode(errors="replace")
        if error is None and status_text:
            try:
                result.update(json.loads(status_text))
            except ValueError:
                result["error"] = f"garbled status from the run: {status_text[:200]!r}"
        if result["wait_status"] is None and result["error"] is None and run.reaped_status is not None:
            result["wait_status"] = run.reaped_status if run.verdict is None else None
            if run.verdict is None and not status_text:
                result["error"] = "the run's supervisor died without reporting a status"
        if run.rusage is not None:
            result["max_rss_kb"] = run.rusage.ru_maxrss
        result["stdout"] = bytes(run.out["stdout"]).decode(errors="replace")
        result["stderr"] = bytes(run.out["stderr"]).decode(errors="replace")
        self.send(result)

    def shutdown(self) -> None:
        """The host is gone: kill and reap every run (no zombie left to the host's init) and remove workdirs."""
        for run in list(self.runs.values()):
            self.kill(run, "timeout")
            if run.reaped_status is None:
                os.waitpid(run.pid, 0)
                run.reaped_status = -1
            with contextlib.suppress(OSError):
                self.finish(run, error="the sandbox is shutting down")

    # Main loop

    def serve(self) -> None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(wake_r, selectors.EVENT_READ, "wake")
        self.selector.register(self.sock, selectors.EVENT_READ, "sock")
        self.send({"hello": True, "isolation": self.isolation, "pid": os.getpid()})
        while True:
            while self.pending and self.free_slots:
                self.start(self.pending.popleft())
            now = time.monotonic()
            timeout = None
            for run in self.runs.values():
                wake_at = run.deadline if run.reaped_status is None else run.reaped_at + 0.2
                timeout = max(0.0, wake_at - now) if timeout is None else max(0.0, min(timeout, wake_at - now))
            for key, _ in self.selector.select(timeout):
                if key.data == "sock":
                    if not self.read_requests():
                        self.shutdown()
                        return
                elif key.data == "wake":
                    while True:
                        try:
                            if not os.read(wake_r, 4096):
                                break
                        except BlockingIOError:
                            break
                    self.reap()
                elif key.fd in key.data.open:
                    self.on_output(key.fd, key.data)
            self.reap()
            now = time.monotonic()
            for run in list(self.runs.values()):
                if run.reaped_status is None and now >= run.deadline:
                    self.kill(run, "timeout")
                self.check_done(run, now)


def _temp_fd() -> int:
    handle = tempfile.TemporaryFile()  # noqa: SIM115 (its fd is dup'ed and kept)
    return os.dup(handle.fileno())


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    config = json.loads(sys.argv[2])
    try:
        zygote = Zygote(sock, config)
    except Exception as exc:
        data = json.dumps({"hello": False, "error": f"{type(exc).__name__}: {exc}"}).encode()
        sock.sendall(_FRAME.pack(len(data)) + data)
        return
    zygote.serve()


if __name__ == "__main__":
    main()
