"""MCP servers' tools as rllm-gym tools, through the official ``mcp`` SDK (``pip install "rllm-gym[integrations]"``).

A server is a streamable-HTTP URL (``"http://127.0.0.1:8000/mcp"``) or a stdio command (``"python server.py"`` or
``["python", "server.py"]``, started as a child process). :class:`MCPServer` holds one session open on an event-loop
thread of its own, lists the server's tools once and turns each into an :class:`MCPTool`; calls are synchronous with a
timeout, their text is cut to ``max_output_chars``. A server that crashes, hangs or answers garbage gives the call an
error output (the model reads it as a tool message), never an exception; :meth:`MCPServer.close` ends the session and
stops a process it started. Only starting (a wrong command, an unreachable URL, something that is not an MCP server)
raises :class:`MCPServerError`, in one line naming the server.

Envs hold servers through :func:`open_mcp_servers`: an :class:`MCPLease` per entry. The envs of one process share a
session (and a stdio server's one process) per server through an :class:`MCPServerPool`, counted and closed with its
last holder; an entry ``{"command": ..., "shared": false}`` (a stateful server) gets a session of each env's own.

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
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import Any

from rllm_gym.integrations import describe_error
from rllm_gym.tools.base import DEFAULT_MAX_OUTPUT_CHARS, Tool, ToolOutput
from rllm_gym.tools.mcp_spec import MCPServerSpec, server_spec

__all__ = [
    "MCPLease",
    "MCPServer",
    "MCPServerError",
    "MCPServerPool",
    "MCPServerSpec",
    "MCPTool",
    "default_pool",
    "mcp_tool_schemas",
    "open_mcp_servers",
    "server_spec",
]

logger = logging.getLogger("rllm_gym.tools.mcp")

# Starting a server (a process importing its SDK, on a busy machine) can take longer than a tool call may.
MIN_START_TIMEOUT_S = 10.0


class MCPServerError(RuntimeError):
    """An MCP server that could not be started or reached (a wrong command, an unreachable URL, another protocol)."""


def _leaf(error: BaseException) -> BaseException:
    # anyio task groups wrap the real cause in (nested) exception groups.
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _describe(error: BaseException) -> str:
    return describe_error(_leaf(error))


def _connection_lost(error: BaseException) -> bool:
    import anyio
    from mcp.shared.exceptions import McpError

    error = _leaf(error)
    closed = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)
    return isinstance(error, closed) or (isinstance(error, McpError) and "closed" in str(error).lower())


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

    ``server``: an ``mcp_servers`` entry (see :func:`server_spec`). ``timeout``: seconds for each tool call.
    ``start_timeout``: seconds for the start and handshake (default: ``timeout``, at least ``MIN_START_TIMEOUT_S``).
    ``max_output_chars``: a result is cut to this many characters. ``env`` adds variables to a stdio server's
    environment.
    """

    def __init__(
        self,
        server: str | Sequence[str] | Mapping[str, Any] | MCPServerSpec,
        *,
        timeout: float = 10.0,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        env: dict[str, str] | None = None,
        start_timeout: float | None = None,
    ):
        spec = server_spec(server)
        self.spec = spec
        self.url, self.command = spec.url, (list(spec.command) if spec.command is not None else None)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
            raise ValueError(f"MCP server timeout must be a positive number of seconds, got {timeout!r}")
        self.label = self.url or shlex.join(self.command or [])
        self.timeout = float(timeout)
        self.start_timeout = max(self.timeout, MIN_START_TIMEOUT_S) if start_timeout is None else float(start_timeout)
        self.max_output_chars = max_output_chars
        self.env = {**dict(spec.env), **dict(env or {})}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._ended: BaseException | None = None
        self._listed: list[Any] = []
        self._closed = False
        self._start()
        self.tools = self.make_tools(self)

    # Session lifetime

    def _start(self) -> None:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._ended = None
        self._lost = False  # a call found the connection gone (the server process ended, the stream closed)
        self._thread = threading.Thread(
            target=self._loop.run_until_complete, args=(self._serve(ready),), name="rllm-mcp", daemon=True
        )
        self._thread.start()
        if not ready.wait(self.start_timeout + 5.0):
            self.close()
            self._closed = False
            seconds = self.start_timeout
            raise MCPServerError(f"MCP server {self.label!r} did not finish the MCP handshake in {seconds:g} s")
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
                    ClientSession(read, write, read_timeout_seconds=timedelta(seconds=self.start_timeout))
                )
                try:
                    await asyncio.wait_for(session.initialize(), self.start_timeout)
                    listed = await asyncio.wait_for(session.list_tools(), self.start_timeout)
                except TimeoutError:
                    self._ended = TimeoutError(f"no answer to the MCP handshake in {self.start_timeout:g} s")
                    raise
                self._listed = list(listed.tools)
                self._session = session
                ready.set()
                await self._stop.wait()
        except BaseException as error:  # recorded: a start failure raises in _start, a later one answers calls
            self._ended = self._ended or error
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

    @property
    def alive(self) -> bool:
        """Whether the session is open (not closed, and the server has not gone away)."""
        return not self._closed and not self._lost and self._session is not None

    def make_tools(self, owner: MCPServer | MCPLease) -> list[MCPTool]:
        """An :class:`MCPTool` per listed tool, its calls made through ``owner`` (this server, or a lease of it)."""
        tools = []
        for listed in self._listed:
            try:
                tools.append(MCPTool(owner, listed.name, listed.description or "", dict(listed.inputSchema or {})))
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
        deadline = timedelta(seconds=self.timeout)
        future = asyncio.run_coroutine_threadsafe(session.call_tool(name, arguments, deadline), loop)
        try:
            result = future.result(self.timeout + 1.0)
        except (TimeoutError, concurrent.futures.TimeoutError):
            future.cancel()
            return ToolOutput(name=name, error=f"MCP tool {name!r} timed out after {self.timeout:g} s")
        except BaseException as error:
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise
            if _connection_lost(error):
                self._lost = True
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

    def __init__(self, server: MCPServer | MCPLease, name: str, description: str, parameters: dict[str, Any]):
        parameters.setdefault("type", "object")
        super().__init__(
            name, description, parameters, max_output_chars=server.max_output_chars, timeout=server.timeout + 2.0
        )
        self.server = server

    def forward(self, **kwargs: Any) -> ToolOutput:
        return self.server.call(self.name, kwargs)


