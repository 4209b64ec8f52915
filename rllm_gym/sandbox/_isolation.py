"""The sandbox's isolation layers, as the zygote (:mod:`rllm_gym.sandbox._zygote`) applies them: standard library only.

Once, in the zygote: new network, IPC and mount namespaces where the OS allows, every mount made read-only, other
users' processes hidden in ``/proc``, a root-owned tmpfs on ``/tmp`` for the per-run working directories, a probe for
per-run PID namespaces and the seccomp program (a small x86-64 deny list). Per run: a tmpfs working directory owned by
the run's uid, a fork into a fresh PID namespace, then, in the run's first process, the switch to that unprivileged
uid, ``no_new_privs``, the parent-death signal, the seccomp filter and the rlimits. The zygote loads this file by its
path (it runs as a script under ``python -I``, so its folder is not on ``sys.path``); keep it free of package imports.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import struct
import sys

libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x08000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH, MS_MOVE = 2, 8192
PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG = 38, 36, 1
WORK_BASE = "/tmp"


def check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s):
        return None if s is None else s.encode()

    check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


# Set up once, in the zygote itself


def setup_namespaces(isolation: list[str]) -> bool:
    """Enter new net/IPC/mount namespaces, build the read-only view; returns whether workdirs get their own tmpfs."""
    if libc is None or os.geteuid() != 0:
        return False
    for flag, name in ((CLONE_NEWNET, "netns"), (CLONE_NEWIPC, "ipcns")):
        if libc.unshare(flag) == 0:
            isolation.append(name)
    if libc.unshare(CLONE_NEWNS) != 0:
        return False
    # Private first: without it the remounts below could propagate back to the host's mounts.
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    _expose_python()
    with open("/proc/self/mountinfo") as mountinfo:
        mounts = [(line.split()[4], line.split()[5].split(",")) for line in mountinfo]
    readonly = True
    for target, options in mounts:
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY  # MS_BIND: per-mount flag only, never the host's superblock
        flags |= sum(
            bit for opt, bit in (("nosuid", MS_NOSUID), ("nodev", MS_NODEV), ("noexec", MS_NOEXEC)) if opt in options
        )
        if libc.mount(None, target.encode(), None, ctypes.c_ulong(flags), None) != 0:
            readonly = readonly and target != "/"
    if readonly:
        isolation.append("readonly_fs")
    try:
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
        isolation.append("hidepid_proc")
    except OSError:
        pass
    mount("tmpfs", WORK_BASE, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    return True


def _expose_python() -> None:
    """Let other uids reach the interpreter's files when they sit under a private folder (pyenv in ``/root``).

    A root-only ancestor (mode 0700) gets an empty read-only tmpfs over it, and only the subfolder on the way to
    Python is mounted back: the run can import the standard library and site-packages, and sees nothing else there.
    """
    keep: dict[str, set[str]] = {}
    for path in {sys.base_prefix, sys.prefix, *sys.path}:
        parts = os.path.realpath(path).split(os.sep)[1:]
        for depth in range(1, len(parts)):
            ancestor = os.sep + os.path.join(*parts[:depth])
            try:
                if not os.stat(ancestor).st_mode & 0o001:
                    keep.setdefault(ancestor, set()).add(parts[depth])
                    break
            except OSError:
                break
    if not keep:
        return
    mount("tmpfs", WORK_BASE, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0700")
    for index, (ancestor, children) in enumerate(keep.items()):
        stashed = []
        for child in sorted(children):
            source = os.path.join(ancestor, child)
            stash = os.path.join(WORK_BASE, f"stash-{index}-{len(stashed)}")
            os.mkdir(stash)
            mount(source, stash, None, MS_BIND | MS_REC)
            stashed.append((child, stash))
        mount("tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
        for child, stash in stashed:
            os.mkdir(os.path.join(ancestor, child))
            mount(stash, os.path.join(ancestor, child), None, MS_MOVE)


def probe_pid_namespace() -> int | None:
    """An fd of our own PID namespace when per-run PID namespaces work (unshare, then setns back after each fork)."""
    if libc is None or os.geteuid() != 0:
        return None
    try:
        own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    if libc.unshare(CLONE_NEWPID) != 0 or libc.setns(own, CLONE_NEWPID) != 0:
        os.close(own)
        return None
    return own


# Seccomp: a small deny list (x86-64 only), on top of the namespaces


_AUDIT_ARCH_X86_64 = 0xC000003E
# ptrace, mount, umount2, unshare, setns, kexec_load, reboot, init/delete/finit_module, bpf, perf_event_open,
# keyctl/add_key/request_key, userfaultfd, process_vm_readv/writev, pivot_root, chroot, swapon/off, acct,
# + io_uring, which could open sockets unseen.
_DENIED_SYSCALLS = (
    *(101, 165, 166, 272, 308, 246, 169, 175, 176, 313, 321, 298, 250),
    *(248, 249, 323, 310, 311, 155, 161, 167, 168, 163, 425, 426, 427),
)
_SOCKET_SYSCALL, _AF_UNIX = 41, 1


def seccomp_program() -> bytes | None:
    import platform

    if platform.machine() != "x86_64":
        return None
    ld_abs, jeq, ret = 0x20, 0x15, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    jge = 0x35
    # Another ABI (i386 via int 0x80, x32 numbers) would dodge the numbers below: deny it outright.
    prog = [(ld_abs, 0, 0, 4), (jeq, 1, 0, _AUDIT_ARCH_X86_64), (ret, 0, 0, deny), (ld_abs, 0, 0, 0)]
    prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, deny)]
    for nr in _DENIED_SYSCALLS:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, deny)]
    # socket(domain, ...): only AF_UNIX (multiprocessing needs it); the empty netns already has no route out.
    prog += [(jeq, 0, 3, _SOCKET_SYSCALL), (ld_abs, 0, 0, 16), (jeq, 1, 0, _AF_UNIX), (ret, 0, 0, deny)]
    prog += [(ret, 0, 0, allow)]
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


def _install_seccomp(program: bytes) -> None:
    buffer = ctypes.create_string_buffer(program)

    class SockFprog(ctypes.Structure):
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

    fprog = SockFprog(len(program) // 8, ctypes.addressof(buffer))
    check(libc.prctl(22, 2, ctypes.byref(fprog), 0, 0), "seccomp")  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


# Per run: its working directory and PID namespace (in the zygote), then its first process


def mount_workdir(workdir: str, file_size_mb: int, uid: int | None) -> None:
    """Give the run's working directory its own small tmpfs, owned by the run's uid when it has one."""
    options = f"size={max(1, file_size_mb) * 2}m,nr_inodes=4096,mode=0700"
    if uid is not None:
        options += f",uid={uid},gid={uid}"
    mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, options)


def unmount_workdir(workdir: str) -> None:
    check(libc.umount2(workdir.encode(), MNT_DETACH), "umount")


def fork_run(pidns_fd: int | None) -> int:
    """``os.fork()``; with ``pidns_fd`` (see :func:`probe_pid_namespace`) the child is pid 1 of a new PID namespace."""
    if pidns_fd is None:
        return os.fork()
    check(libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    pid = -1
    try:
        pid = os.fork()
    finally:
        if pid != 0:
            check(libc.setns(pidns_fd, CLONE_NEWPID), "setns back to our PID namespace")
    return pid


def drop_privileges(uid: int | None, seccomp: bytes | None, zygote_pid: int) -> None:
    """In the run's first process: become ``uid``, forbid regaining root, die with the zygote, install seccomp."""
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    if libc is not None:
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # setuid binaries can no longer regain root
        # If the zygote dies, the run dies with it (and, as PID 1, its namespace). Set after setuid, which clears it.
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() not in (0, zygote_pid):  # the zygote died before the line above (0: parent outside our ns)
            os._exit(1)
        if seccomp is not None:
            _install_seccomp(seccomp)


