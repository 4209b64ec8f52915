"""Landlock for the process that runs model code: from its first line on, it opens no file outside its own folder.

The pages of a file a run reads stay in the host's page cache after it ends, so one run could warm chosen pages of a
cold file and a later run find out which (by timing a read, or by its own major-fault count). Under this layer a
run's process is chrooted into a root of its own that holds only its private ``/sandbox`` tmpfs (pages that are its
own and die with it), the ``/dev`` nodes (no page cache) and the shared objects of extension modules it may still load
(each held resident and locked by the zygote), bound at their own paths (inside its ``/sandbox``, where its ``/tmp``
leads, for those of an interpreter under ``/tmp``), and empty placeholders of the interpreter's own files that it may
not open: no other path of the disk exists for it, not even to ``stat`` (which would warm the
kernel's caches of directories and inodes). Landlock then refuses it every other
access (``EACCES``), the execution of any file included. What the code imports must then come from the
zygote (``_preload.py``): the packages it loaded, the compiled code of the standard library and of those packages, and
their extension modules' shared objects; :func:`import_finders` turn an import of anything else into a
``ModuleNotFoundError`` that says why. Standard library only: the zygote loads this
file by path.

The ruleset is built with the kernel's own ABI (``landlock_create_ruleset``, ``landlock_add_rule``,
``landlock_restrict_self``: syscalls 444-446 on every architecture) and handles every file access right the running
kernel knows (ABI 1: Linux 5.13; ``REFER`` from ABI 2, ``TRUNCATE`` from 3, ``IOCTL_DEV`` from 5).
"""

from __future__ import annotations

import ctypes
import os
import sys

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
TRUNCATE = 1 << 14
# Each ABI's file access rights: bits 0-12 in ABI 1, REFER (13) in 2, TRUNCATE (14) in 3 and 4, IOCTL_DEV (15) from 5.
_HANDLED_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
_HANDLED_LATEST = (1 << 16) - 1
_MAKE_CHAR, _MAKE_BLOCK, _IOCTL_DEV = 1 << 6, 1 << 11, 1 << 15
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | _IOCTL_DEV  # the only rights a rule on a file may hold

_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
if _libc is not None:
    _libc.syscall.restype = ctypes.c_long


class _RulesetAttr(ctypes.Structure):
    _fields_ = (("handled_access_fs", ctypes.c_uint64),)


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is packed: 12 bytes
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


def probe_abi() -> int:
    """The Landlock ABI version of the running kernel; 0 where it has none (before 5.13, or not enabled at boot)."""
    if _libc is None:
        return 0
    version = _libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(0, int(version))


def handled_rights(abi: int) -> int:
    """Every file access right ABI ``abi`` knows: all are handled, so each is refused unless a rule grants it."""
    return _HANDLED_BY_ABI.get(abi, _HANDLED_LATEST)


def build_ruleset(abi: int, run_root: str) -> int:
    """The ruleset of every run of model code, built once (in the zygote; returns its fd): everything beneath
    ``run_root``, the root such a run is chrooted into (``_isolation.make_run_root``), but execution, device nodes
    made and device ioctls. That root holds nothing but what the run may use: its ``/sandbox`` (its own tmpfs, whose
    mount point is in that root, so the rule reaches it), the ``/dev`` nodes and, read-only, the shared objects of the
    extension modules, each resident and locked by the zygote. Raises OSError."""
    handled = handled_rights(abi)
    attr = _RulesetAttr(handled)
    ruleset = _check(_libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(attr), 0), "create")
    try:
        fd = os.open(run_root, os.O_PATH | os.O_CLOEXEC)
        try:
            rule = _PathBeneathAttr(handled & ~(EXECUTE | _MAKE_CHAR | _MAKE_BLOCK | _IOCTL_DEV), fd)
            _check(_libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0), run_root)
        finally:
            os.close(fd)
    except BaseException:
        os.close(ruleset)
        raise
    return ruleset


def restrict(ruleset: int) -> None:
    """Confine this process and everything it starts to ``ruleset`` (needs ``no_new_privs`` first; raises OSError),
    then close the fd: the code that runs next never holds it (a rule added to it would reach later runs)."""
    try:
        _check(_libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0), "restrict_self")
    finally:
        os.close(ruleset)


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"landlock {what}: {os.strerror(code)}")
    return result


class _RunFiles:
    """Finds modules in the run's own folder only (a ``files=`` helper module): what ``PathFinder`` did, minus every
    location the run may not read."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir.rstrip("/") + "/"

    def find_spec(self, name, path=None, target=None):
        import importlib.machinery

        entries = [entry for entry in (sys.path if path is None else path) if self._inside(entry)]
        return importlib.machinery.PathFinder.find_spec(name, entries, target) if entries else None

    def _inside(self, entry: object) -> bool:
        return isinstance(entry, str) and (entry + "/").startswith(self.run_dir)

    def invalidate_caches(self) -> None:
        import importlib.machinery

        importlib.machinery.PathFinder.invalidate_caches()


class _NotPreloaded:
    """The last finder: a module nobody found is one the run could only load from files it may not read."""

    def find_spec(self, name, path=None, target=None):
        raise ModuleNotFoundError(
            f"No module named {name!r} in this sandbox: code here reads no file outside its working folder, so it "
            "imports only the modules preloaded before it started (the standard library, and the sandbox's "
            "preload list) and its own files",
            name=name,
        )


def import_finders(run_dir: str, archive: object) -> list:
    """The ``sys.meta_path`` of a run of model code (built once, in the zygote): imports come from memory only
    (``sys.modules``, built-in and frozen modules, ``archive``: the zygote's compiled standard library, a meta path
    finder) and ``run_dir``'s own files, which come first as ``sys.path[0]`` would; a module found nowhere fails with
    a message that says why instead of a bare ``PermissionError``."""
    import importlib.machinery

    finders = [finder for finder in sys.meta_path if finder is not importlib.machinery.PathFinder]
    at = next((i for i, finder in enumerate(sys.meta_path) if finder is importlib.machinery.PathFinder), len(finders))
    finders[at:at] = [_RunFiles(run_dir), archive]
    return [*finders, _NotPreloaded()]
