"""The ``rllm-gym`` command: ``eval`` runs a policy on an env and tables the results, ``view`` prints episodes.

rllm-gym eval --env rllm/FrozenLake-v0 --tasks 16 --n 4 --out episodes.jsonl     # the embedded tiny model
rllm-gym eval --env rllm/Math-v0 --policy openai --model Qwen/Qwen3-0.6B --base-url http://127.0.0.1:8000/v1
rllm-gym eval ... --out episodes.jsonl --resume      # after a crash: finished episodes are not redone
rllm-gym view episodes.jsonl --index 0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from tqdm import tqdm

__all__ = ["build_parser", "main"]

POLICIES = ("hf", "openai", "vllm")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rllm-gym", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("eval", help="run a policy on an env and print pass@k, rewards and turns")
    run.add_argument("--env", default="rllm/FrozenLake-v0", help="a registered env id (default: %(default)s)")
    run.add_argument("--agent", help="agent class as module:Class (default: the env's registered agent)")
    run.add_argument("--agent-args", type=json.loads, default={}, help="JSON dict of agent arguments")
    run.add_argument("--env-args", type=json.loads, default={}, help="JSON dict of env arguments")
    run.add_argument("--policy", choices=POLICIES, default="hf", help="inference backend (default: %(default)s)")
    run.add_argument("--model", help="model folder or name (default for hf: the embedded tiny model)")
    run.add_argument("--base-url", action="append", help="OpenAI-compatible API root; repeat for replicas")
    run.add_argument("--tokenizer", help="tokenizer folder or name for local token ids (openai policy)")
    run.add_argument("--data", type=Path, help="a JSONL file of task dicts (default: the env draws tasks by seed)")
    run.add_argument("--tasks", type=int, default=16, help="number of tasks (default: %(default)s)")
    run.add_argument("--n", type=int, default=4, help="rollouts per task, the n of pass@k (default: %(default)s)")
    run.add_argument("--out", type=Path, help="episode JSONL file, appended as episodes finish")
    run.add_argument("--resume", action="store_true", help="continue an --out file: finished episodes are kept")
    run.add_argument("--max-steps", type=int, default=10, help="LLM calls per episode (default: %(default)s)")
    run.add_argument("--max-tokens", type=int, default=256, help="tokens per reply (default: %(default)s)")
    run.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: %(default)s)")
    run.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (default: %(default)s)")
    run.add_argument("--n-parallel", type=int, default=64, help="episodes in flight (default: %(default)s)")
    run.add_argument("--timeout", type=float, help="wall-clock seconds per episode")
    run.add_argument("--thinking", choices=("on", "off"), help="chat template thinking switch, where supported")
    run.add_argument("--seed", type=int, default=0, help="seed of sampling and env resets (default: %(default)s)")
    run.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")

    view = commands.add_parser("view", help="print episodes of a JSONL file readably")
    view.add_argument("path", type=Path)
    view.add_argument("--index", type=int, default=0, help="which episode, counted from 0 (default: %(default)s)")
    view.add_argument("--id", help="the episode with this id instead of --index")
    return parser


def _check_eval_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from rllm_gym.registry import env_ids

    if args.env not in env_ids():
        parser.error(f"--env {args.env!r} is not a registered id; choose from {', '.join(env_ids())}")
    for name in ("tasks", "n", "max_steps", "max_tokens", "n_parallel"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    # Checked here, before a model loads, so a typo costs a usage line rather than a traceback minutes later.
    if args.temperature < 0:
        parser.error(f"--temperature must be >= 0 (0 = greedy), got {args.temperature}")
    if not 0 < args.top_p <= 1:
        parser.error(f"--top-p must be in (0, 1] (1 = off), got {args.top_p}")
    if args.timeout is not None and args.timeout <= 0:
        parser.error(f"--timeout must be > 0 seconds (leave it out for no limit), got {args.timeout}")
    for flag, value in (("--env-args", args.env_args), ("--agent-args", args.agent_args)):
        if not isinstance(value, dict):
            parser.error(f"{flag} must be a JSON object such as '{{\"size\": 6}}', got {value!r}")
    if args.agent and ":" not in args.agent:
        parser.error(f"--agent must look like 'package.module:Class', got {args.agent!r}")
    if args.policy in ("openai", "vllm") and not args.model:
        parser.error(f"--policy {args.policy} needs --model (the served or loaded model name)")
    if args.out and args.out.exists() and args.out.stat().st_size and not args.resume:
        parser.error(f"--out {args.out} already holds episodes: pass --resume to continue it, or choose another file")
    if args.resume and not args.out:
        parser.error("--resume needs --out (the file to continue)")
    if args.agent and args.env in env_ids(multi_agent=True):
        parser.error(f"--agent is for single-agent envs; {args.env} plays its registered agent per role")
    if args.data and not args.data.exists():
        parser.error(f"--data {args.data} does not exist")


def make_policy(args: argparse.Namespace) -> Any:
    thinking = None if args.thinking is None else args.thinking == "on"
    if args.policy == "hf":
        from rllm_gym.policies.hf import HFPolicy

        return HFPolicy(args.model, enable_thinking=thinking, device="auto")
    if args.policy == "openai":
        from rllm_gym.policies.openai import OpenAIPolicy

        urls = args.base_url or ["http://127.0.0.1:8000/v1"]
        return OpenAIPolicy(args.model, urls, tokenizer=args.tokenizer, enable_thinking=thinking)
    from rllm_gym.policies.vllm import VLLMPolicy

    return VLLMPolicy(args.model, enable_thinking=thinking)


def load_tasks(args: argparse.Namespace) -> list[Any]:
    if args.data is None:
        return list(range(args.seed, args.seed + args.tasks))
    tasks = []
    with open(args.data) as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    tasks.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise SystemExit(f"--data {args.data}:{number} is not JSON: {error}") from error
    return tasks[: args.tasks]


def run_eval(args: argparse.Namespace) -> dict[str, Any]:
    from rllm_gym.engine import engine_for
    from rllm_gym.metrics import summarize
    from rllm_gym.policies.base import SamplingParams

    policy = make_policy(args)
    sampling = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens, seed=args.seed
    )
    # Multi-agent (PettingZoo) ids: one registered agent per role, one policy shared by every role.
    engine = engine_for(
        args.env,
        policy,
        agent=args.agent,
        agent_args=args.agent_args,
        env_args=args.env_args,
        n_parallel=args.n_parallel,
        out=args.out,
        sampling_params=sampling,
        timeout_s=args.timeout,
        seed=args.seed,
        max_steps=args.max_steps,
    )
    tasks = load_tasks(args)
    bar = tqdm(total=len(tasks) * args.n, desc=f"eval {args.env}", unit="ep", dynamic_ncols=True)
    correct = [0, 0]

    def progress(episode: Any) -> None:
        correct[0] += episode.is_correct
        correct[1] += 1
        bar.update()
        bar.set_postfix(acc=f"{correct[0] / correct[1]:.3f}")

    episodes = asyncio.run(engine.run(tasks, n_rollouts=args.n, progress=progress))
    bar.close()
    return summarize(episodes)


def print_summary(summary: dict[str, Any], console: Console) -> None:
    table = Table(title=f"{summary.get('tasks', 0)} tasks x {summary.get('n', 0)} rollouts")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if key == "termination_reasons":
            value = ", ".join(f"{reason} {count}" for reason, count in value.items())
        elif isinstance(value, float):
            value = f"{value:.3f}"
        table.add_row(key, str(value))
    console.print(table)


def view_episode(args: argparse.Namespace, console: Console) -> None:
    from rllm_gym.store import read_episodes

    for index, episode in enumerate(read_episodes(args.path)):
        if (args.id is not None and episode.id == args.id) or (args.id is None and index == args.index):
            break
    else:
        wanted = f"id {args.id!r}" if args.id is not None else f"index {args.index}"
        raise SystemExit(f"{args.path} has no episode with {wanted}")
    reason = episode.termination_reason.value if episode.termination_reason else "unknown"
    console.rule(f"[bold]{episode.id}[/]  {reason}  correct={episode.is_correct}")
    if "error" in episode.metadata:
        console.print(f"[red]error:[/] {episode.metadata['error']['type']}: {episode.metadata['error']['message']}")
    for trajectory in episode.trajectories:
        console.rule(f"trajectory '{trajectory.name}'  reward={trajectory.reward}", style="dim")
        shown = 0  # messages already printed: each step's chat repeats the history
        for number, step in enumerate(trajectory.steps):
            for message in step.chat_completions[shown:]:
                style = {"system": "dim", "user": "cyan", "assistant": "green", "tool": "yellow"}.get(message["role"])
                console.print(f"[{style}]{message['role']}:[/] ", end="")
                console.print(str(message.get("content", "")), markup=False, highlight=False)
            shown = len(step.chat_completions)
            calls = step.model_output.tool_calls if step.model_output else []
            for call in calls:
                console.print(f"[yellow]tool call:[/] {call.name}({json.dumps(call.arguments)})")
            console.print(f"[bold]step {number}: reward={step.reward} done={step.done}[/]")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console()
    if args.command == "view":
        if not args.path.is_file():
            parser.error(f"view: {args.path} is not a file: pass an episode JSONL file written by eval --out")
        view_episode(args, console)
        return 0
    _check_eval_args(parser, args)
    summary = run_eval(args)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
