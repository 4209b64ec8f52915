"""No information flows between sandbox runs through the host's page cache: attacks on the ``landlock`` layer.

A run that could read a host file could warm chosen pages of it (a hidden test's run, depending on a secret) and a
later run whose output reaches the model could tell which pages are warm by its own major-fault count. With Landlock a
run's program opens no file outside its own folder, and every page of the files it has mapped is resident and locked
by the zygote (``_preload.pin_mapped_files``), so the later run's report cannot depend on the earlier run's secret.
The layer holds wherever the interpreter lives: the last test runs every other test of this file again from a venv
under /tmp, whose files a run reaches through its own /tmp.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from rllm_gym.sandbox import ExecutionStatus, Sandbox, SandboxResult
from rllm_gym.sandbox._isolation import RUN_ALIASES
from rllm_gym.sandbox._landlock import probe_abi

LINUX_ROOT = sys.platform.startswith("linux") and os.geteuid() == 0
PAGE = mmap.PAGESIZE
COLD_PAGES = 64


@pytest.fixture(scope="module")
def sandbox(strict_sandbox):
    return strict_sandbox


def _needs_landlock(box: Sandbox) -> None:
    """Skip where the layer cannot be in force (a kernel without Landlock); elsewhere it must be, wherever the
    interpreter lives (under /tmp too): a missing one fails."""
    if not probe_abi():
        pytest.skip(f"this kernel has no Landlock, so the sandbox runs without its landlock layer ({box.isolation})")
    assert "landlock" in box.isolation and box.landlock_abi, (box.landlock_abi, box.isolation)


def _report(result: SandboxResult) -> dict:
    assert result.status is not ExecutionStatus.SANDBOX_ERROR, (result.error, result.stderr[-2000:])
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, (result.status, result.stdout[-1000:], result.stderr[-2000:])
    return json.loads(lines[-1])


def _resident_pages(path: Path) -> int:
    """How many of the file's pages are in the page cache, as the host sees it (mincore on a mapping of it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        vector = ctypes.create_string_buffer((size + PAGE - 1) // PAGE)
        try:
            assert libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vector) == 0
        finally:
            libc.munmap(ctypes.c_void_p(address), ctypes.c_size_t(size))
    finally:
        os.close(fd)
    return sum(byte & 1 for byte in vector.raw)


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.fixture
def cold_file():
    """A file of 64 pages in the view (the virtual environment's folder, which every run sees), written, synced and
    evicted from the page cache by the test; removed afterwards."""
    if not sys.platform.startswith("linux"):
        pytest.skip("page-cache residency is read with Linux's mincore")
    path = Path(sys.prefix) / f"rllm-cold-{secrets.token_hex(6)}.bin"
    try:
        with open(path, "wb") as handle:
            handle.write(os.urandom(COLD_PAGES * PAGE))
            handle.flush()
            os.fsync(handle.fileno())
        _evict(path)
        if _resident_pages(path):
            pytest.skip(f"this filesystem keeps {path} in the page cache after POSIX_FADV_DONTNEED")
        yield path
    finally:
        path.unlink(missing_ok=True)


# Run A, the "hidden" run: it warms every other page of the file when its secret bit is 1.
_WARM = """
import mmap, os
try:
    fd = os.open(PATH, os.O_RDONLY)
    if SECRET:
        view = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        print(sum(view[offset] for offset in range(0, len(view), 2 * mmap.PAGESIZE)))
        os.pread(fd, mmap.PAGESIZE, mmap.PAGESIZE)
except OSError as exc:
    print("refused:", exc.errno)
"""

# Run B, whose output reaches the model: its own major faults while it reads the file, and what it could open.
_PROBE = """
import json, mmap, os, resource
before = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
try:
    fd = os.open(PATH, os.O_RDONLY)
    view = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    touched = sum(view[offset] for offset in range(0, len(view), mmap.PAGESIZE))
    report = {"majflt": resource.getrusage(resource.RUSAGE_SELF).ru_majflt - before}
except OSError as exc:
    report = {"error": exc.errno}
try:
    with open("/proc/self/stat") as stat:
        report["stat_majflt"] = int(stat.read().rsplit(")", 1)[1].split()[9]) - before
except OSError as exc:
    report["stat_majflt"] = exc.errno
print(json.dumps(report))
"""


