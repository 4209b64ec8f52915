"""Engine throughput: achieved LLM calls per second against the ideal N/L, and the event loop's lag under load.

A policy with a fixed latency L (an ``asyncio.sleep``, no compute) answers N FrozenLake episodes in flight; every
episode makes exactly ``steps`` calls (40; the moves keep the player in its corner). The ideal rate is N/L calls/s.
Reported: the steady state (the middle half of the calls), the whole run (every call over the wall time, start-up and
last wave included), where the time beyond ``steps x L`` (``extra_ms``) goes (``start_ms``: until every episode has
made its first call; ``end_ms``: from the last call's reply to the end of the run; ``gc_ms``: garbage-collection
pauses; the rest is calls answered later than L because the loop was busy), and the engine's CPU per call.

``--code N`` also runs N Code-v0 episodes (their steps run sandboxed programs), ``--tool N`` N Tool-v0 episodes (a
sandboxed ``python`` tool call, then ``finish`` with the answer, math-graded); for each, the lag of the event loop
meanwhile (a ticker that should wake every 5 ms: worst and 99th percentile), episodes/s, and the most sandbox runs
queued or running at once (the engine's backpressure keeps it near ``env_workers``, and the calls that lent their
place while their verdict run runs and its result waits for release: up to 4 per worker).

    python benchmarks/bench_engine.py                          # N = 256, 1024, 2048 at L = 200 ms
    python benchmarks/bench_engine.py --quick                  # N = 256 at L = 50 ms, a few seconds
    python benchmarks/bench_engine.py --quick --code 4096 --tool 4096
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import time
from collections.abc import Callable

from _measure import write_json

from rllm_gym.agents.frozenlake import FrozenLakeAgent
from rllm_gym.engine import AgentExecutionEngine
from rllm_gym.policies.base import build_model_output
from rllm_gym.types import ModelOutput

MAP = ["SFFF", "FHFH", "FFFH", "HFFG"]


class FixedLatencyPolicy:
    """Answers every request after ``latency_s`` with one of a few pre-built replies (``pick(messages)`` chooses which;
    by default they take turns)."""

    def __init__(self, latency_s: float, replies: list[str], pick: Callable[[list[dict]], int] | None = None):
        self.latency_s = latency_s
        self.outputs = [build_model_output(r, completion_ids=list(range(8)), logprobs=[-0.1] * 8) for r in replies]
        self.pick = pick
        self.calls = 0
        self.started: list[float] = []  # when each call arrived, for the steady-state rate
        self.answered: list[float] = []  # when each reply went back

    async def generate(self, messages, sampling_params=None, **kwargs) -> ModelOutput:
        self.calls += 1
        self.started.append(time.perf_counter())
        await asyncio.sleep(self.latency_s)
        self.answered.append(time.perf_counter())
        index = self.pick(messages) if self.pick is not None else self.calls
        return self.outputs[index % len(self.outputs)]


class LoopLag:
    """Wakes every ``interval_s`` and records how late it woke: the event loop's responsiveness.

    ``probe``, when given, is called at each tick and its largest value kept (``peak``), e.g. the sandbox's queue.
    """

    def __init__(self, interval_s: float = 0.005, probe: Callable[[], int] | None = None):
        self.interval_s, self.probe = interval_s, probe
        self.lags: list[float] = []
        self.peak = 0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self.interval_s)
            self.lags.append(max(0.0, loop.time() - start - self.interval_s))
            if self.probe is not None:
                self.peak = max(self.peak, self.probe())

    @property
    def worst_ms(self) -> float:
        return max(self.lags, default=0.0) * 1e3

    @property
    def p99_ms(self) -> float:
        ordered = sorted(self.lags)
        return ordered[int(0.99 * (len(ordered) - 1))] * 1e3 if ordered else 0.0

    def __enter__(self) -> LoopLag:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


class GcPauses:
    """Garbage-collection passes while the block runs: how many, and their total time (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.count, self.total_s, self._start = 0, 0.0, 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.count += 1
            self.total_s += time.perf_counter() - self._start

    def __enter__(self) -> GcPauses:
        gc.callbacks.insert(0, self._callback)  # first in, so the engine's own callback is timed too
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


async def frozenlake_run(n: int, latency_s: float, steps: int) -> dict:
    policy = FixedLatencyPolicy(latency_s, ["Action: left", "Action: up"])
    engine = AgentExecutionEngine(
        env_id="rllm/FrozenLake-v0",
        agent_cls=FrozenLakeAgent,
        policy=policy,
        n_parallel=n,
        max_turns=steps,
        tune_interpreter=True,
    )
    tasks = [{"id": f"lake{i}", "map": MAP} for i in range(n)]
    pauses = GcPauses()
    cpu, begin = time.process_time(), time.perf_counter()
    with LoopLag() as lag, pauses:
        episodes = await engine.run(tasks)
    end = time.perf_counter()
    wall, cpu = end - begin, time.process_time() - cpu
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
        "ideal_wall_s": steps * latency_s,
        "achieved_calls_per_s": achieved,
        "overall_calls_per_s": calls / wall,
        "ideal_calls_per_s": ideal,
        "fraction_of_ideal": achieved / ideal,
        "overall_fraction_of_ideal": calls / wall / ideal,
        # Where the time beyond steps x L goes: until the n-th first call, and after the last reply.
        "start_ms": (sorted(policy.started)[n - 1] - begin) * 1e3,
        "end_ms": (end - max(policy.answered)) * 1e3,
        "extra_ms": (wall - steps * latency_s) * 1e3,
        "gc_ms": pauses.total_s * 1e3,
        "gc_collections": pauses.count,
        "engine_cpu_us_per_call": cpu / calls * 1e6,
        "worst_loop_lag_ms": lag.worst_ms,
        "p99_loop_lag_ms": lag.p99_ms,
    }


