"""Benchmark the tool-use stack: parser throughput (replies per second, per format) and tool-call round-trip latency
(through ``MultiTool`` and through a full ``rllm/Tool-v0`` step).

Run ``python benchmarks/bench_tools.py`` (about a minute), or ``--quick`` for a bounded run of a few seconds;
``--json PATH`` writes the results as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _measure import timings_ms

from rllm_gym.envs.tool import ToolEnv
from rllm_gym.tools import HermesToolParser, JsonBlockToolParser, MultiTool, OpenAIToolParser, ToolCall
from rllm_gym.types import RewardOutput


def _replies(parser: Any) -> list[str]:
    calls = [
        ToolCall(name="calculator", arguments={"expression": "123456789 * 987654321"}),
        ToolCall(name="search", arguments={"query": "When was the Halvard Bridge completed?", "k": 3}),
        ToolCall(name="python", arguments={"code": "import math\nprint(math.factorial(30))\n" * 3}),
    ]
    prefix = "" if parser.name == "openai" else "Let me work this out step by step before calling tools.\n" * 4
    return [prefix + parser.render_calls(calls[:n]) for n in (1, 2, 3)] + [prefix + "The answer is \\boxed{42}."]


def bench_parsers(seconds: float) -> dict[str, dict[str, float]]:
    results = {}
    for parser in (HermesToolParser(), JsonBlockToolParser(), OpenAIToolParser()):
        replies = _replies(parser)
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for reply in replies:
                parser.parse_with_errors(reply)
            n += len(replies)
        elapsed = time.perf_counter() - start
        results[parser.name] = {"replies_per_s": n / elapsed, "us_per_reply": 1e6 * elapsed / n}
    return results


def _latency(function: Callable[[], Any], repeats: int) -> dict[str, float]:
    samples = timings_ms(function, repeats)  # after a warm-up call (imports, sandbox start, BM25 index)
    return {
        "p50_ms": statistics.median(samples),
        "p90_ms": samples[int(0.9 * (len(samples) - 1))],
        "mean_ms": statistics.fmean(samples),
        "n": repeats,
    }


def bench_round_trips(repeats: int, python_repeats: int) -> dict[str, dict[str, float]]:
    tools = MultiTool(["calculator", "search", "python", "finish"])
    calc = ToolCall(name="calculator", arguments={"expression": "3**45 * 7 % 1000003"})
    search = ToolCall(name="search", arguments={"query": "population of Velmora"})
    python = ToolCall(name="python", arguments={"code": "print(sum(range(1000)))"})
    # A budget that never runs out: this measures one step, not an episode.
    env = ToolEnv(reward_fn=lambda task, action: RewardOutput(reward=0.0), max_tool_calls=10**9)
    env.reset(options={"task": {"question": "q", "ground_truth": "1"}})
    parser = HermesToolParser()
    two_calls = parser.render_calls([calc, search])

    return {
        "calculator": _latency(lambda: tools.execute(calc), repeats),
        "search": _latency(lambda: tools.execute(search), repeats),
        "python_sandbox": _latency(lambda: tools.execute(python), python_repeats),
        "parallel_x4_python": _latency(lambda: tools.execute_many([python] * 4, default_timeout=30), python_repeats),
        "env_step_calc+search": _latency(lambda: env.step(two_calls), repeats),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="bounded run of a few seconds")
    parser.add_argument("--json", type=Path, default=None, help="write the results to this JSON file")
    args = parser.parse_args()
    seconds, repeats, python_repeats = (0.5, 100, 3) if args.quick else (3.0, 1000, 20)
    results = {
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "quick": args.quick,
        "parsers": bench_parsers(seconds),
        "round_trips": bench_round_trips(repeats, python_repeats),
    }
    for name, row in results["parsers"].items():
        print(f"parse  {name:<8} {row['replies_per_s']:>12,.0f} replies/s  {row['us_per_reply']:>8.1f} us/reply")
    for name, row in results["round_trips"].items():
        print(f"call   {name:<22} p50 {row['p50_ms']:>8.3f} ms  p90 {row['p90_ms']:>8.3f} ms  (n={row['n']})")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
