"""Code grading against replies written to forge a pass: one test per weakness, beside an honest reply that passes.

Each test grades a hostile reply in every test format where the attack applies (stdin/stdout, TACO function
calls, HumanEval ``check``, MBPP asserts) and asserts it earns nothing, that it still ends in a graded verdict (never
``sandbox_error``, never an exception), and that the honest solution graded right after it still earns 1.0.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from importlib import resources
from pathlib import Path

import gymnasium as gym
import pytest

import rllm_gym
from rllm_gym.envs.code import BUILTIN_TASKS_PATH, builtin_code_tasks
from rllm_gym.rewards.code import CodeReward
from rllm_gym.tools import HermesToolParser
from rllm_gym.types import RewardOutput, ToolCall

TOOL_TASKS_PATH = Path(str(resources.files("rllm_gym.tools").joinpath("tasks.jsonl")))
REPO_ROOT = Path(rllm_gym.__file__).resolve().parents[1]
STATUSES = {
    "ok",
    "wrong_answer",
    "runtime_error",
    "timeout",
    "memory_limit",
    "output_limit",
    "killed",
    "not_plain_data",
}

# The same task in the four formats: double a number. Answers differ per test, so no constant can pass.
TASKS = {
    "stdio": {"tests": [{"input": "2\n", "output": "4\n"}, {"input": "500000\n", "output": "1000000\n"}]},
    "call": {"fn_name": "double", "tests": {"inputs": [[2], [500000], [-7]], "outputs": [4, 1000000, -14]}},
    "humaneval": {
        "test": "def check(candidate):\n"
        "    assert candidate(2) == 4\n"
        "    assert candidate(500000) == 1000000\n"
        "    assert candidate(-7) == -14\n",
        "entry_point": "double",
    },
    "mbpp": {"test_list": ["assert double(2) == 4", "assert double(500000) == 1000000", "assert double(-7) == -14"]},
}
FORMATS = list(TASKS)
FUNCTION_FORMATS = ["call", "humaneval", "mbpp"]
HONEST = {
    "stdio": "print(int(input()) * 2)\n",
    **dict.fromkeys(FUNCTION_FORMATS, "def double(x):\n    return 2 * x\n"),
}
# A wrong solution the attacks decorate: it would earn 0 on its own.
WRONG = {
    "stdio": "print(0)\n",
    **dict.fromkeys(FUNCTION_FORMATS, "def double(x):\n    return 0\n"),
}


@pytest.fixture(scope="module")
def box(strict_sandbox):
    return strict_sandbox


@pytest.fixture(scope="module")
def grader(box):
    return CodeReward(sandbox=box, timeout=2.0)


@pytest.fixture(scope="module")
def fast(box):
    """For hostile replies: a short timeout, a small memory limit and no test after the first failure keep it quick."""
    return CodeReward(sandbox=box, timeout=0.5, memory_mb=128, stop_on_first_failure=True)


def _fence(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


def _grade(grader: CodeReward, task: dict, code: str) -> RewardOutput:
    """Grade and check the verdict is well formed: graded, every test with a known status, no sandbox_error."""
    result = grader(task, _fence(code))
    meta = result.metadata
    assert meta["graded"] is True and result.is_correct in (True, False), meta
    assert "sandbox_error" not in json.dumps(meta.get("error")), meta
    for record in meta["tests"]:
        assert record["status"] in STATUSES, record
        assert isinstance(record["passed"], bool)
    return result


def _attack(grader: CodeReward, fmt: str, code: str) -> RewardOutput:
    """The hostile reply earns 0; the honest one graded right after still earns 1."""
    task = TASKS[fmt]
    hostile = _grade(grader, task, code)
    assert hostile.reward == 0.0 and hostile.is_correct is False, (fmt, hostile.metadata)
    assert hostile.metadata["passed"] < hostile.metadata["total"]
    honest = _grade(grader, task, HONEST[fmt])
    assert honest.reward == 1.0 and honest.is_correct is True, (fmt, honest.metadata)
    return hostile


# 1. Nothing the program prints, exits with or does at exit turns a test into a pass

_FAKE_RESULTS = (
    "import json, sys\n"
    "for i in range(20):\n"
    "    record = {'index': i, 'ok': True, 'passed': True, 'status': 'ok', 'got': 4, 'error': None}\n"
    "    print('@@RLLM_TEST_RESULT@@' + json.dumps(record))\n"
    "    print(json.dumps(record))\n"
    "print(json.dumps({'passed': 3, 'total': 3, 'reward': 1.0, 'is_correct': True}))\n"
    "print('All tests passed')\n"
    "sys.stdout.flush()\n"
)


@pytest.mark.parametrize("fmt", FORMATS)
def test_fake_result_lines_then_os_exit(fast, fmt):
    _attack(fast, fmt, WRONG[fmt] + _FAKE_RESULTS + "import os\nos._exit(0)\n")


@pytest.mark.parametrize("fmt", FORMATS)
def test_fake_result_lines_then_sys_exit(fast, fmt):
    _attack(fast, fmt, WRONG[fmt] + _FAKE_RESULTS + "raise SystemExit(0)\n")


@pytest.mark.parametrize("fmt", FORMATS)
def test_atexit_hook_prints_results_and_exits_zero(fast, fmt):
    code = (
        "import atexit, os\n"
        "def _forge():\n" + "".join(f"    {line}\n" for line in _FAKE_RESULTS.splitlines()) + "    os._exit(0)\n"
        "atexit.register(_forge)\n" + WRONG[fmt]
    )
    _attack(fast, fmt, code)


@pytest.mark.parametrize("fmt", FORMATS)
def test_excepthook_swallows_failures(fast, fmt):
    code = (
        "import os, sys, threading\n"
        "def _hook(*args):\n"
        '    print(\'@@RLLM_TEST_RESULT@@{"index": 0, "ok": true, "got": 4, "error": null}\', flush=True)\n'
        "    os._exit(0)\n"
        "sys.excepthook = _hook\n"
        "threading.excepthook = _hook\n"
        "sys.unraisablehook = _hook\n" + WRONG[fmt]
    )
    _attack(fast, fmt, code)


_BUILTINS = (
    "import builtins, sys\n"
    "class _AE(Exception):\n    pass\n"
    "_real_import = builtins.__import__\n"
    "def _import(name, *args, **kwargs):\n"
    "    module = _real_import(name, *args, **kwargs)\n"
    "    if name == 'json':\n"
    "        module.loads = lambda *a, **k: True\n"
    "        module.dumps = lambda *a, **k: 'true'\n"
    "    return module\n"
    "builtins.AssertionError = _AE\n"
    "builtins.isinstance = lambda *a: True\n"
    "builtins.exec = lambda *a, **k: None\n"
    "builtins.eval = lambda *a, **k: True\n"
    "builtins.all = lambda *a: True\n"
    "builtins.len = lambda *a: 0\n"
    "builtins.__import__ = _import\n"
    "builtins.print = lambda *a, **k: sys.stdout.write('4\\n')\n"
    "builtins.int = lambda *a, **k: 0\n"
)


@pytest.mark.parametrize("fmt", FORMATS)
def test_overriding_builtins(fast, fmt):
    _attack(fast, fmt, WRONG[fmt] + _BUILTINS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_monkeypatching_json_and_struct(fast, fmt):
    code = (
        "import json, struct, sys\n"
        'json.dumps = lambda *a, **k: \'{"ok": true, "index": 0, "got": 4, "error": null}\'\n'
        "json.loads = lambda *a, **k: {'ok': True}\n"
        "json.JSONEncoder.encode = lambda self, o: 'true'\n"
        "json.JSONDecoder.decode = lambda self, s, *a: True\n"
        "struct.pack = lambda *a: b'\\x00\\x00\\x00\\x04true'\n"
        "for name in list(sys.modules):\n"
        "    if 'rllm' in name or 'channel' in name:\n"
        "        module = sys.modules[name]\n"
        "        for attr in ('encode', 'decode', 'loads', 'write_frame'):\n"
        "            if hasattr(module, attr):\n"
        "                setattr(module, attr, lambda *a, **k: True)\n" + WRONG[fmt]
    )
    _attack(fast, fmt, code)


# 2. Strict comparison: only plain data comes back, and compares exactly

_ALWAYS_EQUAL = (
    "class Always:\n"
    "    def __eq__(self, other):\n        return True\n"
    "    def __ne__(self, other):\n        return False\n"
    "    def __hash__(self):\n        return 0\n"
    "def double(x):\n    return Always()\n"
)


@pytest.mark.parametrize("fmt", FUNCTION_FORMATS)
def test_an_object_equal_to_everything_is_not_plain_data(grader, fmt):
    result = _attack(grader, fmt, _ALWAYS_EQUAL)
    statuses = {record["status"] for record in result.metadata["tests"]}
    if fmt == "call":
        assert statuses == {"not_plain_data"}, result.metadata["tests"]
    else:
        assert statuses <= {"not_plain_data", "runtime_error", "wrong_answer"}, result.metadata["tests"]


@pytest.mark.parametrize("base", ["int", "str", "float", "list", "tuple", "dict"])
@pytest.mark.parametrize("fmt", FUNCTION_FORMATS)
def test_builtin_subclasses_with_their_own_eq(grader, fmt, base):
    subclass = (
        f"class Fake({base}):\n"
        "    def __eq__(self, other):\n        return True\n"
        "    def __ne__(self, other):\n        return False\n"
        f"    __hash__ = {base}.__hash__\n"
    )
    result = _attack(grader, fmt, subclass + "def double(x):\n    return Fake()\n")
    if fmt == "call":
        assert {r["status"] for r in result.metadata["tests"]} <= {"not_plain_data", "wrong_answer"}


@pytest.mark.parametrize(
    "body",
    ["return 2 * x + 1", "return 2 * x + 1e-9", "return str(2 * x)", "return [2 * x]"],
    ids=["off_by_one", "float_close_to_int", "str_for_int", "wrapped_in_list"],
)
@pytest.mark.parametrize("fmt", FUNCTION_FORMATS)
def test_close_values_of_the_wrong_kind_fail(fast, fmt, body):
    _attack(fast, fmt, f"def double(x):\n    {body}\n")


def test_call_tests_compare_types_strictly(fast):
    """``4.0`` where the data set expects ``4``: a call test fails it (assert-style tests keep their own Python
    semantics, where ``4.0 == 4``)."""
    _attack(fast, "call", "def double(x):\n    return float(2 * x)\n")


def test_bool_is_not_an_int_and_an_int_is_not_a_bool(grader):
    ints = {"fn_name": "sign", "tests": {"inputs": [[5], [-5], [9]], "outputs": [1, 0, 1]}}
    bools = {"fn_name": "positive", "tests": {"inputs": [[5], [-5]], "outputs": [True, False]}}
    assert _grade(grader, ints, "def sign(x):\n    return 1 if x > 0 else 0\n").reward == 1.0
    assert _grade(grader, ints, "def sign(x):\n    return x > 0\n").reward == 0.0
    assert _grade(grader, bools, "def positive(x):\n    return x > 0\n").reward == 1.0
    assert _grade(grader, bools, "def positive(x):\n    return 1 if x > 0 else 0\n").reward == 0.0
    humaneval = {"test": "def check(candidate):\n    assert candidate(5) == 1\n", "entry_point": "sign"}
    assert _grade(grader, humaneval, "def sign(x):\n    return 1\n").reward == 1.0


def test_floats_use_the_tolerance_only_where_a_float_is_expected(grader):
    floats = {"fn_name": "third", "tests": {"inputs": [[1], [2]], "outputs": [0.3333333333, 0.6666666667]}}
    assert _grade(grader, floats, "def third(x):\n    return x / 3\n").reward == 1.0
    assert _grade(grader, floats, "def third(x):\n    return round(x / 3, 3)\n").reward == 0.0
    assert _grade(grader, floats, "def third(x):\n    return float('nan')\n").reward == 0.0
    assert _grade(grader, floats, "def third(x):\n    return float('inf')\n").reward == 0.0
    loose = {**floats, "float_tolerance": 1e-2}
    assert _grade(grader, loose, "def third(x):\n    return round(x / 3, 3)\n").reward == 1.0
    nested = {"fn_name": "pair", "tests": {"inputs": [[1]], "outputs": [[1, 0.1]]}}
    assert _grade(grader, nested, "def pair(x):\n    return [x, 0.1 + 1e-12]\n").reward == 1.0
    assert _grade(grader, nested, "def pair(x):\n    return [x + 1e-12, 0.1]\n").reward == 0.0  # an int slot


@pytest.mark.parametrize(
    ("printed", "passes"),
    [
        ("1000000", True),
        ("  1000000 \n\n", True),
        ("1000001", False),
        ("1000000.0", False),
        ("1e6", False),
        ("01000000", False),
        ("+1000000", False),
        ("1000000 0", False),
        ("", False),
    ],
)
def test_stdout_integer_tokens_match_exactly(grader, printed, passes):
    task = {"tests": [{"input": "", "output": "1000000\n"}]}
    result = _grade(grader, task, f"print({printed!r})\n")
    assert result.reward == float(passes), (printed, result.metadata["tests"])


@pytest.mark.parametrize(
    ("expected", "printed", "passes"),
    [
        ("0.333333", "0.3333333", True),
        ("0.5", "5e-1", True),
        ("2.5 7", "2.5000000001 7", True),
        ("0.333333", "0.334", False),
        ("0.5", "nan", False),
        ("2.5 7", "2.5 7.0000001", False),
        ("1000.5", "1_000.5", False),
        ("4.0", "\u0664", False),
        ("4.5", "\uff14.\uff15", False),
    ],
)
def test_stdout_float_tokens_use_the_tolerance(grader, expected, printed, passes):
    task = {"tests": [{"input": "", "output": expected + "\n"}]}
    result = _grade(grader, task, f"print({printed!r})\n")
    assert result.reward == float(passes), (expected, printed, result.metadata["tests"])


# 3. The tests and the answers are nowhere the solution can read

_READ_TASK_FILES = f"""
import glob, json, os, sys
ANSWERS = {{}}
paths = [{str(BUILTIN_TASKS_PATH)!r}, {str(TOOL_TASKS_PATH)!r}]
for depth in ('/*.jsonl', '/*/*.jsonl', '/*/*/*.jsonl'):
    paths += glob.glob({str(REPO_ROOT)!r} + depth) + glob.glob('/tmp' + depth)
