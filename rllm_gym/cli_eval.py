"""``rllm-gym eval``: its options, their checks (each failure a usage error of ``rllm-gym eval``, exit status 2), the
policy it builds, the run and the summary it prints."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from rllm_gym.cli_gateway import add_agent_program_arguments, agent_program_engine, check_agent_program_args
from rllm_gym.types import DEFAULT_MAX_TURNS

POLICIES = ("hf", "openai", "vllm")
# Defaults of the options a model folder written by the trainer may set instead (rllm_gym_training.json).
EVAL_DEFAULTS: dict[str, Any] = {
    "env": "rllm/FrozenLake-v0",
    "agent_args": {},
    "env_args": {},
    "max_turns": DEFAULT_MAX_TURNS,
    "max_tokens": 256,
    "thinking": None,
    "chat_template_kwargs": {},
}
RECORDED = "; a --model folder written by the trainer gives its training value"
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
DEFAULT_TASKS = 16  # tasks drawn by seed when no --data file gives them


class DeprecatedAlias(argparse.Action):
    """An option's old name: stores into the new option's dest and says on stderr which flag to use instead."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option=None):
        new = "--" + self.dest.replace("_", "-")
        print(f"rllm-gym eval: {option} is deprecated and will be removed: use {new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def json_object_type(example: str) -> Any:
    """An argparse type for a JSON-object option: text that is not JSON, or JSON that is not an object, is a usage
    error in words a user knows (argparse itself would say "invalid loads value")."""

    def parse(text: str) -> dict[str, Any]:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not valid JSON ({error.msg}, column {error.colno}): write an object such as '{example}'"
            ) from None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object: write one such as '{example}'")
        return value

    parse.__name__ = "JSON object"
    return parse


