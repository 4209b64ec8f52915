"""Benchmark the interop layers against their in-process baselines, measured in the same run: a FrozenLake step
through ``rllm-gym serve`` (OpenEnv over a WebSocket session, the server in another process) vs the same env stepped
in process, and an MCP tool call (a stdio FastMCP server, official SDK) vs the built-in calculator tool.

Run ``python benchmarks/bench_interop.py`` (about a minute), or ``--quick`` for a bounded run of a few seconds after
the servers start; ``--json PATH`` writes the results as JSON.
"""

from __future__ import annotations

import argparse
import platform
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx
from _measure import timings_ms, write_json

import rllm_gym  # noqa: F401 - registers the envs
from rllm_gym.envs.openenv import OpenEnvEnv
from rllm_gym.registry import make
from rllm_gym.tools import MultiTool, ToolCall
from rllm_gym.tools.mcp import MCPServer

MOVES = ("down", "right", "up", "left")


def _row(samples: list[float]) -> dict[str, float]:
    return {"p50_ms": statistics.median(samples), "mean_ms": statistics.fmean(samples), "n": len(samples)}


def _stepper(env: Any) -> Any:
    state = {"i": 0}
    env.reset(seed=0)

    def step() -> None:
        _, _, terminated, truncated, _ = env.step(MOVES[state["i"] % 4])
        state["i"] += 1
        if terminated or truncated:
            env.reset(seed=state["i"])

    return step


def bench_served_step(repeats: int) -> dict[str, Any]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "rllm_gym.cli", "serve", "rllm/FrozenLake-v0", "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(1200):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        served = OpenEnvEnv(base_url=f"http://127.0.0.1:{port}")
        local = make("rllm/FrozenLake-v0")
        try:
            remote_ms = timings_ms(_stepper(served), repeats)
            local_ms = timings_ms(_stepper(local), repeats * 10)
        finally:
            served.close()
            local.close()
    finally:
        server.kill()
        server.wait()
    return {"served": _row(remote_ms), "in_process": _row(local_ms)}


def bench_mcp_call(repeats: int) -> dict[str, Any]:
    server = MCPServer([sys.executable, __file__, "--mcp-server"], timeout=30)
    try:
        tools = MultiTool(["calculator", *server.tools])
        mcp_ms = timings_ms(lambda: tools.execute(ToolCall(name="add", arguments={"a": 2, "b": 3})), repeats)
        builtin_ms = timings_ms(
            lambda: tools.execute(ToolCall(name="calculator", arguments={"expression": "2+3"})), repeats
        )
    finally:
        server.close()
    return {"mcp": _row(mcp_ms), "builtin": _row(builtin_ms)}


def serve_mcp() -> None:
    from mcp.server.fastmcp import FastMCP

    server = FastMCP("bench")

    @server.tool()
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    server.run(transport="stdio")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="bounded run of a few seconds after the servers start")
    parser.add_argument("--json", default=None, help="write the results to this JSON file")
    parser.add_argument("--mcp-server", action="store_true", help=argparse.SUPPRESS)  # the MCP server it starts
    args = parser.parse_args()
    if args.mcp_server:
        serve_mcp()
        return
    repeats = 200 if args.quick else 2000
    results = {
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "quick": args.quick,
        "env_step": bench_served_step(repeats),
        "tool_call": bench_mcp_call(repeats),
    }
    step, call = results["env_step"], results["tool_call"]
    print(
        f"FrozenLake step: served (OpenEnv, WebSocket) p50 {step['served']['p50_ms']:.3f} ms, in process "
        f"{step['in_process']['p50_ms']:.4f} ms: x{step['served']['p50_ms'] / step['in_process']['p50_ms']:.0f}"
    )
    print(
        f"tool call: MCP (stdio) p50 {call['mcp']['p50_ms']:.3f} ms, built-in calculator "
        f"{call['builtin']['p50_ms']:.3f} ms: x{call['mcp']['p50_ms'] / call['builtin']['p50_ms']:.1f}"
    )
    write_json(args.json, results)


if __name__ == "__main__":
    main()