class MCPLease:
    """One env's hold on an MCP server: a session shared through an :class:`MCPServerPool` (``spec.shared``) or one
    of its own. Its tools call through it; :meth:`close` gives the hold back (the shared session ends with its last
    lease; an own one at once), and calls after it get an error. A copy (pickled, forked) opens its own hold on its
    first call, in the process it is in."""

    def __init__(self, spec: MCPServerSpec, *, timeout: float, max_output_chars: int, pool: MCPServerPool | None):
        self.spec, self.label = spec, spec.label
        self.timeout, self.max_output_chars = timeout, max_output_chars
        self._pool = pool
        self._server: MCPServer | None = None
        self._pid = os.getpid()
        self._closed = False
        self._lock = threading.Lock()  # a copy's first calls, on parallel tool threads, take one hold between them
        self._hold()
        self.tools = self._server.make_tools(self) if self._server is not None else []

    def _hold(self) -> None:
        if self._pool is not None:
            self._server = self._pool.acquire(self.spec, self.timeout, self.max_output_chars)
        else:
            self._server = MCPServer(self.spec, timeout=self.timeout, max_output_chars=self.max_output_chars)
        self._pid = os.getpid()

    @property
    def server(self) -> MCPServer | None:
        """The session this lease holds (None once closed, or in a copy before its first call)."""
        return self._server

    def call(self, name: str, arguments: dict[str, Any]) -> ToolOutput:
        if self._closed:
            return ToolOutput(name=name, error=f"MCP server {self.label!r} was closed")
        with self._lock:
            if self._server is None or self._pid != os.getpid():  # a copy: its own hold, in this process
                try:
                    self._hold()
                except MCPServerError as error:
                    self._server = None
                    return ToolOutput(name=name, error=str(error))
            server = self._server
        return server.call(name, arguments) if server is not None else ToolOutput(name=name, error="no session")

    def close(self) -> None:
        server, self._server, self._closed = self._server, None, True
        if server is None or self._pid != os.getpid():
            return  # nothing held here (a fork's copy of the parent's hold is the parent's to give back)
        if self._pool is not None:
            self._pool.release(server)
        else:
            server.close()

    def __getstate__(self) -> dict[str, Any]:
        state = {**self.__dict__, "_server": None, "_pool": None if self._pool is None else _POOL_BY_REFERENCE}
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        if isinstance(self._pool, str):  # _POOL_BY_REFERENCE
            self._pool = default_pool()

    def __repr__(self) -> str:
        return f"MCPLease({self.label!r}, shared={self.spec.shared}, tools={[tool.name for tool in self.tools]})"


