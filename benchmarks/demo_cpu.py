"""Run the README's main job (GRPO on FrozenLake lakes drawn fresh, ``train/configs/demo_cpu.yaml``) for seeds 0, 1
and 2, time it, keep its results in ``benchmarks/results/`` and render the README's sentence about it from them, so
the README's demo numbers are measured, not typed, and say what any of those seeds gives, not what one seed gave.

    python benchmarks/demo_cpu.py                 # run it (3 runs, about 5 minutes each on 2 cores), update README
    python benchmarks/demo_cpu.py --render-only   # re-render the README's sentence from the kept summary
    python benchmarks/demo_cpu.py --check         # exit 1 if the README's sentence differs from that rendering

Each seed runs in a fresh interpreter, one after the other (the job's own seconds are the figure: runs side by side
would share the cores). The kept files: ``demo_cpu_summary.json`` (per seed the job's own ``summary.json``, its
evaluations, the command's wall time and the machine; the blind baseline on the held-out lakes; the whole benchmark's
time) and ``demo_cpu_reward_curve.png`` (seed 0's reward and evaluation curve). ``tests/test_demo_cpu.py`` runs the
median seed again and fails when its held-out success falls below the floor rendered here (:func:`claimed_floor`).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from run_all import run_training, sentence_command  # noqa: E402  (shared with the benchmark table)

CONFIG = "train/configs/demo_cpu.yaml"
COMMAND = f"python -m rllm_gym.train.grpo --config {CONFIG}"
SEEDS = (0, 1, 2)
TARGET = 0.60  # held-out greedy success the main job is meant to reach for every seed (issue 33)
ENV_ID = "rllm/FrozenLake-v0"
SUMMARY = HERE / "results" / "demo_cpu_summary.json"
CURVE = HERE / "results" / "demo_cpu_reward_curve.png"
README = ROOT / "README.md"
START, END = "<!-- demo:start -->", "<!-- demo:end -->"


def run_demo(timeout_s: float) -> dict[str, Any]:
    """The main job as the README gives it, once per seed in a fresh interpreter: each summary, evaluation curve,
    wall time and machine, and the blind baseline the trainer computed on the held-out lakes."""
    start = time.perf_counter()
    runs = []
    for seed in SEEDS:
        flags = () if seed == 0 else ("--seed", str(seed))  # seed 0 is the config's own: the README's command as is
        summary, records, wall_s, about = run_training(
            CONFIG, timeout_s, CURVE if seed == 0 else None, f"the main job (--seed {seed})", flags
        )
        if summary["config"]["seed"] != seed:
            raise SystemExit(f"the main job ran with seed {summary['config']['seed']}, not {seed}")
        runs.append(
            {
                "seed": seed,
                "wall_s": round(wall_s, 1),
                "machine": about,
                "evaluations": evaluation_curve(records),
                "summary": summary,
            }
        )
    baselines = {run["summary"]["heldout_blind_baseline"][ENV_ID] for run in runs}
    if len(baselines) != 1:  # the same lakes and turn limit for every seed: one figure
        raise SystemExit(f"the seeds' runs disagree on the blind baseline: {sorted(baselines)}")
    first = runs[0]["summary"]
    return {
        "measured_by": "`python benchmarks/demo_cpu.py`",
        "command": COMMAND,
        "seeds": list(SEEDS),
        "n_heldout": first["split"]["envs"][ENV_ID]["eval_tasks"],
        "blind_baseline": first["heldout_blind_baseline"][ENV_ID],
        "blind_moves": first["heldout_blind_moves"][ENV_ID],
        "total_wall_s": round(time.perf_counter() - start, 1),
        "machine": runs[0]["machine"],
        "runs": runs,
    }


def evaluation_curve(records: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The run's evaluations (before, every ``eval_steps``, after): step, seconds of training, greedy success held
    out and on training lakes."""
    return [
        {
            "step": record["step"],
            "elapsed_s": round(record["elapsed_s"], 1),
            "heldout": record["eval_heldout/greedy"],
            "train": record.get("eval_train/greedy"),
        }
        for record in records
        if "eval_heldout/greedy" in record
    ]


