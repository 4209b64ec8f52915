"""Tests for rllm_gym/tools/builtins.py: the python tool (through the sandbox) and finish."""

from __future__ import annotations

import re

import pytest

from rllm_gym.tools.builtins import FinishTool, PythonTool


def test_python_tool_returns_printed_output():
    out = PythonTool()(code="print(sum(range(10**5)))")
    assert out.ok and out.output == "4999950000"
    assert out.metadata["status"] == "ok" and out.metadata["exit_code"] == 0


def test_python_tool_reports_errors_with_traceback():
    out = PythonTool()(code="print('before')\n1/0")
    assert not out.ok
    assert out.error.startswith("program ended with status 'runtime_error':")
    assert "ZeroDivisionError" in out.error and "[stdout before the error]\nbefore" in out.error
    assert PythonTool()(code="x = 1").output == "(no output)"


def test_python_tool_sandbox_timeout_is_reported():
    out = PythonTool(timeout=0.5)(code="while True: pass")
    assert out.metadata["status"] == "timeout"
    assert out.error.startswith("program ended with status 'timeout' (limit 0.5 s)")


async def test_python_tool_async_path():
    out = await PythonTool().acall(code="print(6 * 7)")
    assert out.output == "42"


def test_python_tool_validates_its_arguments():
    assert PythonTool()(program="print(1)").error == (
        "invalid arguments for tool 'python': 'code' is a required property"
    )
    with pytest.raises(ValueError, match=re.escape("PythonTool timeout must be a positive number of seconds")):
        PythonTool(timeout=0)
    with pytest.raises(
        ValueError, match=re.escape("PythonTool memory_mb must be an int > 16 (megabytes per run), got 1")
    ):
        PythonTool(memory_mb=1)


def test_finish_echoes_the_response():
    finish = FinishTool()
    assert finish(response="\\boxed{42}").output == "\\boxed{42}"
    assert finish().error == "invalid arguments for tool 'finish': 'response' is a required property"
