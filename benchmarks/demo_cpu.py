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

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from run_all import run_training, sentence_command  # noqa: E402  (shared with the benchmark table)

CONFIG = "train/configs/demo_cpu.yaml"
SUMMARY = HERE / "results" / "demo_cpu_summary.json"
CURVE = HERE / "results" / "demo_cpu_reward_curve.png"
README = ROOT / "README.md"
START, END = "<!-- demo:start -->", "<!-- demo:end -->"


def run_demo(timeout_s: float) -> dict[str, Any]:
    """The main job as the README gives it, in a fresh interpreter; its summary, the wall time and the machine."""
    summary, _, wall_s, about = run_training(CONFIG, timeout_s, CURVE, "the main job")
    configs = ROOT / "train" / "configs"
    summary["demo"] = {"command": f"python -m rllm_gym.train.grpo --config {CONFIG}", "wall_s": round(wall_s, 1)}
    summary["demo"]["n_tasks"] = count_lines(configs / "frozenlake_demo_maps.jsonl")
    summary["demo"]["n_heldout"] = count_lines(configs / "frozenlake_heldout_lakes.jsonl")
    summary["machine"] = about
    return summary


def count_lines(path: Path) -> int:
    return sum(1 for line in path.open() if line.strip())


def render(summary: dict[str, Any]) -> str:
    """The README's sentence on the main job's measured outcome."""
    n, held = summary["demo"]["n_tasks"], summary["demo"]["n_heldout"]
    (before,) = summary["greedy_before"].values()
    (after,) = summary["greedy_after"].values()
    (held_before,) = summary["heldout_before"].values()
    (held_after,) = summary["heldout_after"].values()
    window = summary["config"]["logging_steps"]
    minutes, seconds = divmod(round(summary["demo"]["wall_s"]), 60)
    return (
        f"Measured by `python benchmarks/demo_cpu.py` on {summary['machine']['date'][:10]} "
        f"({summary['machine']['cpu_count']} cores): greedy success on the {n} training lakes "
        f"{round(before * n)}/{n} before, {round(after * n)}/{n} after; on {held} held-out random lakes it never "
        f"trains on {round(held_before * held)}/{held} before, {round(held_after * held)}/{held} after; mean episode "
        f"reward {summary['reward_first']:.2f} over the first {window} steps and {summary['reward_last']:.2f} over "
        f"the last {window}, {summary['train_seconds']:.0f} s of training ({minutes}:{seconds:02d} for the whole "
        f"command)."
    )


def main(argv: list[str] | None = None) -> int:
    description = __doc__.split("\n\n")[0]
    return sentence_command(argv, description, SUMMARY, run_demo, render, (START, END), 900.0)


if __name__ == "__main__":
    sys.exit(main())