def test_a_later_run_cannot_tell_which_pages_an_earlier_run_read(sandbox, cold_file):
    """The channel itself: a secret bit decides whether run A reads a cold file of the view; run B's own fault counts
    and reads must not depend on it, and the host sees no page of the file warmed by A."""
    _needs_landlock(sandbox)
    reports, warmed = {}, {}
    for secret in (0, 1):
        _evict(cold_file)
        assert _resident_pages(cold_file) == 0
        sandbox.run(f"PATH = {str(cold_file)!r}\nSECRET = {secret}\n" + _WARM)
        warmed[secret] = _resident_pages(cold_file)
        reports[secret] = _report(sandbox.run(f"PATH = {str(cold_file)!r}\n" + _PROBE))
    assert warmed == {0: 0, 1: 0}, f"pages of the file warmed by run A: {warmed}"
    assert reports[0] == reports[1], f"run B's report depends on run A's secret: {reports}"
    assert reports[0]["error"] in (2, 13), reports  # ENOENT or EACCES: the file is not the run's to read


_OUTSIDE = """
import ctypes, errno, json, mmap, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}
def attempt(name, action):
    try:
        action()
        out[name] = "allowed"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
def syscall(*args):
    if libc.syscall(*args) < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
for name, path in PATHS.items():
    attempt(name, lambda: os.close(os.open(path, os.O_RDONLY)))
tree = [os.path.join(root, name) for root, _dirs, names in os.walk("/") for name in names]
out["tree"] = sorted(path for path in tree if not os.path.islink(path) and os.access(path, os.R_OK))
for name, path in PATHS.items():
    try:
        out["stat " + name] = os.stat(path).st_size
    except OSError as exc:
        out["stat " + name] = errno.errorcode.get(exc.errno, str(exc.errno))
attempt("exec python", lambda: subprocess.run([sys.executable, "-c", "pass"], check=False))
attempt("own file", lambda: open("mine.txt", "w").write("x" * 10000))
attempt("/dev/null", lambda: open("/dev/null", "w").write("x"))
attempt("/dev/urandom", lambda: open("/dev/urandom", "rb").read(8))
fd = os.open("mine.txt", os.O_RDONLY)
attempt("fadvise", lambda: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED))
attempt("readahead", lambda: syscall(187, fd, ctypes.c_long(0), ctypes.c_size_t(4096)))
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
address = libc.mmap(None, 8192, 1, 1, fd, 0)
for advice, number in (("MADV_PAGEOUT", 21), ("MADV_COLD", 20), ("MADV_DONTNEED", 4), ("MADV_WILLNEED", 3)):
    attempt(advice, lambda: syscall(28, ctypes.c_void_p(address), ctypes.c_size_t(8192), number))
attempt("remap_file_pages", lambda: syscall(216, ctypes.c_void_p(address), ctypes.c_size_t(4096), 0, 1, 0))
attempt("process_madvise", lambda: syscall(440, -1, None, 0, 21, 0))
print(json.dumps(out))
"""


