""":class:`MultiTool`: a named set of tools that validates and dispatches parsed :class:`ToolCall` s, one at a time or
several concurrently, and :data:`BUILTIN_TOOLS`, the registry of tools known by name.

Every failure a model can cause (an unknown tool, arguments that do not fit the schema, a tool that crashes or
times out) comes back as an error :class:`ToolOutput`; nothing here raises on model input.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import difflib
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rllm_gym.tools.base import FunctionTool, Tool, ToolOutput
from rllm_gym.tools.builtins import FinishTool, PythonTool
from rllm_gym.tools.calculator import CalculatorTool
from rllm_gym.tools.search import SearchTool
from rllm_gym.types import ToolCall

__all__ = ["BUILTIN_TOOLS", "MultiTool"]

BUILTIN_TOOLS: Mapping[str, Callable[[], Tool]] = {
    "calculator": CalculatorTool,
    "finish": FinishTool,
    "python": PythonTool,
    "search": SearchTool,
}


def _as_tool(name: str, value: Any) -> Tool:
    if isinstance(value, Tool):
        return value
    if isinstance(value, type) and issubclass(value, Tool):
        return value()
    if callable(value):
        return FunctionTool(value, name=name)
    raise TypeError(f"tool_map[{name!r}] must be a Tool, a Tool subclass or a typed function, got {value!r}")


class MultiTool:
    """Tools by name: built-ins named in ``tools`` (or Tool instances), plus a ``tool_map`` of name -> tool.

    :meth:`execute_many` runs calls on worker threads of this MultiTool's own, started on first use (in each process
    that uses it: they are never pickled, copied or inherited through a fork) and stopped by :meth:`close`.

    Example::

        >>> tools = MultiTool(["calculator", "finish"])
        >>> tools.names
        ['calculator', 'finish']
        >>> tools("calculator", expression="2**70").output
        '1180591620717411303424'
        >>> tools.execute(ToolCall(name="websearch", arguments={})).error
        "unknown tool 'websearch'; available tools: calculator, finish"
    """

    def __init__(
        self,
        tools: Sequence[str | Tool] | None = None,
        tool_map: Mapping[str, Tool | type[Tool] | Callable[..., Any]] | None = None,
    ):
        if tools is None and tool_map is None:
            raise ValueError("MultiTool needs tools=[...] (built-in names or Tool objects) or tool_map={name: tool}")
        if isinstance(tools, str):
            raise TypeError(f"MultiTool tools must be a list of names, got the string {tools!r}: write [{tools!r}]")
        if tools is not None and not isinstance(tools, Sequence):
            raise TypeError(f"MultiTool tools must be a list of built-in names or Tool objects, got {tools!r}")
        if tool_map is not None and not isinstance(tool_map, Mapping):
            raise TypeError(f"MultiTool tool_map must be a dict of name -> Tool or typed function, got {tool_map!r}")
        self.tools: dict[str, Tool] = {}
        for entry in tools or ():
            if isinstance(entry, Tool):
                self._add(entry.name, entry)
            elif entry in BUILTIN_TOOLS:
                self._add(entry, BUILTIN_TOOLS[entry]())
            else:
                close = difflib.get_close_matches(str(entry), BUILTIN_TOOLS, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"unknown built-in tool {entry!r}.{hint} Built-in tools: {', '.join(BUILTIN_TOOLS)}")
        for name, value in (tool_map or {}).items():
            tool = _as_tool(name, value)
            if tool.name != name:
                raise ValueError(f"tool_map key {name!r} differs from the tool's own name {tool.name!r}")
            self._add(name, tool)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_pid = os.getpid()
        self._pool_lock = threading.Lock()

    def _threads(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool_pid != os.getpid():  # a forked copy has the pool object and lock, but not their threads
            self._pool, self._pool_pid, self._pool_lock = None, os.getpid(), threading.Lock()
        with self._pool_lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="rllm-multitool")
            return self._pool

    def close(self) -> None:
        """Stop the worker threads (a call still running past its timeout finishes on its own); reusable after."""
        pool, self._pool = self._pool, None
        if pool is not None and self._pool_pid == os.getpid():
            pool.shutdown(wait=False, cancel_futures=True)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_pool"], state["_pool_pid"], state["_pool_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pool, self._pool_pid, self._pool_lock = None, os.getpid(), threading.Lock()

    def _add(self, name: str, tool: Tool) -> None:
        if name in self.tools:
            raise ValueError(f"tool {name!r} is given twice: tool names must be unique")
        self.tools[name] = tool

    @property
    def names(self) -> list[str]:
        return list(self.tools)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """Each tool's ``{"type": "function", "function": {...}}`` schema, in order."""
        return [tool.json_schema for tool in self.tools.values()]

    def __contains__(self, name: object) -> bool:
        return name in self.tools

    def __getitem__(self, name: str) -> Tool:
        return self.tools[name]

    def __len__(self) -> int:
        return len(self.tools)

    def validate(self, call: ToolCall) -> str | None:
        """None when ``call`` names a known tool with fitting arguments, else the message for the model."""
        tool = self.tools.get(call.name)
        if tool is None:
            return f"unknown tool {call.name!r}; available tools: {', '.join(self.tools)}"
        return tool.validate_arguments(call.arguments)

    def _unknown(self, call: ToolCall) -> ToolOutput | None:
        if call.name in self.tools:
            return None
        return ToolOutput(name=call.name, call_id=call.id, error=self.validate(call))

    def __call__(self, tool_name: str, **kwargs: Any) -> ToolOutput:
        return self.execute(ToolCall(name=tool_name, arguments=kwargs))

    def execute(self, call: ToolCall) -> ToolOutput:
        """Run one call synchronously (no timeout: use :meth:`execute_many` for one)."""
        return self._unknown(call) or self.tools[call.name].call(call)

    async def aexecute(self, call: ToolCall, timeout: float | None = None) -> ToolOutput:
        """Run one call on the event loop, with ``timeout`` seconds (default: the tool's own timeout)."""
        unknown = self._unknown(call)
        if unknown is not None:
            return unknown
        return await self.tools[call.name].acall(_call_id=call.id, timeout=timeout, **call.arguments)

    async def aexecute_many(
        self,
        calls: Sequence[ToolCall],
        timeouts: Mapping[str, float] | None = None,
        default_timeout: float | None = None,
    ) -> list[ToolOutput]:
        """Run ``calls`` concurrently; outputs in call order. ``timeouts`` maps tool name -> seconds."""
        timeouts = timeouts or {}
        return list(await asyncio.gather(*(self.aexecute(c, timeouts.get(c.name, default_timeout)) for c in calls)))

    def execute_many(
        self,
        calls: Sequence[ToolCall],
        timeouts: Mapping[str, float] | None = None,
        default_timeout: float | None = None,
    ) -> list[ToolOutput]:
        """Run ``calls`` concurrently on worker threads and wait; safe to call from any thread, with or without a
        running event loop. A call that exceeds its timeout returns an error output (its thread is left to finish:
        Python cannot kill threads, which is why the python tool also has its own sandbox timeout)."""
        if len(calls) == 1 and timeouts is None and default_timeout is None:
            return [self.execute(calls[0])]
        timeouts = timeouts or {}
        start = time.monotonic()
        pool = self._threads()
        futures = [pool.submit(self.execute, call) for call in calls]
        outputs = []
        for call, future in zip(calls, futures, strict=True):
            limit = timeouts.get(call.name, default_timeout)
            if limit is None and call.name in self.tools:
                limit = self.tools[call.name].timeout
            # Each call's clock starts at submission: they run at the same time, so wait only for what is left.
            remaining = None if limit is None else max(0.0, start + limit - time.monotonic())
            try:
                outputs.append(future.result(timeout=remaining))
            except concurrent.futures.TimeoutError:
                future.cancel()
                message = f"tool {call.name!r} timed out after {limit:g} s"
                outputs.append(ToolOutput(name=call.name, call_id=call.id, error=message))
        return outputs

    def __repr__(self) -> str:
        return f"MultiTool({self.names})"
