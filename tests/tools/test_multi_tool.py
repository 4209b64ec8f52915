"""Tests for rllm_gym/tools/multi_tool.py: building tool sets, validation, dispatch, concurrency and timeouts."""

from __future__ import annotations

import asyncio
import doctest
import multiprocessing
import pickle
import re
import subprocess
import sys
import threading
import time

import pytest

from rllm_gym.tools import multi_tool
from rllm_gym.tools.base import tool
from rllm_gym.tools.calculator import CalculatorTool
from rllm_gym.tools.multi_tool import BUILTIN_TOOLS, MultiTool
from rllm_gym.types import ToolCall


@tool
def nap(seconds: float) -> str:
    """Sleep for a while.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return f"slept {seconds}"


def test_module_doctests_pass():
    assert doctest.testmod(multi_tool).failed == 0


def test_builtin_registry_names():
    assert sorted(BUILTIN_TOOLS) == ["calculator", "finish", "python", "search"]
    tools = MultiTool(list(BUILTIN_TOOLS))
    assert tools.names == ["calculator", "finish", "python", "search"]
    assert [s["function"]["name"] for s in tools.schemas] == tools.names


def test_tool_map_accepts_instances_classes_and_functions():
    def double(x: int) -> int:
        """Double x."""
        return 2 * x

    tools = MultiTool(["finish"], tool_map={"calculator": CalculatorTool, "nap": nap, "double": double})
    assert tools.names == ["finish", "calculator", "nap", "double"]
    assert tools("double", x=21).output == "42"
    assert tools("calculator", expression="6*7").output == "42"
    assert "double" in tools and len(tools) == 4


def test_constructor_errors_name_the_fix():
    with pytest.raises(ValueError, match=re.escape("unknown built-in tool 'calculater'. Did you mean 'calculator'?")):
        MultiTool(["calculater"])
    with pytest.raises(ValueError, match=re.escape("MultiTool needs tools=[...]")):
        MultiTool()
    with pytest.raises(TypeError, match=re.escape("got the string 'search': write ['search']")):
        MultiTool("search")
    with pytest.raises(ValueError, match=re.escape("tool 'calculator' is given twice")):
        MultiTool(["calculator"], tool_map={"calculator": CalculatorTool()})
    with pytest.raises(
        ValueError, match=re.escape("tool_map key 'calc' differs from the tool's own name 'calculator'")
    ):
        MultiTool(tool_map={"calc": CalculatorTool()})
    with pytest.raises(TypeError, match=re.escape("tool_map['x'] must be a Tool")):
        MultiTool(tool_map={"x": 3})


def test_validate_and_execute_unknown_or_invalid_calls():
    tools = MultiTool(["calculator", "finish"])
    assert tools.validate(ToolCall(name="calculator", arguments={"expression": "1"})) is None
    assert tools.validate(ToolCall(name="calculator", arguments={})) == (
        "invalid arguments for tool 'calculator': 'expression' is a required property"
    )
    out = tools.execute(ToolCall(name="browser", arguments={"url": "x"}, id="c1"))
    assert out.error == "unknown tool 'browser'; available tools: calculator, finish"
    assert (out.name, out.call_id) == ("browser", "c1")


def test_execute_many_runs_concurrently_in_order():
    tools = MultiTool(tool_map={"nap": nap})
    calls = [ToolCall(name="nap", arguments={"seconds": 0.3}) for _ in range(4)]
    calls.append(ToolCall(name="nope", arguments={}))
    start = time.monotonic()
    outs = tools.execute_many(calls, default_timeout=5)
    assert time.monotonic() - start < 1.0
    assert [o.output for o in outs[:4]] == ["slept 0.3"] * 4
    assert outs[4].error.startswith("unknown tool 'nope'")


def test_execute_many_per_tool_timeouts():
    tools = MultiTool(["calculator"], tool_map={"nap": nap})
    calls = [
        ToolCall(name="nap", arguments={"seconds": 2}),
        ToolCall(name="calculator", arguments={"expression": "2"}),
    ]
    start = time.monotonic()
    outs = tools.execute_many(calls, timeouts={"nap": 0.2})
    assert time.monotonic() - start < 1.5
    assert outs[0].error == "tool 'nap' timed out after 0.2 s"
    assert outs[1].output == "2"


def test_execute_many_from_a_thread_with_a_running_loop():
    tools = MultiTool(["calculator"])
    results = []

    async def inside_loop():
        results.append(
            tools.execute_many([ToolCall(name="calculator", arguments={"expression": "2**10"})] * 2, None, 5)
        )

    worker = threading.Thread(target=lambda: asyncio.run(inside_loop()))
    worker.start()
    worker.join(10)
    assert [o.output for o in results[0]] == ["1024", "1024"]


async def test_aexecute_many_concurrent_with_timeouts():
    tools = MultiTool(tool_map={"nap": nap})
    calls = [ToolCall(name="nap", arguments={"seconds": 0.2}, id=str(i)) for i in range(3)]
    calls.append(ToolCall(name="nap", arguments={"seconds": 3}, id="slow"))
    start = time.monotonic()
    outs = await tools.aexecute_many(calls, timeouts={"nap": 1.0})
    assert time.monotonic() - start < 2.0
    assert [o.call_id for o in outs] == ["0", "1", "2", "slow"]
    assert [o.output for o in outs[:3]] == ["slept 0.2"] * 3
    assert outs[3].error == "tool 'nap' timed out after 1 s"


# Processes: nothing at import, pickling, close, fork


def test_importing_the_tools_starts_no_thread():
    code = (
        "import threading, rllm_gym.tools, rllm_gym.envs.tool, rllm_gym.registry; "
        "print([t.name for t in threading.enumerate()])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "['MainThread']"


def test_tools_pickle_with_the_standard_library_and_still_validate():
    tools = MultiTool(["calculator", "search", "python", "finish"])
    tools.execute_many([ToolCall(name="calculator", arguments={"expression": "1+1"})], default_timeout=5)
    copied = pickle.loads(pickle.dumps(tools))
    assert copied.names == tools.names
    assert copied.validate(ToolCall(name="calculator", arguments={"expression": 3})) == tools.validate(
        ToolCall(name="calculator", arguments={"expression": 3})
    )
    calls = [ToolCall(name="calculator", arguments={"expression": "2**10"})] * 2
    assert [o.output for o in copied.execute_many(calls, default_timeout=5)] == ["1024", "1024"]
    tools.close()
    copied.close()


def test_close_stops_the_threads_and_a_later_call_starts_new_ones():
    tools = MultiTool(["calculator"])
    calls = [ToolCall(name="calculator", arguments={"expression": "6*7"})] * 2
    tools.execute_many(calls, default_timeout=5)
    assert any(t.name.startswith("rllm-multitool") for t in threading.enumerate())
    tools.close()
    time.sleep(0.2)
    assert [o.output for o in tools.execute_many(calls, default_timeout=5)] == ["42", "42"]
    tools.close()


def test_execute_many_works_in_a_forked_child_after_the_parent_used_its_threads():
    tools = MultiTool(["calculator"])
    calls = [ToolCall(name="calculator", arguments={"expression": "2+3"})] * 2
    tools.execute_many(calls, default_timeout=5)  # the parent's worker threads exist now; a child has none
    context = multiprocessing.get_context("fork")
    results = context.SimpleQueue()
    child = context.Process(target=lambda: results.put(_run_calls(tools, calls)))  # inherits `tools`, unpickled
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
        pytest.fail("execute_many hung in a forked child")
    assert results.get() == ["5", "5"]
    tools.close()


def _run_calls(tools: MultiTool, calls: list[ToolCall]) -> list[str]:
    return [output.output for output in tools.execute_many(calls, default_timeout=5)]
