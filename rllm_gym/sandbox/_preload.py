"""What the zygote loads before its first run, and the files it keeps resident: standard library only, loaded by path.

Runs are forks of the zygote, so what it loaded a run has without reading a file. Under Landlock (``_landlock.py``) a
run reads no file of the view, so before its first run the zygote imports the sandbox's ``preload`` (:func:`preload`)
and builds a :class:`ModuleArchive` of every module of the standard library and of those packages: the compiled code
of their pure-Python modules, in a sealed, shared memfd (a fork copies none of it), and the paths of their extension
modules. Those shared objects and the libraries they need are the only files a run may still read (to load one as it
imports it), and :func:`pin_files` maps each of them whole, read only, and locks it in memory, as it does every file
the zygote itself has mapped (the interpreter, libpython): every page of every file a run can reach is resident as
long as the zygote lives, so it finds nothing cold to warm and no fault to count, through a read or through a mapping
it inherits (grown with ``mremap`` or not)."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib
import importlib.machinery
import importlib.util
import marshal
import os
import struct
import sys
import tempfile
from stat import S_ISREG

# Extension modules never offered (tests of the C API; the GUI and NIS, which need dozens of libraries: X11, Kerberos)
# and folders never archived (test suites, IDLE, the demos, installed packages: those come in through ``preload``).
_SKIP_EXTENSIONS = ("_test", "xx", "_ctypes_test", "_tkinter", "nis")
_SKIP_FOLDERS = {
    "test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages", "lib-dynload", "idlelib",
    "turtledemo",
}  # fmt: skip
_MADV_WILLNEED, _MADV_DONTFORK = 3, 10
_PROT_READ, _MAP_SHARED = 1, 1
_MAP_FAILED = ctypes.c_void_p(-1).value
_F_ADD_SEALS, _SEALS = 1033, 0x1 | 0x2 | 0x4 | 0x8  # F_SEAL_SEAL, SHRINK, GROW, WRITE


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


class ModuleArchive:
    """Every module of the standard library and of given packages, importable in a run that reads no source file.

    Pure-Python modules: their compiled code, in one sealed, read-only memfd the zygote maps (shared: a fork copies
    none of it). Extension modules: their paths; a run loads one from its file, one of the few it may read
    (:meth:`shared_objects`: bound in the runs' own root by ``_isolation.make_run_root``, pinned by
    :func:`pin_files`). The run imports through :meth:`find_spec` and the module runs in the run, as it would from
    its file. Sealed (no write, no resize), the code cannot be changed by one run for the next.
    """

    def __init__(self) -> None:
        self.index: dict[str, tuple[int, int, bool, str]] = {}  # name -> (offset, size, is package, file)
        self.extensions: dict[str, str] = {}  # name -> the shared object's path
        self.extension_dirs: set[str] = set()  # folders on sys.path that hold extension modules (lib-dynload)
        self.address = 0  # where the sealed memfd is mapped (read only, shared)
        self._fd = os.memfd_create("rllm-sandbox-modules", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self._size = 0

    def add_tree(self, folder: str, prefix: str = "") -> None:
        """Every module below ``folder`` (``.py`` files and extension modules), named from ``prefix`` (``""`` for a
        folder on ``sys.path``); subfolders without ``__init__.py`` and those of ``_SKIP_FOLDERS`` are left out."""
        for root, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_FOLDERS and d.isidentifier())
            relative = os.path.relpath(root, folder)
            parts = [] if relative == "." else relative.split(os.sep)
            if parts and not os.path.exists(os.path.join(root, "__init__.py")):
                dirs[:] = []  # not a package: nothing below it is importable by name
                continue
            for file in sorted(files):
                stem, extension = _module_stem(file)
                if stem is None or (extension and stem.startswith(_SKIP_EXTENSIONS)):
                    continue
                name = ".".join(filter(None, [prefix, *parts, None if stem == "__init__" else stem]))
                if not name or name in self.index or name in self.extensions:
                    continue
                if extension:
                    self.extensions[name] = os.path.join(root, file)
                    if not prefix and not parts:
                        self.extension_dirs.add(folder)
                else:
                    self._add(name, os.path.join(root, file), stem == "__init__")

    def shared_objects(self) -> tuple[list[str], list[str]]:
        """What a run may read to load the archive's extension modules, and what the zygote must pin for that.

        Readable: each folder of the standard library's extension modules (``lib-dynload``: nothing else is in it),
        each extension module of a package, each library they need that this process has not loaded (found by
        loading them all in a throwaway child), and the dynamic loader's cache. Pinned: every file in those, and
        every file this process has mapped (a run inherits those mappings)."""
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child loads them; this process stays as it was
            os.close(read)
            for path in self.extensions.values():
                with contextlib.suppress(OSError):  # a library it needs is missing here: it cannot load anyway
                    ctypes.CDLL(path, mode=sys.getdlopenflags())
            with os.fdopen(write, "w") as out:
                out.write("\n".join(_mapped_files()))
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as listing:
            loaded = set(listing.read().split("\n"))
        os.waitpid(pid, 0)
        folders = sorted(self.extension_dirs)
        inside = {os.path.join(folder, entry) for folder in folders for entry in os.listdir(folder)}
        extra = {path for path in loaded - _mapped_files() - inside if os.path.isfile(path)}
        extra |= {path for path in self.extensions.values() if os.path.dirname(path) not in self.extension_dirs}
        cache = ["/etc/ld.so.cache"] if os.path.isfile("/etc/ld.so.cache") else []
        return folders + sorted(extra) + cache, sorted(loaded | inside | extra | set(cache))

    def _add(self, name: str, path: str, package: bool) -> None:
        try:
            code = _code_bytes(path)
        except (OSError, SyntaxError, ValueError):
            return
        self.index[name] = (self._size, len(code), package, path)
        while code:  # written at once: the zygote's heap never holds the whole archive
            written = os.write(self._fd, code)
            code, self._size = code[written:], self._size + written

    def seal(self, libc: ctypes.CDLL) -> bool:
        """Seal the memfd, map it read only and lock it; returns False where it could not be locked."""
        try:
            fcntl.fcntl(self._fd, _F_ADD_SEALS, _SEALS)
            address = _mmap(libc)(None, max(1, self._size), _PROT_READ, _MAP_SHARED, self._fd, 0)
            if address in (None, _MAP_FAILED):
                raise OSError(ctypes.get_errno(), "mmap of the module archive failed")
        finally:
            os.close(self._fd)
        self.address = address
        return libc.mlock(ctypes.c_void_p(address), ctypes.c_size_t(max(1, self._size))) == 0

    # In a run (the finder and loader of what the archive holds)

    def find_spec(self, name, path=None, target=None):
        if name in self.extensions:
            where = self.extensions[name]
            loader = importlib.machinery.ExtensionFileLoader(name, where)
            return importlib.util.spec_from_file_location(name, where, loader=loader)
        entry = self.index.get(name)
        if entry is None or not self.address:
            return None
        spec = importlib.machinery.ModuleSpec(name, self, origin=entry[3], is_package=entry[2])
        if entry[2]:
            spec.submodule_search_locations = [os.path.dirname(entry[3])]
        spec.has_location = True
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        exec(self.get_code(module.__spec__.name), module.__dict__)

    def get_code(self, name: str):
        offset, size, _package, _path = self.index[name]
        return marshal.loads(ctypes.string_at(self.address + offset, size))

    def is_package(self, name: str) -> bool:
        return self.index[name][2]

    def get_source(self, name: str) -> None:
        return None


def _module_stem(file: str) -> tuple[str | None, bool]:
    """A file's module name and whether it is an extension module; None for a file that is not a module."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if file.endswith(suffix):
            stem = file[: -len(suffix)]
            return (stem if stem.isidentifier() else None), True
    stem = file[:-3]
    return (stem if file.endswith(".py") and stem.isidentifier() else None), False


