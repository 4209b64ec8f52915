"""The sandbox's warm fork server ("zygote"): a small standard-library-only process that forks one child per run.

The host (:mod:`rllm_gym.sandbox`) starts this file as a script with ``python -I`` and a scrubbed environment, so
that it never inherits the host's imports (forking a process with torch loaded costs ~10 ms) or its secrets. At start
it creates a memory cgroup for its runs and moves into a private mount namespace rooted at a minimal read-only tree
(see ``_isolation.py`` beside this file). Each run is forked into a fresh PID namespace; that first process, the run's
supervisor, stays root, gives the run new mount, network and IPC namespaces, a private ``/tmp`` and ``/proc``, then
forks the solution's process, which joins the run's memory cgroup and drops to an unprivileged uid of its own with
rlimits and a seccomp filter. The wall-clock timeout and the output cap are enforced here. A paired run (a function
test) is two such runs joined by two pipes: a harness running trusted test code, whose program arrives as a memfd
passed over the socket so that it never sits in this process's memory (the solution's process is a fork of it), and
the solution, which answers the harness's calls (``channel.py``). A run's own processes are in ``_zygote_run.py``.
Requests and results are length-prefixed JSON frames on a socket the host passes as ``argv[1]``.
"""

from __future__ import annotations

# Modules a typical solution imports (and the run's own): loaded once here, so each forked run gets them free.
import atexit  # noqa: F401
import bisect  # noqa: F401
import collections
import contextlib
import functools  # noqa: F401
import gc
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
import types

_FRAME = struct.Struct("!I")


def _load_sibling(name: str, **shared: types.ModuleType) -> types.ModuleType:
    """A sibling module (``_isolation.py``, ``channel.py``, ``_zygote_run.py``), loaded by path and kept out of
    ``sys.modules``; ``shared``: siblings already loaded, set as its globals once it has run (one copy of each).

    ``python -I`` leaves this script's folder off ``sys.path``, and putting it there would reach every run's
    ``sys.path``; out of ``sys.modules``, a run's own module of the same name still imports as itself.
    """
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.__dict__.update(shared)
    return module


_isolation = _load_sibling("_isolation")
_cgroups = _load_sibling("_cgroups")
_landlock = _load_sibling("_landlock")
_preload = _load_sibling("_preload")
_run = _load_sibling("_zygote_run", _isolation=_isolation, _landlock=_landlock, channel=_load_sibling("channel"))
_libc = _isolation.libc
_OUTPUT_POLL_S = 0.02  # how often the sizes of running programs' outputs are checked against their cap


