"""The sandbox against programs written to break out of it: each attack contained, with a verdict, the host unharmed.

Every test here is a hostile program (or a pair of them) and an assertion on what it could see or do. A test whose
attack needs an isolation layer the machine lacks is skipped with the layer's name, never passed in silence.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import pytest

import rllm_gym
from rllm_gym.envs.code import BUILTIN_TASKS_PATH
from rllm_gym.sandbox import REQUIRED_LAYERS, ExecutionStatus, Sandbox, SandboxResult
from rllm_gym.sandbox._isolation import RUN_DIR

LINUX_ROOT = sys.platform.startswith("linux") and os.geteuid() == 0
TOOL_TASKS_PATH = Path(str(resources.files("rllm_gym.tools").joinpath("tasks.jsonl")))
REPO_ROOT = Path(rllm_gym.__file__).resolve().parents[1]
FULL_ISOLATION = {layer for layer in REQUIRED_LAYERS if "|" not in layer}  # the memory layer has two forms
# Statuses a hostile program may end with; sandbox_error is never one of them.
VERDICTS = set(ExecutionStatus) - {ExecutionStatus.SANDBOX_ERROR}


@pytest.fixture(scope="module")
def sandbox(strict_sandbox):
    return strict_sandbox


@pytest.fixture(scope="module")
def view_sandbox(strict_sandbox):
    """Runs that may read the view's files (``read_view=True``, no landlock layer): what the view itself holds."""
    with Sandbox(max_parallel=4, read_view=True) as box:
        box.start()
        yield box


def _needs(box: Sandbox, *layers: str) -> None:
    missing = [layer for layer in layers if layer not in box.isolation]
    if missing:
        pytest.skip(f"isolation layers {missing} are not available here (in force: {box.isolation})")


def _run(box: Sandbox, code: str, **kwargs) -> SandboxResult:
    result = box.run(code, **kwargs)
    assert result.status is not ExecutionStatus.SANDBOX_ERROR, (result.error, result.stderr[-2000:])
    return result


def _last_json(result: SandboxResult) -> dict:
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, (result.status, result.stdout[-1000:], result.stderr[-2000:])
    return json.loads(lines[-1])