_POOL_BY_REFERENCE = "default_pool"  # a pickled lease names the pool; the copy uses the default pool where it lands


class MCPServerPool:
    """The MCP sessions the envs of one process share: one per server spec (with its timeout and output limit),
    opened by the first :meth:`acquire`, counted, and closed by the :meth:`release` of the last holder. MCP answers
    concurrent requests on one session by their ids, so the envs' calls stay apart (for a stateless server; a
    stateful one takes ``shared: false``). A session whose server has gone away is replaced for later holders."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[Any, ...], tuple[MCPServer, int]] = {}
        self._pid = os.getpid()

    def acquire(self, spec: MCPServerSpec, timeout: float, max_output_chars: int) -> MCPServer:
        key = (spec, timeout, max_output_chars)
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's sessions are not this process's
                self._held, self._pid = {}, os.getpid()
            server, count = self._held.get(key, (None, 0))
            if server is None or not server.alive:
                server, count = MCPServer(spec, timeout=timeout, max_output_chars=max_output_chars), 0
            self._held[key] = (server, count + 1)
            return server

    def release(self, server: MCPServer) -> None:
        with self._lock:
            key = next((key for key, (held, _) in self._held.items() if held is server), None)
            count = self._held[key][1] - 1 if key is not None else 0
            if key is not None and count > 0:
                self._held[key] = (server, count)
                return
            if key is not None:
                del self._held[key]
        server.close()  # the last holder (or a replaced session's): outside the lock, it may take a moment

    def sessions(self) -> dict[str, int]:
        """``{server label: holders}`` of the sessions open now."""
        with self._lock:
            return {server.label: count for server, count in self._held.values()}


_DEFAULT_POOL: MCPServerPool | None = None
_DEFAULT_POOL_LOCK = threading.Lock()


def default_pool() -> MCPServerPool:
    """The process's pool, which ``rllm/Tool-v0`` and :func:`open_mcp_servers` use for shared servers."""
    global _DEFAULT_POOL
    with _DEFAULT_POOL_LOCK:
        if _DEFAULT_POOL is None:
            _DEFAULT_POOL = MCPServerPool()
        return _DEFAULT_POOL


def open_mcp_servers(
    servers: Sequence[str | Sequence[str] | Mapping[str, Any]],
    *,
    timeout: float = 10.0,
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    pool: MCPServerPool | None = None,
) -> list[MCPLease]:
    """An :class:`MCPLease` per entry (shared ones through ``pool``, default: :func:`default_pool`); when one fails
    to start, those already held are given back and it raises."""
    if isinstance(servers, (str, Mapping)) or not isinstance(servers, Sequence):
        raise ValueError(
            f"mcp_servers must be a list of URLs, commands or dicts, got {servers!r}: write [{servers!r}]"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise ValueError(f"MCP server timeout must be a positive number of seconds, got {timeout!r}")
    specs = [server_spec(server) for server in servers]  # every entry checked before any server starts
    shared_pool = pool if pool is not None else default_pool()
    opened: list[MCPLease] = []
    try:
        for spec in specs:
            held_by = shared_pool if spec.shared else None
            opened.append(MCPLease(spec, timeout=float(timeout), max_output_chars=max_output_chars, pool=held_by))
    except BaseException:
        for lease in opened:
            lease.close()
        raise
    return opened


def mcp_tool_schemas(
    servers: Sequence[str | Sequence[str] | Mapping[str, Any]], *, timeout: float = 10.0
) -> list[dict[str, Any]]:
    """The ``{"type": "function", ...}`` schemas of the servers' tools (each server is held, listed and given back:
    a shared one that an env holds is not started again)."""
    opened = open_mcp_servers(servers, timeout=timeout)
    try:
        return [tool.json_schema for lease in opened for tool in lease.tools]
    finally:
        for lease in opened:
            lease.close()
