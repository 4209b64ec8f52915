"""Episodes through the gateway against the same policy called directly: what recording agent programs costs.

``--sessions`` episodes (64) are in flight at once on one HFPolicy (the embedded tiny model unless ``--model``), each
making ``--turns`` chat calls (2) where every call extends the previous one (token continuation on both paths), and
both paths run as episodes of an :class:`~rllm_gym.engine.AgentWorkflowEngine` (the same bookkeeping, the same
interpreter settings as ``rllm-gym eval`` and the trainer: ``tune_interpreter=True``). Direct: each episode's workflow
calls ``policy.generate(messages, previous=step)`` itself and records the Steps. Gateway: each episode is an agent
program using ``openai.AsyncOpenAI`` against its gateway session, run by :class:`~rllm_gym.sdk.AgentProgramEngine`
(HTTP, JSON and session recording added). Two more rows separate the clients' own costs: the
openai client with its default TLS set-up built per episode (it loads the CA bundle, ~50 ms of CPU each), and the same
program on plain aiohttp. Decoding is greedy, so every path generates the same tokens; they are timed in turn,
``--rounds`` times each, after a warm-up of each, and the ratios of the medians to direct are reported (goal: <= 1.1).
The process's CPU time per LLM call over the direct path's (``*_cpu_ms_per_call``) says what each way of calling
costs, whatever else the machine runs: the clients run in this process, on the cores that also generate. The event
loop thread's CPU per call (``*_loop_cpu_ms_per_call``) is what a turn's batch waits for: programs, gateway and
engine share that one thread, and a batch goes out once every session has asked. Each path's batch sizes
(``*_batch_sizes``, the last round's) show that both paths run the same batches. ``server_cpu_ms_per_call`` is the
gateway's own CPU per call apart from the clients' and the model's (:mod:`_gateway_cost`: clients in another process).

A second workload (``--long-tokens``, 128) times direct against the gateway with the openai client at replies of a
realistic length, where the fixed cost per call weighs less; it is reported beside the first, never instead of it.

``--policy vllm`` (in the vLLM venv: README, "vLLM on a CPU") runs direct against the gateway with the openai client
on one VLLMPolicy instead, at both reply lengths: vLLM batches continuously (a request that arrives late joins the
running batch between decode steps, in the engine core's own process), so the programs' client CPU overlaps
generation rather than adding to every turn as it does before HFPolicy's batch, which waits for its last request.

    python benchmarks/bench_gateway.py                  # 64 sessions, 2 turns, 32 tokens a reply, 3 rounds; and 128
    python benchmarks/bench_gateway.py --quick          # 1 round, 16 tokens; and 128
    .venv-vllm/bin/python benchmarks/bench_gateway.py --policy vllm --max-tokens 16   # 3 rounds, 16 and 128 tokens
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import ssl
import statistics
import sys
import time

import aiohttp
import httpx
import openai
from _gateway_cost import gateway_cost
from _measure import write_json

from rllm_gym.engine import AgentWorkflowEngine
from rllm_gym.engine.workflow import TerminationEvent, Workflow
from rllm_gym.policies import HFPolicy
from rllm_gym.policies.base import Policy, SamplingParams
from rllm_gym.sdk import AgentProgramEngine
from rllm_gym.types import Step, TerminationReason, Trajectory


def question(task: int) -> str:
    return f"move left then up, task {task}"


class DirectWorkflow(Workflow):
    """The agent program's episode with the policy called in process: the same calls, recorded as the gateway records
    them (a Trajectory with the task as input, a Step per call, the last reply as output)."""

    def __init__(self, policy: Policy, *, turns: int, **kwargs) -> None:
        super().__init__(policy, **kwargs)
        self.turns = turns

    @property
    def cheap_to_build(self) -> bool:
        return True

    async def run(self, task: int, uid: str) -> None:
        trajectory = Trajectory(name="agent", task=task, input={"task": task})
        self.commit(trajectory=trajectory)
        messages = [{"role": "user", "content": question(task)}]
        for _ in range(self.turns):
            previous = trajectory.steps[-1] if trajectory.steps else None
            output = await self.policy.generate(messages, self.sampling_params, previous=previous)
            reply = {"role": "assistant", "content": output.content}
            step = Step(
                chat_completions=[*messages, reply],
                prompt_ids=output.prompt_ids,
                response_ids=output.completion_ids,
                logprobs=output.logprobs,
                model_response=output.text,
                action=reply,
                model_output=output,
            )
            trajectory.steps.append(step)
            messages = [*messages, reply, {"role": "user", "content": "and again"}]
        trajectory.output = output.content
        raise TerminationEvent(TerminationReason.ENV_DONE)


def program_of(turns: int, max_tokens: int, tls: ssl.SSLContext | None):
    """The agent program: a client of its own per episode, on a TLS context built once (``tls``), or, with ``None``,
    the client's default, which loads the CA bundle anew (~50 ms of CPU per client)."""

    async def program(task: int, base_url: str) -> str:
        http_client = None if tls is None else httpx.AsyncClient(verify=tls)
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, http_client=http_client)
        messages = [{"role": "user", "content": question(task)}]
        content = ""
        for _ in range(turns):
            reply = await client.chat.completions.create(model="p", messages=messages, max_tokens=max_tokens)
            content = reply.choices[0].message.content or ""
            messages = [*messages, {"role": "assistant", "content": content}, {"role": "user", "content": "and again"}]
        await client.close()
        return content

    return program


