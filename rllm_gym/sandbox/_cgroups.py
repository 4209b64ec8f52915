"""The sandbox's memory cgroups, as the zygote (:mod:`rllm_gym.sandbox._zygote`) makes and uses them: standard library
only, loaded by path like ``_isolation.py``.

The zygote creates one cgroup of its own for its runs, with one child cgroup per run slot whose limit is the run's
``memory_mb``; a run's solution process joins its slot before it drops root.
"""

from __future__ import annotations

import contextlib
import os
import sys


class MemoryCgroups:
    """A memory cgroup per run slot, under one of the zygote's own: the limit counts every page a run charges.

    Anonymous memory, tmpfs writes (its ``/tmp``, ``/dev/shm``), memfd and SysV shared memory are all charged to the
    cgroup of the process that touches them, so one limit holds them all. cgroup v2 (``memory.max``,
    ``memory.swap.max``, ``memory.events``) or v1 (``memory.limit_in_bytes``, ``memory.memsw.limit_in_bytes``,
    ``memory.oom_control``). The folder is opened before the zygote leaves the host's tree and used through that fd.
    """

    def __init__(self, fd: int, version: int, path: str):
        self.fd, self.version, self.path = fd, version, path

    @classmethod
    def create(cls, name: str) -> MemoryCgroups | None:
        if not sys.platform.startswith("linux") or os.geteuid() != 0:
            return None
        try:
            with open("/proc/self/cgroup") as handle:
                lines = [line.rstrip("\n").split(":", 2) for line in handle]
        except OSError:
            return None
        v1 = next((path for _, controllers, path in lines if "memory" in controllers.split(",")), None)
        v2 = next((path for hid, controllers, path in lines if hid == "0" and controllers == ""), None)
        candidates = []
        if v1 is not None:
            candidates.append((1, "/sys/fs/cgroup/memory" + v1.rstrip("/")))
        if v2 is not None:
            candidates.append((2, _cgroup2_mount() + v2.rstrip("/")))
        for version, parent in candidates:
            made = cls._make(version, parent, name)
            if made is not None:
                return made
        return None

    @classmethod
    def _make(cls, version: int, parent: str, name: str) -> MemoryCgroups | None:
        if version == 2:
            try:
                with open(os.path.join(parent, "cgroup.subtree_control")) as handle:
                    if "memory" not in handle.read().split():
                        return None
            except OSError:
                return None
        path = os.path.join(parent, name)
        try:
            os.mkdir(path)
        except OSError:
            return None
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        made = cls(fd, version, path)
        try:
            if version == 2:
                made._write("cgroup.subtree_control", "+memory")
            made.prepare(0, 64 << 20)
        except OSError:
            made.close()
            return None
        return made

    def _write(self, relative: str, value: str) -> None:
        fd = os.open(relative, os.O_WRONLY, dir_fd=self.fd)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)

    def _read(self, relative: str) -> str:
        fd = os.open(relative, os.O_RDONLY, dir_fd=self.fd)
        try:
            return os.read(fd, 65536).decode()
        finally:
            os.close(fd)

    def prepare(self, slot: int, limit_bytes: int) -> int:
        """Set slot ``slot``'s limit (creating it on first use); returns its OOM-kill count so far."""
        name = f"slot-{slot}"
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, dir_fd=self.fd)
        if self.version == 2:
            self._write(f"{name}/memory.max", str(limit_bytes))
            with contextlib.suppress(FileNotFoundError):
                self._write(f"{name}/memory.swap.max", "0")
        else:
            limits = [f"{name}/memory.limit_in_bytes"]
            try:
                os.stat(f"{name}/memory.memsw.limit_in_bytes", dir_fd=self.fd)
                limits.append(f"{name}/memory.memsw.limit_in_bytes")
            except FileNotFoundError:
                pass
            # memory <= memory+swap at every moment: lower memory first, raise memory+swap first.
            for relative in limits if self._limit(limits[0]) > limit_bytes else reversed(limits):
                self._write(relative, str(limit_bytes))
        return self.oom_kills(slot)

    def _limit(self, relative: str) -> int:
        return int(self._read(relative).strip())

    def oom_kills(self, slot: int) -> int:
        text = self._read(f"slot-{slot}/" + ("memory.events" if self.version == 2 else "memory.oom_control"))
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def join(self, slot: int) -> int:
        """An fd to write ``0`` to (it moves the writer into slot ``slot``): opened by the supervisor, used by its
        child before it drops root, while that child has a single thread.

        On v1 the fd is the slot's ``tasks`` file, which moves the writing thread alone: the kernel then skips the
        lock that keeps every thread group still (``cgroup_threadgroup_rwsem``), whose write side waits for an RCU
        grace period (about 10 ms a run on a loaded machine, most of what the layers cost at one run in flight);
        ``cgroup.procs`` takes it. A process of one thread is all of it, and what it starts begins in its cgroup.
        v2's ``cgroup.threads`` is for threaded cgroups only, so v2 writes ``cgroup.procs``."""
        target = "tasks" if self.version == 1 else "cgroup.procs"
        return os.open(f"slot-{slot}/{target}", os.O_WRONLY, dir_fd=self.fd)

    def close(self) -> None:
        for entry in os.listdir(self.fd):
            if entry.startswith("slot-"):
                with contextlib.suppress(OSError):
                    os.rmdir(entry, dir_fd=self.fd)
        os.close(self.fd)
        with contextlib.suppress(OSError):  # by path: only where the host's tree is visible (the host removes it)
            os.rmdir(self.path)


def _cgroup2_mount() -> str:
    try:
        with open("/proc/self/mountinfo") as handle:
            for line in handle:
                fields = line.split()
                if " - cgroup2 " in line:
                    return fields[4]
    except OSError:
        pass
    return "/sys/fs/cgroup"