def test_a_run_opens_no_file_outside_its_folder_and_cannot_evict_or_read_ahead(sandbox):
    """Every path of the view (standard library, interpreter, /etc, the venv, /proc, the other libraries) is missing or
    refused, even to stat; its own folder, the /dev nodes and the extension modules' files (pinned) are not; the calls
    that evict or read pages in are refused."""
    _needs_landlock(sandbox)
    import _decimal

    paths = {
        "stdlib": os.__file__,
        "interpreter": sys.executable,
        "/etc/passwd": "/etc/passwd",
        "venv": str(Path(sys.prefix) / "pyvenv.cfg"),
        "/proc/self/maps": "/proc/self/maps",
        "/proc/loadavg": "/proc/loadavg",
        "a library no extension needs": "/usr/lib/os-release",
        "an extension module": _decimal.__file__,
    }
    out = _report(sandbox.run(f"PATHS = {paths!r}\n" + textwrap.dedent(_OUTSIDE), timeout=10))
    refused = ["stdlib", "interpreter", "/etc/passwd", "venv", "exec python", "/proc/self/maps"]
    refused += ["/proc/loadavg", "a library no extension needs"]
    refused += [
        "stat " + name for name in paths if name not in ("an extension module", "stdlib", "interpreter", "venv")
    ]
    # The interpreter's own files are placeholders in memory: a stat finds an empty file, not the disk's.
    assert [out["stat stdlib"], out["stat interpreter"], out["stat venv"]] == [0, 0, 0], out
    # Not there at all (the run's root holds nothing else of the disk: no cache of directories or inodes to warm by
    # a stat), or there and refused by Landlock.
    assert {name: out[name] for name in refused if out[name] not in ("ENOENT", "EACCES")} == {}, out
    assert out["stdlib"] == out["interpreter"] == "EACCES", out  # the interpreter's own files: refused as such
    # What it can read of its whole root: its own files, the /dev nodes and the shared objects and the loader's cache
    # (the interpreter's own files are there too, as placeholders nobody may read).
    others = [path for path in out["tree"] if not path.startswith(("/sandbox/", "/dev/"))]
    assert others and all(".so" in os.path.basename(path) or path == "/etc/ld.so.cache" for path in others), others
    allowed = ("an extension module", "own file", "/dev/null", "/dev/urandom", "MADV_DONTNEED", "MADV_WILLNEED")
    assert {name: out[name] for name in allowed} == dict.fromkeys(allowed, "allowed"), out
    denied = ("fadvise", "readahead", "MADV_PAGEOUT", "MADV_COLD", "remap_file_pages", "process_madvise")
    assert {name: out[name] for name in denied} == dict.fromkeys(denied, "EPERM"), out


# Extension modules the program below loads but does not call: it moves their first mapping (a module in use would
# crash) and grows it over the rest of the file.
UNUSED = ("_decimal", "_sqlite3", "_lzma", "_bz2", "_codecs_jp", "_codecs_kr", "_elementtree")
_FAULTS = """
import ctypes, importlib, json, os, resource
from ctypes import POINTER, Structure, c_char_p, c_int, c_size_t, c_uint16, c_uint32, c_uint64, c_void_p
for name in UNUSED:
    importlib.import_module(name)
class Phdr(Structure):
    _fields_ = [("type", c_uint32), ("flags", c_uint32), ("offset", c_uint64), ("vaddr", c_uint64),
                ("paddr", c_uint64), ("filesz", c_uint64), ("memsz", c_uint64), ("align", c_uint64)]
class Info(Structure):
    _fields_ = [("addr", c_uint64), ("name", c_char_p), ("phdr", POINTER(Phdr)), ("phnum", c_uint16)]
libc = ctypes.CDLL(None, use_errno=True)
libc.mremap.restype = c_void_p
libc.mremap.argtypes = [c_void_p, c_size_t, c_size_t, c_int]
PAGE = resource.getpagesize()
segments = []  # (start, end of the file's bytes, file offset, path) of every loaded object's PT_LOAD segments
def visit(info, size, data):
    info = info.contents
    for i in range(info.phnum):
        ph = info.phdr[i]
        if ph.type == 1 and ph.filesz:
            start = info.addr + ph.vaddr
            segments.append((start - start % PAGE, start + ph.filesz, ph.offset - start % PAGE, info.name.decode()))
    return 0
CALLBACK = ctypes.CFUNCTYPE(c_int, POINTER(Info), c_size_t, c_void_p)
libc.dl_iterate_phdr(CALLBACK(visit), None)
before = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
pages = 0
for start, end, _offset, _path in segments:
    for address in range(start, end, PAGE):
        ctypes.string_at(address, 1)
        pages += 1
grown = 0
for start, end, offset, path in segments:
    if offset != 0 or not os.path.basename(path).startswith(UNUSED):
        continue
    length = (end - start + PAGE - 1) // PAGE * PAGE
    tail = min(256, (os.stat(path).st_size - length) // PAGE)
    moved = libc.mremap(start, length, length + tail * PAGE, 1) if tail > 0 else None  # MREMAP_MAYMOVE
    if moved in (None, ctypes.c_void_p(-1).value):
        continue
    for address in range(moved, moved + length + tail * PAGE, PAGE):
        ctypes.string_at(address, 1)
        grown += 1
majflt = resource.getrusage(resource.RUSAGE_SELF).ru_majflt - before
print(json.dumps({"pages": pages, "grown": grown, "majflt": majflt}))
"""


