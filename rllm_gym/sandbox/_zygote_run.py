"""One sandboxed run, as the zygote (``_zygote.py``) forks it: the run's record (:class:`Run`), its supervisor (the
first process, root, which sets up the run's namespaces and files) and the solution's process (unprivileged, with its
limits), which executes the program. Standard library only.

``_zygote.py`` loads this file by path (as it loads ``_isolation.py``, ``_landlock.py`` and ``channel.py``) and hands
it its own copies of those once it has run, as the globals ``_isolation``, ``_landlock`` and ``channel`` declared
below: one copy of each in the zygote, none in ``sys.modules`` where a run's own module of the same name would find it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import tempfile
import time
import traceback
import types
from typing import Any

# Set by _zygote.py once this file has run (nothing here uses them at import): its own _isolation.py, _landlock.py
# and channel.py.
_isolation: Any = None
_landlock: Any = None
channel: Any = None


def memfd(name: str) -> int:
    return os.memfd_create(name) if hasattr(os, "memfd_create") else _temp_fd()


def _temp_fd() -> int:
    handle = tempfile.TemporaryFile()  # noqa: SIM115 (its fd is dup'ed and kept)
    return os.dup(handle.fileno())


def _enter_solution(
    req: dict, workdir: str, ctx: dict, supervisor: int, role: str | None, ruleset: int | None
) -> None:
    """In the solution's process: drop privileges, apply limits and the environment (inherited by the code); where
    the code is the model's (not a pair's harness), apply the Landlock ``ruleset`` (an fd, closed here either way)."""
    # Dispositions a fresh ``python`` would have.
    for sig, handler in (
        (signal.SIGCHLD, signal.SIG_DFL),
        (signal.SIGTERM, signal.SIG_DFL),
        (signal.SIGHUP, signal.SIG_DFL),
        (signal.SIGINT, signal.default_int_handler),
        (signal.SIGPIPE, signal.SIG_IGN),
    ):
        signal.signal(sig, handler)
    _isolation.drop_privileges(ctx["uid"], ctx["seccomp"], supervisor)
    _isolation.apply_rlimits(req, ctx["uid"])
    os.chdir(workdir)
    os.environ.clear()
    os.environ.update(req["env"])
    os.environ.update({"HOME": workdir, "TMPDIR": workdir, "PWD": workdir})
    if ruleset is not None and role != "harness":
        _landlock.restrict(ruleset)
        sys.meta_path[:] = ctx["finders"]
    elif ruleset is not None:
        os.close(ruleset)


def _run_code(req: dict, workdir: str, code: str, role: str | None) -> int:
    """Execute the program as ``__main__`` in this (forked) interpreter and return its exit code.

    ``role``: ``"harness"`` gets the ``_rllm_channel`` module; ``"solution"`` serves the harness's calls once its
    code has run, and runs as a module named ``__solution__`` (also ``sys.modules["__main__"]``), as the data sets'
    own harnesses import a solution: its ``if __name__ == "__main__":`` block (a demo reading stdin, its own
    ``unittest.main()``) does not run and end the process before it answers a call.
    """
    sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115 (they live as long as the run)
    sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115 (they live as long as the run)
    sys.stderr = sys.__stderr__ = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)  # noqa: SIM115 (they live as long as the run)
    path = os.path.join(workdir, req["filename"])
    sys.argv = [path, *req["argv"]]
    sys.path[0:0] = [workdir]
    main = types.ModuleType("__solution__" if role == "solution" else "__main__")
    main.__file__ = path
    sys.modules["__main__"] = sys.modules[main.__name__] = main
    if role == "harness":
        channel.harness_module()
    exit_code = 0
    try:
        exec(compile(code, path, "exec"), main.__dict__)
        if role == "solution":
            channel.serve(main.__dict__)
    except SystemExit as stop:
        exit_code = _exit_code(stop.code)
    except BaseException as exc:
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        exit_code = 1
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
        exit_code = _exit_code(stop.code)
    except BaseException:
        os.write(2, traceback.format_exc().encode(errors="replace"))
        exit_code = exit_code or 120  # what CPython exits with when flushing stdout fails
    return exit_code


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _read_all(fd: int) -> str:
    chunks, offset = [], 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks).decode("utf-8")


def supervise(req: dict, run: Run, ctx: dict, fds: dict[str, int]) -> None:
    """Body of the run's first process (pid 1 of its PID namespace when available, root when the zygote is): it sets
    up the run's namespaces and files, forks the solution's process and reports how it ended on the status pipe."""
    status_w = fds["status"]
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        workdir = run.workdir
        # The run's data (code, stdin, files) arrives in a memfd that only this process reads: the zygote, of which
        # every run is a fork, never holds one run's code, input or output where another run could find it.
        payload = json.loads(_read_all(fds["payload"]))
        code = payload["code"]
        if ctx["view"]:
            landlocked = ctx["landlock"] is not None and run.role != "harness"
            own = frozenset([*payload["files"], req["filename"]])
            _isolation.enter_run(ctx["namespaces"], req["file_size_mb"], ctx["uid"], ctx["own_proc"], landlocked, own)
        stdin_fd = os.memfd_create("stdin") if hasattr(os, "memfd_create") else _temp_fd()
        os.write(stdin_fd, payload["stdin"].encode("utf-8", "surrogatepass"))  # a lone surrogate: text, no fault
        os.lseek(stdin_fd, 0, os.SEEK_SET)
        fds["stdin"] = stdin_fd
        for name, text in {**payload["files"], req["filename"]: code}.items():
            path = os.path.join(workdir, name)
            with open(path, "w", encoding="utf-8", errors="surrogatepass") as handle:
                handle.write(text)
            if ctx["uid"] is not None:
                os.chown(path, ctx["uid"], ctx["uid"])
        keep = [fcntl.fcntl(status_w, fcntl.F_DUPFD_CLOEXEC, 10)]
        cgroup = None
        if ctx["cgroups"] is not None:
            cgroup = ctx["cgroups"].join(run.slot)
            keep.append(fcntl.fcntl(cgroup, fcntl.F_DUPFD_CLOEXEC, 10))
            cgroup = keep[-1]
        ruleset = None
        if ctx["landlock"] is not None:  # the zygote's Landlock ruleset: the solution's process applies and closes it
            ruleset = fcntl.fcntl(ctx["landlock"], fcntl.F_DUPFD_CLOEXEC, 10)
            keep.append(ruleset)
        status_w = keep[0]
        targets = [(fds["stdin"], 0), (fds["stdout"], 1), (fds["stderr"], 2)]
        if "chan_r" in fds:
            targets += [(fds["chan_r"], 3), (fds["chan_w"], 4)]
        staged = [(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 20), target) for fd, target in targets]
        for fd, target in staged:
            os.dup2(fd, target)  # dup2 clears close-on-exec on the target
        _close_fds_from(len(targets), keep=set(keep))
        supervisor = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                if cgroup is not None:
                    os.write(cgroup, b"0")
                    os.close(cgroup)
                _enter_solution(req, workdir, ctx, supervisor, run.role, ruleset)
            except BaseException as exc:  # an infrastructure fault: say so, never pass for the code's exit
                message = f"the solution's process could not start: {type(exc).__name__}: {exc}"
                os.write(status_w, (json.dumps({"error": message}) + "\n").encode())
                os._exit(126)
            os.close(status_w)
            os._exit(_run_code(req, workdir, code, run.role))
        for fd in range(len(targets)):
            os.close(fd)
        if cgroup is not None:
            os.close(cgroup)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_IGN)  # the supervisor outlives whatever the code sends it
        # As the namespace's init we also reap orphans; report the solution's own status.
        while True:
            reaped, status = os.waitpid(-1, 0)
            if reaped == pid:
                break
        os.write(status_w, (json.dumps({"wait_status": status}) + "\n").encode())
        os._exit(0)
    except BaseException as exc:
        try:
            os.write(status_w, (json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n").encode())
        finally:
            os._exit(0)


def _close_fds_from(first: int, keep: set[int]) -> None:
    """Close every fd >= first but those in ``keep``: the zygote's socket and other runs' pipes must not leak in."""
    bounds, start = [], first
    for fd in sorted(k for k in keep if k >= first):
        if fd > start:
            bounds.append((start, fd - 1))
        start = fd + 1
    bounds.append((start, ~0))
    # os.closerange loops over close() up to the limit when Python was built without close_range(): ~20 ms.
    if _isolation.libc is not None and all(_isolation.libc.syscall(436, low, high, 0) == 0 for low, high in bounds):
        return
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = range(first, 4096)
    for fd in fds:
        if fd >= first and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


class Run:
    def __init__(self, req: dict, slot: int, role: str | None = None):
        self.req, self.slot, self.role = req, slot, role
        self.id = req["id"]
        self.pid: int | None = None
        self.workdir = ""
        self.status = bytearray()
        self.outputs: list[int] = []  # the stdout and stderr memfds, never read here: they go to the host
        self.open: dict[int, str] = {}
        self.verdict: str | None = None  # "timeout", "output_limit" or "stopped" when the zygote killed the run
        self.truncated = False
        self.start = time.monotonic()
        self.deadline = self.start + req["timeout"]
        self.reaped_status: int | None = None
        self.rusage = None
        self.reaped_at = 0.0
        self.oom_before = 0
        self.group: list[Run] = [self]  # both runs of a pair
        self.result: dict | None = None
        self.stop_quietly = False  # a pair's solution, stopped because its harness is done