def add_eval_parser(commands: Any, common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``eval`` to the subcommands; returns its parser."""
    run = commands.add_parser(
        "eval", parents=[common], help="run a policy on an env and print pass@k, rewards and turns"
    )
    run.add_argument("--env", help=f"a registered env id (default: {EVAL_DEFAULTS['env']}{RECORDED})")
    run.add_argument("--agent", help="agent class as module:Class (default: the env's registered agent)")
    run.add_argument(
        "--agent-args",
        type=json_object_type('{"system_prompt": "..."}'),
        help=f"JSON dict of agent arguments (default: {{}}{RECORDED})",
    )
    run.add_argument(
        "--env-args",
        type=json_object_type('{"size": 6}'),
        help=f"JSON dict of env arguments (default: {{}}{RECORDED})",
    )
    run.add_argument("--policy", choices=POLICIES, default="hf", help="inference backend (default: %(default)s)")
    run.add_argument("--model", help="model folder or name (default for hf: the embedded tiny model)")
    run.add_argument("--base-url", action="append", help="OpenAI-compatible API root; repeat for replicas")
    run.add_argument("--tokenizer", help="tokenizer folder or name for local token ids (openai policy)")
    run.add_argument("--data", type=Path, help="a JSONL file of task dicts (default: the env draws tasks by seed)")
    run.add_argument(
        "--tasks",
        type=int,
        help=f"number of tasks (default: every task of --data; without it, {DEFAULT_TASKS} seeds from --seed on)",
    )
    run.add_argument("--n", type=int, default=4, help="rollouts per task, the n of pass@k (default: %(default)s)")
    run.add_argument("--out", type=Path, help="episode JSONL file, appended as episodes finish")
    run.add_argument("--resume", action="store_true", help="continue an --out file: finished episodes are kept")
    run.add_argument("--max-turns", type=int, help=f"LLM calls per episode (default: 10{RECORDED})")
    run.add_argument(
        "--max-steps", type=int, dest="max_turns", action=DeprecatedAlias, help="deprecated name of --max-turns"
    )
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
        type=json_object_type('{"enable_thinking": false}'),
        help=f"JSON dict of chat template arguments, e.g. '{{\"enable_thinking\": false}}' (default: {{}}{RECORDED})",
    )
    run.add_argument("--seed", type=int, default=0, help="seed of sampling and env resets (default: %(default)s)")
    run.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    run.add_argument(
        "--benchmark",
        action="append",
        help="score a benchmark (rllm-gym benchmarks lists them) with its own env, prompt and grader; repeat for more",
    )
    run.add_argument(
        "--data-dir", type=Path, help="--benchmark's data offline: a local copy in the hub's layout (default: the hub)"
    )
    run.add_argument("--results", type=Path, help="--benchmark's results JSON file (settings, prompts, every figure)")
    run.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar on stderr (it is drawn only when stderr is a terminal; TQDM_DISABLE=1 also hides it)",
    )
    add_agent_program_arguments(run)
    return run


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


def check_eval_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Any]:
    """Every check of eval's options (a failure is a usage error, before a model loads); returns the tasks to run."""
    from rllm_gym.registry import UnknownEnvError, env_ids, env_spec

    check_agent_program_args(parser, args)
    try:
        env_spec(args.env)  # raises with the closest ids, as rllm_gym.make does
    except UnknownEnvError as error:
        parser.error(f"--env: {error}")
    for name in ("tasks", "n", "max_turns", "max_tokens", "n_parallel"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    # Checked here, before a model loads, so a typo costs a usage line rather than a traceback minutes later.
    if args.seed < 0:
        parser.error(f"--seed must be >= 0 (it seeds sampling and every env reset), got {args.seed}")
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
    if args.data and not args.data.is_file():
        parser.error(f"--data {args.data}: no such file (a JSONL file of task dicts)")
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
    return load_tasks(parser, args)  # read here: a bad line is a usage error before the model loads


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


def load_tasks(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Any]:
    """The tasks to run: every task of ``--data`` (the first ``--tasks`` of them when given, said on stderr), or
    ``--tasks`` reset seeds from ``--seed`` on."""
    if args.data is None:
        return list(range(args.seed, args.seed + (args.tasks or DEFAULT_TASKS)))
    from rllm_gym.data import JsonlError, read_jsonl

    try:
        tasks = read_jsonl(args.data)
    except JsonlError as error:
        parser.error(f"--data {error.path}:{error.line} is not valid JSON ({error.msg}): one task dict per line")
    except UnicodeDecodeError as error:
        parser.error(f"--data {args.data} is not UTF-8 text ({error.reason}): one JSON task dict per line")
    if not tasks:
        parser.error(f"--data {args.data} holds no tasks: one JSON task dict per line")
    if args.tasks is not None and args.tasks < len(tasks):
        print(
            f"rllm-gym eval: --tasks {args.tasks}: the first {args.tasks} of the {len(tasks)} tasks of {args.data}",
            file=sys.stderr,
        )
        return tasks[: args.tasks]
    return tasks


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


def run_eval(args: argparse.Namespace, tasks: list[Any], policy: Any = None) -> tuple[dict[str, Any], list[Any]]:
    """The summary of ``tasks`` x ``args.n`` episodes (with ``errors`` when episodes ended in ERROR), and the
    episodes; ``policy`` (a benchmark's: one policy for several runs) replaces the one the options give."""
    from rllm_gym.engine import engine_for
    from rllm_gym.engine.report import ErrorTally
    from rllm_gym.metrics import summarize
    from rllm_gym.policies.base import SamplingParams

    if args.policy == "openai":
        check_server(args)
    if not progress_shown(args):
        # transformers draws its "Loading weights" bar whether or not stderr is a terminal: off with eval's own bar.
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    policy = make_policy(args) if policy is None else policy
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
        max_turns=args.max_turns,
        tune_interpreter=True,  # the CLI's process runs nothing but this engine: its loop-lag figures need it
    )
    if args.agent_program:  # the program is the agent: it runs behind a gateway on the policy instead
        engine = agent_program_engine(args, policy, sampling)
    # disable=None: drawn only when stderr is a terminal, so logs and CI output get no carriage-return noise.
    bar = tqdm(
        total=len(tasks) * args.n,
        desc=f"eval {args.env}",
        unit="ep",
        dynamic_ncols=True,
        disable=None if progress_shown(args) else True,
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


def progress_shown(args: argparse.Namespace) -> bool:
    """Whether eval draws progress bars: only on a terminal, and neither --no-progress nor TQDM_DISABLE=1."""
    # TQDM_DISABLE is read here: tqdm's disable=None ("only on a terminal") passed explicitly would override it.
    disabled = args.no_progress or os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true")
    return not disabled and sys.stderr.isatty()


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


def run_eval_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``rllm-gym eval`` once parsed (``parser``: eval's own, for usage errors); its exit status."""
    if args.benchmark:
        from rllm_gym.benchmarks.run import run_benchmark_command

        return run_benchmark_command(parser, args)
    if args.data_dir is not None or args.results is not None:
        parser.error("--data-dir and --results go with --benchmark (--data is a task file for --env)")
    recorded = apply_training_record(args)
    if recorded:
        print(recorded, file=sys.stderr, flush=True)
    tasks = check_eval_args(parser, args)
    summary, episodes = run_eval(args, tasks)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary, Console())
    return 1 if report_failure(summary, episodes) else 0