def raw_program_of(turns: int, max_tokens: int):
    """The same program on plain aiohttp (JSON in, JSON out): the gateway's cost without the openai client's."""

    async def program(task: int, base_url: str) -> str:
        messages = [{"role": "user", "content": question(task)}]
        content = ""
        async with aiohttp.ClientSession() as http:
            for _ in range(turns):
                body = {"model": "p", "messages": messages, "max_tokens": max_tokens}
                async with http.post(f"{base_url}/chat/completions", json=body) as response:
                    content = (await response.json())["choices"][0]["message"]["content"]
                reply = {"role": "assistant", "content": content}
                messages = [*messages, reply, {"role": "user", "content": "and again"}]
        return content

    return program


async def timed(
    engine: AgentWorkflowEngine,
    sessions: int,
    batches: list[int] | None = None,
    loop_cpu: list[float] | None = None,
    replies: dict[tuple[int, int], list[int]] | None = None,
) -> tuple[float, float, int]:
    """Wall seconds, process CPU seconds and completion tokens of one run of ``sessions`` episodes; ``batches``, when
    given, gets the size of each ``generate`` call the run made (``HFPolicy.batch_sizes``), ``loop_cpu`` the CPU
    seconds of the event loop's thread (programs, gateway, engine and prompt building; generation runs in a worker
    thread), to which the run's figure is appended, and ``replies`` each call's completion ids by (task, turn)."""
    first_batch = len(getattr(engine.policy, "batch_sizes", ()))
    start, cpu, loop_start = time.perf_counter(), time.process_time(), time.thread_time()
    episodes = await engine.run(list(range(sessions)))
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    if loop_cpu is not None:
        loop_cpu.append(time.thread_time() - loop_start)
    if batches is not None:
        batches[:] = engine.policy.batch_sizes[first_batch:]
    failed = [e for e in episodes if e.termination_reason.value != "env_done"]
    if failed:
        raise RuntimeError(f"{len(failed)} episodes failed: {failed[0].metadata.get('error')}")
    if replies is not None:
        for episode in episodes:
            for turn, step in enumerate(episode.trajectories[0].steps):
                replies[(episode.task, turn)] = list(step.response_ids)
    tokens = sum(len(step.response_ids) for e in episodes for t in e.trajectories for step in t.steps)
    return elapsed, cpu, tokens


