"""Run the README's main job (GRPO on FrozenLake with the tiny model, ``train/configs/demo_cpu.yaml``), time it, keep
its results in ``benchmarks/results/`` and render the README's sentence about it from them, so the README's demo
numbers are measured, not typed.

    python benchmarks/demo_cpu.py                 # run it (about 3 minutes on 2 cores), keep results, update README
    python benchmarks/demo_cpu.py --render-only   # re-render the README's sentence from the kept summary
    python benchmarks/demo_cpu.py --check         # exit 1 if the README's sentence differs from that rendering

The kept files: ``demo_cpu_summary.json`` (the job's own ``summary.json`` plus the whole command's wall time and the
machine) and ``demo_cpu_reward_curve.png`` (the job's reward curve).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from run_all import machine, replace_between  # noqa: E402  (shared with the benchmark table)

CONFIG = "train/configs/demo_cpu.yaml"
SUMMARY = HERE / "results" / "demo_cpu_summary.json"
CURVE = HERE / "results" / "demo_cpu_reward_curve.png"
README = ROOT / "README.md"
START, END = "<!-- demo:start -->", "<!-- demo:end -->"


def run_demo(timeout_s: float) -> dict[str, Any]:
    """The main job as the README gives it, in a fresh interpreter; its summary, the wall time and the machine."""
    with tempfile.TemporaryDirectory(prefix="rllm-gym-demo-") as tmp:
        command = [sys.executable, "-m", "rllm_gym.train.grpo", "--config", CONFIG, "--output_dir", tmp]
        about = machine()
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        wall_s = time.perf_counter() - start
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
            raise SystemExit(f"the main job exited with status {done.returncode}:\n{tail}")
        print(done.stdout.rstrip(), flush=True)
        summary = json.loads((Path(tmp) / "summary.json").read_text())
        n_tasks = sum(1 for line in (ROOT / "train" / "configs" / "frozenlake_demo_maps.jsonl").open() if line.strip())
        summary["demo"] = {"command": f"python -m rllm_gym.train.grpo --config {CONFIG}", "wall_s": round(wall_s, 1)}
        summary["demo"]["n_tasks"] = n_tasks
        summary["machine"] = about
        CURVE.parent.mkdir(exist_ok=True)
        shutil.copyfile(Path(tmp) / "reward_curve.png", CURVE)
    return summary


def render(summary: dict[str, Any]) -> str:
    """The README's sentence on the main job's measured outcome."""
    n = summary["demo"]["n_tasks"]
    (before,) = summary["greedy_before"].values()
    (after,) = summary["greedy_after"].values()
    window = summary["config"]["logging_steps"]
    minutes, seconds = divmod(round(summary["demo"]["wall_s"]), 60)
    return (
        f"Measured by `python benchmarks/demo_cpu.py` on {summary['machine']['date'][:10]} "
        f"({summary['machine']['cpu_count']} cores): greedy success {round(before * n)}/{n} before, "
        f"{round(after * n)}/{n} after, mean episode reward {summary['reward_first']:.2f} over the first {window} "
        f"steps and {summary['reward_last']:.2f} over the last {window}, {summary['train_seconds']:.0f} s of training "
        f"({minutes}:{seconds:02d} for the whole command)."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--render-only", action="store_true", help="re-render the README from the kept summary")
    mode.add_argument("--check", action="store_true", help="exit 1 if the README's sentence differs from it")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds the job may run (default 900)")
    args = parser.parse_args(argv)
    if args.render_only or args.check:
        summary = json.loads(SUMMARY.read_text())
    else:
        summary = run_demo(args.timeout)
        SUMMARY.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    readme = README.read_text()
    rendered = replace_between(readme, START, END, render(summary), "the main job's measured outcome")
    if args.check:
        if rendered != readme:
            print(
                f"README's main-job sentence differs from {SUMMARY}: run `python benchmarks/demo_cpu.py --render-only`"
            )
            return 1
        return 0
    README.write_text(rendered)
    print(render(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
