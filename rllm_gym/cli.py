"""The ``rllm-gym`` command: ``list`` the envs, ``eval`` a policy on one, ``train`` with GRPO, ``view`` episodes.

rllm-gym list                                        # every env id, its default agent, the extras it needs
rllm-gym eval --env rllm/FrozenLake-v0 --tasks 16 --n 4 --out episodes.jsonl     # the embedded tiny model
rllm-gym eval --env rllm/Math-v0 --policy openai --model Qwen/Qwen3-0.6B --base-url http://127.0.0.1:8000/v1
rllm-gym eval ... --out episodes.jsonl --resume      # after a crash: finished episodes are not redone
rllm-gym train --config train/configs/demo_cpu.yaml --max_steps 50     # = python -m rllm_gym.train.grpo ...
rllm-gym view episodes.jsonl --range 2:5             # or --index -1, --id seed-3:0, --task seed-3, --brief

An eval whose episodes all ended in ERROR exits with status 1 and the errors behind them; ``--log-level info`` (or
``debug``, with tracebacks) shows what the engine does as it goes.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from tqdm import tqdm

__all__ = ["build_parser", "main"]

POLICIES = ("hf", "openai", "vllm")
# Defaults of the options a model folder written by the trainer may set instead (rllm_gym_training.json).
EVAL_DEFAULTS: dict[str, Any] = {
    "env": "rllm/FrozenLake-v0",
    "agent_args": {},
    "env_args": {},
    "max_steps": 10,
    "max_tokens": 256,
    "thinking": None,
    "chat_template_kwargs": {},
}
RECORDED = "; a --model folder written by the trainer gives its training value"
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


def build_parser() -> argparse.ArgumentParser:
    from rllm_gym.log import LOG_LEVELS

    lines = __doc__.replace("``", "").splitlines()
    parser = argparse.ArgumentParser(
        prog="rllm-gym",
        description=lines[0],
        epilog="examples:\n" + "\n".join("  " + line for line in lines[2 : lines.index("", 2)]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="warning",
        help="messages of the rllm_gym logger printed to stderr (default: %(default)s)",
    )
    common.add_argument("--debug", action="store_true", help="show the traceback of an error, not only its message")

    listing = commands.add_parser(
        "list", parents=[common], help="every env id with its default agent, extras and one line about it"
    )
    listing.add_argument("--json", action="store_true", help="a JSON list, with full module:Class agent paths")
    # `rllm-gym train ...` is handed to the trainer before this parser runs (see main); listed here for --help.
    commands.add_parser(
        "train",
        add_help=False,
        help="GRPO training: python -m rllm_gym.train.grpo with the same flags (rllm-gym train --help lists them)",
    )

    run = commands.add_parser(
        "eval", parents=[common], help="run a policy on an env and print pass@k, rewards and turns"
    )
    run.add_argument("--env", help=f"a registered env id (default: {EVAL_DEFAULTS['env']}{RECORDED})")
    run.add_argument("--agent", help="agent class as module:Class (default: the env's registered agent)")
    run.add_argument("--agent-args", type=json.loads, help=f"JSON dict of agent arguments (default: {{}}{RECORDED})")
    run.add_argument("--env-args", type=json.loads, help=f"JSON dict of env arguments (default: {{}}{RECORDED})")
    run.add_argument("--policy", choices=POLICIES, default="hf", help="inference backend (default: %(default)s)")
    run.add_argument("--model", help="model folder or name (default for hf: the embedded tiny model)")
    run.add_argument("--base-url", action="append", help="OpenAI-compatible API root; repeat for replicas")
    run.add_argument("--tokenizer", help="tokenizer folder or name for local token ids (openai policy)")
    run.add_argument("--data", type=Path, help="a JSONL file of task dicts (default: the env draws tasks by seed)")
    run.add_argument("--tasks", type=int, default=16, help="number of tasks (default: %(default)s)")
    run.add_argument("--n", type=int, default=4, help="rollouts per task, the n of pass@k (default: %(default)s)")
    run.add_argument("--out", type=Path, help="episode JSONL file, appended as episodes finish")
    run.add_argument("--resume", action="store_true", help="continue an --out file: finished episodes are kept")
    run.add_argument("--max-steps", type=int, help=f"LLM calls per episode (default: 10{RECORDED})")
    run.add_argument("--max-tokens", type=int, help=f"tokens per reply (default: 256{RECORDED})")
    run.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: %(default)s)")
    run.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (default: %(default)s)")
    run.add_argument("--n-parallel", type=int, default=64, help="episodes in flight (default: %(default)s)")
    run.add_argument("--timeout", type=float, help="wall-clock seconds per episode")
    run.add_argument(
        "--thinking", choices=("on", "off"), help=f"chat template thinking switch, where supported{RECORDED}"
    )
    run.add_argument(
        "--chat-template-kwargs",
        type=json.loads,
        help=f"JSON dict of chat template arguments, e.g. '{{\"enable_thinking\": false}}' (default: {{}}{RECORDED})",
    )
    run.add_argument("--seed", type=int, default=0, help="seed of sampling and env resets (default: %(default)s)")
    run.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    run.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar on stderr (it is drawn only when stderr is a terminal; TQDM_DISABLE=1 also hides it)",
    )
    add_view_parser(commands, common)
    return parser


def add_view_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    from rllm_gym.view import REASONS

    view = commands.add_parser(
        "view",
        parents=[common],
        help="print the episodes of a JSONL file (all, or a selection); model text is printed literally",
        description="Print episodes of a JSONL file written by eval --out: every one by default, or a selection.",
    )
    view.add_argument("path", type=Path, help="episode JSONL file")
    which = view.add_mutually_exclusive_group()
    which.add_argument("--index", type=int, help="only the episode at this position, from 0 (-1: the last)")
    which.add_argument(
        "--range",
        type=range_type,
        help="positions START:STOP, STOP excluded: 2:5, :3, 10: (negative, from the end: --range=-5:)",
    )
    which.add_argument("--id", action="append", help="the episode with this id (e.g. seed-3:0); repeat for more")
    which.add_argument("--task", help="every rollout of this task id (an episode id without its ':N')")
    view.add_argument("--reason", choices=REASONS, help="only the episodes that ended this way (e.g. error)")
    view.add_argument("--brief", action="store_true", help="one line per episode instead of the whole chat")


def range_type(text: str) -> slice:
    """``--range``'s type: :func:`rllm_gym.view.parse_range`, its message shown (argparse hides a ValueError's)."""
    from rllm_gym.view import parse_range

    try:
        return parse_range(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def apply_training_record(args: argparse.Namespace) -> str | None:
    """Fill the options not given from the --model folder's training record, then the defaults; say which were used.

    Returns the line that says so (None when the model folder has no record).
    """
    from rllm_gym.train.model_record import TRAINING_FILE, eval_settings, read_training_record

    record = read_training_record(args.model) if args.model and Path(args.model).is_dir() else None
    settings = eval_settings(record) if record else {}
    used, overridden = [], []
    for option, value in settings.items():
        flag = f"--{option.replace('_', '-')}"
        if getattr(args, option) is None:
            setattr(args, option, value)
            used.append(f"{flag} {json.dumps(value) if isinstance(value, dict) else value}")
        else:
            overridden.append(flag)
    for option, value in EVAL_DEFAULTS.items():
        if getattr(args, option) is None:
            setattr(args, option, value)
    if record is None:
        return None
    line = f"rllm-gym eval: settings from {Path(args.model) / TRAINING_FILE}: {', '.join(used) or 'none'}"
    return line + (f" (given on the command line instead: {', '.join(overridden)})" if overridden else "")


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
    for flag, value in (
        ("--env-args", args.env_args),
        ("--agent-args", args.agent_args),
        ("--chat-template-kwargs", args.chat_template_kwargs),
    ):
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
    from rllm_gym.engine.arguments import check_arguments
    from rllm_gym.policies.base import check_model_source

    try:
        check_arguments(args.env, agent=args.agent, agent_args=args.agent_args, env_args=args.env_args)
        if args.model and args.policy in ("hf", "vllm"):
            check_model_source(args.model, "--model")
        if args.tokenizer:
            check_model_source(args.tokenizer, "--tokenizer")
    except (ValueError, ImportError, AttributeError) as error:
        parser.error(str(error))


def make_policy(args: argparse.Namespace) -> Any:
    thinking = None if args.thinking is None else args.thinking == "on"
    template_kwargs = args.chat_template_kwargs  # --thinking, when given, wins over its enable_thinking
    if args.policy == "hf":
        from rllm_gym.policies.hf import HFPolicy

        return HFPolicy(args.model, enable_thinking=thinking, chat_template_kwargs=template_kwargs, device="auto")
    if args.policy == "openai":
        from rllm_gym.policies.openai import OpenAIPolicy

        urls = args.base_url or [DEFAULT_BASE_URL]
        return OpenAIPolicy(
            args.model, urls, tokenizer=args.tokenizer, enable_thinking=thinking, chat_template_kwargs=template_kwargs
        )
    from rllm_gym.policies.vllm import VLLMPolicy

    return VLLMPolicy(args.model, enable_thinking=thinking, chat_template_kwargs=template_kwargs)


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


def check_server(args: argparse.Namespace) -> None:
    """Fail in seconds, naming the URL, when an OpenAI-compatible server cannot be reached at all."""
    import httpx

    for url in args.base_url or [DEFAULT_BASE_URL]:
        try:
            httpx.get(url.rstrip("/") + "/models", timeout=10.0)
        except httpx.TransportError as error:  # an HTTP error status means the server is there: the run will tell
            raise SystemExit(
                f"rllm-gym eval: cannot reach the OpenAI-compatible server at {url}: {type(error).__name__}: {error}. "
                f"Start one (see the README's OpenAI section) or point --base-url at it."
            ) from error


def run_eval(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    """The summary (with ``errors`` when episodes ended in ERROR) and the episodes."""
    from rllm_gym.engine import engine_for
    from rllm_gym.engine.report import ErrorTally
    from rllm_gym.metrics import summarize
    from rllm_gym.policies.base import SamplingParams

    if args.policy == "openai":
        check_server(args)
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
    # disable=None: drawn only when stderr is a terminal, so logs and CI output get no carriage-return noise.
    bar = tqdm(
        total=len(tasks) * args.n,
        desc=f"eval {args.env}",
        unit="ep",
        dynamic_ncols=True,
        # None is tqdm's "only on a terminal"; passed explicitly it would override TQDM_DISABLE, so read it here.
        disable=True if args.no_progress or os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true") else None,
    )
    correct = [0, 0]

    def progress(episode: Any) -> None:
        correct[0] += episode.is_correct
        correct[1] += 1
        bar.update()
        bar.set_postfix(acc=f"{correct[0] / correct[1]:.3f}")

    episodes = asyncio.run(engine.run(tasks, n_rollouts=args.n, progress=progress))
    bar.close()
    summary = summarize(episodes)
    tally = ErrorTally()
    tally.add(episodes)
    if tally:
        summary["errors"] = tally.groups()
    return summary, episodes


def print_summary(summary: dict[str, Any], console: Console) -> None:
    table = Table(title=f"{summary.get('tasks', 0)} tasks x {summary.get('n', 0)} rollouts")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if key == "errors":
            continue
        if key == "termination_reasons":
            value = ", ".join(f"{reason} {count}" for reason, count in value.items())
        elif isinstance(value, float):
            value = f"{value:.3f}"
        table.add_row(key, str(value))
    console.print(table)
    if summary.get("errors"):
        from rllm_gym.engine.report import describe_errors

        console.print("[red]errors behind the ERROR episodes[/] (read one with rllm-gym view FILE --id ID):")
        console.print(describe_errors(summary["errors"]), markup=False, highlight=False)


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, but an unknown flag is a usage error that names the closest known one."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        flags = [option for action in commands_of(parser)[args.command]._actions for option in action.option_strings]
        flag = next((item for item in unknown if item.startswith("-")), unknown[0])
        close = difflib.get_close_matches(flag.split("=")[0], flags, n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; see rllm-gym {args.command} --help"
        parser.error(f"{args.command}: unrecognized argument {flag}{hint}")
    return args


def commands_of(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def main(argv: list[str] | None = None) -> int:
    """Run the command; a user error ends with one line on stderr (``--debug``: the traceback too)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:
        return run_train(argv[1:])
    parser = build_parser()
    args = parse_args(parser, argv)
    try:
        return run_command(parser, args)
    except KeyboardInterrupt:
        print(f"rllm-gym {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if args.debug:
            raise
        message = f"rllm-gym {args.command}: {type(error).__name__}: {error} (--debug shows the traceback)"
        print(message, file=sys.stderr)
        return 1


def run_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from rllm_gym.log import configure_logging

    configure_logging(args.log_level)
    if args.command == "list":
        list_envs(args.json)
        return 0
    console = Console()
    if args.command == "view":
        return run_view(parser, args)
    recorded = apply_training_record(args)
    if recorded:
        print(recorded, file=sys.stderr, flush=True)
    _check_eval_args(parser, args)
    summary, episodes = run_eval(args)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary, console)
    return 1 if report_failure(summary, episodes) else 0


