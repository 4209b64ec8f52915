"""What the zygote loads before its first run, and the files it keeps resident: standard library only, loaded by path.

Runs are forks of the zygote, so a module it imported is one a run has without reading a file. Under Landlock
(``_landlock.py``) that is the only way a run imports at all: :func:`preload_stdlib` imports the whole standard
library (every module and submodule that imports cleanly here, less those with an effect on import, the test suites,
the GUI and the deprecated 2to3), :func:`preload` the sandbox's own ``preload`` list. Then :func:`pin_mapped_files`
maps every file the zygote has mapped (the interpreter, libpython, every extension module and library it loaded) in
full, read only, and locks it in memory: every page of those files is resident for as long as the zygote lives, so a
run, which can reach file pages only through the mappings it inherits (grown with ``mremap`` or not), finds nothing
cold to warm and no fault to count.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import sys
import tempfile
import warnings
from stat import S_ISREG

# Never preloaded: an effect on import (a browser, a print, a GUI, readline's terminal setup, 2to3 writing grammar
# pickles next to its sources) or not meant to be imported by a program (test suites, IDLE, the package installers).
_SKIP = {
    "antigravity", "this", "idlelib", "tkinter", "_tkinter", "turtle", "turtledemo", "test", "lib2to3", "readline",
    "rlcompleter", "ensurepip", "venv", "pydoc", "distutils", "__main__", "tests", "idle_test",
}  # fmt: skip
_MCL_CURRENT, _MADV_WILLNEED = 1, 3
_PROT_READ, _MAP_SHARED = 1, 1
_MAP_FAILED = ctypes.c_void_p(-1).value


def preload(modules: list) -> None:
    """Import trusted modules once, before the view is built (the view is read-only and a namespace can only be
    entered by a single-threaded process), so that runs fork with them loaded (``Sandbox(preload=...)``).

    Numerical libraries are kept single-threaded (no thread pool, which would neither survive the fork nor let the
    zygote enter its namespaces); matplotlib writes its font cache into a temporary folder removed afterwards.
    """
    if not modules:
        return
    import shutil

    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    scratch = tempfile.mkdtemp(prefix="rllm-sandbox-preload-")
    os.environ.setdefault("MPLCONFIGDIR", scratch)
    try:
        for name in modules:
            importlib.import_module(name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def preload_stdlib() -> int:
    """Import every standard-library module and submodule this interpreter has (``sys.stdlib_module_names``, then
    each package's folder), but those in ``_SKIP``; one that fails to import here (another platform's) is left out.
    Returns how many modules are loaded."""
    import pkgutil

    with warnings.catch_warnings():  # deprecated modules (cgi, imp, ...) still import: quietly
        warnings.simplefilter("ignore")
        for name in sorted(sys.stdlib_module_names - _SKIP):
            if name.startswith("__") or not _import(name):
                continue
            path = getattr(sys.modules[name], "__path__", None)
            for info in pkgutil.walk_packages(path or [], name + ".", onerror=lambda _name: None):
                if _SKIP.isdisjoint(info.name.split(".")):
                    _import(info.name)
    return len(sys.modules)


def _import(name: str) -> bool:
    try:
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            importlib.import_module(name)
    except Exception:  # another platform's module, or one whose optional library is missing here
        return False
    return True


def pin_mapped_files(libc: ctypes.CDLL) -> tuple[int, bool]:
    """Map each file this process has mapped, whole and read only, and lock it (``mlock``); where locking is not
    allowed, read it in (``MADV_WILLNEED``) instead. Returns the bytes mapped and whether they are locked.

    The files are opened through ``/proc/self/map_files`` (the mapping itself, so a file whose path the view hides
    or that was deleted is still the one mapped). The mappings are never unmapped: they live as long as the zygote.
    """
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    seen: set[tuple[int, int]] = set()
    total, locked = 0, True
    with open("/proc/self/maps") as handle:
        lines = handle.read().splitlines()
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith("/") or fields[4] == "0":
            continue  # anonymous memory, the stack, vdso: no file behind it
        try:
            fd = os.open("/proc/self/map_files/" + fields[0], os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            stat = os.fstat(fd)
            if (stat.st_dev, stat.st_ino) in seen or stat.st_size == 0 or not S_ISREG(stat.st_mode):
                continue
            seen.add((stat.st_dev, stat.st_ino))
            address = libc.mmap(None, stat.st_size, _PROT_READ, _MAP_SHARED, fd, 0)
            if address in (None, _MAP_FAILED):
                continue
            total += stat.st_size
            if libc.mlock(ctypes.c_void_p(address), ctypes.c_size_t(stat.st_size)) != 0:
                locked = False
                libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(stat.st_size), _MADV_WILLNEED)
        finally:
            os.close(fd)
    return total, locked