def test_every_page_a_run_has_mapped_is_resident(sandbox):
    """Pages a run can reach without opening a file (the segments of the interpreter, its libraries and the extension
    modules it loads, and the rest of those files, reached by growing a mapping with mremap) fault nothing in: there
    is nothing cold for one run to warm and another to count. The host first drops what it can of those files."""
    _needs_landlock(sandbox)
    import _decimal

    for name in UNUSED:  # the host drops what is not locked of the files the program grows its mappings over
        for library in Path(_decimal.__file__).parent.glob(name + ".*.so"):
            _evict(library)
    out = _report(sandbox.run(f"UNUSED = {UNUSED!r}\n" + textwrap.dedent(_FAULTS), timeout=20))
    assert out["pages"] > 1000 and out["grown"] > 0, out
    assert out["majflt"] == 0, out


def test_loading_an_extension_module_warms_no_page_of_its_file(sandbox):
    """The files a run may still read (an extension module it imports) are held resident by the zygote: whether run A
    loaded one (its secret) leaves the host's page cache as it was, after the host dropped what it could of it."""
    _needs_landlock(sandbox)
    import importlib.machinery

    spec = importlib.machinery.PathFinder.find_spec("_codecs_tw")  # found, not imported: the host keeps no mapping
    if spec is None or not spec.origin.endswith(".so"):
        pytest.skip("this interpreter has no _codecs_tw extension module")
    path, resident = Path(spec.origin), {}
    for secret in (0, 1):
        _evict(path)
        code = f"import json\nif {secret}:\n    import _codecs_tw\nprint(json.dumps({{'loaded': {secret}}}))"
        assert _report(sandbox.run(code)) == {"loaded": secret}
        resident[secret] = _resident_pages(path)
    assert resident[0] == resident[1] > 0, f"pages of {path.name} in the page cache after run A: {resident}"


_IMPORTS = """
import json, sys
import heapq, fractions, email.mime.text, xml.dom.minidom, sqlite3, decimal, asyncio, multiprocessing.pool
import helper
out = {"heapq": heapq.nsmallest(2, [3, 1, 2]), "helper": helper.VALUE}
out["sqlite"] = sqlite3.connect(":memory:").execute("select 6*7").fetchone()[0]
try:
    import THIRD_PARTY
except ModuleNotFoundError as exc:
    out["missing"] = str(exc)
print(json.dumps(out))
"""


@pytest.mark.parametrize("preloaded", [False, True])
def test_a_run_imports_the_standard_library_and_what_was_preloaded_only(sandbox, preloaded):
    """The standard library (submodules too) and a run's own files import; a third-party package does only when the
    sandbox preloaded it, and otherwise fails with a message that says why (the model's error, not the sandbox's)."""
    _needs_landlock(sandbox)
    pytest.importorskip("yaml")
    code = textwrap.dedent(_IMPORTS).replace("THIRD_PARTY", "yaml")
    files = {"helper.py": "VALUE = 7\n"}
    if preloaded:
        with Sandbox(max_parallel=1, preload=["yaml"]) as box:
            out = _report(box.run(code, files=files, timeout=10))
    else:
        out = _report(sandbox.run(code, files=files, timeout=10))
    assert out["heapq"] == [1, 2] and out["helper"] == 7 and out["sqlite"] == 42, out
    if preloaded:
        assert "missing" not in out, out
    else:
        assert "No module named 'yaml' in this sandbox" in out["missing"], out
        assert "preload" in out["missing"], out


def test_read_view_keeps_file_access_for_trusted_scorers():
    """``Sandbox(read_view=True)``, as reasoning-gym's scorers use it: no landlock layer, the view's files read."""
    if not LINUX_ROOT:
        pytest.skip("the view needs root on Linux")
    with Sandbox(max_parallel=1, read_view=True) as box:
        result = box.run("import os\nprint(len(open(os.__file__).read()) > 0)")
        assert "landlock" not in box.isolation and box.landlock_abi == 0
    assert result.ok and result.stdout == "True\n", (result.status, result.stderr[-1000:])


