"""Episodes through the gateway against the same policy called directly: what recording agent programs costs.

``--sessions`` episodes (64) are in flight at once on one HFPolicy (the embedded tiny model unless ``--model``), each
making ``--turns`` chat calls (2) where every call extends the previous one (token continuation on both paths). Direct:
each episode calls ``policy.generate(messages, previous=step)`` itself. Gateway: each episode is an agent program
using ``openai.AsyncOpenAI`` against its gateway session, run by :class:`~rllm_gym.sdk.AgentProgramEngine`
(HTTP, JSON, session recording, the engine's bookkeeping included). Decoding is greedy, so both paths generate the
same tokens; the two are timed alternately, ``--rounds`` times each, after a warm-up of each, and the ratio of the
medians is reported (goal: <= 1.1).

    python benchmarks/bench_gateway.py                  # 64 sessions, 2 turns, 32 tokens a reply, 3 rounds
    python benchmarks/bench_gateway.py --quick          # 1 round, 16 tokens
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import time

import openai
from _measure import write_json

from rllm_gym.policies import HFPolicy
from rllm_gym.policies.base import SamplingParams
from rllm_gym.sdk import AgentProgramEngine
from rllm_gym.types import Step


def question(task: int) -> str:
    return f"move left then up, task {task}"


async def direct(policy: HFPolicy, sessions: int, turns: int, params: SamplingParams) -> float:
    async def episode(task: int) -> None:
        messages = [{"role": "user", "content": question(task)}]
        previous = None
        for _ in range(turns):
            output = await policy.generate(messages, params, previous=previous)
            reply = {"role": "assistant", "content": output.content}
            previous = Step(
                chat_completions=[*messages, reply],
                prompt_ids=output.prompt_ids,
                response_ids=output.completion_ids,
                logprobs=output.logprobs,
                model_output=output,
            )
            messages = [*messages, reply, {"role": "user", "content": "and again"}]

    start = time.perf_counter()
    await asyncio.gather(*(episode(task) for task in range(sessions)))
    return time.perf_counter() - start


def program_of(turns: int, max_tokens: int):
    async def program(task: int, base_url: str) -> str:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": question(task)}]
        content = ""
        for _ in range(turns):
            reply = await client.chat.completions.create(model="p", messages=messages, max_tokens=max_tokens)
            content = reply.choices[0].message.content or ""
            messages = [*messages, {"role": "assistant", "content": content}, {"role": "user", "content": "and again"}]
        await client.close()
        return content

    return program


async def through_gateway(engine: AgentProgramEngine, sessions: int) -> float:
    start = time.perf_counter()
    episodes = await engine.run(list(range(sessions)))
    elapsed = time.perf_counter() - start
    failed = [e for e in episodes if e.termination_reason.value != "env_done"]
    if failed:
        raise RuntimeError(f"{len(failed)} gateway episodes failed: {failed[0].metadata.get('error')}")
    return elapsed


async def main(args: argparse.Namespace) -> dict:
    policy = HFPolicy(args.model, max_batch_size=args.sessions, batch_wait_s=0.005)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    engine = AgentProgramEngine(
        program_of(args.turns, args.max_tokens), policy, sampling_params=params, n_parallel=args.sessions, seed=0
    )
    await direct(policy, args.sessions, args.turns, params)  # warm-ups: first generate, client imports
    await through_gateway(engine, args.sessions)
    direct_s, gateway_s = [], []
    for _ in range(args.rounds):
        direct_s.append(await direct(policy, args.sessions, args.turns, params))
        gateway_s.append(await through_gateway(engine, args.sessions))
    ratio = statistics.median(gateway_s) / statistics.median(direct_s)
    return {
        "sessions": args.sessions,
        "turns": args.turns,
        "max_tokens": args.max_tokens,
        "direct_s": [round(s, 3) for s in direct_s],
        "gateway_s": [round(s, 3) for s in gateway_s],
        "ratio": round(ratio, 3),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: the embedded tiny model)")
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 round of 16-token replies")
    parser.add_argument("--json", help="also write the results to this file")
    arguments = parser.parse_args()
    if arguments.quick:
        arguments.rounds, arguments.max_tokens = 1, 16
    results = asyncio.run(main(arguments))
    print(
        f"{results['sessions']} sessions x {results['turns']} turns: direct {results['direct_s']} s, "
        f"gateway {results['gateway_s']} s, ratio {results['ratio']}x (goal <= 1.1)"
    )
    write_json(arguments.json, results)
