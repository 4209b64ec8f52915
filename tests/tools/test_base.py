"""Tests for rllm_gym/tools/base.py: Tool, ToolOutput, the @tool decorator and its JSON schemas."""

from __future__ import annotations

import asyncio
import doctest
import re
import time

import pytest

from rllm_gym.tools import base
from rllm_gym.tools.base import FunctionTool, Tool, ToolCall, ToolOutput, function_schema, tool


def test_module_doctests_pass():
    assert doctest.testmod(base).failed == 0


def test_tool_output_truncates_output_and_error_with_a_marker():
    out = ToolOutput(name="t", output="x" * 50).truncate(10)
    assert out.output == "x" * 10 + "\n... [truncated 40 characters]"
    assert out.truncated
    err = ToolOutput(name="t", error="e" * 20).truncate(5)
    assert err.error.startswith("eeeee\n... [truncated 15") and err.to_string().startswith("Error: eeeee")
    short = ToolOutput(name="t", output="ok")
    assert short.truncate(10) is short and not short.truncated


@tool
def power(base_: int, exponent: int = 2, label: str | None = None) -> int:
    """Raise a number to a power.

    Longer explanation.

    Args:
        base_: The base.
        exponent: The exponent.
        label: Ignored label.
    """
    return base_**exponent


def test_tool_decorator_builds_schema_from_google_docstring():
    assert isinstance(power, FunctionTool)
    assert power.name == "power"
    assert power.description == "Raise a number to a power.\n\nLonger explanation."
    props = power.parameters["properties"]
    assert props["base_"] == {"type": "integer", "description": "The base."}
    assert props["exponent"] == {"type": "integer", "default": 2, "description": "The exponent."}
    assert power.parameters["required"] == ["base_"]
    assert "title" not in power.parameters and "title" not in props["exponent"]
    assert power(base_=3, exponent=4).output == "81"


def test_function_schema_reads_numpy_docstrings():
    def scale(values: list[float], factor: float) -> list[float]:
        """Scale values.

        Parameters
        ----------
        values : list of float
            Numbers to scale.
        factor : float
            Multiplier.
        """
        return [v * factor for v in values]

    description, params = function_schema(scale)
    assert description == "Scale values."
    assert params["properties"]["values"] == {
        "type": "array",
        "items": {"type": "number"},
        "description": "Numbers to scale.",
    }
    assert params["properties"]["factor"]["description"] == "Multiplier."
    assert FunctionTool(scale)(values=[1, 2], factor=1.5).output == "[1.5, 3.0]"


def test_tool_decorator_with_options_and_missing_annotation():
    @tool(name="greet", description="Say hello.", max_output_chars=8)
    def hello(who: str) -> str:
        return f"hello {who}"

    assert hello.name == "greet" and hello.description == "Say hello."
    assert hello(who="everyone").output.startswith("hello ev\n... [truncated")

    def untyped(x):
        return x

    with pytest.raises(TypeError, match=re.escape("argument 'x' needs a type annotation, e.g. x: str")):
        tool(untyped)

    def star(*args: int) -> int:
        return 0

    with pytest.raises(TypeError, match=re.escape("cannot take *args")):
        tool(star)


def test_call_validates_arguments_and_never_raises():
    assert power(exponent=2).error == "invalid arguments for tool 'power': 'base_' is a required property"
    assert power(base_="3").error == "invalid arguments for tool 'power': '3' is not of type 'integer' (at 'base_')"

    @tool
    def broken(x: int) -> int:
        """Always fails."""
        raise RuntimeError(f"cannot handle {x}")

    assert broken(x=1).error == "RuntimeError: cannot handle 1"
    out = power.call(ToolCall(name="power", arguments={"base_": 2}, id="c7"))
    assert (out.output, out.call_id) == ("4", "c7")


def test_tool_constructor_rejects_bad_arguments():
    class Plain(Tool):
        def forward(self, **kwargs):
            return ToolOutput(name=self.name, output="x")

    with pytest.raises(ValueError, match=re.escape("tool name must match")):
        Plain("bad name!", "d")
    with pytest.raises(ValueError, match=re.escape("parameters must be a JSON schema of type 'object'")):
        Plain("p", "d", {"type": "string"})
    for _ in range(2):  # the second time from the verdicts kept per schema: the same error
        with pytest.raises(ValueError, match=re.escape("parameters are not a valid JSON schema: 'no-such-type' is")):
            Plain("p", "d", {"type": "object", "properties": {"x": {"type": "no-such-type"}}})
    Plain("p", "d", {"type": "object", "properties": {"x": {"type": ["string", "null"]}}})
    with pytest.raises(ValueError, match=re.escape("parameters are not a valid JSON schema")):  # a tuple is no array
        Plain("p", "d", {"type": "object", "properties": {"x": {"type": ("string", "null")}}})
    with pytest.raises(ValueError, match=re.escape("max_output_chars must be a positive int")):
        Plain("p", "d", max_output_chars=0)
    assert Plain("p", "d")().output == "x"


async def test_async_function_tool_and_timeout():
    @tool
    async def slow(seconds: float) -> str:
        """Sleep, then answer."""
        await asyncio.sleep(seconds)
        return "done"

    assert (await slow.acall(seconds=0.01)).output == "done"
    assert slow(seconds=0.0).output == "done"  # sync call from inside a running loop goes through a worker thread
    start = time.monotonic()
    out = await slow.acall(seconds=5, timeout=0.1)
    assert out.error == "tool 'slow' timed out after 0.1 s"
    assert time.monotonic() - start < 2


async def test_sync_tool_async_forward_runs_off_the_event_loop():
    @tool
    def block(seconds: float) -> str:
        """Block the thread."""
        time.sleep(seconds)
        return "ok"

    start = time.monotonic()
    outs = await asyncio.gather(*(block.acall(seconds=0.3) for _ in range(4)))
    assert [o.output for o in outs] == ["ok"] * 4
    assert time.monotonic() - start < 1.0
