"""``rllm-gym gateway``: serve a policy as an OpenAI-compatible gateway that records sessions, until interrupted;
and the agent-program options of ``rllm-gym eval`` (``--agent-program``, ``--reward-fn``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from typing import Any

__all__ = ["add_agent_program_arguments", "add_gateway_parser", "agent_program_engine", "run_gateway_command"]


def add_gateway_parser(commands: Any, common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    gateway = commands.add_parser(
        "gateway",
        parents=[common],
        help="serve a policy as an OpenAI-compatible API that records each session's calls with their token ids",
    )
    gateway.add_argument("--policy", choices=("hf", "openai", "vllm"), default="hf", help="backend (default: hf)")
    gateway.add_argument("--model", help="model folder or name (default for hf: the embedded tiny model)")
    gateway.add_argument("--base-url", action="append", help="upstream OpenAI-compatible API root (openai policy)")
    gateway.add_argument("--tokenizer", help="tokenizer folder or name for local token ids (openai policy)")
    gateway.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    gateway.add_argument("--port", type=int, default=8100, help="port; 0 picks a free one (default: %(default)s)")
    gateway.add_argument("--max-tokens", type=int, default=256, help="default tokens per reply (default: 256)")
    gateway.add_argument("--temperature", type=float, default=1.0, help="default temperature (default: 1.0)")
    gateway.add_argument("--max-context-tokens", type=int, help="prompt + reply limit (default: the model's)")
    gateway.add_argument("--thinking", choices=("on", "off"), help="enable_thinking for the chat template")
    gateway.add_argument("--chat-template-kwargs", type=json.loads, default={}, help="JSON dict for the template")
    return gateway


def add_agent_program_arguments(run: argparse.ArgumentParser) -> None:
    """``rllm-gym eval``'s options for an agent program in place of an env and agent."""
    run.add_argument(
        "--agent-program",
        help="module:function run as fn(task, base_url) against a gateway session, one episode per call "
        "(instead of --env/--agent; tasks come from --data)",
    )
    run.add_argument("--reward-fn", help="module:function scoring fn(task, output) -> float or RewardOutput")


def agent_program_engine(args: argparse.Namespace, policy: Any, sampling: Any) -> Any:
    """The engine of ``rllm-gym eval --agent-program``: the program behind a gateway on ``policy``."""
    from rllm_gym.sdk import AgentProgramEngine

    return AgentProgramEngine(
        args.agent_program,
        policy,
        reward_fn=args.reward_fn,
        sampling_params=sampling,
        timeout_s=args.timeout,
        max_turns=args.max_turns,
        n_parallel=args.n_parallel,
        out=args.out,
        seed=args.seed,
    )


def check_agent_program_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from rllm_gym.sdk import load_function

    if args.reward_fn and not args.agent_program:
        parser.error("--reward-fn scores an --agent-program's output; envs grade their own episodes")
    if not args.agent_program:
        return
    if args.agent:
        parser.error("--agent-program replaces --agent (the program is the agent)")
    try:
        load_function(args.agent_program, "--agent-program")
        if args.reward_fn:
            load_function(args.reward_fn, "--reward-fn")
    except ValueError as error:
        parser.error(str(error))


def run_gateway_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from rllm_gym.cli_eval import make_policy
    from rllm_gym.gateway import Gateway
    from rllm_gym.policies.base import SamplingParams

    if not 0 <= args.port < 65536:
        parser.error(f"--port must be in [0, 65535] (0 picks a free one), got {args.port}")
    if args.max_tokens < 1:
        parser.error(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if not 0 <= args.temperature < math.inf:  # NaN fails this too
        parser.error(f"--temperature must be a finite number >= 0 (0 = greedy), got {args.temperature}")
    if args.max_context_tokens is not None and args.max_context_tokens < 1:
        parser.error(f"--max-context-tokens must be >= 1 (or left out: the model's), got {args.max_context_tokens}")
    if not isinstance(args.chat_template_kwargs, dict):
        parser.error("--chat-template-kwargs must be a JSON object such as '{\"enable_thinking\": false}'")
    if args.policy in ("openai", "vllm") and not args.model:
        parser.error(f"--policy {args.policy} needs --model (the served or loaded model name)")
    policy = make_policy(args)
    sampling = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    gateway = Gateway(
        policy, sampling_params=sampling, host=args.host, port=args.port, max_context_tokens=args.max_context_tokens
    )

    async def serve() -> None:
        url = await gateway.start()
        print(f"rllm-gym gateway: listening on {url}", flush=True)
        print(f"  open a session: curl -s -X POST {url}/sessions -d '{{\"task\": null}}'", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await gateway.close()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        print("rllm-gym gateway: stopped", file=sys.stderr)
    return 0
