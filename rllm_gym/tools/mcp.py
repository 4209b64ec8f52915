"""MCP servers' tools as rllm-gym tools, through the official ``mcp`` SDK (``pip install "rllm-gym[integrations]"``).

A server is a streamable-HTTP URL (``"http://127.0.0.1:8000/mcp"``) or a stdio command (``"python server.py"`` or
``["python", "server.py"]``, started as a child process). :class:`MCPServer` holds one session open on an event-loop
thread of its own, lists the server's tools once and turns each into an :class:`MCPTool`; calls are synchronous with a
timeout, their text is cut to ``max_output_chars``. A server that crashes, hangs or answers garbage gives the call an
error output (the model reads it as a tool message), never an exception; :meth:`MCPServer.close` ends the session and
stops a process it started. Only starting (a wrong command, an unreachable URL, something that is not an MCP server)
raises :class:`MCPServerError`, in one line naming the server.

    >>> server = MCPServer("python my_server.py")            # doctest: +SKIP
    >>> [tool.name for tool in server.tools]                 # doctest: +SKIP
    ['add', 'echo']
    >>> server.tools[0](a=1, b=2).output                     # doctest: +SKIP
    '3'
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import shlex
import threading
from collections.abc import Sequence
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import Any

from rllm_gym.tools.base import DEFAULT_MAX_OUTPUT_CHARS, Tool, ToolOutput

__all__ = ["MCPServer", "MCPServerError", "MCPTool", "mcp_tool_schemas", "open_mcp_servers"]

logger = logging.getLogger("rllm_gym.tools.mcp")


class MCPServerError(RuntimeError):
    """An MCP server that could not be started or reached (a wrong command, an unreachable URL, another protocol)."""


def _leaf(error: BaseException) -> BaseException:
    # anyio task groups wrap the real cause in (nested) exception groups.
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _describe(error: BaseException) -> str:
    error = _leaf(error)
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _result_text(result: Any) -> str:
    parts = []
    for item in result.content:
        if getattr(item, "type", None) == "text":
            parts.append(item.text)
        else:  # images, audio and resources: named, not inlined (the env's observations are text)
            parts.append(f"[{getattr(item, 'type', 'content')}: {getattr(item, 'mimeType', None) or 'no type'}]")
    if not parts and result.structuredContent is not None:
        parts.append(str(result.structuredContent))
    return "\n".join(parts)


class MCPServer:
    """One MCP server's session, held open on a private event-loop thread (see the module docstring).

    ``server``: a ``http(s)://`` URL (streamable HTTP) or a stdio command (a string split like a shell, or a list).
    ``timeout``: seconds for each tool call (and for starting). ``max_output_chars``: a result is cut to this many
    characters. ``env`` adds variables to a stdio server's environment.
    """

    def __init__(
        self,
        server: str | Sequence[str],
        *,
        timeout: float = 10.0,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        env: dict[str, str] | None = None,
    ):
        if isinstance(server, str) and server.startswith(("http://", "https://")):
            self.url, self.command = server, None
        elif isinstance(server, str) and server.strip():
            self.url, self.command = None, shlex.split(server)
        elif (
            not isinstance(server, str)
            and isinstance(server, Sequence)
            and server
            and all(isinstance(part, str) for part in server)
        ):
            self.url, self.command = None, list(server)
        else:
            raise ValueError(
                "mcp_servers entries must be an http(s):// URL of a streamable-HTTP MCP server or a stdio command "
                f"(a string like 'python server.py' or a list of strings), got {server!r}"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
            raise ValueError(f"MCP server timeout must be a positive number of seconds, got {timeout!r}")
        self.label = self.url or shlex.join(self.command or [])
        self.timeout = float(timeout)
        self.max_output_chars = max_output_chars
        self.env = dict(env or {})
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._ended: BaseException | None = None
        self._listed: list[Any] = []
        self._closed = False
        self._start()
        self.tools = self._make_tools()

    # Session lifetime

    def _start(self) -> None:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._ended = None
        self._thread = threading.Thread(
            target=self._loop.run_until_complete, args=(self._serve(ready),), name="rllm-mcp", daemon=True
        )
        self._thread.start()
        if not ready.wait(self.timeout + 5.0):
            self.close()
            self._closed = False
            raise MCPServerError(f"MCP server {self.label!r} did not finish the MCP handshake in {self.timeout:g} s")
        if self._session is None:
            reason = _describe(self._ended) if self._ended is not None else "it stopped during the handshake"
            self.close()
            self._closed = False
            what = "could not be reached" if self.url else "could not be started"
            raise MCPServerError(
                f"MCP server {self.label!r} {what} or does not speak MCP ({reason}); give the URL of a "
                "streamable-HTTP MCP endpoint (often ending in /mcp) or a command that runs a stdio MCP server"
            )

    async def _serve(self, ready: threading.Event) -> None:
        from mcp import ClientSession

        self._stop = asyncio.Event()
        try:
            async with AsyncExitStack() as stack:
                if self.url is not None:
                    import httpx
                    from mcp.client.streamable_http import streamable_http_client

                    client = await stack.enter_async_context(httpx.AsyncClient(timeout=self.timeout))
                    read, write, _ = await stack.enter_async_context(
                        streamable_http_client(self.url, http_client=client)
                    )
                else:
                    from mcp import StdioServerParameters
                    from mcp.client.stdio import get_default_environment, stdio_client

                    command, *args = self.command or [""]
                    parameters = StdioServerParameters(
                        command=command, args=args, env={**get_default_environment(), **self.env}
                    )
                    errlog = await stack.enter_async_context(_devnull())
                    read, write = await stack.enter_async_context(stdio_client(parameters, errlog=errlog))
                session = await stack.enter_async_context(
                    ClientSession(read, write, read_timeout_seconds=timedelta(seconds=self.timeout))
                )
                await asyncio.wait_for(session.initialize(), self.timeout)
                listed = await asyncio.wait_for(session.list_tools(), self.timeout)
                self._listed = list(listed.tools)
                self._session = session
                ready.set()
                await self._stop.wait()
        except BaseException as error:  # recorded: a start failure raises in _start, a later one answers calls
            self._ended = error
        finally:
            self._session = None
            ready.set()

    def close(self) -> None:
        """End the session (a stdio server's process is stopped) and the loop thread; calls after it get an error."""
        self._closed = True
        loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None:
            return
        if self._stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._stop.set)
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.timeout + 5.0)
        if not (thread and thread.is_alive()):
            loop.close()

    def __getstate__(self) -> dict[str, Any]:
        # A copy (pickled to a worker process) keeps the tool list and opens its own session on its first call.
        state = self.__dict__.copy()
        state.update(_loop=None, _thread=None, _session=None, _stop=None, _ended=None)
        return state

    # Tools and calls

    def _make_tools(self) -> list[MCPTool]:
        tools = []
        for listed in self._listed:
            try:
                tools.append(MCPTool(self, listed.name, listed.description or "", dict(listed.inputSchema or {})))
            except ValueError as error:  # a tool rllm-gym cannot offer (odd name, broken schema): left out, said so
                logger.warning("MCP server %r: tool %r left out: %s", self.label, listed.name, error)
        return tools

    def call(self, name: str, arguments: dict[str, Any]) -> ToolOutput:
        """Call tool ``name``; the result's text, or an error output (server gone, hung, garbage, tool error)."""
        if self._closed:
            return ToolOutput(name=name, error=f"MCP server {self.label!r} was closed")
        if self._loop is None:
            try:
                self._start()
            except MCPServerError as error:
                return ToolOutput(name=name, error=str(error))
        session, loop = self._session, self._loop
        if session is None or loop is None:
            reason = _describe(self._ended) if self._ended is not None else "the session ended"
            return ToolOutput(name=name, error=f"MCP server {self.label!r} is gone ({reason})")
        future = asyncio.run_coroutine_threadsafe(session.call_tool(name, arguments), loop)
        try:
            result = future.result(self.timeout + 1.0)
        except (TimeoutError, concurrent.futures.TimeoutError):
            future.cancel()
            return ToolOutput(name=name, error=f"MCP tool {name!r} timed out after {self.timeout:g} s")
        except BaseException as error:
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise
            return ToolOutput(name=name, error=f"MCP server {self.label!r} failed the call ({_describe(error)})")
        text = _result_text(result)
        return (
            ToolOutput(name=name, error=text or "the tool failed")
            if result.isError
            else ToolOutput(name=name, output=text)
        )

    def __repr__(self) -> str:
        return f"MCPServer({self.label!r}, tools={[tool.name for tool in self.tools]})"