def report_failure(summary: dict[str, Any], episodes: list[Any]) -> bool:
    """Say on stderr why an eval whose every episode ended in ERROR failed; True when it did."""
    from rllm_gym.engine.report import all_errored, describe_errors

    if not all_errored(episodes):
        return False
    print(
        f"rllm-gym eval: all {len(episodes)} episodes ended in ERROR, so there is no score:\n"
        f"{describe_errors(summary['errors'])}",
        file=sys.stderr,
    )
    return True


def run_train(argv: list[str]) -> int:
    """``rllm-gym train ARGS`` is ``python -m rllm_gym.train.grpo ARGS``: the same flags, messages and exit status."""
    from rllm_gym.train.grpo import cli  # imported here: torch and TRL take seconds to load

    program, sys.argv[0] = sys.argv[0], "rllm-gym train"  # the trainer's --help then reads "usage: rllm-gym train"
    try:
        return cli(argv)
    finally:
        sys.argv[0] = program


def list_envs(as_json: bool) -> None:
    """Print every registered env: id, default agent, pip extras, one line about it (all from the registry)."""
    from rllm_gym.registry import ENV_SPECS

    rows = [env_row(spec) for spec in ENV_SPECS]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = [("id", "default agent", "extras", "description")]
    for row in rows:
        agent = row["agent"]
        if isinstance(agent, dict):
            agent = " ".join(f"{role}={path.rpartition(':')[2]}" for role, path in agent.items())
        elif agent:
            agent = agent.rpartition(":")[2]
        table.append((row["id"], agent or "-", ",".join(row["extras"]) or "-", row["description"]))
    widths = [max(len(line[column]) for line in table) for column in range(3)]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line[:3], widths, strict=True)) + "  " + line[3])