for path in paths:
    try:
        rows = [json.loads(line) for line in open(path) if line.strip()]
    except (OSError, ValueError):
        continue
    for row in rows:
        tests = row.get('tests') if isinstance(row, dict) else None  # any other JSONL under /tmp is skipped
        if isinstance(tests, list):
            ANSWERS.update((t['input'], t['output']) for t in tests)
        elif isinstance(tests, dict):
            ANSWERS.update((json.dumps(i), o) for i, o in zip(tests['inputs'], tests['outputs']))
try:
    sys.path.insert(0, {str(REPO_ROOT)!r})
    from rllm_gym.envs.code import builtin_code_tasks
    for row in builtin_code_tasks():
        tests = row['tests']
        if isinstance(tests, list):
            ANSWERS.update((t['input'], t['output']) for t in tests)
        else:
            ANSWERS.update((json.dumps(i), o) for i, o in zip(tests['inputs'], tests['outputs']))
except Exception:
    pass
"""


def test_the_shipped_task_files_cannot_be_read_for_answers(grader):
    tasks = builtin_code_tasks()
    stdio = next(t for t in tasks if isinstance(t["tests"], list))
    call = next(t for t in tasks if t.get("fn_name"))
    cheat_stdio = _READ_TASK_FILES + "import sys\ndata = sys.stdin.read()\nprint(ANSWERS.get(data, 'no answer'))\n"
    cheat_call = _READ_TASK_FILES + (
        f"def {call['fn_name']}(*args):\n    return ANSWERS.get(json.dumps(list(args)), 'no answer')\n"
    )
    # The cheat works where nothing hides the files: run unsandboxed on the host, it prints the right answer.
    test = stdio["tests"][0]
    unsandboxed = subprocess.run(
        [sys.executable, "-I", "-c", cheat_stdio], input=test["input"], capture_output=True, text=True, timeout=60
    )
    assert unsandboxed.stdout.split() == test["output"].split(), unsandboxed.stderr[-2000:]
    for task, cheat in ((stdio, cheat_stdio), (call, cheat_call)):
        assert _grade(grader, task, task["reference_solution"]).reward == 1.0
        result = _grade(grader, task, cheat)
        assert result.reward == 0.0, (task["id"], result.metadata["tests"])


_SECRET_HUNT = r"""
import gc, inspect, json, os, re, sys
PATTERN = re.compile(r"RLLMSECRET-[0-9a-f]{32}")
BPATTERN = re.compile(rb"RLLMSECRET-[0-9a-f]{32}")


