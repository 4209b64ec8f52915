"""The sandbox against hostile programs: each contained, with the right status, the host unharmed, nothing left."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rllm_gym
from rllm_gym.sandbox import (
    REQUIRED_LAYERS,
    ExecutionStatus,
    Sandbox,
    SandboxResult,
    SandboxUnavailableError,
    arun_python,
    run_python,
)
from rllm_gym.sandbox._isolation import RUN_DIR

LINUX_ROOT = sys.platform.startswith("linux") and os.geteuid() == 0


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(max_parallel=8) as box:
        box.start()
        yield box


def _uid_processes(uid: int) -> list[int]:
    """Pids of live processes owned by ``uid`` (read from /proc, so it sees every namespace's processes)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            match = re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE)
            if match and int(match.group(1)) == uid:
                pids.append(int(entry.name))
    return pids


def _needs(box: Sandbox, *layers: str) -> None:
    missing = [layer for layer in layers if layer not in box.isolation]
    if missing:
        pytest.skip(f"isolation layers {missing} are not available here: {box.isolation}")


def test_full_isolation_is_in_effect_as_root_on_linux(sandbox):
    if not LINUX_ROOT:
        pytest.skip("namespaces need root on Linux")
    result = sandbox.run("print('hi')")
    # Every required layer, and of the memory alternatives the cgroup itself (root can make one).
    expected = {layer.split("|")[0] for layer in REQUIRED_LAYERS}
    assert len(expected) == 13 and "memory_cgroup" in expected and set(result.isolation) >= expected


def test_stdout_stdin_and_exit_codes(sandbox):
    result = sandbox.run(
        "import sys\nname = input()\nprint('hello', name)\nprint('warn', file=sys.stderr)", stdin="ada\n"
    )
    assert result.status is ExecutionStatus.OK and result.exit_code == 0
    assert result.stdout == "hello ada\n" and result.stderr == "warn\n" and not result.truncated
    assert sandbox.run("import sys; sys.exit(3)").exit_code == 3
    crash = sandbox.run("def f():\n    raise ValueError('boom')\nf()")
    assert crash.status is ExecutionStatus.RUNTIME_ERROR and crash.exit_code == 1
    assert crash.stderr.strip().endswith("ValueError: boom") and "_zygote" not in crash.stderr


def test_lone_surrogates_in_code_input_and_files_are_the_programs_affair(sandbox):
    """Text UTF-8 cannot encode is the caller's (a model's) text: the run ends in its own status, never
    ``sandbox_error``."""
    broken = sandbox.run("s = '\ud800'\nprint(len(s))\n")
    assert broken.status is ExecutionStatus.RUNTIME_ERROR and "surrogates not allowed" in broken.stderr
    commented = sandbox.run("print(2 * 21)  # \udcff\n")
    assert commented.status is ExecutionStatus.RUNTIME_ERROR
    echoed = sandbox.run(
        "import sys\nprint(repr(sys.stdin.read()), open('f.txt', encoding='utf-8', errors='replace').read())",
        stdin="a\ud800b",
        files={"f.txt": "\udcff"},
    )
    assert echoed.status is ExecutionStatus.OK and echoed.stdout.startswith("'a\ufffd\ufffd\ufffdb'"), echoed


def test_big_stdin_and_extra_files(sandbox):
    data = "\n".join(str(i) for i in range(200_000)) + "\n"
    result = sandbox.run(
        "import sys\nprint(sum(map(int, sys.stdin)), open('n.txt').read())", stdin=data, files={"n.txt": "seven"}
    )
    assert result.stdout == f"{sum(range(200_000))} seven\n"


def test_infinite_loop_times_out_on_wall_clock(sandbox):
    start = time.monotonic()
    result = sandbox.run("while True:\n    pass", timeout=1.0)
    assert result.status is ExecutionStatus.TIMEOUT and result.exit_code is None
    assert 0.9 < time.monotonic() - start < 5


def test_sleep_past_the_timeout(sandbox):
    result = sandbox.run("import time\nprint('started', flush=True)\ntime.sleep(30)", timeout=0.5)
    assert result.status is ExecutionStatus.TIMEOUT and result.stdout == "started\n" and result.duration_s < 3


def test_cpu_time_limit_is_a_timeout(sandbox):
    result = sandbox.run("while True:\n    pass", timeout=10, cpu_time_s=1)
    assert result.status is ExecutionStatus.TIMEOUT and result.exit_code == -signal.SIGXCPU


def test_memory_bomb(sandbox):
    result = sandbox.run("chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))", memory_mb=200)
    assert result.status is ExecutionStatus.MEMORY_LIMIT


def test_printing_gigabytes_is_cut_at_the_cap(sandbox):
    start = time.monotonic()
    result = sandbox.run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", max_output_bytes=100_000)
    assert result.status is ExecutionStatus.OUTPUT_LIMIT and result.truncated
    assert result.stdout == "x" * 100_000 and time.monotonic() - start < 5


def test_huge_file_hits_the_file_size_limit(sandbox):
    result = sandbox.run("f = open('big.bin', 'wb')\nwhile True:\n    f.write(b'x' * (1 << 20))", file_size_mb=4)
    assert result.status is ExecutionStatus.OUTPUT_LIMIT
    assert "File too large" in result.stderr or "No space left" in result.stderr


def test_fork_bomb_is_contained_and_leaves_nothing(sandbox):
    _needs(sandbox, "unprivileged_uid", "pidns")  # root ignores RLIMIT_NPROC: never run a fork bomb without a uid
    code = (
        "import os, resource\n"
        "cap = min(64, resource.getrlimit(resource.RLIMIT_NPROC)[1])\n"
        "resource.setrlimit(resource.RLIMIT_NPROC, (cap, cap))  # bound the bomb even if the sandbox did not\n"
        "print(os.getuid(), flush=True)\n"
        "while True:\n"
        "    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    result = sandbox.run(code, timeout=2, max_processes=32)
    assert result.status is ExecutionStatus.TIMEOUT
    uid = int(result.stdout.split()[0])
    assert uid != 0 and _uid_processes(uid) == []


def test_daemon_does_not_outlive_the_run(sandbox):
    code = (
        "import os, sys, time\n"
        "print(os.getuid(), flush=True)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        sys.stdout.close(); sys.stderr.close(); os.close(1); os.close(2)\n"
        "        time.sleep(30)\n"
        "    os._exit(0)\n"
        "print('parent exits')\n"
    )
    result = sandbox.run(code, timeout=5)
    assert result.status is ExecutionStatus.OK and result.stdout.endswith("parent exits\n")
    assert result.duration_s < 3  # the sandbox did not wait for the daemon's 30 s
    uid = int(result.stdout.split()[0])
    if "unprivileged_uid" in sandbox.isolation:
        assert _uid_processes(uid) == []
    zygote = sandbox._proc.pid
    children = Path(f"/proc/{zygote}/task/{zygote}/children").read_text().split()
    assert children == []


def test_killing_the_parent_harms_nobody(sandbox):
    code = (
        "import os, signal\n"
        f"for pid in (os.getppid(), {os.getpid()}, {sandbox._proc.pid}):\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError as exc:\n        print(pid, type(exc).__name__)\n"
        "print('still here')\n"
    )
    result = sandbox.run(code)
    assert result.status is ExecutionStatus.OK and result.stdout.endswith("still here\n")
    assert sandbox._proc.poll() is None and sandbox.run("print(1)").stdout == "1\n"


def test_secrets_are_invisible(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-planted-secret")
    monkeypatch.setenv("HF_TOKEN", "hf-planted-secret")
    code = (
        "import os\n"
        "print(sorted(os.environ))\n"
        f"for path in ('/proc/self/environ', '/proc/{os.getpid()}/environ', '/proc/{os.getpid()}/cmdline', "
        "'/proc/1/environ'):\n"
        "    try:\n        print(path, open(path, 'rb').read())\n"
        "    except OSError as exc:\n        print(path, exc)\n"
    )
    with Sandbox(max_parallel=2) as box:  # started after the secrets were planted
        result = box.run(code)
    assert result.status is ExecutionStatus.OK
    assert "planted-secret" not in result.stdout and "OPENAI_API_KEY" not in result.stdout
    assert "HF_TOKEN" not in result.stdout


def test_writes_outside_the_workdir_are_impossible(sandbox, tmp_path):
    _needs(sandbox, "readonly_fs")
    target = tmp_path / "escaped"
    attempts = [
        f"open({str(target)!r}, 'w').write('x')",
        f"os.close(os.open({str(target)!r}, os.O_CREAT | os.O_WRONLY))",
        f"pathlib.Path({str(target)!r}).write_text('x')",
        f"os.mkdir({str(target)!r})",
        f"os.symlink('/etc/passwd', {str(target)!r})",
        "open('mine.txt', 'w').write('x'); os.link('mine.txt', " + repr(str(target)) + ")",
        "open('mine2.txt', 'w').write('x'); shutil.move('mine2.txt', " + repr(str(target)) + ")",
        f"subprocess.run(['touch', {str(target)!r}], check=True)",
        "open('/usr/escaped', 'w').write('x')",
        "open('/etc/passwd', 'a').write('x')",
    ]
    # /tmp and /dev/shm are the run's own private tmpfs: writable, and gone with the run.
    code = (
        "import os, pathlib, shutil, subprocess\nopen('inside.txt', 'w').write('ok')\nprint(os.getcwd())\n"
        "open('/tmp/escaped-to-tmp', 'w').write('x')\nopen('/dev/shm/escaped', 'w').write('x')\n"
    )
    for attempt in attempts:
        code += (
            f"try:\n    {attempt}\n    print('WROTE', {attempt!r})\nexcept Exception as exc:\n    print('blocked')\n"
        )
    result = sandbox.run(code)
    assert result.status is ExecutionStatus.OK, result.stderr
    assert "WROTE" not in result.stdout and result.stdout.count("blocked") == len(attempts)
    assert not target.exists() and not Path("/dev/shm/escaped").exists() and not Path("/tmp/escaped-to-tmp").exists()
    workdir = result.stdout.splitlines()[0]
    assert workdir == RUN_DIR and os.listdir(f"/proc/{sandbox._proc.pid}/root{workdir}") == []  # the run's tmpfs died


def test_an_interpreter_under_tmp_stays_visible_and_the_view_folder_is_removed(tmp_path):
    """A venv under the host's /tmp (CI clones may live there): its packages reach the code (preloaded: under Landlock
    a run reads no file of it); /tmp is the run's own."""
    if not LINUX_ROOT:
        pytest.skip("the view needs root on Linux")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "probe_module.py").write_text("VALUE = 42\n")
    paths = [str(Path(rllm_gym.__file__).parents[1]), *(p for p in sys.path if p.endswith("site-packages"))]
    script = (
        "import os\nfrom rllm_gym.sandbox import Sandbox\n"
        "with Sandbox(max_parallel=1, preload=['probe_module']) as box:\n"
        '    r = box.run(\'import os, probe_module; open("/tmp/x", "w").write("1"); '
        'print(probe_module.VALUE, os.getcwd(), os.path.exists(os.environ["TMPDIR"] + "/x"))\')\n'
        "    views = [box._view_base]\n"
        "print(r.status.value, r.stdout.strip(), r.stderr[-300:])\n"
        "with Sandbox(max_parallel=1, packages=[]) as box:\n"
        "    print('limited', box.run('import probe_module').status.value)\n"
        "    views.append(box._view_base)\n"
        "print('left', set(filter(os.path.exists, views)) if all(views) else views)\n"  # its own (other tests': not)
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    out = subprocess.run([str(venv / "bin" / "python"), "-c", script], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"ok 42 {RUN_DIR} True" in out.stdout and "left set()" in out.stdout, out.stdout
    assert "limited runtime_error" in out.stdout, out.stdout  # packages=[] still covers that venv's site-packages


def test_network_connections_fail(sandbox):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code = (
        "import socket\n"
        f"for family, address in ((socket.AF_INET, ('127.0.0.1', {port})), (socket.AF_INET, ('1.1.1.1', 80)), "
        f"(socket.AF_INET6, ('::1', {port}))):\n"
        "    try:\n"
        "        s = socket.socket(family)\n        s.settimeout(1)\n        s.connect(address)\n"
        "        print('CONNECTED')\n"
        "    except OSError as exc:\n        print('refused', exc.errno)\n"
    )
    try:
        result = sandbox.run(code)
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()
    assert result.status is ExecutionStatus.OK and result.stdout.count("refused") == 3


def test_zygote_death_is_a_sandbox_error_then_it_restarts():
    with Sandbox(max_parallel=2) as box:
        future = box.submit("import time\ntime.sleep(10)", timeout=20)
        time.sleep(0.3)
        box._proc.kill()  # our own child, started by this Sandbox
        result = future.result(timeout=10)
        assert result.status is ExecutionStatus.SANDBOX_ERROR and "zygote exited" in result.error
        assert box.run("print(2)").stdout == "2\n"


def test_bad_arguments_name_the_field():
    message = "sandbox timeout must be a positive number of seconds, finite (wall-clock, per run), got -1"
    with pytest.raises(ValueError, match=re.escape(message)):
        run_python("pass", timeout=-1)
    with pytest.raises(ValueError, match=re.escape("sandbox file names must be plain names inside the workdir")):
        run_python("pass", files={"../x": ""})
    with pytest.raises(TypeError, match=re.escape("sandbox code must be a str, got bytes")):
        run_python(b"pass")


async def test_many_concurrent_runs_do_not_block_the_loop():
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    start = time.monotonic()
    results = await asyncio.gather(
        *(arun_python(f"import time\ntime.sleep(0.3)\nprint({i})", run_class="visible") for i in range(24))
    )
    elapsed = time.monotonic() - start
    task.cancel()
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(24)]
    assert all(isinstance(r, SandboxResult) and r.ok for r in results)
    assert elapsed < 0.3 * 24 / 2  # ran in parallel
    assert ticks > elapsed / 0.01 / 3  # the loop kept ticking while we waited


def test_packages_limits_what_the_code_can_import():
    code = (
        "import importlib\n"
        "for name in ('yaml', 'tqdm', 'json'):\n"
        "    try:\n        importlib.import_module(name)\n        print(name, 'ok')\n"
        "    except ImportError:\n        print(name, 'missing')\n"
    )
    with Sandbox(max_parallel=1, packages=["yaml"]) as box:
        assert box.run(code).stdout.split("\n")[:3] == ["yaml ok", "tqdm missing", "json ok"]
    with Sandbox(max_parallel=1, packages=[]) as box:
        assert box.run(code).stdout.split("\n")[:3] == ["yaml missing", "tqdm missing", "json ok"]
    with pytest.raises(ValueError, match=re.escape("Sandbox packages must be None or a list of import names")):
        Sandbox(packages="numpy")


def test_strict_refuses_to_run_without_a_required_layer(monkeypatch):
    import rllm_gym.sandbox._spawn as spawn_module  # where a starting zygote's layers are checked

    monkeypatch.setattr(spawn_module, "REQUIRED_LAYERS", (*spawn_module.REQUIRED_LAYERS, "quantum_fence"))
    with Sandbox(max_parallel=1) as box, pytest.raises(SandboxUnavailableError, match=r"missing layers \['quantum"):
        box.run("print(1)")
    with Sandbox(max_parallel=1, strict=False) as box:  # the same machine, weaker promise: it runs and says what held
        result = box.run("print(1)")
        assert result.ok and "quantum_fence" not in result.isolation
    with pytest.raises(ValueError, match=re.escape("Sandbox(isolate=False) runs code without isolation")):
        Sandbox(isolate=False)


def test_paired_run_carries_plain_data_only(sandbox):
    solution = (
        "class Always:\n    def __eq__(self, other):\n        return True\n"
        "def add(a, b):\n    return a + b\n"
        "def forged():\n    return Always()\n"
        "def fails():\n    raise ValueError('nope')\n"
    )
    harness = (
        "import _rllm_channel as ch\n"
        "print(repr(ch.remote('add')(1, 2)), repr(ch.remote('add')((1,), (2,))), repr(ch.remote('add')(b'a', b'b')))\n"
        "for name in ('forged', 'fails', 'missing'):\n"
        "    try:\n        ch.remote(name)()\n"
        "    except Exception as exc:\n        print(name, type(exc).__name__, getattr(exc, 'status', '-'))\n"
    )
    pair = sandbox.run_pair(solution, harness)
    assert pair.harness.ok and pair.solution.ok, (pair.harness.stderr, pair.solution.stderr)
    assert pair.harness.stdout.splitlines() == [
        "3 (1, 2) b'ab'",
        "forged RemoteError not_plain_data",
        "fails ValueError -",
        "missing NameError -",
    ]
    gone = sandbox.run_pair("import os\nos._exit(0)", harness)
    assert gone.harness.status is ExecutionStatus.RUNTIME_ERROR and "ended before answering" in gone.harness.stderr


def test_a_paired_solution_runs_as_a_module_not_main(sandbox):
    """As a data set's harness imports a solution: its main block does not run, so it cannot end the process before
    it answers; a run of its own is ``__main__`` as ever."""
    solution = (
        "import sys\n"
        "def names():\n"
        "    return [__name__, sys.modules['__main__'].__name__, sys.modules['__solution__'] is not None]\n"
        "if __name__ == '__main__':\n    raise SystemExit(3)\n"
    )
    harness = "import _rllm_channel as ch\nprint(ch.remote('names')())\n"
    pair = sandbox.run_pair(solution, harness)
    assert pair.harness.ok and pair.solution.ok, (pair.harness.stderr, pair.solution.stderr)
    assert pair.harness.stdout.split("\n")[0] == "['__solution__', '__solution__', True]"
    alone = sandbox.run("print(__name__)\nif __name__ == '__main__':\n    raise SystemExit(3)\n")
    assert alone.stdout == "__main__\n" and alone.exit_code == 3


def test_in_flight_counts_runs_submitted_and_not_answered(sandbox):
    assert sandbox.in_flight == 0
    futures = [sandbox.submit("import time; time.sleep(0.3)", timeout=10) for _ in range(3)]
    assert sandbox.in_flight == 3  # what a caller's backpressure bounds: queued or running, not yet answered
    assert all(future.result(timeout=40).ok for future in futures)
    assert sandbox.in_flight == 0


def test_the_default_sandbox_takes_max_parallel_from_the_environment():
    # In a fresh process: the default sandbox is made once per process.
    probe = "from rllm_gym.sandbox import default_sandbox; print(default_sandbox().max_parallel)"

    def run(value: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "RLLM_GYM_SANDBOX_MAX_PARALLEL": value}
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)

    assert run("12").stdout.strip() == "12"
    for bad in ("0", "many", "300"):
        failed = run(bad)
        assert failed.returncode != 0
        assert f"RLLM_GYM_SANDBOX_MAX_PARALLEL must be an int in [1, 256] (runs at once), got {bad!r}" in failed.stderr