_NO_LANDLOCK_HOST = """
import ctypes, json, struct, warnings
# A seccomp filter on this host process (inherited by its zygote): landlock's syscalls get ENOSYS, as on a kernel
# without it. ld arch; not x86-64 -> allow; ld nr; 444..446 -> ENOSYS; allow.
prog = [(0x20, 0, 0, 4), (0x15, 0, 4, 0xC000003E), (0x20, 0, 0, 0), (0x35, 0, 2, 444), (0x35, 1, 0, 447),
        (0x06, 0, 0, 0x00050000 | 38), (0x06, 0, 0, 0x7FFF0000)]
program = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *ins) for ins in prog))
class Fprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0
assert libc.prctl(22, 2, ctypes.byref(Fprog(len(prog), ctypes.addressof(program))), 0, 0) == 0
from rllm_gym.sandbox import Sandbox
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with Sandbox(max_parallel=1) as box:
        result = box.run("import os\\nprint(len(open(os.__file__).read()) > 0)")
        print(json.dumps({"isolation": box.isolation, "abi": box.landlock_abi, "status": result.status.value,
                          "stdout": result.stdout, "warnings": [str(w.message) for w in caught]}))
"""


def test_without_landlock_the_sandbox_runs_with_its_other_layers_and_says_so():
    """A kernel without Landlock (simulated by a seccomp filter on the host): the strict sandbox still runs code with
    every required layer, lists no ``landlock``, reports ABI 0 and warns once, naming the layer."""
    if not LINUX_ROOT or not probe_abi():
        pytest.skip("needs root on Linux with Landlock, to take it away")
    process = subprocess.run(
        [sys.executable, "-c", _NO_LANDLOCK_HOST], capture_output=True, text=True, timeout=120, check=False
    )
    assert process.returncode == 0, process.stderr[-3000:]
    out = json.loads(process.stdout.splitlines()[-1])
    assert out["abi"] == 0 and "landlock" not in out["isolation"] and "seccomp" in out["isolation"], out
    assert out["status"] == "ok" and out["stdout"] == "True\n", out
    assert len(out["warnings"]) == 1 and "'landlock' layer" in out["warnings"][0], out["warnings"]
    assert "/tmp" not in out["warnings"][0]  # an interpreter under /tmp gets the layer too: not a condition of it


_STDLIB_SOLUTION = """
import bisect, collections, datetime, decimal, fractions, functools, heapq, itertools, math, re, statistics, string
from typing import List
def solve(xs: List[int]) -> int:
    counts = collections.Counter(xs)
    best = heapq.nlargest(1, counts.items(), key=lambda kv: (kv[1], kv[0]))[0][0]
    assert fractions.Fraction(1, 3) + fractions.Fraction(2, 3) == 1
    assert decimal.Decimal("0.1") * 3 == decimal.Decimal("0.3")
    assert bisect.bisect([1, 2, 3], 2) == 2 and functools.reduce(max, xs) == max(xs) and math.gcd(4, 6) == 2
    assert re.fullmatch(r"[a-z]+", string.ascii_lowercase) and statistics.median([1, 2, 3]) == 2
    assert datetime.date(2024, 3, 1) - datetime.timedelta(days=1) == datetime.date(2024, 2, 29)
    return best + sum(1 for _ in itertools.combinations(xs, 0)) - 1
"""


def test_correct_solutions_that_import_the_standard_library_still_score_and_the_python_tool_works(sandbox):
    """Controls, through the default sandbox (as Code-v0 and Tool-v0 use it): HumanEval- and MBPP-style tests and a
    stdin/stdout test of solutions that import a dozen standard modules pay 1.0; the python tool prints its result."""
    _needs_landlock(sandbox)
    from rllm_gym.rewards.code import code_reward_fn
    from rllm_gym.tools.builtins import PythonTool

    solution = f"```python\n{_STDLIB_SOLUTION}\n```"
    humaneval = {"test": "def check(candidate):\n    assert candidate([3, 1, 3, 2]) == 3\n", "entry_point": "solve"}
    mbpp = {"test_list": ["assert solve([5, 5, 1]) == 5", "assert solve([2]) == 2"], "test_imports": ["import math"]}
    stdio_program = _STDLIB_SOLUTION + "print(solve([int(x) for x in input().split()]))\n"
    stdio = {"tests": [{"input": "4 4 9\n", "output": "4\n"}]}
    for task, reply in ((humaneval, solution), (mbpp, solution), (stdio, f"```python\n{stdio_program}\n```")):
        result = code_reward_fn(task, reply)
        assert result.reward == 1.0, result.metadata
    out = PythonTool()(code="import fractions, heapq\nprint(heapq.nsmallest(2, [3, 1, 2]), fractions.Fraction(1, 2))")
    assert out.error is None and out.output == "[1, 2] 1/2", out


