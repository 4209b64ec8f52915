"""Adapters that take rllm-gym environments to where other tools expect them.

:mod:`rllm_gym.integrations.trl` turns any registered single-agent env into an ``environment_factory`` for plain
``trl.GRPOTrainer`` (one tool per kind of action, ``reset(**row)`` from a dataset row, ``get_reward()`` the episode
return); :mod:`rllm_gym.integrations.openenv` serves any registered env over the OpenEnv protocol (``rllm-gym
serve``). The other directions live with the envs and tools: ``rllm/OpenEnv-v0`` (:mod:`rllm_gym.envs.openenv`) plays
an OpenEnv server, and :mod:`rllm_gym.tools.mcp` brings MCP servers' tools into ``rllm/Tool-v0``.
"""

from __future__ import annotations

__all__ = ["describe_error"]


def describe_error(error: BaseException) -> str:
    """``Type: message`` on one line, at most 300 characters: what the interop's one-line errors quote of a library's
    exception (an HTTP client's message spans lines and may carry a whole page)."""
    text = " ".join(str(error).split())
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