def _limit(which: int, value: int, slack: int = 0) -> None:
    """Set the soft limit to ``value`` and the hard one ``slack`` above it (never above the current hard limit)."""
    import resource as res

    _soft, hard = res.getrlimit(which)
    value = value if hard == res.RLIM_INFINITY else min(value, hard)
    res.setrlimit(which, (value, value + slack if hard == res.RLIM_INFINITY else min(value + slack, hard)))


def apply_rlimits(req: dict, uid: int | None) -> None:
    """The run's CPU, memory, file-size, core, fd and (with its own uid) process limits, inherited by its code."""
    import resource as res

    cpu = max(1, int(req["cpu_time_s"] + 0.999))
    _limit(res.RLIMIT_CPU, cpu, slack=1)  # SIGXCPU at the soft limit (a timeout), SIGKILL a second later
    _limit(res.RLIMIT_AS, req["memory_mb"] << 20)
    _limit(res.RLIMIT_FSIZE, req["file_size_mb"] << 20)
    _limit(res.RLIMIT_CORE, 0)
    _limit(res.RLIMIT_NOFILE, 256)
    if uid is not None:  # root ignores RLIMIT_NPROC; a fresh uid per run makes it count only this run's processes
        _limit(res.RLIMIT_NPROC, req["max_processes"])
