"""``mcp_servers`` entries: URLs, stdio commands and MCP-client dicts parsed into one spec, bad ones named."""

from __future__ import annotations

import re

import gymnasium as gym
import pytest

import rllm_gym  # noqa: F401 - registers the envs
from rllm_gym.tools.mcp_spec import MCPServerSpec, server_spec


def test_every_form_of_an_entry_is_one_spec() -> None:
    assert server_spec("http://127.0.0.1:8000/mcp") == MCPServerSpec(url="http://127.0.0.1:8000/mcp")
    command = MCPServerSpec(command=("python", "server.py", "--fast"))
    assert server_spec("python server.py --fast") == server_spec(["python", "server.py", "--fast"]) == command
    assert server_spec({"command": "python", "args": ["server.py", "--fast"]}) == command
    stateful = server_spec({"command": "python server.py", "env": {"B": "2", "A": "1"}, "shared": False})
    assert stateful == MCPServerSpec(command=("python", "server.py"), env=(("A", "1"), ("B", "2")), shared=False)
    assert stateful.label == "python server.py" and hash(stateful)  # a pool key


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"command": "python", "sharde": False}, "unknown keys ['sharde']"),
        ({"command": "python", "shared": "no"}, "'shared' must be true or false"),
        ({"url": "http://127.0.0.1:9/mcp", "command": "python"}, "exactly one of 'url' or 'command'"),
        ({"url": "ftp://127.0.0.1:9/mcp"}, "'url' must be an http(s):// URL"),
        ({"command": "python", "args": "server.py"}, "'args' must be a list of strings"),
    ],
)
def test_bad_entries_are_one_clear_line(entry, message) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        server_spec(entry)
    with pytest.raises(ValueError, match=re.escape(message)):  # before any server starts
        gym.make("rllm/Tool-v0", mcp_servers=["python never_started.py", entry])