class _devnull:
    """An async context manager around ``os.devnull`` opened for writing: a stdio server's stderr goes there."""

    async def __aenter__(self) -> Any:
        self.file = open(os.devnull, "w")  # noqa: SIM115 - closed by __aexit__
        return self.file

    async def __aexit__(self, *exc: Any) -> None:
        self.file.close()


class MCPTool(Tool):
    """One tool of an :class:`MCPServer`: its schema as the server lists it, calls forwarded to the server."""

    def __init__(self, server: MCPServer, name: str, description: str, parameters: dict[str, Any]):
        parameters.setdefault("type", "object")
        super().__init__(
            name, description, parameters, max_output_chars=server.max_output_chars, timeout=server.timeout + 2.0
        )
        self.server = server

    def forward(self, **kwargs: Any) -> ToolOutput:
        return self.server.call(self.name, kwargs)


def open_mcp_servers(servers: Sequence[str | Sequence[str]], *, timeout: float = 10.0) -> list[MCPServer]:
    """An :class:`MCPServer` per entry; when one fails to start, those already started are closed and it raises."""
    if isinstance(servers, str) or not isinstance(servers, Sequence):
        raise ValueError(f"mcp_servers must be a list of URLs or commands, got {servers!r}: write [{servers!r}]")
    opened: list[MCPServer] = []
    try:
        for server in servers:
            opened.append(MCPServer(server, timeout=timeout))
    except BaseException:
        for server in opened:
            server.close()
        raise
    return opened


def mcp_tool_schemas(servers: Sequence[str | Sequence[str]], *, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The ``{"type": "function", ...}`` schemas of the servers' tools (each server is started, listed and closed)."""
    opened = open_mcp_servers(servers, timeout=timeout)
    try:
        return [tool.json_schema for server in opened for tool in server.tools]
    finally:
        for server in opened:
            server.close()