def env_row(spec: Any) -> dict[str, Any]:
    """One env as ``rllm-gym list --json`` prints it; the agent is ``module:Class`` or ``{role: module:Class}``."""
    import importlib

    from rllm_gym.registry import default_agent

    def path(agent: Any) -> str:
        return f"{agent.__module__}:{agent.__qualname__}"

    try:
        agent = default_agent(spec.id)
    except ValueError:  # no agent registered: eval and train need --agent
        agent = None
    except ImportError:  # the agent needs an extra that is not installed: list it as registered
        agent = spec.agent
    if isinstance(agent, dict):
        agent = {role: path(cls) for role, cls in agent.items()}
    elif agent is not None:
        agent = path(agent)
    description = spec.description
    if not description:  # an env registered without one: the first line of its module's docstring
        doc = importlib.import_module(spec.entry_point.partition(":")[0]).__doc__ or ""
        description = doc.strip().splitlines()[0] if doc.strip() else ""
    return {
        "id": spec.id,
        "description": description,
        "agent": agent,
        "extras": list(spec.extras),
        "multi_agent": spec.multi_agent,
        "install": f'pip install "rllm-gym[{",".join(spec.extras)}]"' if spec.extras else None,
    }


def run_view(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from rllm_gym.view import Selection, SelectionError, view

    if not args.path.is_file():
        parser.error(f"view: {args.path} is not a file: pass an episode JSONL file written by eval --out")
    selection = Selection(args.index, args.range, tuple(args.id or ()), args.task, args.reason)
    # Model text may hold anything: no emoji codes, no highlighting (markup is never parsed, see rllm_gym.view).
    console = Console(emoji=False, highlight=False)
    try:
        shown = view(args.path, selection, console, brief=args.brief)
    except SelectionError as error:
        parser.error(f"view: {args.path}: {error}")
    if not shown:
        why = f"no selected episode ended with reason {args.reason!r}" if args.reason else "it holds no episodes"
        print(f"rllm-gym view: nothing to show in {args.path}: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
