"""A real MCP server for the tests (official SDK's FastMCP): ``python mcp_test_server.py`` speaks stdio,
``python mcp_test_server.py --http PORT`` streamable HTTP on 127.0.0.1:PORT/mcp. Its tools misbehave on request."""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.fastmcp import FastMCP

server = FastMCP("rllm-test", host="127.0.0.1", port=int(sys.argv[2]) if "--http" in sys.argv else 8000)


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
def shout(text: str, times: int = 1) -> str:
    """Repeat the text in capitals."""
    return text.upper() * times


@server.tool()
async def hang(seconds: float) -> str:
    """Sleep, then answer (the server goes on answering other calls meanwhile)."""
    await asyncio.sleep(seconds)
    return "woke up"


@server.tool()
def fail(message: str) -> str:
    """Raise an error inside the tool."""
    raise ValueError(message)


@server.tool()
def crash() -> str:
    """End the server process at once."""
    os._exit(3)


@server.tool()
async def garbage() -> str:
    """Write a line that is not JSON-RPC on the protocol's stdout, then never answer."""
    sys.stdout.write("this is not json\n")
    sys.stdout.flush()
    await asyncio.sleep(60)
    return "late"


if __name__ == "__main__":
    server.run(transport="streamable-http" if "--http" in sys.argv else "stdio")