def _code_bytes(path: str) -> bytes:
    """The marshalled code of a source file: its cached ``.pyc`` when that matches the source, else compiled."""
    stat = os.stat(path)
    try:
        with open(importlib.util.cache_from_source(path), "rb") as handle:
            cached = handle.read()
        flags, mtime, size = struct.unpack_from("<III", cached, 4)
        if (
            cached[:4] == importlib.util.MAGIC_NUMBER
            and flags == 0
            and mtime == int(stat.st_mtime) & 0xFFFFFFFF
            and size == stat.st_size & 0xFFFFFFFF
        ):
            return cached[16:]
    except (OSError, NotImplementedError, struct.error):
        pass
    with open(path, "rb") as handle:
        return marshal.dumps(compile(handle.read(), path, "exec", dont_inherit=True))


def pin_files(libc: ctypes.CDLL, paths: list[str]) -> tuple[int, bool]:
    """Map each file whole, read only, and lock it (``mlock``; where locking is not allowed, read it in with
    ``MADV_WILLNEED``), in this process alone (``MADV_DONTFORK``: no fork copies the mapping). The mappings are never
    unmapped: they live as long as the zygote. Returns the bytes mapped and whether they are all locked."""
    mmap = _mmap(libc)
    seen: set[tuple[int, int]] = set()
    total, locked = 0, True
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            stat = os.fstat(fd)
            if (stat.st_dev, stat.st_ino) in seen or stat.st_size == 0 or not S_ISREG(stat.st_mode):
                continue
            seen.add((stat.st_dev, stat.st_ino))
            address = mmap(None, stat.st_size, _PROT_READ, _MAP_SHARED, fd, 0)
            if address in (None, _MAP_FAILED):
                continue
            total += stat.st_size
            where, size = ctypes.c_void_p(address), ctypes.c_size_t(stat.st_size)
            if libc.mlock(where, size) != 0:
                locked = False
                libc.madvise(where, size, _MADV_WILLNEED)
            libc.madvise(where, size, _MADV_DONTFORK)
        finally:
            os.close(fd)
    return total, locked


def _mmap(libc: ctypes.CDLL):
    function = libc.mmap
    function.restype = ctypes.c_void_p
    function.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    return function


def _mapped_files() -> set[str]:
    with open("/proc/self/maps") as maps:
        fields = [line.rstrip("\n").split(maxsplit=5) for line in maps]
    return {f[5] for f in fields if len(f) == 6 and f[5].startswith("/") and os.path.isfile(f[5])}
