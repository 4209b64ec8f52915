"""Engine throughput: achieved LLM calls per second against the ideal N/L, and the engine's own CPU per call.

A policy with a fixed latency L (an ``asyncio.sleep``, no compute) answers N FrozenLake episodes in flight; every
episode makes exactly ``steps`` calls (40; the moves keep the player in its corner), so start-up (one env per slot)
and the last wave weigh little against the steady state. The ideal rate is N/L calls/s; the
engine's CPU per call (env step, agent, records, scheduling) is the process CPU time over the calls. The achieved
rate is the steady state (the middle half of the calls); the overall rate, start-up and last wave included, is
reported beside it. With
``--code N`` it also runs N Code-v0 episodes whose steps run sandboxed programs off the loop, and reports the worst
lag of the event loop meanwhile (a ticker that should wake every 10 ms).

    python benchmarks/bench_engine.py                 # N = 256, 1024, 2048 at L = 200 ms
    python benchmarks/bench_engine.py --quick         # N = 256 at L = 50 ms, a few seconds
    python benchmarks/bench_engine.py --code 4096     # also the loop lag with 4096 Code-v0 episodes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time

from rllm_gym.agents.frozenlake import FrozenLakeAgent
from rllm_gym.engine import AgentExecutionEngine
from rllm_gym.policies.base import build_model_output
from rllm_gym.types import ModelOutput

MAP = ["SFFF", "FHFH", "FFFH", "HFFG"]


class FixedLatencyPolicy:
    """Answers every request after ``latency_s`` with one of a few pre-built replies."""

    def __init__(self, latency_s: float, replies: list[str]):
        self.latency_s = latency_s
        self.outputs = [build_model_output(r, completion_ids=list(range(8)), logprobs=[-0.1] * 8) for r in replies]
        self.calls = 0
        self.started: list[float] = []  # when each call arrived, for the steady-state rate

    async def generate(self, messages, sampling_params=None, **kwargs) -> ModelOutput:
        self.calls += 1
        self.started.append(time.perf_counter())
        await asyncio.sleep(self.latency_s)
        return self.outputs[self.calls % len(self.outputs)]


class LoopLag:
    """Wakes every ``interval_s`` and records how late it woke: the event loop's responsiveness."""

    def __init__(self, interval_s: float = 0.01):
        self.interval_s, self.worst_s, self._task = interval_s, 0.0, None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self.interval_s)
            self.worst_s = max(self.worst_s, loop.time() - start - self.interval_s)

    def __enter__(self) -> LoopLag:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        self._task.cancel()


async def frozenlake_run(n: int, latency_s: float, steps: int) -> dict:
    policy = FixedLatencyPolicy(latency_s, ["Action: left", "Action: up"])
    engine = AgentExecutionEngine(
        env_id="rllm/FrozenLake-v0", agent_cls=FrozenLakeAgent, policy=policy, n_parallel=n, max_steps=steps
    )
    tasks = [{"id": f"lake{i}", "map": MAP} for i in range(n)]
    cpu, wall = time.process_time(), time.perf_counter()
    with LoopLag() as lag:
        episodes = await engine.run(tasks)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    calls = policy.calls
    assert calls == n * steps and len(episodes) == n
    ideal = n / latency_s
    # Steady state: the rate over the middle half of the calls, past start-up (one env per slot) and the last wave.
    first, last = calls // 4, 3 * calls // 4
    achieved = (last - first) / (policy.started[last] - policy.started[first])
    return {
        "n_in_flight": n,
        "latency_ms": latency_s * 1e3,
        "calls": calls,
        "wall_s": wall,
        "achieved_calls_per_s": achieved,
        "overall_calls_per_s": calls / wall,
        "ideal_calls_per_s": ideal,
        "fraction_of_ideal": achieved / ideal,
        "engine_cpu_us_per_call": cpu / calls * 1e6,
        "worst_loop_lag_ms": lag.worst_s * 1e3,
    }


async def code_run(n: int) -> dict:
    from rllm_gym.agents.code import CodeAgent

    reply = "```python\nprint(input())\n```"
    policy = FixedLatencyPolicy(0.0, [reply])
    engine = AgentExecutionEngine(env_id="rllm/Code-v0", agent_cls=CodeAgent, policy=policy, n_parallel=n, max_steps=1)
    wall = time.perf_counter()
    with LoopLag() as lag:
        episodes = await engine.run(list(range(n)))
    return {
        "code_episodes": len(episodes),
        "wall_s": time.perf_counter() - wall,
        "worst_loop_lag_ms": lag.worst_s * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N=256, L=50 ms: a few seconds")
    parser.add_argument("--code", type=int, default=0, metavar="N", help="also run N Code-v0 episodes (loop lag)")
    parser.add_argument("--json", metavar="PATH", help="also write the results to this JSON file")
    args = parser.parse_args()
    configs = [(256, 0.05)] if args.quick else [(256, 0.2), (1024, 0.2), (2048, 0.2)]
    rows = [asyncio.run(frozenlake_run(n, latency, steps=10 if args.quick else 40)) for n, latency in configs]
    print(
        f"{'N':>5} {'L ms':>5} {'calls/s':>9} {'overall':>8} {'ideal':>8} {'of ideal':>8} {'CPU us/call':>11} "
        f"{'lag ms':>7}"
    )
    for r in rows:
        print(
            f"{r['n_in_flight']:>5} {r['latency_ms']:>5.0f} {r['achieved_calls_per_s']:>9.0f} "
            f"{r['overall_calls_per_s']:>8.0f} "
            f"{r['ideal_calls_per_s']:>8.0f} {r['fraction_of_ideal']:>8.1%} {r['engine_cpu_us_per_call']:>11.1f} "
            f"{r['worst_loop_lag_ms']:>7.1f}"
        )
    results = {"benchmark": "bench_engine", "machine": platform.platform(), "frozenlake": rows}
    if args.code:
        results["code"] = asyncio.run(code_run(args.code))
        print(f"Code-v0: {results['code']}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