class Zygote:
    def __init__(self, sock: socket.socket, config: dict, landlock_abi: int = 0, archive=None):
        # Under Landlock: what runs of model code may read, and what the zygote pins (see _preload.py).
        usable = landlock_abi and archive is not None
        readable, pinned = archive.shared_objects() if usable else (None, [])
        unreadable = [entry[3] for entry in archive.index.values()] if usable else []
        unreadable += [sys.executable, os.path.realpath(sys.executable), os.path.join(sys.prefix, "pyvenv.cfg")]
        self.sock = sock
        self.isolation: list[str] = ["rlimits", "tmpdir", "scrubbed_env", "session_kill"]
        isolate = config["isolate"]
        self.cgroups = _cgroups.MemoryCgroups.create(f"rllm-sandbox-{os.getpid()}") if isolate else None
        self.namespaces = _isolation.probe_run_namespaces() if isolate else 0
        self.pidns_fd = _isolation.probe_pid_namespace() if isolate else None
        self.view = (
            isolate
            and self.pidns_fd is not None
            and _isolation.build_view(
                config["view_base"], config["hidden"], self.isolation, config["packages"], readable, unreadable
            )
        )
        if self.view:
            for flag, name in ((_isolation.CLONE_NEWNET, "netns"), (_isolation.CLONE_NEWIPC, "ipcns")):
                if flag & self.namespaces:
                    self.isolation.append(name)
        if self.pidns_fd is not None:
            self.isolation += ["pidns"] + (["private_proc"] if self.view else [])
        self.uid_base = config["uid_base"] if isolate and os.geteuid() == 0 else None
        if self.uid_base is not None:
            self.isolation.append("unprivileged_uid")
        memory_rules = self.cgroups is None and bool(self.view)
        self.seccomp = _isolation.seccomp_program(memory_rules) if isolate and _libc is not None else None
        if self.seccomp is not None:
            self.isolation.append("seccomp")
        if self.cgroups is not None:
            self.isolation.append("memory_cgroup")
        elif memory_rules and self.seccomp is not None:
            self.isolation.append("memory_rules")
        # Landlock confines a run to its own root, which holds what it may read even of a tree under /tmp.
        usable = usable and self.view
        self.landlock = landlock_abi if usable else 0
        self.ruleset, self.finders = None, []
        if self.landlock:
            _preload.pin_files(_libc, pinned)
            self.ruleset = _landlock.build_ruleset(self.landlock, _isolation.RUN_ROOT)
            self.finders = _landlock.import_finders(_isolation.RUN_DIR, archive)
            self.isolation.append("landlock")
        if _libc is not None:  # orphans of runs come back to us, not to the host's init
            _libc.prctl(_isolation.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self.max_parallel = config["max_parallel"]
        self.units = self.max_parallel  # a single run takes one unit, a pair one unit and two slots
        self.free_slots = list(range(2 * self.max_parallel))
        self.pending: collections.deque[dict] = collections.deque()
        self.runs: dict[int, _run.Run] = {}  # by pid
        self.selector = selectors.DefaultSelector()
        self.inbox = bytearray()
        self.inbox_fds: collections.deque[int] = collections.deque()

    # Protocol

    def send(self, message: dict, fds: list[int] | None = None) -> None:
        data = json.dumps({**message, "nfds": len(fds or [])}).encode()
        data = _FRAME.pack(len(data)) + data
        if fds:  # the fds travel with the frame's first bytes
            data = data[socket.send_fds(self.sock, [data], fds) :]
        self.sock.sendall(data)

    def read_requests(self) -> bool:
        chunk, ancillary, _flags, _addr = self.sock.recvmsg(1 << 20, socket.CMSG_SPACE(64 * 4))
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                count = len(data) // 4
                self.inbox_fds.extend(struct.unpack(f"{count}i", data[: count * 4]))
        if not chunk:
            return False
        self.inbox += chunk
        while len(self.inbox) >= 4:
            (size,) = _FRAME.unpack_from(self.inbox)
            if len(self.inbox) < 4 + size:
                break
            req = json.loads(self.inbox[4 : 4 + size])
            del self.inbox[: 4 + size]
            req["fds"] = [self.inbox_fds.popleft() for _ in range(req.get("nfds", 0)) if self.inbox_fds]
            self.pending.append(req)
        return True

    # Runs

    def context(self, slot: int) -> dict:
        return {
            "uid": None if self.uid_base is None else self.uid_base + slot,
            "seccomp": self.seccomp,
            "view": self.view,
            "namespaces": self.namespaces,
            "own_proc": self.pidns_fd is not None,
            "cgroups": self.cgroups,
            "landlock": self.ruleset,  # the fd of the ruleset of runs of model code, where they get the layer
            "finders": self.finders,
        }

    def start(self, req: dict) -> None:
        """Launch a run, or a pair's two; ``req["fds"]``: the payload memfd (and the harness's, for a pair)."""
        self.units -= 1
        first = _run.Run(req, self.free_slots.pop(), "harness" if req.get("pair") else None)
        group = [first]
        if req.get("pair"):
            group.append(_run.Run(req, self.free_slots.pop(), "solution"))
        for member in group:
            member.group = group
        pipes = [os.pipe(), os.pipe()] if req.get("pair") else []
        try:
            if len(req["fds"]) != len(group):
                raise OSError("the run's data did not arrive with its request")
            if not req.get("pair"):
                self.launch(first, {"payload": req["fds"][0]})
                return
            (to_solution_r, to_solution_w), (to_harness_r, to_harness_w) = pipes
            harness, solution = group
            self.launch(harness, {"chan_r": to_harness_r, "chan_w": to_solution_w, "payload": req["fds"][1]})
            if harness.result is None:
                self.launch(solution, {"chan_r": to_solution_r, "chan_w": to_harness_w, "payload": req["fds"][0]})
        except OSError as exc:
            self.finish(first, error=f"could not start the run: {exc}")
        finally:
            for fd in (*[fd for pipe in pipes for fd in pipe], *req["fds"]):
                os.close(fd)

    def launch(self, run: _run.Run, extra_fds: dict[str, int]) -> None:
        req = run.req
        ctx = self.context(run.slot)
        try:
            if self.view:
                run.workdir = _isolation.RUN_DIR
            else:
                run.workdir = tempfile.mkdtemp(prefix="rllm-sandbox-")
                if ctx["uid"] is not None:
                    os.chown(run.workdir, ctx["uid"], ctx["uid"])
            if self.cgroups is not None:
                run.oom_before = self.cgroups.prepare(run.slot, req["memory_mb"] << 20)
            run.outputs = [_run.memfd("stdout"), _run.memfd("stderr")]
            st_r, st_w = os.pipe()
            fds = {"stdout": run.outputs[0], "stderr": run.outputs[1], "status": st_w, **extra_fds}
            pid = _isolation.fork_run(self.pidns_fd)
            if pid == 0:
                _run.supervise(req, run, ctx, fds)
            run.pid = pid
            run.start = time.monotonic()
            run.deadline = run.start + req["timeout"]
            os.close(st_w)
            os.set_blocking(st_r, False)
            run.open[st_r] = "status"
            self.selector.register(st_r, selectors.EVENT_READ, run)
            self.runs[pid] = run
        except Exception as exc:
            self.finish(run, error=f"could not start the run: {type(exc).__name__}: {exc}")

    def on_status(self, fd: int, run: _run.Run) -> None:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            self.close_fd(run, fd)
            return
        run.status += chunk[: max(0, (1 << 16) - len(run.status))]

    def check_output_sizes(self) -> None:
        """Past ``max_output_bytes`` on stdout or stderr, the run is killed (the files themselves are never read)."""
        for run in list(self.runs.values()):
            if run.reaped_status is None and any(
                os.fstat(fd).st_size > run.req["max_output_bytes"] for fd in run.outputs
            ):
                self.kill(run, "output_limit")

    def close_fd(self, run: _run.Run, fd: int) -> None:
        self.selector.unregister(fd)
        os.close(fd)
        del run.open[fd]

    def kill(self, run: _run.Run, verdict: str) -> None:
        if run.pid is None:
            return
        if run.verdict is None and run.reaped_status is None:
            run.verdict = verdict
        if run.reaped_status is None:
            os.kill(run.pid, signal.SIGKILL)  # pid 1 of the run's PID namespace: the kernel kills the rest
        self.sweep(run)

    def sweep(self, run: _run.Run) -> None:
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
                if run.role == "harness" and run.verdict is None:  # the tests are over: the solution goes
                    solution = run.group[1]
                    solution.deadline = min(solution.deadline, run.reaped_at + 0.2)
                    solution.stop_quietly = True

    def check_done(self, run: _run.Run, now: float) -> None:
        if run.reaped_status is None:
            return
        if run.open and now - run.reaped_at < 0.2:
            return  # a straggler may still hold a pipe: give it a moment, then it was swept anyway
        for fd in list(run.open):
            with contextlib.suppress(OSError):
                self.on_status(fd, run)
            if fd in run.open:
                self.close_fd(run, fd)
        self.finish(run)

    def finish(self, run: _run.Run, error: str | None = None) -> None:
        for fd in list(run.open):
            self.close_fd(run, fd)
        if run.pid is not None:
            self.runs.pop(run.pid, None)
        if run.workdir and not self.view:
            import shutil

            shutil.rmtree(run.workdir, ignore_errors=True)
        self.free_slots.append(run.slot)
        run.result = self.outcome(run, error)
        if error is not None:  # the other half of a pair cannot run without this one
            for member in run.group:
                if member.result is None and member.pid is None:
                    self.free_slots.append(member.slot)
                    member.result = self.outcome(member, f"not started: {error}")
                elif member.result is None:
                    self.kill(member, "stopped")
        if any(member.result is None for member in run.group):
            return
        self.units += 1
        outputs = [fd for member in run.group for fd in member.outputs]
        if len(run.group) == 1:
            self.send(run.result, outputs)
        else:
            harness, solution = run.group
            self.send({**harness.result, "solution": solution.result}, outputs)
        for fd in outputs:
            os.close(fd)

    def outcome(self, run: _run.Run, error: str | None) -> dict:
        result = {
            "id": run.id,
            "duration_s": time.monotonic() - run.start,
            "truncated": run.truncated,
            "verdict": run.verdict,
            "error": error,
            "wait_status": None,
            "max_rss_kb": None,
            "oom": False,
        }
        status_text = bytes(run.status).decode(errors="replace")
        if error is None and status_text:
            try:
                reports = [json.loads(line) for line in status_text.splitlines() if line.strip()]
            except ValueError:
                reports = [{"error": f"garbled status from the run's supervisor: {status_text[:200]!r}"}]
            for report in reports:
                result.update(report)
            result["error"] = next((r["error"] for r in reports if r.get("error")), None)
        silent = result["wait_status"] is None and result["error"] is None and not status_text
        if silent and run.reaped_status is not None and run.verdict is None:
            if self.uid_base is None and os.WIFSIGNALED(run.reaped_status):
                result["verdict"] = "killed"  # same uid as its supervisor: the code could kill it
            else:
                result["error"] = "the run's supervisor died without reporting a status"
        if run.verdict == "stopped" or (run.stop_quietly and run.verdict == "timeout"):
            result["verdict"] = "stopped"
        if self.cgroups is not None and error is None:
            with contextlib.suppress(OSError, ValueError):
                result["oom"] = self.cgroups.oom_kills(run.slot) > run.oom_before
        if run.rusage is not None:
            result["max_rss_kb"] = run.rusage.ru_maxrss
        if len(run.outputs) < 2:  # it never started: empty outputs keep the reply's shape
            run.outputs = [_run.memfd("stdout"), _run.memfd("stderr")]
        sizes = [os.fstat(fd).st_size for fd in run.outputs]
        result["truncated"] = run.truncated or any(size > run.req["max_output_bytes"] for size in sizes)
        if result["truncated"] and result["verdict"] is None and result["error"] is None:
            result["verdict"] = "output_limit"
        return result

    def shutdown(self) -> None:
        """The host is gone: kill and reap every run (no zombie left to the host's init), release the cgroups."""
        for run in list(self.runs.values()):
            self.kill(run, "timeout")
            if run.reaped_status is None:
                os.waitpid(run.pid, 0)
                run.reaped_status = -1
        if self.cgroups is not None:
            with contextlib.suppress(OSError):
                self.cgroups.close()

    # Main loop

    def serve(self) -> None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(wake_r, selectors.EVENT_READ, "wake")
        self.selector.register(self.sock, selectors.EVENT_READ, "sock")
        cgroup = None if self.cgroups is None else self.cgroups.path
        hello = {"hello": True, "isolation": self.isolation, "pid": os.getpid(), "cgroup": cgroup}
        self.send({**hello, "landlock_abi": self.landlock})
        while True:
            while self.pending and self.units > 0:
                self.start(self.pending.popleft())
            now = time.monotonic()
            timeout = None
            for run in self.runs.values():
                wake_at = run.deadline if run.reaped_status is None else run.reaped_at + 0.2
                wake_at = min(wake_at, now + _OUTPUT_POLL_S)
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
                    self.on_status(key.fd, key.data)
            self.reap()
            self.check_output_sizes()
            now = time.monotonic()
            for run in list(self.runs.values()):
                if run.reaped_status is None and now >= run.deadline:
                    self.kill(run, "timeout")
                self.check_done(run, now)


def _module_archive(preloaded: list[str]):
    """The standard library's pure-Python modules and those of the preloaded packages, for runs to import from."""
    archive = _preload.ModuleArchive()
    archive.add_tree(os.path.dirname(os.__file__))
    for folder in sys.path:
        if os.path.basename(folder) == "lib-dynload" and os.path.isdir(folder):
            archive.add_tree(folder)
    for name in preloaded:
        top = name.partition(".")[0]
        for folder in getattr(sys.modules.get(top), "__path__", None) or []:
            archive.add_tree(folder, top)
    archive.seal(_libc)
    return archive


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    config = json.loads(sys.argv[2])
    try:
        # Runs of model code get Landlock where the kernel has it: they then import only what is loaded here.
        landlock_abi = _landlock.probe_abi() if config["isolate"] and not config["read_view"] else 0
        preload = list(config.get("preload") or [])
        if landlock_abi:  # and the packages the code may import: under landlock, it can import nothing else
            preload += [name for name in config["packages"] or [] if name not in preload]
        _preload.preload(preload)
        archive = _module_archive(preload) if landlock_abi else None
        gc.freeze()  # what runs inherit is never scanned by their collections (which would copy every page of it)
        zygote = Zygote(sock, config, landlock_abi, archive)
    except Exception as exc:
        data = json.dumps({"hello": False, "error": f"{type(exc).__name__}: {exc}"}).encode()
        sock.sendall(_FRAME.pack(len(data)) + data)
        return
    zygote.serve()


if __name__ == "__main__":
    main()