def _look(found, value):
    if isinstance(value, str):
        found.extend(PATTERN.findall(value))
    elif isinstance(value, (bytes, bytearray)):
        found.extend(m.decode() for m in BPATTERN.findall(value))


def _memory(found, pid):
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", buffering=0)
    except OSError:
        return
    for line in maps:
        span, perms = line.split()[:2]
        start, end = (int(x, 16) for x in span.split("-"))
        if "r" in perms and end - start < (256 << 20) and "[v" not in line:
            try:
                mem.seek(start)
                _look(found, mem.read(end - start))
            except (OSError, ValueError, OverflowError):
                pass


def hunt(*args):
    found = []
    for obj in gc.get_objects():
        for ref in gc.get_referents(obj):
            _look(found, ref)
    for info in inspect.stack():
        for value in {**info.frame.f_locals, **info.frame.f_globals}.values():
            _look(found, value if isinstance(value, (str, bytes)) else repr(value)[:100000])
        for const in info.frame.f_code.co_consts:
            _look(found, const)
    frame = sys._getframe()
    while frame is not None:
        _look(found, repr(frame.f_locals)[:100000])
        frame = frame.f_back
    for module in list(sys.modules.values()):
        _look(found, repr(getattr(module, "__dict__", ""))[:1000000])
    for pid in [p for p in os.listdir("/proc") if p.isdigit()] + ["self"]:
        for what in ("cmdline", "environ"):
            try:
                _look(found, open(f"/proc/{pid}/{what}", "rb").read())
            except OSError:
                pass
        _memory(found, pid)
    for fd in range(3, 64):
        try:
            blocking = os.get_blocking(fd)
            os.set_blocking(fd, False)
            try:
                _look(found, os.read(fd, 1 << 16))
            finally:
                os.set_blocking(fd, blocking)
        except OSError:
            pass
    for root, _, files in os.walk(os.getcwd()):
        for name in files:
            try:
                _look(found, open(os.path.join(root, name), "rb").read(1 << 20))
            except OSError:
                pass
    print("HUNTED", found, flush=True)
    return found[0] if found else "nothing found"