def _shmem_kb() -> int:
    return int(re.search(r"^Shmem:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.MULTILINE).group(1))


# What held


def test_every_layer_holds_as_root_on_linux(sandbox):
    if not LINUX_ROOT:
        pytest.skip("namespaces, cgroups and uids need root on Linux")
    result = _run(sandbox, "print('hi')")
    assert result.ok and result.stdout == "hi\n"
    layers = set(result.isolation)
    assert layers >= FULL_ISOLATION, f"missing: {FULL_ISOLATION - layers}"
    assert layers & {"memory_cgroup", "memory_rules"}, layers
    assert set(sandbox.isolation) == layers


def test_strict_sandbox_refuses_a_machine_without_namespaces():
    """A degraded machine (root without CAP_SYS_ADMIN): strict refuses and names the layer; strict=False says so."""
    if not LINUX_ROOT or not Path("/usr/bin/setpriv").exists():
        pytest.skip("needs root on Linux and setpriv(1) to drop CAP_SYS_ADMIN")
    probe = (
        "import json\n"
        "from rllm_gym.sandbox import Sandbox, SandboxUnavailableError\n"
        "out = {}\n"
        "try:\n"
        "    Sandbox(max_parallel=1).start()\n"
        "    out['strict'] = 'started'\n"
        "except SandboxUnavailableError as exc:\n"
        "    out['strict'] = str(exc)\n"
        "with Sandbox(max_parallel=1, strict=False) as box:\n"
        "    result = box.run(\"print('degraded but running')\")\n"
        "    out['status'], out['stdout'], out['isolation'] = result.status.value, result.stdout, result.isolation\n"
        "print(json.dumps(out))\n"
    )
    command = ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", sys.executable, "-c", probe]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    missing = FULL_ISOLATION - set(out["isolation"])
    assert missing, f"dropping CAP_SYS_ADMIN removed no layer: {out}"
    assert out["strict"] != "started", "the strict sandbox ran model code without namespaces"
    assert any(layer in out["strict"] for layer in missing), f"the error names no missing layer {missing}: {out}"
    assert out["status"] == "ok" and out["stdout"] == "degraded but running\n"


# A minimal file system view


def test_cwd_home_and_tmpdir_are_the_runs_private_tmp(sandbox):
    _needs(sandbox, "minimal_fs", "unprivileged_uid")
    code = (
        "import json, os, tempfile\n"
        "open('/tmp/mine.txt', 'w').write('x')\n"
        "st = os.stat('/tmp')\n"
        "print(json.dumps({'cwd': os.getcwd(), 'home': os.environ.get('HOME'), 'tmpdir': os.environ.get('TMPDIR'),\n"
        "    'gettempdir': tempfile.gettempdir(), 'owner': st.st_uid, 'uid': os.getuid(),\n"
        "    'shm': os.path.realpath('/dev/shm'), 'shm_link': os.path.islink('/dev/shm'),\n"
        "    'tmp_is_workdir': os.path.samefile('/tmp', os.getcwd()),\n"
        "    'shm_sees_tmp': os.path.exists('/dev/shm/mine.txt')}))\n"
    )
    out = _last_json(_run(sandbox, code))
    # /tmp is the same folder: a link to it, or (an interpreter under the host's /tmp) a bind of it.
    assert out["cwd"] == out["home"] == out["tmpdir"] == out["gettempdir"] == RUN_DIR and out["tmp_is_workdir"], out
    assert out["owner"] == out["uid"] != 0
    assert out["shm_link"] and out["shm"] == RUN_DIR and out["shm_sees_tmp"]


def test_files_left_in_tmp_do_not_reach_the_next_run(sandbox):
    _needs(sandbox, "tmpdir")
    token = secrets.token_hex(8)
    first = _run(sandbox, f"open('/tmp/left-{token}', 'w').write('x')\nopen('/dev/shm/shm-{token}', 'w').write('y')")
    assert first.ok, first.stderr
    second = _run(sandbox, f"import os\nprint(os.listdir('/tmp'), os.path.exists('/dev/shm/shm-{token}'))")
    assert second.ok and token not in second.stdout and second.stdout.endswith("False\n"), second.stdout


def test_the_project_the_home_and_the_host_cwd_do_not_exist(sandbox):
    _needs(sandbox, "minimal_fs")
    targets = {
        "code tasks": str(BUILTIN_TASKS_PATH),
        "tool tasks": str(TOOL_TASKS_PATH),
        "package": str(Path(rllm_gym.__file__).parent),
        "sandbox source": str(Path(rllm_gym.__file__).parent / "sandbox" / "_zygote.py"),
        "pyproject": str(REPO_ROOT / "pyproject.toml"),
        "tests": str(REPO_ROOT / "tests"),
        "this test": str(Path(__file__).resolve()),
        "git": str(REPO_ROOT / ".git"),
    }
    code = (
        "import json, os, sys\n"
        f"targets = {targets!r}\n"
        "out = {'exists': {}, 'read': {}, 'listing': {}}\n"
        "for name, path in targets.items():\n"
        "    out['exists'][name] = os.path.exists(path)\n"
        "    try:\n"
        "        out['read'][name] = repr(open(path, 'rb').read(200))\n"
        "    except OSError as exc:\n"
        "        out['read'][name] = type(exc).__name__\n"
        f"for folder in ({str(REPO_ROOT)!r}, {str(Path.home())!r}, {os.getcwd()!r}):\n"
        "    try:\n"
        "        out['listing'][folder] = sorted(os.listdir(folder))\n"
        "    except OSError as exc:\n"
        "        out['listing'][folder] = type(exc).__name__\n"
        "# what the interpreter itself needs: the first folder on the way to each of its trees\n"
        "out['python'] = sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.executable)})\n"
        "try:\n"
        "    import rllm_gym  # noqa\n"
        "    out['import'] = 'imported ' + str(rllm_gym.__file__)\n"
        "except ImportError as exc:\n"
        "    out['import'] = type(exc).__name__\n"
        "print(json.dumps(out))\n"
    )
    out = _last_json(_run(sandbox, code))
    assert not any(out["exists"].values()), out["exists"]
    assert all(not value.startswith(("b'", 'b"')) for value in out["read"].values()), out["read"]
    assert out["import"] in ("ModuleNotFoundError", "ImportError"), out["import"]
    for folder, listing in out["listing"].items():
        if isinstance(listing, str):
            continue  # the folder does not exist at all
        # only the way to the interpreter/venv may show: REPO_ROOT/.venv, /root/.pyenv
        way = {p[len(folder) + 1 :].split("/")[0] for p in out["python"] if p.startswith(folder.rstrip("/") + "/")}
        assert set(listing) <= way, f"{folder} shows {set(listing) - way} inside the sandbox"


def test_etc_holds_only_the_basics_and_there_is_no_sys(view_sandbox):
    sandbox = view_sandbox
    _needs(sandbox, "minimal_fs")
    code = (
        "import json, os\n"
        "print(json.dumps({'etc': sorted(os.listdir('/etc')), 'sys': os.path.exists('/sys'),\n"
        "    'root': sorted(os.listdir('/')), 'passwd': open('/etc/passwd').read()}))\n"
    )
    out = _last_json(_run(sandbox, code))
    assert set(out["etc"]) <= {"passwd", "group", "hosts", "ld.so.cache", "localtime"}, out["etc"]
    assert {"passwd", "group", "hosts"} <= set(out["etc"])
    assert out["sys"] is False and "sys" not in out["root"]
    host_users = {line.split(":")[0] for line in Path("/etc/passwd").read_text().splitlines() if line}
    sandbox_users = {line.split(":")[0] for line in out["passwd"].splitlines() if line}
    assert len(sandbox_users) <= 3 and sandbox_users != host_users, out["passwd"]


def test_walking_the_whole_tree_finds_no_task_file(view_sandbox):
    sandbox = view_sandbox
    _needs(sandbox, "minimal_fs")
    markers = [json.loads(BUILTIN_TASKS_PATH.read_text().splitlines()[0])["id"]]
    markers.append(json.loads(TOOL_TASKS_PATH.read_text().splitlines()[0])["ground_truth"])
    code = (
        "import os\n"
        f"markers = {[m.encode() for m in markers]!r}\n"
        "names = {'code_tasks.jsonl', 'test_attacks.py', 'test_code_attacks.py'}\n"
        "walked = 0\n"
        "for root, dirs, files in os.walk('/'):\n"
        "    if root == '/':\n"
        "        dirs[:] = [d for d in dirs if d not in ('proc', 'sys')]\n"
        "    for name in files:\n"
        "        walked += 1\n"
        "        path = os.path.join(root, name)\n"
        "        if name in names or (name == 'tasks.jsonl' and 'rllm' in root) or '/rllm_gym/' in path:\n"
        "            print('NAMED', path)\n"
        "        if name.endswith(('.jsonl', '.json')):\n"
        "            try:\n"
        "                with open(path, 'rb') as f:\n"
        "                    data = f.read(4 << 20)\n"
        "            except OSError:\n"
        "                continue\n"
        "            if any(m in data for m in markers):\n"
        "                print('FOUND', path)\n"
        "print('walked', walked)\n"
    )
    result = _run(sandbox, code, timeout=30)
    assert result.ok, result.stderr[-2000:]
    assert "FOUND" not in result.stdout and "NAMED" not in result.stdout, result.stdout[-3000:]
    assert int(result.stdout.split("walked")[-1]) > 100  # it did walk the interpreter's files


def test_proc_shows_only_the_runs_own_processes(view_sandbox):
    sandbox = view_sandbox  # under landlock a run cannot read /proc at all
    _needs(sandbox, "pidns", "private_proc")
    host_pids = [os.getpid(), sandbox._proc.pid, os.getppid()]
    code = (
        "import json, os\n"
        "out = {'pids': sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), 'me': os.getpid(), 'reads': {}}\n"
        f"for pid in {host_pids!r} + [1, os.getppid()]:\n"
        "    for what in ('cmdline', 'environ', 'mem', 'maps', 'root/etc/hostname', 'cwd/pyproject.toml'):\n"
        "        path = f'/proc/{pid}/{what}'\n"
        "        try:\n"
        "            with open(path, 'rb') as f:\n"
        "                out['reads'][path] = f.read(4096).decode('latin-1')\n"
        "        except OSError as exc:\n"
        "            out['reads'][path] = 'ERR ' + type(exc).__name__\n"
        "print(json.dumps(out))\n"
    )
    out = _last_json(_run(sandbox, code))
    # Only this namespace's processes: itself and (unless hidden from it) its supervisor, pid 1.
    assert out["me"] in out["pids"] and set(out["pids"]) <= {1, out["me"]}, out["pids"]
    for pid in host_pids:
        if pid not in out["pids"]:
            assert all(
                value.startswith("ERR") for path, value in out["reads"].items() if path.startswith(f"/proc/{pid}/")
            ), pid
    # The supervisor (pid 1) is root: its memory, environment and file system are out of reach.
    for what in ("environ", "mem", "root/etc/hostname", "cwd/pyproject.toml"):
        assert out["reads"][f"/proc/1/{what}"].startswith("ERR"), (what, out["reads"][f"/proc/1/{what}"][:200])
    host_environ = Path(f"/proc/{os.getpid()}/environ").read_bytes().decode("latin-1").split("\0")
    leaked = [entry for entry in host_environ if len(entry) > 12 and entry in json.dumps(out["reads"])]
    assert not leaked, leaked


# Paired runs: the test harness and the solution in separate processes

_SCAN_SOLUTION = r"""
import gc, itertools, json, os, re, sys
PATTERN = re.compile(r"RLLMSECRET-[0-9a-f]{32}")
BPATTERN = re.compile(rb"RLLMSECRET-[0-9a-f]{32}")


def _text(found, where, value):
    if isinstance(value, str):
        found.update(f"{where}:{m}" for m in PATTERN.findall(value))
    elif isinstance(value, (bytes, bytearray)):
        found.update(f"{where}:{m.decode()}" for m in BPATTERN.findall(value))


def _memory(found, pid):
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", buffering=0)
    except OSError as exc:
        found.add(f"no-mem-{pid}:{type(exc).__name__}")
        return
    for line in maps:
        span, perms = line.split()[:2]
        start, end = (int(x, 16) for x in span.split("-"))
        if "r" not in perms or end - start > (256 << 20) or "[v" in line:
            continue
        try:
            mem.seek(start)
            _text(found, f"mem{pid}", mem.read(end - start))
        except (OSError, ValueError, OverflowError):
            pass


def scan(fds=True):
    found = set()
    for obj in gc.get_objects():
        for ref in gc.get_referents(obj):
            _text(found, "gc", ref)
    frame = sys._getframe()
    while frame is not None:
        for name, value in {**frame.f_locals, **frame.f_globals}.items():
            _text(found, "frame", name)
            _text(found, "frame", value if isinstance(value, (str, bytes)) else repr(value)[:100000])
        for const in frame.f_code.co_consts:
            _text(found, "const", const)
        frame = frame.f_back
    for module in list(sys.modules.values()):
        for value in list(getattr(module, "__dict__", {}).values()):
            _text(found, "module", value)
    _text(found, "env", repr(dict(os.environ)))
    _text(found, "argv", repr(sys.argv))
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:  # under landlock
        pids = []
    for pid in pids + ["self"]:
        for what in ("cmdline", "environ"):
            try:
                _text(found, f"proc{pid}", open(f"/proc/{pid}/{what}", "rb").read())
            except OSError:
                pass
        _memory(found, pid)
    for fd in range(256) if fds else ():
        if fd in (1, 2):
            continue
        try:
            blocking = os.get_blocking(fd)
            os.set_blocking(fd, False)
            try:
                _text(found, f"fd{fd}", os.read(fd, 1 << 20))
            finally:
                os.set_blocking(fd, blocking)
        except OSError:
            pass
    skip = tuple(os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, "/usr", "/proc", "/sys"))
    # Lazily, so that the pruning of dirs below takes effect; under landlock "/" cannot be listed, hence the cwd too.
    for root, dirs, files in itertools.chain(os.walk("/"), os.walk(os.getcwd())):
        dirs[:] = [d for d in dirs if not os.path.join(root, d).startswith(skip)]
        for name in files:
            try:
                with open(os.path.join(root, name), "rb") as f:
                    _text(found, "file", f.read(1 << 20))
            except OSError:
                pass
    return sorted(found)


# At import the harness may already wait on fd 3: reading it would only make the run time out.
print("AT_IMPORT", json.dumps(scan(fds=False)), flush=True)
"""


def test_the_solution_cannot_find_the_harness_secret(sandbox):
    """gc, frames, modules, /proc/*/mem, fds, files: the expected value is nowhere the solution can look."""
    _needs(sandbox, "pidns", "minimal_fs")
    secret = f"RLLMSECRET-{secrets.token_hex(16)}"
    harness = (
        "import _rllm_channel\n"
        f"EXPECTED = {secret!r}\n"
        "found = _rllm_channel.remote('scan')()\n"
        "print('FOUND', found)\n"
        "print('MATCH' if any(EXPECTED in item for item in found) else 'NOMATCH')\n"
    )
    control = f"RLLMSECRET-{secrets.token_hex(16)}"  # planted in the solution's own code: the scan must see it
    solution = f"CONTROL = {control!r}\n{_SCAN_SOLUTION}"
    pair = sandbox.run_pair(solution, harness, timeout=30)
    assert pair.harness.status is ExecutionStatus.OK, (pair.harness.stderr[-2000:], pair.solution.stderr[-2000:])
    assert "NOMATCH" in pair.harness.stdout, pair.harness.stdout[-3000:]
    for where in ("gc", "frame", "module", "file"):
        assert f"{where}:{control}" in pair.harness.stdout, where
    # Its own memory: read (and the control found there) or closed to it (a non-dumpable process).
    assert re.search(rf"mem\w*:{control}|no-mem-self", pair.harness.stdout)
    assert "AT_IMPORT" in pair.solution.stdout and secret not in pair.solution.stdout
    assert secret not in pair.solution.stderr


def test_run_pair_passes_plain_data_and_refuses_the_rest(sandbox):
    solution = (
        "class Always:\n"
        "    def __eq__(self, other):\n        return True\n"
        "    def __ne__(self, other):\n        return False\n"
        "class Int(int):\n"
        "    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\n"
        "class Mine(Exception):\n    pass\n"
        "def add(a, b):\n    return a + b\n"
        "def echo(x):\n    return x\n"
        "def always():\n    return Always()\n"
        "def fake_int():\n    return Int(0)\n"
        "def nested_always():\n    return [1, {'k': Always()}]\n"
        "def boom():\n    raise ValueError('bad value')\n"
        "def mine():\n    raise Mine('custom')\n"
        "def gen():\n    return (i for i in range(3))\n"
        "def deep():\n"
        "    x = []\n"
        "    for _ in range(100000):\n        x = [x]\n"
        "    return x\n"
    )
    harness = (
        "import _rllm_channel as ch\n"
        "def attempt(name, *args):\n"
        "    try:\n"
        "        value = ch.remote(name)(*args)\n"
        "        return ['value', type(value).__name__, repr(value)]\n"
        "    except ch.RemoteError as exc:\n"
        "        return ['RemoteError', str(exc)[:200]]\n"
        "    except Exception as exc:\n"
        "        return [type(exc).__name__, str(exc)[:200]]\n"
        "import json\n"
        "sample = [1, 2.5, 'x', b'\\x00\\xff', None, True, (1, 2), {'a': [1]}, {1, 2}, frozenset({3})]\n"
        "print(json.dumps({\n"
        "    'add': attempt('add', 1, 2), 'echo': attempt('echo', sample),\n"
        "    'always': attempt('always'), 'fake_int': attempt('fake_int'),\n"
        "    'nested_always': attempt('nested_always'), 'boom': attempt('boom'), 'mine': attempt('mine'),\n"
        "    'gen': attempt('gen'), 'deep': attempt('deep'), 'missing': attempt('no_such_function'),\n"
        "    'after': attempt('add', 'a', 'b'),\n"
        "}))\n"
    )
    pair = sandbox.run_pair(solution, harness)
    assert pair.harness.ok, pair.harness.stderr[-2000:]
    out = _last_json(pair.harness)
    assert out["add"] == ["value", "int", "3"]
    assert out["echo"][0] == "value" and out["echo"][2] == repr(
        [1, 2.5, "x", b"\x00\xff", None, True, (1, 2), {"a": [1]}, {1, 2}, frozenset({3})]
    )
    for name in ("always", "fake_int", "nested_always", "gen", "deep"):
        assert out[name][0] == "RemoteError", (name, out[name])
    assert out["mine"] == ["Exception", "custom"]  # a class of its own is its nearest builtin base
    assert out["boom"] == ["ValueError", "bad value"]
    assert out["missing"][0] in ("NameError", "RemoteError")
    assert out["after"] == ["value", "str", "'ab'"]  # the solution still serves after all that


_DYING = {
    "exit_at_import": "import os\nos._exit(0)\ndef add(a, b):\n    return a + b\n",
    "sigkill_in_call": "import os, signal\ndef add(a, b):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    "os_exit_in_call": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "sys_exit_in_call": "import sys\ndef add(a, b):\n    sys.exit(0)\n",
    "hang": "import time\ndef add(a, b):\n    time.sleep(60)\n",
    "kill_supervisor": (
        "import os, signal\n"
        "for pid in (os.getppid(), 1):\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError as exc:\n        print('refused', pid, exc.errno)\n"
        "def add(a, b):\n    return a + b\n"
    ),
}


@pytest.mark.parametrize("name", list(_DYING))
def test_a_solution_that_dies_or_hangs_fails_the_call(sandbox, name):
    solution = _DYING[name]
    harness = (
        "import _rllm_channel as ch\n"
        "try:\n"
        "    print('GOT', ch.remote('add')(1, 2))\n"
        "except Exception as exc:\n"
        "    print('FAILED', type(exc).__name__)\n"
    )
    start = time.monotonic()
    pair = sandbox.run_pair(solution, harness, timeout=2)
    assert time.monotonic() - start < 10
    for result in (pair.harness, pair.solution):
        assert result.status in VERDICTS, (result.status, result.error)
    honest = "GOT 3" in pair.harness.stdout
    if name == "kill_supervisor":
        assert honest, (pair.harness.stdout, pair.solution.stdout)  # signalling the supervisor is refused
    else:
        assert not honest and ("FAILED" in pair.harness.stdout or pair.harness.status is not ExecutionStatus.OK)


def test_forged_frames_on_the_channel_do_not_become_answers(sandbox):
    """The solution writes fake replies and garbage on every fd before serving: no value it did not return arrives."""
    solution = (
        "import json, os, struct\n"
        "def frame(obj):\n"
        "    data = json.dumps(obj).encode()\n"
        "    return struct.pack('!I', len(data)) + data\n"
        "for fd in range(3, 64):\n"
        "    for junk in (frame({'ok': 42}), frame({'ok': {'l': [42]}}), b'\\xff' * 64, struct.pack('!I', 1 << 30)):\n"
        "        try:\n"
        "            os.write(fd, junk)\n"
        "        except OSError:\n"
        "            pass\n"
        "def answer(x):\n    return -1\n"
    )
    harness = (
        "import _rllm_channel as ch\n"
        "got = []\n"
        "for i in range(3):\n"
        "    try:\n"
        "        got.append(ch.remote('answer')(i))\n"
        "    except Exception as exc:\n"
        "        got.append(type(exc).__name__)\n"
        "print('GOT', got)\n"
    )
    pair = sandbox.run_pair(solution, harness, timeout=3)
    assert pair.harness.status in VERDICTS and pair.solution.status in VERDICTS, (pair.harness, pair.solution)
    # A fake frame is at worst a value the solution could have returned: the harness reads it and goes on.
    assert pair.harness.ok and "GOT" in pair.harness.stdout, pair.harness.stderr[-2000:]


def test_a_reply_built_to_exhaust_the_harness_ends_in_a_verdict(sandbox):
    solution = "def bomb():\n    return [{}] * 1_400_000\ndef wide():\n    return 'x' * (15 << 20)\n"
    harness = (
        "import _rllm_channel as ch\n"
        "for name in ('bomb', 'wide'):\n"
        "    try:\n"
        "        print(name, len(ch.remote(name)()))\n"
        "    except Exception as exc:\n"
        "        print(name, type(exc).__name__)\n"
    )
    pair = sandbox.run_pair(solution, harness, timeout=10, memory_mb=256)
    assert pair.harness.status in VERDICTS and pair.solution.status in VERDICTS, (pair.harness, pair.solution)
    if pair.harness.ok:
        assert re.search(r"^bomb \w+$", pair.harness.stdout, re.MULTILINE), pair.harness.stdout[-500:]


# Signals: every way a program can kill itself or its neighbours ends in a verdict

_SIGNAL_ATTACKS = {
    "sigkill_self": ("import os, signal\nprint('x', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)", "killed"),
    "sigterm_self": ("import os, signal\nprint('x', flush=True)\nos.kill(os.getpid(), signal.SIGTERM)", "killed"),
    # killpg(0): its own group (the group's number may be 1 inside the namespace, and killpg(1) means kill(-1))
    "killpg_self": ("import os, signal\nprint('x', flush=True)\nos.killpg(0, signal.SIGKILL)", "killed"),
    "child_kills_parent": (
        "import os, signal, time\nprint('x', flush=True)\n"
        "if os.fork() == 0:\n    os.kill(os.getppid(), signal.SIGKILL)\n    os._exit(0)\ntime.sleep(5)",
        "killed",
    ),
    "segfault": ("import ctypes\nprint('x', flush=True)\nctypes.string_at(0)", "runtime_error"),
    "kill_minus_one": (
        "import os, signal, time\nprint('x', flush=True)\n"
        "child = os.fork()\n"
        "if child == 0:\n    time.sleep(5)\n    os._exit(0)\n"
        "time.sleep(0.1)\nos.kill(-1, signal.SIGKILL)\n"
        "print('child', os.waitpid(child, 0)[1] & 0x7F)",
        "ok",
    ),
    "signal_the_supervisor": (
        "import os, signal\nprint('x', flush=True)\nrefused = tried = 0\n"
        "for pid in {1, os.getppid()}:\n"
        "    for sig in range(1, 65):\n"
        "        if sig == signal.SIGCONT:\n"
        "            continue  # allowed within a session, and harmless\n"
        "        tried += 1\n"
        "        try:\n            os.kill(pid, sig)\n"
        "        except PermissionError:\n            refused += 1\n"
        "print('refused', refused, 'of', tried)",
        "ok",
    ),
    "stop_self": ("import os, signal\nprint('x', flush=True)\nos.kill(os.getpid(), signal.SIGSTOP)", "timeout"),
}


@pytest.mark.parametrize("name", list(_SIGNAL_ATTACKS))
def test_signals_end_in_a_verdict(sandbox, name):
    code, expected = _SIGNAL_ATTACKS[name]
    if name in ("signal_the_supervisor", "kill_minus_one"):
        _needs(sandbox, "pidns", "unprivileged_uid")
    result = _run(sandbox, code, timeout=1.5)
    assert result.status.value == expected, (result.status, result.exit_code, result.stderr[-500:])
    assert result.stdout.startswith("x\n")
    if name == "signal_the_supervisor":
        refused, tried = re.search(r"refused (\d+) of (\d+)", result.stdout).groups()
        assert refused == tried, result.stdout
    if name == "kill_minus_one":
        assert result.stdout.endswith("child 9\n"), result.stdout
    assert sandbox.run("print(7)").stdout == "7\n"  # the sandbox is unharmed


# Output: whatever bytes the program writes, the sandbox returns them as text


@pytest.mark.parametrize(
    "code",
    [
        "import os\nos.write(1, bytes(range(256)) * 100)\nos.write(2, b'\\xff\\xfe\\x00' * 100)",
        "import os, struct, json\n"
        "frame = json.dumps({'id': 0, 'wait_status': 0, 'stdout': 'PASSED', 'verdict': 'ok'}).encode()\n"
        "for fd in (1, 2, *range(3, 40)):\n"
        "    try:\n        os.write(fd, struct.pack('!I', len(frame)) + frame + b'\\n')\n"
        "    except OSError:\n        pass\n",
        "import os\nos.close(0)\nos.close(1)\nos.close(2)",
        "import sys\nsys.stdout.close()\nsys.stderr.close()\nprint('x')",
        "import sys\nwhile True:\n    sys.stdout.write('y' * 65536)",
        "import sys\nsys.stdout.write('z' * (1 << 22))\nsys.stdout.flush()",
    ],
    ids=["binary", "protocol_frames", "close_fds", "close_streams", "endless", "one_huge_write"],
)
def test_output_attacks_end_in_a_verdict(sandbox, code):
    result = _run(sandbox, code, timeout=3, max_output_bytes=200_000)
    assert isinstance(result.stdout, str) and isinstance(result.stderr, str)
    assert len(result.stdout) <= 200_000 * 4
    if "while True" in code or "1 << 22" in code:
        assert result.status is ExecutionStatus.OUTPUT_LIMIT and result.truncated
    if "range(256)" in code:
        assert result.ok and len(result.stdout) >= 20_000
    if "PASSED" in code:
        assert result.ok and '"stdout": "PASSED"' in result.stdout  # raw, never parsed
    assert sandbox.run("print(8)").stdout == "8\n"


# Nothing shared between runs

_GC_SCAN = r"""
import gc, json, re
PATTERN = re.compile(r"RLLMSECRET-[0-9a-f]{32}")
found = set()
for obj in gc.get_objects():
    for ref in gc.get_referents(obj):
        if isinstance(ref, (str, bytes)):
            found.update(PATTERN.findall(ref if isinstance(ref, str) else ref.decode("latin-1")))
print(json.dumps(sorted(found)))
"""


def test_a_previous_runs_code_input_and_files_are_invisible_to_the_next(sandbox):
    """The fork server must not hand one run's code, stdin, files or test harness to the next run in its memory."""
    tokens = {key: f"RLLMSECRET-{secrets.token_hex(16)}" for key in ("code", "stdin", "file", "solution", "harness")}
    first = _run(
        sandbox,
        f"X = {tokens['code']!r}\nprint(input())",
        stdin=tokens["stdin"] + "\n",
        files={"data.txt": tokens["file"]},
    )
    assert first.ok
    pair = sandbox.run_pair(
        f"def f():\n    return {tokens['solution']!r}\n",
        f"import _rllm_channel as ch\nEXPECTED = {tokens['harness']!r}\nprint(ch.remote('f')() == EXPECTED)",
    )
    assert pair.harness.ok and pair.harness.stdout == "False\n"
    result = _run(sandbox, _GC_SCAN)
    seen = set(json.loads(result.stdout.splitlines()[-1]))
    leaked = {key for key, token in tokens.items() if token in seen}
    assert not leaked, f"a later run found the earlier runs' {sorted(leaked)} in its memory"


_IPC_CREATE = r"""
import ctypes, json, os, socket, time
libc = ctypes.CDLL(None, use_errno=True)
KEY, NAME = {key}, {name!r}
out = {{'shm': libc.shmget(KEY, 4096, 0o1666), 'sem': libc.semget(KEY, 1, 0o1666), 'msg': libc.msgget(KEY, 0o1666)}}
out['mq'] = libc.mq_open(('/' + NAME).encode(), os.O_CREAT | os.O_RDWR, 0o666, None)
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind('\0' + NAME)
server.listen(1)
open('/tmp/' + NAME, 'w').write('x')
out['created_at'] = time.time()
print(json.dumps(out), flush=True)
server.settimeout({hold})
try:
    server.accept()
    print('ACCEPTED')
except OSError:
    print('nobody came')
"""

_IPC_ATTACH = r"""
import ctypes, json, os, socket, time
libc = ctypes.CDLL(None, use_errno=True)
KEY, NAME = {key}, {name!r}
seen = []
deadline = time.time() + {look}
while True:
    checked_at = time.time()
    if libc.shmget(KEY, 0, 0) >= 0: seen.append('shm')
    if libc.semget(KEY, 0, 0) >= 0: seen.append('sem')
    if libc.msgget(KEY, 0) >= 0: seen.append('msg')
    if libc.mq_open(('/' + NAME).encode(), os.O_RDONLY) >= 0: seen.append('mq')
    if os.path.exists('/tmp/' + NAME) or os.path.exists('/dev/shm/' + NAME): seen.append('tmp')
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect('\0' + NAME)
        seen.append('socket')
    except OSError:
        pass
    s.close()
    if seen or time.time() > deadline:
        break
    time.sleep(0.05)
print(json.dumps({{'seen': seen, 'checked_at': checked_at}}), flush=True)
"""


def test_ipc_and_abstract_sockets_are_not_shared_between_concurrent_runs(view_sandbox):
    sandbox = view_sandbox  # under landlock POSIX message queues are refused outright (their files are not the run's)
    _needs(sandbox, "ipcns", "netns")
    key, name = secrets.randbelow(1 << 30) + 1, f"rllm-attack-{secrets.token_hex(6)}"
    creator = sandbox.submit(_IPC_CREATE.format(key=key, name=name, hold=2.5), timeout=5, run_class="visible")
    time.sleep(0.5)
    attacker = sandbox.submit(_IPC_ATTACH.format(key=key, name=name, look=1.0), timeout=5, run_class="visible")
    created, attacked = creator.result(timeout=30), attacker.result(timeout=30)
    made, looked = _last_json(created), _last_json(attacked)
    assert all(made[kind] >= 0 for kind in ("shm", "sem", "msg", "mq")), made  # the attack really had objects
    assert looked["checked_at"] > made["created_at"], "the attacker looked before the objects existed"
    assert looked["seen"] == [], looked
    assert "nobody came" in created.stdout
    later = _last_json(_run(sandbox, _IPC_ATTACH.format(key=key, name=name, look=0.0)))
    assert later["seen"] == [], f"objects of a finished run are still there: {later}"
    host_keys = {int(line.split()[0]) for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]}
    assert key not in host_keys


# The memory limit counts all memory

_PLACE = {
    "tmp": "def place(i, chunk):\n    with open(f'/tmp/f{i}', 'wb') as f:\n        f.write(chunk)\n",
    "dev_shm": "def place(i, chunk):\n    with open(f'/dev/shm/f{i}', 'wb') as f:\n        f.write(chunk)\n",
    "memfd": (
        "fds = []\n"
        "def place(i, chunk):\n"
        "    fd = os.memfd_create(f'm{i}')\n"
        "    fds.append(fd)\n"
        "    if os.write(fd, chunk) != len(chunk):\n        raise OSError(28, 'short write')\n"
    ),
    "sysv_shm": (
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.shmat.restype = ctypes.c_void_p\n"
        "def place(i, chunk):\n"
        "    shmid = libc.shmget(0, len(chunk), 0o1600)\n"
        "    if shmid < 0:\n        raise OSError(ctypes.get_errno(), 'shmget')\n"
        "    addr = libc.shmat(shmid, None, 0)\n"
        "    if addr in (None, ctypes.c_void_p(-1).value):\n        raise OSError(ctypes.get_errno(), 'shmat')\n"
        "    ctypes.memset(addr, 1, len(chunk))\n"
        "    libc.shmdt(ctypes.c_void_p(addr))\n"
    ),
}


@pytest.mark.parametrize("where", list(_PLACE))
def test_memory_outside_the_heap_counts_against_the_limit(sandbox, where):
    _needs(sandbox, "ipcns")
    if not {"memory_cgroup", "memory_rules"} & set(sandbox.isolation):
        pytest.skip(f"neither memory_cgroup nor memory_rules is in force: {sandbox.isolation}")
    memory_mb = 96
    code = (
        "import ctypes, os\n" + _PLACE[where] + "chunk = b'x' * (4 << 20)\nplaced = 0\n"
        "for i in range(100):\n"
        "    try:\n        place(i, chunk)\n"
        "    except (OSError, MemoryError) as exc:\n"
        "        print('write error', type(exc).__name__, exc, flush=True)\n        break\n"
        "    placed += 4\n"
        "    print('placed', placed, flush=True)\n"
    )
    before = _shmem_kb()
    result = _run(sandbox, code, memory_mb=memory_mb, file_size_mb=1024, timeout=10)
    placed = max([int(n) for n in re.findall(r"^placed (\d+)$", result.stdout, re.MULTILINE)] or [0])
    assert placed <= memory_mb, f"{placed} MB held in {where} past memory_mb={memory_mb}: {result.status}"
    assert result.status is ExecutionStatus.MEMORY_LIMIT or "write error" in result.stdout, (
        result.status,
        result.stdout[-500:],
        result.stderr[-500:],
    )
    deadline = time.monotonic() + 5  # the kernel frees a dead IPC namespace's segments a moment later
    while _shmem_kb() - before >= 64 * 1024 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _shmem_kb() - before < 64 * 1024, "the run's shared memory outlived it on the host"
    assert sandbox.run("print(9)").stdout == "9\n"


# The syscall filter

_SYSCALLS = r"""
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
AT_FDCWD = -100
NEW = {'ns': 0x20000, 'cgroup': 0x02000000, 'uts': 0x04000000, 'ipc': 0x08000000, 'user': 0x10000000,
       'pid': 0x20000000, 'net': 0x40000000, 'time': 0x80}


def sc(nr, *args):
    ctypes.set_errno(0)
    ret = libc.syscall(L(nr), *[L(a) if isinstance(a, int) else a for a in args])
    err = ctypes.get_errno()
    if ret == 0 and nr == 56:  # a clone that worked: this is the child
        os._exit(0)
    return [ret, errno.errorcode.get(err, err) if ret < 0 else 0]


try:
    ns_fd = os.open('/proc/self/ns/net', os.O_RDONLY)
except OSError:  # no /proc for model code under landlock: the filter answers before the fd is looked at
    ns_fd = -1
out = {f'unshare_{k}': sc(272, v) for k, v in NEW.items()}
# (CLONE_NEWTIME only exists for unshare and clone3: in clone's flags 0x80 is part of the exit signal)
out.update({f'clone_{k}': sc(56, v | 17, 0, 0, 0, 0) for k, v in NEW.items() if k != 'time'})
out.update({
    'clone3': sc(435, 0, 0),
    'setns': sc(308, ns_fd, 0),
    'mount': sc(165, b'none', b'/tmp', b'tmpfs', 0, 0),
    'umount2': sc(166, b'/tmp', 0),
    'pivot_root': sc(155, b'/tmp', b'/tmp'),
    'chroot': sc(161, b'/tmp'),
    'open_tree': sc(428, AT_FDCWD, b'/tmp', 0),
    'move_mount': sc(429, -1, b'', AT_FDCWD, b'/tmp', 0),
    'fsopen': sc(430, b'tmpfs', 0),
    'fsconfig': sc(431, 3, 0, 0, 0, 0),
    'fsmount': sc(432, 3, 0, 0),
    'fspick': sc(433, AT_FDCWD, b'/', 0),
    'mount_setattr': sc(442, AT_FDCWD, b'/', 0, 0, 0),
    'ptrace_traceme': sc(101, 0, 0, 0, 0),
    'ptrace_attach_1': sc(101, 16, 1, 0, 0),
    'process_vm_readv': sc(310, os.getpid(), 0, 0, 0, 0, 0),
    'process_vm_writev': sc(311, os.getpid(), 0, 0, 0, 0, 0),
    'bpf': sc(321, 0, 0, 0),
    'keyctl': sc(250, 0, -2, 0, 0, 0),
    'add_key': sc(248, b'user', b'rllm', b'v', 1, -2),
    'request_key': sc(249, b'user', b'rllm', 0, 0),
    'perf_event_open': sc(298, 0, 0, -1, -1, 0),
    'userfaultfd': sc(323, 0),
    'kexec_load': sc(246, 0, 0, 0, 0),
    'kexec_file_load': sc(320, -1, -1, 0, 0, 0),
    'io_uring_setup': sc(425, 1, 0),
    'io_uring_enter': sc(426, 0, 0, 0, 0, 0, 0),
    'io_uring_register': sc(427, 0, 0, 0, 0),
    'socket_inet': sc(41, 2, 1, 0),
    'socket_inet6': sc(41, 10, 1, 0),
    'socket_netlink': sc(41, 16, 3, 0),
    'socket_packet': sc(41, 17, 3, 0),
    'x32_unshare_user': sc(272 | 0x40000000, NEW['user']),
})
print(json.dumps(out))
"""


def test_the_syscall_filter_closes_every_door(sandbox):
    _needs(sandbox, "seccomp")
    out = _last_json(_run(sandbox, _SYSCALLS))
    opened = {name: value for name, value in out.items() if value[0] >= 0}
    assert not opened, f"syscalls that worked: {opened}"
    assert out["clone3"] == [-1, "ENOSYS"], out["clone3"]
    assert out["x32_unshare_user"][1] in ("EPERM", "ENOSYS")
    wrong = {n: v for n, v in out.items() if n not in ("clone3", "x32_unshare_user") and v[1] != "EPERM"}
    assert not wrong, f"denied with another errno than EPERM: {wrong}"


@pytest.mark.parametrize("read_view", [False, True])
def test_honest_programs_still_work_under_every_layer(sandbox, view_sandbox, read_view):
    box = view_sandbox if read_view else sandbox
    code = (
        "import json, multiprocessing, os, socket, subprocess, sys, tempfile, threading\n"
        "out = {}\n"
        "t = threading.Thread(target=lambda: out.__setitem__('thread', True))\nt.start()\nt.join()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n    os._exit(3)\n"
        "out['fork'] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])\n"
        "a, b = socket.socketpair()\na.sendall(b'hi')\nout['unix'] = b.recv(2).decode()\n"
        "try:\n"
        "    sub = subprocess.run([sys.executable, '-c', 'print(6*7)'], capture_output=True, text=True)\n"
        "    out['sub'] = sub.stdout\n"
        "except OSError:\n    out['sub'] = 'refused'\n"
        "with multiprocessing.get_context('fork').Pool(2) as pool:\n"
        "    out['pool'] = pool.map(abs, [-1, -2])\n"
        "with tempfile.NamedTemporaryFile('w+') as f:\n"
        "    f.write('t')\n    f.flush()\n    f.seek(0)\n    out['tempfile'] = f.read()\n"
        "import math, collections, heapq, bisect, fractions, decimal, itertools, functools, re, random\n"
        "out['stdlib'] = math.comb(5, 2)\n"
        "print(json.dumps(out))\n"
    )
    out = _last_json(_run(box, code, timeout=10))
    assert out == {
        "thread": True,
        "fork": 3,
        "unix": "hi",
        "sub": "refused" if "landlock" in box.isolation else "42\n",  # no program to execute under landlock
        "pool": [1, 2],
        "tempfile": "t",
        "stdlib": 10,
    }


# No host state one run can set and another read: page-cache probes and host-wide counters

_PROBES = r"""
import ctypes, errno, json, os
from ctypes import c_int, c_long, c_size_t, c_void_p
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype, libc.mmap.argtypes = c_void_p, [c_void_p, c_size_t, c_int, c_int, c_int, c_long]
libc.syscall.restype = c_long
out = {}
def outcome(result):
    return "allowed" if result != -1 else errno.errorcode.get(ctypes.get_errno(), "?")
with open("own.bin", "wb") as handle:
    handle.write(bytes(4096))
fd = os.open("own.bin", os.O_RDONLY)
address = libc.mmap(None, 4096, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
out["mincore"] = outcome(libc.mincore(c_void_p(address), c_size_t(4096), ctypes.create_string_buffer(1)))
out["sysinfo"] = outcome(libc.sysinfo(ctypes.create_string_buffer(256)))
out["cachestat"] = outcome(libc.syscall(451, fd, ctypes.create_string_buffer(16), ctypes.create_string_buffer(64), 0))
try:
    os.preadv(fd, [bytearray(16)], 0, os.RWF_NOWAIT)
    out["preadv2"] = "allowed"
except OSError as exc:
    out["preadv2"] = errno.errorcode[exc.errno]
shown = {}
for name in NAMES:
    try:
        with open("/proc/" + name, "rb") as handle:
            shown[name] = len(handle.read())
    except FileNotFoundError:
        shown[name] = 0
    except OSError as exc:
        shown[name] = errno.errorcode[exc.errno]
out["proc"] = shown
print(json.dumps(out))
"""


def test_no_run_can_probe_the_page_cache_or_read_host_wide_counters(sandbox):
    """What one run could set (pages it read, files it holds open, processes it started, memory it took) and another
    read: the probes fail and the host-wide /proc files read empty."""
    from rllm_gym.sandbox._isolation import HOST_WIDE_PROC

    _needs(sandbox, "seccomp", "private_proc")
    code = f"NAMES = {list(HOST_WIDE_PROC)!r}\n" + _PROBES
    out = _last_json(_run(sandbox, code))
    assert {key: out[key] for key in ("mincore", "sysinfo", "cachestat", "preadv2")} == dict.fromkeys(
        ("mincore", "sysinfo", "cachestat", "preadv2"), "EPERM"
    ), out
    # Empty (covered by /dev/null) or, under landlock, not readable at all.
    assert set(out["proc"].values()) <= {0, "EACCES"}, out["proc"]
