"""The ``rllm-gym`` command: ``list`` the envs, ``eval`` a policy on one, ``train`` with GRPO, ``view`` episodes.

rllm-gym list                                        # every env id, its default agent, the extras it needs
rllm-gym eval --env rllm/FrozenLake-v0 --tasks 16 --n 4 --out episodes.jsonl     # the embedded tiny model
rllm-gym benchmarks                                  # GSM8K, MATH-500, AIME, HumanEval, ...: source, grader, size
rllm-gym eval --benchmark humaneval --n 4 --results humaneval.json   # a benchmark with its own prompt and grader
rllm-gym eval --env rllm/Math-v0 --policy openai --model Qwen/Qwen3-0.6B --base-url http://127.0.0.1:8000/v1
rllm-gym eval ... --out episodes.jsonl --resume      # after a crash: finished episodes are not redone
rllm-gym train --config train/configs/demo_cpu.yaml --max_steps 50 --output_dir runs/demo_50   # = grpo.py
rllm-gym view episodes.jsonl --range 2:5             # or --index -1, --id seed-3:0, --task seed-3, --brief
rllm-gym gateway --port 8100                         # an OpenAI-compatible API recording sessions (agent programs)
rllm-gym serve rllm/FrozenLake-v0 --port 8000        # over OpenEnv: gym.make("rllm/OpenEnv-v0", base_url=...)

An eval whose episodes all ended in ERROR exits with status 1 and the errors behind them; ``--log-level info`` (or
``debug``, with tracebacks) shows what the engine does as it goes.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from rllm_gym.cli_eval import add_eval_parser, run_eval_command
from rllm_gym.cli_gateway import add_gateway_parser, run_gateway_command
from rllm_gym.cli_serve import add_serve_parser, run_serve

__all__ = ["build_parser", "main"]


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
    benchmarks = commands.add_parser(
        "benchmarks", parents=[common], help="the benchmarks eval --benchmark scores: env, grader, source, size"
    )
    benchmarks.add_argument("--json", action="store_true", help="a JSON list, with each benchmark's prompt format")
    # `rllm-gym train ...` is handed to the trainer before this parser runs (see main); listed here for --help.
    commands.add_parser(
        "train",
        add_help=False,
        help="GRPO training: python -m rllm_gym.train.grpo with the same flags (rllm-gym train --help lists them)",
    )

    add_eval_parser(commands, common)
    add_view_parser(commands, common)
    add_gateway_parser(commands, common)
    add_serve_parser(commands, common)
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


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, but an unknown flag is a usage error that names the closest known one."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        flags = [option for action in commands_of(parser)[args.command]._actions for option in action.option_strings]
        flag = next((item for item in unknown if item.startswith("-")), unknown[0])
        close = difflib.get_close_matches(flag.split("=")[0], flags, n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; see rllm-gym {args.command} --help"
        commands_of(parser)[args.command].error(f"unrecognized argument {flag}{hint}")  # its usage, not the top one
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
    if args.command == "benchmarks":
        list_benchmarks(args.json)
        return 0
    # A usage error of a subcommand prints that subcommand's usage (argparse: exit status 2).
    command = commands_of(parser)[args.command]
    if args.command == "view":
        return run_view(command, args)
    if args.command == "gateway":
        return run_gateway_command(command, args)
    if args.command == "serve":
        return run_serve(args)
    return run_eval_command(command, args)


def run_train(argv: list[str]) -> int:
    """``rllm-gym train ARGS`` is ``python -m rllm_gym.train.grpo ARGS``: the same flags, messages and exit status."""
    from rllm_gym.train.command import train_command

    return train_command(argv, prog="rllm-gym train")


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


def list_benchmarks(as_json: bool) -> None:
    """Print every benchmark of :data:`rllm_gym.benchmarks.BENCHMARKS` (``--json``: each one's whole card)."""
    from rllm_gym.benchmarks import BENCHMARKS

    cards = [bench.card() for bench in BENCHMARKS]
    if as_json:
        print(json.dumps(cards, indent=2))
        return
    table = [("name", "env", "answer format", "grader", "metric", "size", "source (hub data set:split@revision)")]
    for card in cards:
        grader = card["grader"].split(" (")[0].rpartition(".")[2]  # the class, or the words before the details
        metric = card["metric"].split(" (")[0]
        table.append(
            (card["name"], card["env"], card["answer_format"], grader, metric, str(card["size"]), card["source"])
        )
    widths = [max(len(line[column]) for line in table) for column in range(6)]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line[:6], widths, strict=True)) + "  " + line[6])


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
        parser.error(f"{args.path} is not a file: pass an episode JSONL file written by eval --out")
    selection = Selection(args.index, args.range, tuple(args.id or ()), args.task, args.reason)
    # Model text may hold anything: no emoji codes, no highlighting (markup is never parsed, see rllm_gym.view).
    console = Console(emoji=False, highlight=False)
    try:
        shown = view(args.path, selection, console, brief=args.brief)
    except SelectionError as error:
        parser.error(f"{args.path}: {error}")
    if not shown and args.reason:  # an answer, not a failure: none of them ended that way
        print(f"rllm-gym view: no selected episode of {args.path} ended with reason {args.reason!r}", file=sys.stderr)
        return 0
    if not shown:
        print(f"rllm-gym view: nothing to show in {args.path}: it holds no episodes", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