_PRIVATE_TMP = """
import json, os
with open("/tmp/x", "w") as handle:
    handle.write("mine")
out = {"read": open("/tmp/x").read(), "same": os.path.samefile("/tmp/x", "x"), "listing": sorted(os.listdir("/tmp"))}
out["nested"] = sorted(
    [os.path.join(root, name), os.path.getsize(os.path.join(root, name)), os.access(os.path.join(root, name), os.R_OK)]
    for root, _dirs, names in os.walk("/tmp/") for name in names if root != "/tmp/"
)
# What it sees of the interpreter's tree is the same for every run: nothing of it can be changed, moved or added to.
tops = [os.path.join("/tmp", name) for name in os.listdir("/tmp") if os.path.isdir(os.path.join("/tmp", name))]
attempts = [lambda path=path: os.unlink(path) for path, _size, _readable in out["nested"]]
attempts += [lambda path=path: open(path, "ab").close() for path, _size, _readable in out["nested"]]
for top in tops:
    attempts += [lambda: os.rename(top, "/tmp/moved"), lambda: os.rmdir(top), lambda: os.mkdir(top + "/new")]
    attempts += [lambda: os.chmod(top, 0o777), lambda: open(top + "/new.so", "w").close()]
out["changed"], out["attempts"] = 0, len(attempts)
for attempt in attempts:
    try:
        attempt()
        out["changed"] += 1
    except OSError:
        pass
print(json.dumps(out))
"""


def test_a_runs_tmp_is_its_own_and_shows_nothing_of_the_hosts(sandbox):
    """A run's /tmp is its own folder, writable: a file written there reads back. It shows no file of the host's
    /tmp nor another run's; where the interpreter lives under /tmp (or /dev/shm), only the folders leading to that
    tree and, in it, the extension modules' files the run may load and the unreadable placeholders of the
    interpreter's own, which no run can change."""
    _needs_landlock(sandbox)
    token = secrets.token_hex(6)
    marker = Path("/tmp") / f"rllm-host-{token}"
    marker.write_text("the host's")
    try:
        assert sandbox.run(f"open('/tmp/other-{token}', 'w').write('another run')").ok
        out = _report(sandbox.run(textwrap.dedent(_PRIVATE_TMP)))
        again = _report(sandbox.run(textwrap.dedent(_PRIVATE_TMP)))
    finally:
        marker.unlink()
    assert out["changed"] == again["changed"] == 0 and out["nested"] == again["nested"], (out, again)
    trees = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}  # where the run finds one under an alias:
    trees = {"/tmp" + tree[len(alias) :] for tree in trees for alias in RUN_ALIASES if tree.startswith(alias + "/")}
    assert out["read"] == "mine" and out["same"], out
    assert set(out["listing"]) == {"x", "main.py", *(tree.split("/")[2] for tree in trees)}, out
    assert bool(out["attempts"]) == bool(out["nested"]) == bool(trees), out
    for path, size, readable in out["nested"]:
        assert any(path.startswith(tree + "/") for tree in trees), path
        assert (".so" in os.path.basename(path) and readable) or (size == 0 and not readable), (path, size, readable)
    for top in {tree.split("/")[2] for tree in trees}:  # a file of the run named like that folder takes its place
        code = f"print(open({top!r}).read(), open('/tmp/' + {top!r}).read())"
        with Sandbox(max_parallel=1, read_view=True) as trusted:  # without Landlock, the same
            for result in (sandbox.run(code, files={top: "mine"}), trusted.run(code, files={top: "mine"})):
                assert result.ok and result.stdout == "mine mine\n", (result.status, result.error, result.stderr)