def solved(results: dict[str, Any], key: str) -> list[int]:
    """Lakes solved per seed, in seed order: ``key`` is a summary field (``heldout_after``, ``greedy_before``...)."""
    n = results["n_heldout"] if key.startswith("heldout") else results["runs"][0]["summary"]["config"]["eval_limit"]
    return [round(run["summary"][key][ENV_ID] * n) for run in results["runs"]]


def heldout_range(results: dict[str, Any]) -> tuple[int, int]:
    """The range of held-out lakes solved after training over the kept seeds: the README states it and
    ``tests/test_demo_cpu.py`` holds a fresh run to it."""
    after = solved(results, "heldout_after")
    return min(after), max(after)


def claimed_floor(results: dict[str, Any]) -> int:
    """The held-out lakes the README claims any run of the kept seeds solves, and ``tests/test_demo_cpu.py`` holds a
    fresh run to: the issue's target (``TARGET`` of them) when every kept seed reached it, else the lowest kept
    result. Below the lowest measured result on purpose: another CPU's kernels round differently, and the run's
    outcome moves by a few lakes with them."""
    return min(min(solved(results, "heldout_after")), math.ceil(TARGET * results["n_heldout"]))


def median_seed(results: dict[str, Any]) -> int:
    """The seed whose held-out result is the median of the kept ones (the CI guard's run: room on both sides)."""
    after = solved(results, "heldout_after")
    order = sorted(range(len(after)), key=lambda i: after[i])
    return results["runs"][order[len(order) // 2]]["seed"]


def spread(values: list[int], n: int) -> str:
    """``12/64`` when every seed gives it, else ``the median/n (low-high over the seeds)``."""
    if min(values) == max(values):
        return f"{values[0]}/{n} for every seed"
    return f"{round(statistics.median(values))}/{n} (median; {min(values)}/{n} to {max(values)}/{n})"


def clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}:{rest:02d}"


def render(results: dict[str, Any]) -> str:
    """The README's sentence on the main job's measured outcome over the kept seeds."""
    n = results["n_heldout"]
    seeds = [run["seed"] for run in results["runs"]]
    low, high = heldout_range(results)
    train_s = [run["summary"]["train_seconds"] for run in results["runs"]]
    wall_s = [run["wall_s"] for run in results["runs"]]
    m = results["runs"][0]["summary"]["config"]["eval_limit"]
    load = max(run["machine"]["load_average_start"] for run in results["runs"])
    shared = (
        f" The cores were shared with other work (load average up to {load:.0f} at a run's start): the seconds are "
        "inflated."
        # Above the cores and a half: a seed's own run (one thread per core) leaves up to about one per core in the
        # 1-minute average at the next seed's start (2.02 on 2 idle cores), which is not other work.
        if load > results["machine"]["cpu_count"] + 0.5
        else ""
    )
    return (
        f"Measured by {results['measured_by']} on {results['machine']['date'][:10]} "
        f"({results['machine']['cpu_count']} cores), the command above with `--seed` "
        f"{', '.join(str(seed) for seed in seeds[:-1])} and {seeds[-1]}: greedy success on the {n} held-out lakes "
        f"{spread(solved(results, 'heldout_before'), n)} before training and "
        f"{spread(solved(results, 'heldout_after'), n)} after, every seed within {low}/{n} to {high}/{n}, where the "
        f"best fixed move sequence, blind to the grid ({', '.join(results['blind_moves'])}), solves "
        f"{round(results['blind_baseline'] * n)}/{n} (CI runs `--seed {median_seed(results)}` again and fails below "
        f"{claimed_floor(results)}/{n} or at the blind baseline); on {m} of the lakes it trained on "
        f"{spread(solved(results, 'greedy_after'), m)} after; {statistics.median(train_s):.0f} s of training "
        f"(median; at most {max(train_s):.0f} s), {clock(statistics.median(wall_s))} for the whole command (median; "
        f"at most {clock(max(wall_s))})." + shared
    )


def main(argv: list[str] | None = None) -> int:
    description = __doc__.split("\n\n")[0]
    return sentence_command(argv, description, SUMMARY, run_demo, render, (START, END), 900.0)


if __name__ == "__main__":
    sys.exit(main())