def _sandbox_in_flight() -> int:
    """Sandbox runs queued or running now in the process's shared sandbox (what the engine has submitted)."""
    from rllm_gym.sandbox import default_sandbox

    return default_sandbox().in_flight


async def loaded_run(env: str, n: int) -> dict:
    """N episodes of Code-v0 or Tool-v0 at once (policy latency 0): the event loop's lag while they run."""
    if env == "code":
        from rllm_gym.agents.code import CodeAgent as agent_cls

        env_id, max_steps = "rllm/Code-v0", 1
        policy = FixedLatencyPolicy(0.0, ["```python\nprint(input())\n```"])
    else:
        from rllm_gym.agents.tool import ToolAgent as agent_cls

        env_id, max_steps = "rllm/Tool-v0", 2
        python = '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'
        finish = '<tool_call>{"name": "finish", "arguments": {"response": "\\boxed{42}"}}</tool_call>'
        # The first turn runs the program; once its output is in the chat (a reply was made), the answer.
        policy = FixedLatencyPolicy(
            0.0, [python, finish], pick=lambda messages: int(any(m["role"] == "assistant" for m in messages))
        )
    engine = AgentExecutionEngine(
        env_id=env_id, agent_cls=agent_cls, policy=policy, n_parallel=n, max_turns=max_steps, tune_interpreter=True
    )
    wall = time.perf_counter()
    with LoopLag(probe=_sandbox_in_flight) as lag:
        episodes = await engine.run(list(range(n)))
    wall = time.perf_counter() - wall
    reasons: dict[str, int] = {}
    for episode in episodes:
        reasons[episode.termination_reason.value] = reasons.get(episode.termination_reason.value, 0) + 1
    return {
        "env": env_id,
        "episodes": len(episodes),
        "wall_s": wall,
        "episodes_per_s": len(episodes) / wall,
        "worst_loop_lag_ms": lag.worst_ms,
        "p99_loop_lag_ms": lag.p99_ms,
        "max_sandbox_in_flight": lag.peak,
        "env_workers": engine.env_workers,
        "termination_reasons": reasons,
        "load_average": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N=256, L=50 ms: a few seconds")
    parser.add_argument("--n", type=int, nargs="+", metavar="N", help="FrozenLake episodes in flight (L = 200 ms)")
    parser.add_argument("--code", type=int, default=0, metavar="N", help="also run N Code-v0 episodes (loop lag)")
    parser.add_argument("--tool", type=int, default=0, metavar="N", help="also run N Tool-v0 episodes (loop lag)")
    parser.add_argument("--json", metavar="PATH", help="also write the results to this JSON file")
    args = parser.parse_args()
    if args.n:
        configs = [(n, 0.2) for n in args.n]
    else:
        configs = [(256, 0.05)] if args.quick else [(256, 0.2), (1024, 0.2), (2048, 0.2)]
    load = round(os.getloadavg()[0], 2)
    rows = [asyncio.run(frozenlake_run(n, latency, steps=10 if args.quick else 40)) for n, latency in configs]
    print(
        f"{'N':>5} {'L ms':>5} {'calls/s':>9} {'ideal':>8} {'steady':>7} {'whole':>7} {'extra ms':>8} "
        f"{'start ms':>8} {'end ms':>7} {'gc ms':>6} {'CPU us/call':>11} {'lag ms':>7}"
    )
    for r in rows:
        print(
            f"{r['n_in_flight']:>5} {r['latency_ms']:>5.0f} {r['achieved_calls_per_s']:>9.0f} "
            f"{r['ideal_calls_per_s']:>8.0f} {r['fraction_of_ideal']:>7.1%} {r['overall_fraction_of_ideal']:>7.1%} "
            f"{r['extra_ms']:>8.0f} {r['start_ms']:>8.0f} {r['end_ms']:>7.0f} {r['gc_ms']:>6.0f} "
            f"{r['engine_cpu_us_per_call']:>11.1f} {r['worst_loop_lag_ms']:>7.1f}"
        )
    results = {"benchmark": "bench_engine", "machine": platform.platform(), "load_average": load, "frozenlake": rows}
    for key, n in (("code", args.code), ("tool", args.tool)):
        if n:
            r = results[key] = asyncio.run(loaded_run(key, n))
            print(
                f"{r['env']}: {r['episodes']} episodes in {r['wall_s']:.1f} s ({r['episodes_per_s']:.0f}/s), "
                f"loop lag worst {r['worst_loop_lag_ms']:.1f} ms, p99 {r['p99_loop_lag_ms']:.1f} ms, "
                f"at most {r['max_sandbox_in_flight']} sandbox runs in flight, {r['termination_reasons']}, "
                f"load average {r['load_average']}"
            )
    write_json(args.json, results)


if __name__ == "__main__":
    main()