# Runs a command with a host folder bound at another path, in a mount namespace of its own: an interpreter installed
# under /tmp without copying it (its prefix is where it is bound: a bind mount, unlike a link, is not resolved).
_BOUND = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
source, target, *command = sys.argv[1:]
assert libc.unshare(0x00020000) == 0 and libc.mount(b"none", b"/", None, (1 << 14) | (1 << 18), None) == 0
assert libc.mount(source.encode(), target.encode(), None, 4096 | (1 << 14), None) == 0, ctypes.get_errno()
os.execv(command[0], command)
"""


def _output(*command: str) -> str:
    process = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    assert process.returncode == 0, (command, process.stderr[-3000:])
    return process.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("location", "interpreter_too"), [("/tmp", False), ("/dev/shm", False), ("/tmp", True)], ids=["tmp", "shm", "base"]
)
def test_every_attack_of_this_file_fails_the_same_from_a_venv_under_tmp(location, interpreter_too):
    """An interpreter under /tmp or /dev/shm (a venv with a symlinked python, as CI machines and pip's build isolation
    make; with ``interpreter_too`` the interpreter's own prefix as well, its standard library's extension modules
    included), which a run reaches through its own /tmp: every other test of this file runs again from it, the
    page-cache probe on a cold file of that venv included (not on /dev/shm, a tmpfs whose pages cannot be dropped),
    and none may skip. A package of that venv (yaml, copied in) is preloaded from there, its extension module loaded
    through the run's /tmp."""
    if not LINUX_ROOT or not probe_abi() or not os.path.isdir(location):
        pytest.skip(f"needs root on Linux with Landlock, and {location}")
    yaml = pytest.importorskip("yaml")
    import site

    import rllm_gym

    this = Path(__file__).resolve()
    base = Path(tempfile.mkdtemp(prefix="rllm-landlock-", dir=location))
    try:
        wrap, creator = [], sys.executable
        if interpreter_too:  # the interpreter's prefix, bound at base/python for each command below
            prefix = os.path.realpath(sys.base_prefix)
            (base / "python").mkdir()
            wrap = [sys.executable, "-c", _BOUND, prefix, str(base / "python")]
            creator = str(base / "python" / os.path.relpath(os.path.realpath(sys._base_executable), prefix))
        venv = base / "x" / ".venv"
        _output(*wrap, creator, "-m", "venv", "--without-pip", "--symlinks", str(venv))
        python = [*wrap, str(venv / "bin" / "python")]
        purelib = _output(*python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip()
        sources = [*site.getsitepackages(), str(Path(rllm_gym.__file__).parents[1])]
        Path(purelib, "rllm-host.pth").write_text(f"import site; list(map(site.addsitedir, {sources!r}))\n")
        shutil.copytree(Path(yaml.__file__).parent, Path(purelib, "yaml"))
        where = "import json, sys, rllm_gym, yaml\n"
        where += "print(json.dumps([sys.prefix, sys.base_prefix, rllm_gym.__file__, yaml.__file__]))"
        prefix, base_prefix, package, yaml_file = json.loads(_output(*python, "-c", where))
        assert prefix == str(venv) and package == rllm_gym.__file__ and yaml_file.startswith(purelib), where
        assert base_prefix == str(base / "python") if interpreter_too else not base_prefix.startswith(location), where
        options = ["-k", "not venv_under_tmp" + (" and not earlier_run" if location != "/tmp" else "")]
        options += ["-m", "slow or not slow", "-p", "no:cacheprovider", f"--basetemp={base / 'pytest'}"]
        process = subprocess.run(
            [*python, "-m", "pytest", str(this), "-q", "-rs", *options],
            capture_output=True, text=True, timeout=900, cwd=this.parents[2], check=False,
        )  # fmt: skip
    finally:
        shutil.rmtree(base, ignore_errors=True)
    summary = process.stdout.strip().splitlines()[-1] if process.stdout.strip() else ""
    assert process.returncode == 0 and "passed" in summary, process.stdout[-6000:] + process.stderr[-3000:]
    assert "skipped" not in summary and "deselected" in summary, process.stdout[-6000:]
