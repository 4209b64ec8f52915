"""An ``mcp_servers`` entry, checked once: :func:`server_spec` turns a URL, a stdio command or a dict as MCP clients
write them into an :class:`MCPServerSpec` (see :mod:`rllm_gym.tools.mcp`)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["MCPServerSpec", "server_spec"]

_SPEC_KEYS = ("url", "command", "args", "env", "shared")


@dataclass(frozen=True)
class MCPServerSpec:
    """One ``mcp_servers`` entry, checked: a streamable-HTTP ``url`` or a stdio ``command`` (program and arguments),
    variables ``env`` added to a stdio server's environment, and whether the envs of a process share its session
    (``shared``, default True; False for a stateful server: one session, and one stdio process, per env)."""

    url: str | None = None
    command: tuple[str, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()
    shared: bool = True

    @property
    def label(self) -> str:
        return self.url or shlex.join(self.command or ())


def server_spec(entry: Any) -> MCPServerSpec:
    """An ``mcp_servers`` entry as an :class:`MCPServerSpec`: a ``http(s)://`` URL, a stdio command (a string split
    like a shell, or a list of strings), or a dict as MCP clients write them, ``{"url": ...}`` or ``{"command":
    "python", "args": ["server.py"], "env": {...}}``, with ``"shared": false`` for a stateful server."""
    if isinstance(entry, MCPServerSpec):
        return entry
    if isinstance(entry, Mapping):
        return _dict_spec(entry)
    if isinstance(entry, str) and entry.startswith(("http://", "https://")):
        return MCPServerSpec(url=entry)
    if isinstance(entry, str) and entry.strip():
        return MCPServerSpec(command=tuple(shlex.split(entry)))
    if not isinstance(entry, str) and isinstance(entry, Sequence) and entry and all(isinstance(p, str) for p in entry):
        return MCPServerSpec(command=tuple(entry))
    raise ValueError(
        "mcp_servers entries must be an http(s):// URL of a streamable-HTTP MCP server, a stdio command (a string "
        "like 'python server.py' or a list of strings) or a dict {'url': ...} / {'command': ..., 'args': [...]}, "
        f"got {entry!r}"
    )


def _dict_spec(entry: Mapping[str, Any]) -> MCPServerSpec:
    unknown = sorted(str(key) for key in entry if key not in _SPEC_KEYS)
    if unknown:
        raise ValueError(f"mcp_servers entry {dict(entry)!r}: unknown keys {unknown}; a dict takes {list(_SPEC_KEYS)}")
    shared = entry.get("shared", True)
    if not isinstance(shared, bool):
        raise ValueError(f"mcp_servers entry 'shared' must be true or false, got {shared!r}")
    env = entry.get("env") or {}
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError(f"mcp_servers entry 'env' must be a dict of strings, got {env!r}")
    if ("url" in entry) == ("command" in entry):
        raise ValueError(f"mcp_servers entry {dict(entry)!r} needs exactly one of 'url' or 'command'")
    if "url" in entry:
        if not isinstance(entry["url"], str) or not entry["url"].startswith(("http://", "https://")):
            raise ValueError(f"mcp_servers entry 'url' must be an http(s):// URL, got {entry['url']!r}")
        if "args" in entry or env:
            raise ValueError("mcp_servers entry: 'args' and 'env' go with a stdio 'command', not with a 'url'")
        return MCPServerSpec(url=entry["url"], shared=shared)
    args = entry.get("args", [])
    if isinstance(args, str) or not isinstance(args, Sequence) or not all(isinstance(arg, str) for arg in args):
        raise ValueError(f"mcp_servers entry 'args' must be a list of strings, got {args!r}")
    base = server_spec(entry["command"]) if "args" not in entry else MCPServerSpec(command=(entry["command"],))
    if base.command is None or not isinstance(entry["command"], (str, list, tuple)):
        raise ValueError(f"mcp_servers entry 'command' must be a program (a string), got {entry['command']!r}")
    return MCPServerSpec(command=(*base.command, *args), env=tuple(sorted(env.items())), shared=shared)
