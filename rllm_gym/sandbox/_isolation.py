"""The sandbox's isolation layers, as the zygote (:mod:`rllm_gym.sandbox._zygote`) applies them: standard library only.

Once, in the zygote: a private mount namespace whose root is a new, read-only tree holding only ``/usr`` (and the
``/bin``, ``/lib`` links), the interpreter's prefix and virtual environment, a synthetic ``/etc``, a few ``/dev``
nodes, empty ``/proc`` and ``/sandbox`` mount points and ``/tmp`` as a link to ``/sandbox`` (:func:`build_view`);
the project's own package folders are covered by empty mounts; a memory cgroup of the zygote's own for the runs
(``_cgroups.py``); a probe for per-run PID namespaces and the seccomp program. Per run, in the run's supervisor
(pid 1 of a fresh PID namespace, still root): new mount, network and IPC namespaces, a private size-capped tmpfs on
``/sandbox`` owned by the run's uid (its working directory, ``HOME`` and ``TMPDIR``; ``/tmp`` and ``/dev/shm`` point
into it) and a fresh ``/proc`` (:func:`enter_run`); where the interpreter or its venv lives under ``/tmp`` or
``/dev/shm`` (:data:`RUN_ALIASES`), what the run may read of it is bound inside that tmpfs, at the path under
``/tmp`` that leads there (a run of model code under Landlock, in its own root: :func:`make_run_root`, the same);
then, in the solution's process: the memory cgroup, the switch to the run's unprivileged uid, ``no_new_privs``, the
parent-death signal, the seccomp filter and the rlimits. The zygote loads this file by its path (it runs as a script
under ``python -I``, so its folder is not on ``sys.path``); keep it free of package imports.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import struct
import sys

try:
    import resource  # loaded here: after dropping root, a run may no longer reach the interpreter's lib-dynload
except ImportError:  # not POSIX
    resource = None

libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG = 38, 36, 1
_SYS_PIVOT_ROOT = 155
_BASE = ""  # the host folder where build_view assembles the new root (made and removed by the host)
# Inside the view: each run's private tmpfs, its working directory, HOME and TMPDIR. Not /tmp itself: the interpreter
# or its venv may live under /tmp and must stay visible; /tmp is a link here unless such a tree occupies it.
RUN_DIR = "/sandbox"
RUN_ROOT = "/.run-root"  # inside the view: the root of runs of model code under Landlock (make_run_root)
# The host folders a run's own tmpfs stands for: a host path below one (an interpreter or venv under /tmp) is reached
# in a run through RUN_DIR, so each run binds what it needs of such a tree back inside its RUN_DIR.
RUN_ALIASES = ("/tmp", "/dev/shm")
_TMP_TREES: list[tuple[str, str, str]] = []  # (alias, tree below it, its second read-only mount): each run rebinds
# Inside the view, outside RUN_ROOT: what make_run_root binds below an alias (by the path under it); each run of model
# code binds every top folder of it inside its RUN_DIR, at the path its files have under /tmp.
RUN_ROOT_ALIASED = "/.run-root-aliased"
_ALIASED_TOPS: list[str] = []
_DEVICES = ("null", "zero", "full", "random", "urandom")
_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")


def check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s):
        return None if s is None else s.encode()

    check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


# Set up once, in the zygote itself


def build_view(
    base: str,
    hidden: list[str],
    isolation: list[str],
    packages: list[str] | None = None,
    run_files: list | None = None,
    run_unreadable: list[str] = (),
) -> bool:
    """Move the zygote into a private mount namespace rooted at a minimal read-only tree; False when not possible.

    ``base``: an empty host folder (the host makes and removes it) where the new root is assembled on a tmpfs.
    ``hidden``: host folders (the project's packages) that must not exist for the code even when they sit inside a
    tree the view exposes (a non-editable install in site-packages): each gets an empty read-only mount over it.
    ``packages``: None exposes every installed third-party package; a list, only those top-level import names
    (each site-packages folder becomes an empty tmpfs holding just their files). ``run_files``, ``run_unreadable``:
    for :func:`make_run_root`, which builds the smaller root of runs of model code.
    """
    if libc is None or os.geteuid() != 0 or libc.unshare(CLONE_NEWNS) != 0:
        return False
    # Private first: without it the mounts below could propagate back to the host's mounts.
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    global _BASE
    _BASE = base
    mount("tmpfs", _BASE, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    root = _BASE + "/root"
    os.mkdir(root, 0o755)
    mount(root, root, None, MS_BIND)  # pivot_root needs a mount point
    for name in _SYSTEM_DIRS:
        host = "/" + name
        if os.path.islink(host):
            os.symlink(os.readlink(host), root + host)
        elif os.path.isdir(host):
            _bind_readonly(host, root + host)
    for tree in _python_trees():
        _bind_readonly(tree, root + tree)
    if packages is not None:
        for folder in _site_packages():
            _allow_only(root + folder, packages)
    for path in sorted({os.path.realpath(p) for p in hidden}):
        if os.path.exists(root + path):
            if os.path.isdir(root + path):
                mount("tmpfs", root + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=0555")
            else:
                placeholder = _BASE + "/hidden-file"  # an empty, unreadable file over the hidden one
                if not os.path.exists(placeholder):
                    open(placeholder, "w").close()
                    os.chmod(placeholder, 0)
                _bind_readonly(placeholder, root + path)
    for tree in _python_trees():
        alias = _alias_of(tree)
        if alias is not None:  # each run's own folder covers it: enter_run binds it back from this second mount,
            stash = f"/.python-trees/{len(_TMP_TREES)}"  # which carries the covers above (MS_REC)
            os.makedirs(root + stash, 0o755)
            _bind_tree(root + tree, root + stash)
            _TMP_TREES.append((alias, tree, stash))
    _make_etc(root)
    _make_dev(root)
    if run_files is not None:
        make_run_root(root + RUN_ROOT, run_files, run_unreadable, root + RUN_ROOT_ALIASED)
    for name, mode in (("proc", 0o555), (RUN_DIR.lstrip("/"), 0o755), (".old", 0o700)):
        os.mkdir(os.path.join(root, name), mode)
    if not os.path.lexists(root + "/tmp"):  # else /tmp holds the interpreter's tree and each run binds its own folder
        os.symlink(RUN_DIR, root + "/tmp")
    os.chdir(root)
    check(libc.syscall(_SYS_PIVOT_ROOT, b".", b".old"), "pivot_root")
    os.chdir("/")
    check(libc.umount2(b"/.old", MNT_DETACH), "umount the host's tree")
    os.rmdir("/.old")
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")  # the zygote's own
    mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    isolation += ["minimal_fs", "readonly_fs"]
    return True


def make_run_root(run_root: str, files: list[str], unreadable: list[str] = (), aliased: str = "") -> None:
    """The root a run of model code is chrooted into (under Landlock): in memory (directories of the view's tmpfs)
    but for ``files`` (each file of a folder one by one) bound read-only at their own paths, the system links, the
    ``/dev`` nodes and an empty ``/sandbox``. No other path of the disk exists there, so a run cannot warm the
    kernel's caches of directories and inodes (by a ``stat`` of a cold path) for a later run to time. ``unreadable``
    (the interpreter's own files) get an empty placeholder nobody may read: opening one fails with ``EACCES``, as for
    any file a run may not read, without a lookup on the disk. A path below one of :data:`RUN_ALIASES` (an
    interpreter or venv under /tmp), whose alias is the run's own folder there, is built in ``aliased`` instead, by
    its path under the alias: :func:`enter_run` binds it inside each run's folder, where that path leads."""
    os.mkdir(run_root, 0o755)
    for name in _SYSTEM_DIRS:
        if os.path.islink("/" + name):
            os.symlink(os.readlink("/" + name), f"{run_root}/{name}")

    def at(path: str) -> str:  # where ``path`` is built
        alias = _alias_of(path)
        return run_root + path if alias is None else aliased + path[len(alias) :]

    bound: set[str] = set()
    for path in files:
        inside = [os.path.join(path, entry) for entry in sorted(os.listdir(path))] if os.path.isdir(path) else [path]
        os.makedirs(at(path) if os.path.isdir(path) else os.path.dirname(at(path)), 0o755, exist_ok=True)
        for file in inside:
            if os.path.isfile(file) and not os.path.islink(file):
                _bind_readonly(file, at(file))
                bound.add(file)
    for folder in {os.path.dirname(file) for file in bound}:  # the names the loader asks for: libssl.so.3 -> ...
        for entry in os.listdir(folder):
            link = os.path.join(folder, entry)
            if os.path.islink(link) and os.path.realpath(link) in bound and not os.path.lexists(at(link)):
                os.symlink(os.readlink(link), at(link))
    _make_dev(run_root)
    os.mkdir(run_root + RUN_DIR, 0o755)
    os.symlink(RUN_DIR, run_root + "/tmp")
    for path in unreadable:
        with contextlib.suppress(OSError):  # where a bound file is: nothing to stand in for
            os.makedirs(os.path.dirname(at(path)), 0o755, exist_ok=True)
            os.close(os.open(at(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0))
    _ALIASED_TOPS[:] = sorted(os.listdir(aliased)) if aliased and os.path.isdir(aliased) else []


def _alias_of(path: str) -> str | None:
    """The folder of :data:`RUN_ALIASES` that ``path`` lies below, if any."""
    return next((alias for alias in RUN_ALIASES if path.startswith(alias + "/")), None)


def _bind_tree(source: str, target: str) -> None:
    """A read-only bind of ``source`` with every mount below it (the package covers and hidden folders)."""
    mount(source, target, None, MS_BIND | MS_REC)
    mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _bind_readonly(source: str, target: str, nodev: bool = True) -> None:
    if os.path.isdir(source):
        os.makedirs(target, 0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
        open(target, "w").close()
    mount(source, target, None, MS_BIND)
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | (MS_NODEV if nodev else 0)
    mount(None, target, None, flags)


def _python_trees() -> list[str]:
    """The interpreter's prefix and its virtual environment's (not ``sys.path`` entries elsewhere: an editable
    install puts the project's source folder on the path, and that must stay out of the view)."""
    trees: list[str] = []
    for path in sorted({os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}, key=len):
        covered = any(path == t or path.startswith(t + os.sep) for t in trees)
        system = any(path == "/" + d or path.startswith(f"/{d}/") for d in _SYSTEM_DIRS)
        if path != "/" and not covered and not system:
            trees.append(path)
    return trees


def _site_packages() -> list[str]:
    return sorted({os.path.realpath(p) for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")})


def _allow_only(folder: str, packages: list[str]) -> None:
    """Cover ``folder`` (a site-packages in the view) with a tmpfs that holds only ``packages``' files."""
    if not os.path.isdir(folder):
        return
    wanted = {name.lower().replace("-", "_") for name in packages}
    entries = []
    for entry in os.listdir(folder):
        stem = entry.split(".")[0].lower()
        if entry.endswith((".dist-info", ".egg-info")):
            stem = entry.split("-")[0].lower().replace("-", "_")
        if stem in wanted or stem.lstrip("_") in wanted:  # numpy, numpy.libs, _yaml for yaml, foo.cpython-*.so
            entries.append(entry)
    sources = {entry: os.path.join(folder, entry) for entry in entries}
    stash = f"{_BASE}/stash-{len(os.listdir(_BASE))}"
    os.mkdir(stash)
    mount(folder, stash, None, MS_BIND)  # the real folder stays reachable while the tmpfs covers it
    mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
    for entry, source in sources.items():
        _bind_readonly(os.path.join(stash, os.path.relpath(source, folder)), os.path.join(folder, entry))
    mount(None, folder, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _make_etc(root: str) -> None:
    etc = root + "/etc"
    os.mkdir(etc, 0o755)
    files = {
        "passwd": "root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:65534:65534:sandbox:"
        + RUN_DIR
        + ":/usr/sbin/nologin\n",
        "group": "root:x:0:\nsandbox:x:65534:\n",
        "hosts": "127.0.0.1 localhost\n::1 localhost\n",
    }
    for name, text in files.items():
        with open(os.path.join(etc, name), "w") as handle:
            handle.write(text)
    if os.path.isfile("/etc/ld.so.cache"):
        _bind_readonly("/etc/ld.so.cache", etc + "/ld.so.cache")
    if os.path.islink("/etc/localtime"):
        os.symlink(os.readlink("/etc/localtime"), etc + "/localtime")


def _make_dev(root: str) -> None:
    dev = root + "/dev"
    os.makedirs(dev, 0o755, exist_ok=True)  # it holds the interpreter's tree where that lives under /dev/shm
    for name in _DEVICES:
        if os.path.exists("/dev/" + name):
            _bind_readonly("/dev/" + name, f"{dev}/{name}", nodev=False)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1")):
        os.symlink(target, f"{dev}/{name}")
    os.symlink("/proc/self/fd/2", dev + "/stderr")
    if not os.path.lexists(dev + "/shm"):  # else enter_run binds the run's own folder over it
        os.symlink(RUN_DIR, dev + "/shm")  # POSIX shared memory and semaphores land in the run's own capped tmpfs


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


def probe_run_namespaces() -> int:
    """The namespace flags (net, IPC) a run can get for itself: a forked child tries them and reports."""
    if libc is None or os.geteuid() != 0:
        return 0
    flags = 0
    for flag in (CLONE_NEWNET, CLONE_NEWIPC):
        pid = os.fork()
        if pid == 0:
            os._exit(0 if libc.unshare(flag) == 0 else 1)
        if os.waitpid(pid, 0)[1] == 0:
            flags |= flag
    return flags


# Seccomp: a deny list (x86-64 only), on top of the namespaces


_AUDIT_ARCH_X86_64 = 0xC000003E
_DENIED_SYSCALLS = {
    "ptrace": 101, "syslog": 103, "acct": 163, "settimeofday": 164, "mount": 165, "umount2": 166, "swapon": 167,
    "swapoff": 168, "reboot": 169, "pivot_root": 155, "chroot": 161, "init_module": 175, "delete_module": 176,
    "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298,
    "name_to_handle_at": 303, "open_by_handle_at": 304, "setns": 308, "process_vm_readv": 310,
    "process_vm_writev": 311, "kcmp": 312, "finit_module": 313, "kexec_file_load": 320, "bpf": 321,
    "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_getfd": 438,
    "mount_setattr": 442, "open_tree_attr": 467,
    # Probes of host state another run can set: which file pages are cached (mincore, cachestat, preadv2's
    # RWF_NOWAIT, pwritev2 for symmetry; io_uring above) and host-wide counters (sysinfo: processes, load, memory).
    "mincore": 27, "sysinfo": 99, "preadv2": 327, "pwritev2": 328, "cachestat": 451,
    # What could evict file pages or read them in behind a mapping's back (madvise's MADV_COLD/MADV_PAGEOUT below).
    "readahead": 187, "remap_file_pages": 216, "fadvise64": 221, "process_madvise": 440,
}  # fmt: skip
# Host-wide counters a fresh /proc still shows (open files, inodes, processes, load and the last pid, memory and page
# cache, I/O, locks, cgroups): one run could set them and another read them. Each is covered by /dev/null.
HOST_WIDE_PROC = (
    "loadavg", "stat", "meminfo", "vmstat", "zoneinfo", "buddyinfo", "pagetypeinfo", "diskstats", "schedstat",
    "softirqs", "interrupts", "locks", "cgroups", "swaps", "key-users", "slabinfo", "pressure/cpu", "pressure/io",
    "pressure/memory", "sys/fs/file-nr", "sys/fs/inode-nr", "sys/fs/inode-state", "sys/fs/dentry-state",
    "sys/fs/aio-nr", "sys/kernel/random/entropy_avail",
)  # fmt: skip
# Without a memory cgroup, memory that lives outside the address space limit is refused instead (memory_rules).
_MEMORY_SYSCALLS = {"shmget": 29, "memfd_create": 319}
_CLONE, _CLONE3, _SOCKET, _AF_UNIX = 56, 435, 41, 1
_MADVISE, _MADV_COLD, _MADV_PAGEOUT = 28, 20, 21
_CLONE_NEW_FLAGS = CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID
_CLONE_NEW_FLAGS |= CLONE_NEWNET


def seccomp_program(memory_rules: bool = False) -> bytes | None:
    """The filter: EPERM for the deny list, for ``clone`` with any ``CLONE_NEW*`` flag, for ``madvise`` with
    ``MADV_COLD`` or ``MADV_PAGEOUT`` (the advice allocators use stays allowed) and for non-UNIX sockets; ENOSYS for
    ``clone3`` (its flags sit behind a pointer a filter cannot read, and libc then falls back to
    ``clone``); another ABI than x86-64 is refused outright."""
    import platform

    if platform.machine() != "x86_64":
        return None
    ld_abs, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow = 0x7FFF0000  # SECCOMP_RET_ALLOW
    deny, nosys = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS  # SECCOMP_RET_ERRNO
    # Another ABI (i386 via int 0x80, x32 numbers) would dodge the numbers below: deny it outright.
    prog = [(ld_abs, 0, 0, 4), (jeq, 1, 0, _AUDIT_ARCH_X86_64), (ret, 0, 0, deny), (ld_abs, 0, 0, 0)]
    prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, deny)]
    denied = sorted({*_DENIED_SYSCALLS.values(), *(_MEMORY_SYSCALLS.values() if memory_rules else ())})
    for nr in denied:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, deny)]
    prog += [(jeq, 0, 1, _CLONE3), (ret, 0, 0, nosys)]
    # clone(flags, ...): the low 32 bits of args[0] (offset 16) hold the namespace flags.
    prog += [(jeq, 0, 4, _CLONE), (ld_abs, 0, 0, 16), (jset, 0, 1, _CLONE_NEW_FLAGS), (ret, 0, 0, deny)]
    prog += [(ret, 0, 0, allow)]
    # madvise(addr, length, advice): advice is args[2] (offset 32).
    prog += [(jeq, 0, 5, _MADVISE), (ld_abs, 0, 0, 32), (jeq, 2, 0, _MADV_COLD), (jeq, 1, 0, _MADV_PAGEOUT)]
    prog += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    # socket(domain, ...): only AF_UNIX (multiprocessing needs it); the empty netns already has no route out.
    prog += [(jeq, 0, 3, _SOCKET), (ld_abs, 0, 0, 16), (jeq, 1, 0, _AF_UNIX), (ret, 0, 0, deny)]
    prog += [(ret, 0, 0, allow)]
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


def _install_seccomp(program: bytes) -> None:
    buffer = ctypes.create_string_buffer(program)

    class SockFprog(ctypes.Structure):
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

    fprog = SockFprog(len(program) // 8, ctypes.addressof(buffer))
    check(libc.prctl(22, 2, ctypes.byref(fprog), 0, 0), "seccomp")  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


# Per run: its PID namespace (in the zygote), its own namespaces and mounts (in its supervisor), then the solution


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


def enter_run(
    namespaces: int, file_size_mb: int, uid: int | None, own_proc: bool, run_root: bool = False, own: frozenset = ()
) -> None:
    """In the run's supervisor: new mount (+ ``namespaces``) namespaces, a private tmpfs on RUN_DIR and a fresh /proc
    with its host-wide files covered; with ``run_root`` (model code under Landlock, which reads no /proc), the
    supervisor enters :data:`RUN_ROOT` (``chroot``) with the tmpfs on its RUN_DIR instead, and mounts no /proc.
    ``own``: the names of the run's own files; where one is also the name of the top folder of a tree bound in
    RUN_DIR (an interpreter under ``/tmp/<name>``), the run's file takes that place and the tree is not bound."""
    check(libc.unshare(CLONE_NEWNS | namespaces), "unshare the run's namespaces")
    options = f"size={max(1, file_size_mb) * 2}m,nr_inodes=4096,mode=0700"
    if uid is not None:
        options += f",uid={uid},gid={uid}"
    if run_root:
        mount("tmpfs", RUN_ROOT + RUN_DIR, "tmpfs", MS_NOSUID | MS_NODEV, options)
        for top in (top for top in _ALIASED_TOPS if top not in own):  # what it may read of a tree under /tmp
            inside = f"{RUN_ROOT}{RUN_DIR}/{top}"
            os.mkdir(inside, 0o755)
            _bind_tree(f"{RUN_ROOT_ALIASED}/{top}", inside)
        os.chroot(RUN_ROOT)
        os.chdir("/")
        return
    mount("tmpfs", RUN_DIR, "tmpfs", MS_NOSUID | MS_NODEV, options)
    if _TMP_TREES:  # the interpreter lives under /tmp: /tmp becomes the run's folder with that tree bound back in it
        for alias, tree, stash in _TMP_TREES:
            inside = RUN_DIR + tree[len(alias) :]
            if inside.split("/")[2] in own:
                continue
            os.makedirs(inside, 0o755, exist_ok=True)
            _bind_tree(stash, inside)
        for alias in sorted({alias for alias, _tree, _stash in _TMP_TREES}):
            mount(RUN_DIR, alias, None, MS_BIND | MS_REC)
    if own_proc:  # the supervisor is pid 1 of the run's PID namespace: this /proc shows the run's processes only
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
        for name in HOST_WIDE_PROC:
            with contextlib.suppress(OSError):  # absent on this kernel: nothing to cover
                mount("/dev/null", "/proc/" + name, None, MS_BIND)


def drop_privileges(uid: int | None, seccomp: bytes | None, supervisor_pid: int) -> None:
    """In the solution's process: become ``uid``, forbid regaining root, die with its supervisor, install seccomp."""
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    if libc is not None:
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # setuid binaries can no longer regain root
        # If the supervisor dies, the solution dies with it. Set after setuid, which clears it.
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != supervisor_pid:  # the supervisor died before the line above
            os._exit(1)
        if seccomp is not None:
            _install_seccomp(seccomp)


def _limit(which: int, value: int, slack: int = 0) -> None:
    """Set the soft limit to ``value`` and the hard one ``slack`` above it (never above the current hard limit)."""
    res = resource
    _soft, hard = res.getrlimit(which)
    value = value if hard == res.RLIM_INFINITY else min(value, hard)
    res.setrlimit(which, (value, value + slack if hard == res.RLIM_INFINITY else min(value + slack, hard)))


def apply_rlimits(req: dict, uid: int | None) -> None:
    """The run's CPU, memory, file-size, core, fd and (with its own uid) process limits, inherited by its code."""
    res = resource
    cpu = max(1, int(req["cpu_time_s"] + 0.999))
    _limit(res.RLIMIT_CPU, cpu, slack=1)  # SIGXCPU at the soft limit (a timeout), SIGKILL a second later
    _limit(res.RLIMIT_AS, req["memory_mb"] << 20)
    _limit(res.RLIMIT_FSIZE, req["file_size_mb"] << 20)
    _limit(res.RLIMIT_CORE, 0)
    _limit(res.RLIMIT_NOFILE, 256)
    if uid is not None:  # root ignores RLIMIT_NPROC; a fresh uid per run makes it count only this run's processes
        _limit(res.RLIMIT_NPROC, req["max_processes"])