def engines_for(policy: Policy, args: argparse.Namespace, max_tokens: int, programs: dict) -> dict:
    """The direct path and one AgentProgramEngine per program, all with replies of up to ``max_tokens``."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    settings = {"sampling_params": params, "n_parallel": args.sessions, "tune_interpreter": True}
    direct = AgentWorkflowEngine(
        DirectWorkflow,
        policy,
        workflow_args={"turns": args.turns, "sampling_params": params},
        n_parallel=args.sessions,
        tune_interpreter=True,
    )
    return {
        "direct": direct,
        **{name: AgentProgramEngine(program, policy, **settings) for name, program in programs.items()},
    }


async def long_replies(policy: Policy, args: argparse.Namespace) -> dict:
    """Direct vs the gateway with the openai client at ``--long-tokens`` a reply (greedy: the same replies on both
    paths; the tiny model may end one early on EOS, so the mean reply length is reported)."""
    program = program_of(args.turns, args.long_tokens, ssl.create_default_context())
    engines = engines_for(policy, args, args.long_tokens, {"gateway": program})
    for engine in engines.values():
        await timed(engine, args.sessions)
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            wall, _, tokens = await timed(engine, args.sessions)
            seconds[name].append(wall)
    return {
        "long_max_tokens": args.long_tokens,
        "long_mean_reply_tokens": round(tokens / (args.sessions * args.turns), 1),
        "long_direct_s": [round(s, 3) for s in seconds["direct"]],
        "long_gateway_s": [round(s, 3) for s in seconds["gateway"]],
        "long_ratio": round(statistics.median(seconds["gateway"]) / statistics.median(seconds["direct"]), 3),
    }


async def continuous_batching(policy: Policy, args: argparse.Namespace) -> dict:
    """``--policy vllm``: direct vs the gateway with the openai client on one VLLMPolicy, at ``--max-tokens`` and at
    ``--long-tokens`` a reply, interleaved ``--rounds`` times after a warm-up of each. vLLM batches continuously (its
    engine core is a process of its own; a request that arrives late joins the running batch between decode steps),
    so the clients' CPU overlaps generation instead of adding to each turn. Greedy on both paths: ``same_tokens`` is
    the share of calls (task, turn) whose completion ids the two paths agree on, in the last round. On a CPU every
    core generates too: ``*_cpu_ms_per_call`` (this process: programs, gateway, vLLM's output handling) and
    ``*_engine_cpu_ms_per_call`` (vLLM's engine-core and worker processes) say where each path's CPU went."""
    import psutil  # a dependency of vLLM

    def engine_cpu() -> float:
        """CPU seconds of this process's children (vLLM's engine core and its worker) so far."""
        return sum(sum(child.cpu_times()[:2]) for child in psutil.Process().children(recursive=True))

    results: dict = {"policy": "vllm", "sessions": args.sessions, "turns": args.turns}
    calls = args.sessions * args.turns
    for prefix, max_tokens in (("", args.max_tokens), ("long_", args.long_tokens)):
        if not max_tokens:
            continue
        programs = {"gateway": program_of(args.turns, max_tokens, ssl.create_default_context())}
        if not prefix:  # the clients' share: the same program on plain aiohttp, at the short replies
            programs["gateway_raw_http"] = raw_program_of(args.turns, max_tokens)
        engines = engines_for(policy, args, max_tokens, programs)
        for engine in engines.values():
            await timed(engine, args.sessions)
        seconds: dict[str, list[float]] = {name: [] for name in engines}
        cpu: dict[str, list[float]] = {name: [] for name in engines}
        core: dict[str, list[float]] = {name: [] for name in engines}
        replies: dict[str, dict] = {name: {} for name in engines}
        for _ in range(args.rounds):
            for name, engine in engines.items():
                before = engine_cpu()
                wall, used, tokens = await timed(engine, args.sessions, replies=replies[name])
                core[name].append(engine_cpu() - before)
                seconds[name].append(wall)
                cpu[name].append(used)
        direct, gateway = replies["direct"], replies["gateway"]
        same = sum(gateway.get(key) == ids for key, ids in direct.items()) / max(1, len(direct))
        base = statistics.median(seconds["direct"])
        results |= {
            f"{prefix}max_tokens": max_tokens,
            f"{prefix}mean_reply_tokens": round(tokens / (args.sessions * args.turns), 1),
            **{f"{prefix}{name}_s": [round(s, 3) for s in values] for name, values in seconds.items()},
            f"{prefix}ratio": round(statistics.median(seconds["gateway"]) / base, 3),
            f"{prefix}same_tokens": round(same, 3),
            **{
                f"{prefix}{name}_{what}_ms_per_call": round(1e3 * statistics.median(values[name]) / calls, 3)
                for name in engines
                for what, values in (("cpu", cpu), ("engine_cpu", core))
            },
        }
        if "gateway_raw_http" in seconds:
            results[f"{prefix}ratio_raw_http"] = round(statistics.median(seconds["gateway_raw_http"]) / base, 3)
    machine = {"cpus": os.cpu_count(), "machine": platform.machine(), "load_average": round(os.getloadavg()[0], 2)}
    return results | machine


async def main(args: argparse.Namespace) -> dict:
    policy = HFPolicy(args.model, max_batch_size=args.sessions, batch_wait_s=0.005)
    programs = {
        "gateway": program_of(args.turns, args.max_tokens, ssl.create_default_context()),
        "gateway_default_client": program_of(args.turns, args.max_tokens, None),
        "gateway_raw_http": raw_program_of(args.turns, args.max_tokens),
    }
    engines = engines_for(policy, args, args.max_tokens, programs)
    for engine in engines.values():  # warm-ups: first generate, client imports
        await timed(engine, args.sessions)
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    cpu: dict[str, list[float]] = {name: [] for name in engines}
    batches: dict[str, list[int]] = {name: [] for name in engines}  # the last round's generate calls, per path
    loop_cpu: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            wall, used, _ = await timed(engine, args.sessions, batches[name], loop_cpu[name])
            seconds[name].append(wall)
            cpu[name].append(used)
    base = statistics.median(seconds["direct"])
    calls = args.sessions * args.turns
    base_cpu = statistics.median(cpu["direct"])
    cpu_per_call = {
        f"{name}_cpu_ms_per_call": round(1e3 * (statistics.median(cpu[name]) - base_cpu) / calls, 3)
        for name in programs
    }
    return {
        "sessions": args.sessions,
        "turns": args.turns,
        "max_tokens": args.max_tokens,
        **{f"{name}_s": [round(s, 3) for s in values] for name, values in seconds.items()},
        "ratio": round(statistics.median(seconds["gateway"]) / base, 3),
        "ratio_default_client": round(statistics.median(seconds["gateway_default_client"]) / base, 3),
        "ratio_raw_http": round(statistics.median(seconds["gateway_raw_http"]) / base, 3),
        "direct_cpu_s": [round(s, 3) for s in cpu["direct"]],
        # The event loop's CPU per LLM call: what each turn's batch waits for (every session's share, one after the
        # other), free of the generation threads' CPU, which swings on a loaded machine.
        **{
            f"{name}_loop_cpu_ms_per_call": round(1e3 * statistics.median(values) / calls, 3)
            for name, values in loop_cpu.items()
        },
        # Every path hands the policy the same batches (64 requests per turn), so the same forward passes run.
        **{f"{name}_batch_sizes": sizes for name, sizes in batches.items()},
        **cpu_per_call,
        **(await long_replies(policy, args) if args.long_tokens else {}),
        # The server's CPU per call with the clients in another process and no model (_gateway_cost.py).
        "server_cpu_ms_per_call": await gateway_cost(policy.tokenizer, args.sessions, args.turns, 5, args.max_tokens),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "load_average": round(os.getloadavg()[0], 2),
    }


def vllm_main(args: argparse.Namespace) -> dict:
    """Build the VLLMPolicy (the project's CPU defaults on a CPU), run :func:`continuous_batching`, print its rows."""
    from rllm_gym.policies.vllm import VLLMPolicy

    policy = VLLMPolicy(args.model)
    try:
        results = asyncio.run(continuous_batching(policy, args))
    finally:
        policy.shutdown()
    for prefix in ("", "long_"):
        if f"{prefix}ratio" in results:
            print(
                f"VLLMPolicy, {results['sessions']} sessions x {results['turns']} turns, replies of up to "
                f"{results[f'{prefix}max_tokens']} tokens ({results[f'{prefix}mean_reply_tokens']} on average): "
                f"direct {results[f'{prefix}direct_s']} s, gateway (openai) {results[f'{prefix}gateway_s']} s, ratio "
                f"{results[f'{prefix}ratio']}x (goal <= 1.1); same greedy tokens in "
                f"{results[f'{prefix}same_tokens']:.0%} of the calls. CPU per call, this process / the engine's: "
                f"direct {results[f'{prefix}direct_cpu_ms_per_call']} / "
                f"{results[f'{prefix}direct_engine_cpu_ms_per_call']} ms, gateway "
                f"{results[f'{prefix}gateway_cpu_ms_per_call']} / "
                f"{results[f'{prefix}gateway_engine_cpu_ms_per_call']} ms"
                + (
                    f"; plain aiohttp instead of openai: ratio {results[f'{prefix}ratio_raw_http']}x, CPU "
                    f"{results[f'{prefix}gateway_raw_http_cpu_ms_per_call']} / "
                    f"{results[f'{prefix}gateway_raw_http_engine_cpu_ms_per_call']} ms"
                    if f"{prefix}ratio_raw_http" in results
                    else ""
                )
            )
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: the embedded tiny model)")
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--long-tokens", type=int, default=128, help="the second workload's reply length (0: leave it out)"
    )
    parser.add_argument("--quick", action="store_true", help="1 round of 16-token replies")
    parser.add_argument(
        "--policy",
        choices=("hf", "vllm"),
        default="hf",
        help="hf: the HFPolicy workloads; vllm: direct vs the openai client on a VLLMPolicy (run with the vLLM venv)",
    )
    parser.add_argument("--json", help="also write the results to this file")
    arguments = parser.parse_args()
    if arguments.quick:
        arguments.rounds, arguments.max_tokens = 1, 16
    if arguments.policy == "vllm":
        write_json(arguments.json, vllm_main(arguments))
        sys.exit(0)
    results = asyncio.run(main(arguments))
    print(
        f"{results['sessions']} sessions x {results['turns']} turns: direct {results['direct_s']} s, "
        f"gateway {results['gateway_s']} s, ratio {results['ratio']}x (goal <= 1.1); with the client's default TLS "
        f"set-up per episode {results['gateway_default_client_s']} s, ratio {results['ratio_default_client']}x; "
        f"plain aiohttp instead of openai {results['gateway_raw_http_s']} s, ratio {results['ratio_raw_http']}x. "
        f"CPU per call over direct: openai {results['gateway_cpu_ms_per_call']} ms, with its default TLS set-up "
        f"{results['gateway_default_client_cpu_ms_per_call']} ms, "
        f"aiohttp {results['gateway_raw_http_cpu_ms_per_call']} ms. The event loop's CPU per call: direct "
        f"{results['direct_loop_cpu_ms_per_call']} ms, gateway with openai "
        f"{results['gateway_loop_cpu_ms_per_call']} ms, "
        f"with aiohttp {results['gateway_raw_http_loop_cpu_ms_per_call']} ms. Batch sizes (generate calls): direct "
        f"{results['direct_batch_sizes']}, gateway {results['gateway_batch_sizes']}"
    )
    server = results["server_cpu_ms_per_call"]
    print(
        f"The server's CPU per call, clients in another process, no model: the gateway {server['gateway']} ms, a bare "
        f"aiohttp handler {server['bare_aiohttp']} ms, the policy's prompt work called directly "
        f"{server['policy_direct']} ms"
    )
    if arguments.long_tokens:
        print(
            f"replies of up to {results['long_max_tokens']} tokens ({results['long_mean_reply_tokens']} on average): "
            f"direct {results['long_direct_s']} s, gateway {results['long_gateway_s']} s, ratio "
            f"{results['long_ratio']}x (load average {results['load_average']})"
        )
    write_json(arguments.json, results)
