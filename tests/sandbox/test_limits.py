"""One rule for the sandbox's limits: every entry point that takes them accepts and refuses the same values."""

from __future__ import annotations

import inspect
import math
import re

import pytest

from rllm_gym.envs.code import CodeEnv
from rllm_gym.rewards.code import CodeReward
from rllm_gym.sandbox import DEFAULT_LIMITS, Sandbox, SandboxLimits, arun_python, run_python
from rllm_gym.tools.builtins import PythonTool

# Values the three old checks disagreed on: 16 (PythonTool took it, CodeReward and run_python did not), 512.0 and
# 64.5 (run_python took them and rounded), True (PythonTool took it as 1 s), inf (run_python took it).
MEMORY = [16, 17, 512, 512.0, 64.5, True, 0, -5, "512", None]
TIMEOUT = [0, -1, 0.5, 3, True, math.inf, math.nan, "5", None]


def _error(make) -> str | None:
    try:
        make()
    except ValueError as exc:
        return str(exc)
    return None


def _owners(field: str, value):
    """Each entry point that takes ``field``, built with ``value``, and the name its errors use."""
    sandbox = Sandbox(max_parallel=1)  # never started: arguments are checked before any run
    return [
        ("sandbox", lambda: sandbox.submit("pass", **{field: value})),
        ("sandbox", lambda: run_python("pass", sandbox=sandbox, **{field: value})),
        ("CodeReward", lambda: CodeReward(**{field: value})),
        ("CodeReward", lambda: CodeEnv(**{field: value})),
        ("PythonTool", lambda: PythonTool(**{field: value})),
        ("SandboxLimits", lambda: SandboxLimits(owner="SandboxLimits", **{field: value})),
    ]


@pytest.mark.parametrize(("field", "value"), [("memory_mb", v) for v in MEMORY] + [("timeout", v) for v in TIMEOUT])
def test_every_entry_point_applies_the_same_rule(field, value):
    try:
        SandboxLimits(**{field: value})
        accepted = True
    except ValueError:
        accepted = False
    for owner, make in _owners(field, value):
        message = _error(make)
        if accepted:
            assert message is None, (owner, message)
        else:  # the same message, naming who was called, the field and a value that works
            with pytest.raises(ValueError) as raised:
                SandboxLimits(owner=owner, **{field: value})
            assert message == str(raised.value), (owner, message)
            assert message.startswith(f"{owner} {field} must be ") and f"pass e.g. {field}=" in message


def test_the_rule_itself():
    for good in (dict(memory_mb=17), dict(timeout=0.5), dict(timeout=3, cpu_time_s=1), dict(max_output_bytes=1)):
        SandboxLimits(**good)
    for bad, text in [
        (dict(memory_mb=16), "sandbox memory_mb must be an int > 16 (megabytes per run), got 16"),
        (dict(memory_mb=512.0), "sandbox memory_mb must be an int > 16 (megabytes per run), got 512.0"),
        (dict(file_size_mb=0.5), "sandbox file_size_mb must be an int > 0 (megabytes per written file), got 0.5"),
        (dict(timeout=math.inf), "sandbox timeout must be a positive number of seconds, finite"),
        (dict(cpu_time_s=0), "sandbox cpu_time_s must be a positive number of seconds, finite"),
        (dict(max_processes=True), "sandbox max_processes must be an int > 0 (processes per run), got True"),
    ]:
        with pytest.raises(ValueError, match="^" + re.escape(text)):
            SandboxLimits(**bad)


def test_an_unknown_limit_is_refused_by_name():
    with pytest.raises(TypeError, match="memory_gb"):
        run_python("pass", sandbox=Sandbox(max_parallel=1), memory_gb=1)
    with pytest.raises(TypeError, match="no 'owner' argument"):
        run_python("pass", sandbox=Sandbox(max_parallel=1), owner="me")


async def test_the_async_entry_point_checks_in_the_callers_frame():
    with pytest.raises(ValueError, match="sandbox memory_mb must be an int > 16"):
        await arun_python("pass", sandbox=Sandbox(max_parallel=1), memory_mb=8)


def test_each_default_is_written_once():
    assert SandboxLimits() == DEFAULT_LIMITS and DEFAULT_LIMITS.memory_mb == 512 and DEFAULT_LIMITS.timeout == 5.0
    for function in (CodeReward.__init__, CodeEnv.__init__, PythonTool.__init__):
        parameters = inspect.signature(function).parameters
        assert parameters["memory_mb"].default == DEFAULT_LIMITS.memory_mb
        assert parameters["timeout"].default == DEFAULT_LIMITS.timeout
    assert CodeReward().memory_mb == PythonTool().memory_mb == CodeEnv().grader.memory_mb == 512
    assert DEFAULT_LIMITS.cpu_seconds == DEFAULT_LIMITS.timeout
    assert SandboxLimits(timeout=2, cpu_time_s=1).cpu_seconds == 1