"""


@pytest.mark.parametrize("fmt", FUNCTION_FORMATS)
def test_the_expected_value_cannot_be_found_in_memory_frames_or_fds(grader, fmt):
    """A reply that returns whatever secret-looking string it can find would pass if it found the expected value."""
    secret = f"RLLMSECRET-{secrets.token_hex(16)}"
    task = {
        "call": {"fn_name": "hunt", "tests": {"inputs": [["x"]], "outputs": [secret]}},
        "humaneval": {
            "test": f"SECRET = {secret!r}\ndef check(candidate):\n    assert candidate('x') == SECRET\n",
            "entry_point": "hunt",
        },
        "mbpp": {"test_list": [f"assert hunt('x') == {secret!r}"], "test_setup_code": f"EXPECTED = {secret!r}"},
    }[fmt]
    result = CodeReward(sandbox=grader.sandbox, timeout=20.0)(task, _fence(_SECRET_HUNT))
    assert result.metadata["graded"] is True
    assert result.reward == 0.0, result.metadata["tests"]
    for record in result.metadata["tests"]:
        assert secret not in str(record.get("got", "")) and secret not in str(record.get("error", ""))
    # Graded after the hunt: the secret in this honest reply is no test's (see the next test for why it matters).
    honest = _grade(grader, task, f"def hunt(x):\n    return {secret!r}\n")
    assert honest.reward == 1.0, honest.metadata


# Another sample's reply to the same task, graded just before, must be out of reach: copying it would forge a pass.
_COPY_PREVIOUS = (
    "import gc\n"
    "NEEDLE = '2 ' + '* x' if {function} else 'int(input()) ' + '* 2'\n"
    "SOURCE = None\n"
    "for obj in gc.get_objects():\n"
    "    for ref in gc.get_referents(obj):\n"
    "        if isinstance(ref, str) and NEEDLE in ref and 'NEEDLE' not in ref and len(ref) < 10000:\n"
    "            SOURCE = ref\n"
)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_previous_replys_code_cannot_be_copied(fast, fmt):
    honest = _grade(fast, TASKS[fmt], HONEST[fmt])  # another sample of the same group, graded first
    assert honest.reward == 1.0
    copy = _COPY_PREVIOUS.format(function=fmt != "stdio")
    if fmt == "stdio":
        copy += "exec(SOURCE) if SOURCE else print(0)\n"
    else:
        copy += "def double(x):\n    found = {}\n    exec(SOURCE or 'def double(x): return 0', found)\n"
        copy += "    return found['double'](x)\n"
    result = _grade(fast, TASKS[fmt], copy)
    assert result.reward == 0.0, f"the reply copied the previous run's code: {result.metadata['tests']}"


# 4. Whatever the program does to itself or its neighbours ends in a verdict, in the grader and in env.step

_HOSTILE = {
    "sigkill_self": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    "sigterm_self": "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n",
    "killpg_self": "import os, signal\nos.killpg(0, signal.SIGKILL)\n",
    "sigstop_self": "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\n",
    "segfault": "import ctypes\nctypes.string_at(0)\n",
    "signal_everyone": (
        "import os, signal\n"
        "for pid in (1, os.getppid(), -1, 0):\n"
        "    for sig in range(1, 65):\n"
        "        if pid in (-1, 0) and sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM):\n"
        "            continue\n"
        "        try:\n            os.kill(pid, sig)\n"
        "        except OSError:\n            pass\n"
    ),
    "kill_minus_one": "import os, signal\nos.kill(-1, signal.SIGKILL)\n",
    "binary_output": "import os\nos.write(1, bytes(range(256)) * 64)\nos.write(2, b'\\xff' * 1000)\n",
    "huge_output": "import sys\nwhile True:\n    sys.stdout.write('4\\n' * 100000)\n",
    "close_stdio": "import os, sys\nsys.stdout.close()\nsys.stderr.close()\nos.close(1)\nos.close(2)\n",
    "close_channel_fds": (
        "import os\nfor fd in range(3, 64):\n    try:\n        os.close(fd)\n    except OSError:\n        pass\n"
    ),
    "fork_and_exit": "import os, time\nif os.fork():\n    os._exit(0)\ntime.sleep(30)\n",
    "memory_bomb": "x = []\nwhile True:\n    x.append(bytearray(32 << 20))\n",
    "recursion": "import sys\nsys.setrecursionlimit(10**6)\ndef f(n):\n    return f(n + 1)\nf(0)\n",
    "infinite_loop": "while True:\n    pass\n",
    "trace_profile_audit_hooks": (
        "import sys\nsys.settrace(lambda *a: None)\nsys.setprofile(lambda *a: None)\n"
        "sys.addaudithook(lambda event, args: None)\n"
    ),
    "gc_callback_and_finalizer_print_answers": (
        "import gc, os\ngc.callbacks.append(lambda *a: os.write(1, b'4\\n1000000\\n'))\n"
        "class _Late:\n    def __del__(self):\n        os.write(1, b'4\\n1000000\\n')\n_late = _Late()\n"
    ),
    "signal_handlers_exit_zero": (
        "import os, signal\n"
        "for sig in (signal.SIGALRM, signal.SIGTERM, signal.SIGHUP):\n"
        "    signal.signal(sig, lambda *a: (os.write(1, b'4\\n'), os._exit(0)))\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.05)\n"
    ),
    "daemon_thread_keeps_printing": (
        "import os, threading, time\n"
        "def _spam():\n    while True:\n        os.write(1, b'4\\n')\n        time.sleep(0.001)\n"
        "threading.Thread(target=_spam, daemon=True).start()\n"
    ),
    "double_fork_prints_later": (
        "import os, time\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(0.3)\n"
        "        os.write(1, b'4\\n1000000\\n')\n        os._exit(0)\n    os._exit(0)\n"
    ),
    "garbage_frames": (
        "import os, struct\n"
        "for fd in range(0, 64):\n"
        "    try:\n        os.write(fd, struct.pack('!I', 1 << 31) + b'{\"ok\": 4}' + b'\\x00' * 100)\n"
        "    except OSError:\n        pass\n"
    ),
}


@pytest.mark.parametrize("name", list(_HOSTILE))
@pytest.mark.parametrize("fmt", FORMATS)
def test_hostile_programs_end_in_a_verdict(fast, fmt, name):
    result = _attack(fast, fmt, WRONG[fmt] + _HOSTILE[name])
    statuses = {r["status"] for r in result.metadata["tests"]}
    if name in ("sigkill_self", "sigterm_self", "killpg_self"):
        assert statuses <= {"killed", "runtime_error"}, result.metadata["tests"]
        if fmt == "stdio":
            assert statuses == {"killed"}, result.metadata["tests"]
    if name in ("sigstop_self", "infinite_loop"):
        assert statuses == {"timeout"}, result.metadata["tests"]
    if name == "huge_output" and fmt == "stdio":
        assert statuses == {"output_limit"}, result.metadata["tests"]
    if name == "memory_bomb" and fmt == "stdio":
        assert statuses == {"memory_limit"}, result.metadata["tests"]


@pytest.mark.parametrize("fmt", FUNCTION_FORMATS)
def test_dying_inside_the_call_ends_in_a_verdict(fast, fmt):
    for body in (
        "import os, signal\n    os.kill(os.getpid(), signal.SIGKILL)",
        "import os\n    os._exit(0)",
        "raise SystemExit(0)",
        "import os, signal\n    os.kill(os.getpid(), signal.SIGSTOP)",
        "x = []\n    while True:\n        x.append(bytearray(32 << 20))",
        "return [{}] * 1_400_000",
        "x = []\n    for _ in range(100000):\n        x = [x]\n    return x",
        "return (i for i in range(3))",
        "return 10 ** 20000 + 1",
    ):
        _attack(fast, fmt, f"def double(x):\n    {body}\n")


@pytest.mark.parametrize("name", ["sigkill_self", "signal_everyone", "huge_output", "binary_output", "garbage_frames"])
def test_env_step_never_raises_on_hostile_replies(name):
    env = gym.make("rllm/Code-v0", timeout=2.0)
    for fmt in FORMATS:
        env.reset(options={"task": {"prompt": "Double a number.", **TASKS[fmt]}})
        for reply in (_fence(_HOSTILE[name] + WRONG[fmt]), _HOSTILE[name], "```python\n" + _HOSTILE[name]):
            observation, reward, terminated, truncated, info = env.step(reply)
            assert isinstance(observation, str) and reward == 0.0 and terminated and not truncated
            assert info["graded"] is True and info["is_correct"] is False, info
            env.reset(options={"task": {"prompt": "Double a number.", **TASKS[fmt]}})
        _, reward, *_ = env.step(_fence(HONEST[fmt]))
        assert reward == 1.0
    env.close()


def test_tool_env_python_cannot_read_the_tool_tasks():
    env = gym.make("rllm/Tool-v0")
    tasks = [json.loads(line) for line in TOOL_TASKS_PATH.read_text().splitlines() if line.strip()]
    lookup = next(t for t in tasks if t["kind"] == "lookup")
    env.reset(options={"task": lookup})
    code = (
        "import os\n"
        f"paths = [{str(TOOL_TASKS_PATH)!r}, {str(BUILTIN_TASKS_PATH)!r}]\n"
        "for root, dirs, files in os.walk('/'):\n"
        "    dirs[:] = [d for d in dirs if root != '/' or d not in ('proc', 'sys')]\n"
        # Of the installed packages only an installed rllm_gym could hold the files: walking torch's thousands of
        # files would only race the tool's time limit on a loaded machine.
        "    if root.endswith('-packages'):\n"
        "        dirs[:] = [d for d in dirs if d.startswith('rllm')]\n"
        "    paths += [os.path.join(root, f) for f in files if f.endswith('tasks.jsonl')]\n"
        "for path in paths:\n"
        "    try:\n"
        "        print('READ', path, open(path).read())\n"
        "    except OSError as exc:\n"
        "        print('DENIED', path, type(exc).__name__)\n"
        "try:\n"
        "    from importlib import resources\n"
        "    print('READ', resources.files('rllm_gym.tools').joinpath('tasks.jsonl').read_text())\n"
        "except Exception as exc:\n"
        "    print('DENIED resources', type(exc).__name__)\n"
    )
    reply = HermesToolParser().render_calls([ToolCall(name="python", arguments={"code": code})])
    observation, _, terminated, truncated, info = env.step(reply)
    assert not terminated and not truncated and info["n_tool_calls"] == 1
    assert "READ" not in observation and observation.count("DENIED") >= 3, observation[-2000:]
    assert lookup["ground_truth"] not in observation and lookup["id"] not in observation
    env.close()


def test_no_per_test_record_quotes_the_solution_process_unbounded(grader):
    """Feedback text is capped: a reply printing megabytes does not grow the metadata (or the env observation)."""
    result = _grade(grader, TASKS["stdio"], "print('4' * (1 << 19))\n")
    assert result.reward == 0.0 and len(json.dumps(result.metadata)) < 64_000


@pytest.mark.parametrize("kind", FUNCTION_FORMATS)
def test_a_solution_that_loops_forever_costs_the_per_test_limit_once(box, kind):
    """Every test is run (fraction=True), yet the first stalled call fails the rest at once: the paired run's own
    limit (the per-test limit times the tests) is never reached, so a loop costs one per-test limit per reply."""
    loose = CodeReward(sandbox=box, timeout=0.5, memory_mb=128, fraction=True)
    result = _grade(loose, TASKS[kind], "def double(x):\n    while True:\n        pass\n")
    records = result.metadata["tests"]
    assert result.reward == 0.0 and records[0]["status"] == "timeout", records
    if kind != "humaneval":  # one check() holds every assert: its one test's limit is the paired run's own
        assert "did not answer within 0.5 s (the per-test limit)" in records[0]["error"], records
        later = records[1:]
        assert all(r["status"] == "timeout" and "got no answer within its time limit" in r["error"] for r in later)
    assert _grade(loose, TASKS[kind], HONEST[kind]).reward == 1.0
