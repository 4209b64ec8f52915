"""Learning per sample of asynchronous GRPO: the README's main job (``train/configs/demo_cpu.yaml``) with
``--max_staleness`` K = 0, 1 and 2 for seeds 0, 1 and 2, and greedy success on its 64 held-out lakes at the same
number of samples (every run trains 220 steps of 8 lakes x 8 rollouts), so that K >= 1 can be compared with the
seed-to-seed spread of the synchronous trainer (K = 0), as issue 46 asks.

    nice -n 19 python benchmarks/async_heldout.py --staleness 0 --jobs 1     # K = 0, one at a time (~3 min each)
    nice -n 19 python benchmarks/async_heldout.py --staleness 1        # K = 1: 3 runs, 2 at a time (~6 min each)
    nice -n 19 python benchmarks/async_heldout.py --staleness 1 --seeds 0     # some runs, merged into the results
    nice -n 19 python benchmarks/async_heldout.py --modes truncate off   # other corrections (async_is_mode)
    OMP_NUM_THREADS=1 nice -n 19 python benchmarks/async_heldout.py       # on cores other work shares
    python benchmarks/async_heldout.py --report                        # print the comparison of the kept results

Each run is a fresh interpreter (``run_all.run_training``: the command a user types, in a temporary folder). Runs
finish into ``benchmarks/results/async_heldout.json`` one by one, merged with the runs already kept there (a run of the
same K, seed and correction replaces the kept one; runs kept before the correction was recorded ran ``truncate``), each
with the commit its runs started from (:func:`commit`: the async code may change after it), its wall time, the machine
and its load average at the start and the end: with two runs side by side the seconds are not a speed figure
(``bench_async.py`` measures speed); the held-out success is the figure (a run samples and trains the same whatever
runs beside it: each step is sampled by the weights it was handed over with). The main job's own K (``MAIN``: its
config's ``max_staleness`` with the default correction) is not run here: its runs are the main job's, which
``demo_cpu.py`` keeps for the same seeds in ``demo_cpu_summary.json``; the comparison takes them from there and names
that source (run ``demo_cpu.py`` first after a change of the recipe or the trainer). K = 0 runs once, whatever
``--modes`` (nothing to correct); two K = 0 runs side by side crawl on 2 cores (each synchronous trainer's torch
threads spin while the other's run: ~8 s a step against ~0.8 alone), so run them with ``--jobs 1``. A run that fails or
times out is said and left out, and the command then exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from demo_cpu import CONFIG, ENV_ID, SUMMARY, evaluation_curve  # noqa: E402  (the main job's command and curve)
from run_all import machine, run_training  # noqa: E402

from rllm_gym.train.config import load_config  # noqa: E402
from rllm_gym.train.off_policy import MODES, OffPolicyCorrection  # noqa: E402  (async_is_mode's values)

RESULTS = HERE / "results" / "async_heldout.json"
DEFAULT_MODE = OffPolicyCorrection.mode  # the default of train/config.py's async_is_mode too
MAIN = load_config(["--config", str(ROOT / CONFIG)])[0].max_staleness  # the main job's K: demo_cpu.py's (kept_main)
STALENESS = tuple(k for k in (0, 1, 2) if k != MAIN)
SEEDS = (0, 1, 2)
ASYNC_METRICS = ("async/staleness_mean", "async/staleness_max", "async/dropped_rows", "async/is_clipped")
# Per logged step, what shows a collapse as it happens: the reward, the entropy and the bonus TRL's adaptive control
# puts on it, the sampler-trainer mismatch and the share of replies cut at the length limit.
TRACE_METRICS = {
    "reward": "reward",
    "entropy": "entropy",
    "entropy_coef": "entropy_coef",
    "mismatch": "async/mismatch",
    "too_long": "rollout/termination/max_response_length_exceeded",
}


def commit() -> str:
    """The checkout's commit, ``-dirty`` when its tracked files differ from it, the results under
    ``benchmarks/results/`` aside (this script writes one of them after each run: its later runs ran the same code)."""
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    name = head.stdout.strip() or "unknown"
    return f"{name}-dirty" if changed.stdout.strip() else name


def one_run(staleness: int, seed: int, mode: str, timeout_s: float, code: str) -> dict[str, Any]:
    """The main job with ``--max_staleness staleness --seed seed --async_is_mode mode``: its held-out curve, result
    and async metrics, with ``code`` (:func:`commit` as the runs started) as its commit."""
    flags = ("--seed", str(seed), "--max_staleness", str(staleness), "--async_is_mode", mode)
    label = f"the main job (K={staleness}, {mode})"
    summary, records, wall_s, about = run_training(CONFIG, timeout_s, None, label, flags)
    config = summary["config"]
    if (config["seed"], config["max_staleness"], config["async_is_mode"]) != (seed, staleness, mode):
        raise SystemExit(
            f"the main job ran with seed {config['seed']}, max_staleness {config['max_staleness']}, "
            f"async_is_mode {config['async_is_mode']}"
        )
    logged = [record for record in records if "async/staleness_mean" in record]
    return {
        "max_staleness": staleness,
        "seed": seed,
        "async_is_mode": mode,
        "commit": code,
        "wall_s": round(wall_s, 1),
        "train_seconds": summary["train_seconds"],
        "machine": about,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),  # 1 on shared cores: waiting threads spin otherwise
        "load_average_end": round(os.getloadavg()[0], 2),
        "steps": config["max_steps"],
        "samples": config["max_steps"] * config["prompts_per_step"] * config["num_generations"],
        "heldout_before": summary["heldout_before"][ENV_ID],
        "heldout_after": summary["heldout_after"][ENV_ID],
        "evaluations": evaluation_curve(records),
        "termination_reasons": summary["termination_reasons"],  # a collapse shows here (e.g. every reply too long)
        "reward_first_last": [summary["reward_first"], summary["reward_last"]],
        "async": {name: max(record[name] for record in logged) for name in ASYNC_METRICS} if logged else {},
        "trace": trace(records),
    }


def trace(records: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The logged training steps' :data:`TRACE_METRICS` (rounded; a metric a step did not log is left out)."""
    return [
        {"step": record["step"]}
        | {name: round(record[key], 4) for name, key in TRACE_METRICS.items() if key in record}
        for record in records
        if "loss" in record
    ]


def mode_of(run: dict[str, Any]) -> str:
    """A kept run's correction: runs kept before the field was recorded ran the default of then, ``truncate``."""
    return run.get("async_is_mode", "truncate")


def kept() -> dict[str, Any]:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {"runs": [], "comparison": compare([])}


def keep(run: dict[str, Any], lock: threading.Lock) -> None:
    """Merge one finished run into the results file (replacing a kept run of the same K, seed and correction) and
    re-summarise."""
    key = (run["max_staleness"], run["seed"], mode_of(run))
    with lock:
        results = kept()
        runs = [old for old in results["runs"] if (old["max_staleness"], old["seed"], mode_of(old)) != key]
        runs = sorted([*runs, run], key=lambda entry: (mode_of(entry), entry["max_staleness"], entry["seed"]))
        results = {"measured_by": "`nice -n 19 python benchmarks/async_heldout.py`", "config": CONFIG, "runs": runs}
        results["comparison"] = compare(runs)
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")


def row_name(staleness: int, mode: str) -> str:
    """A comparison row's name: ``K=0`` (nothing to correct), else K and the correction."""
    return "K=0" if staleness == 0 else f"K={staleness} {mode}"


def kept_main() -> dict[str, Any]:
    """The main job's held-out results after training per seed as ``demo_cpu.py`` kept them, its row's name (its K
    and correction, from the runs' own configs) and the date and command that measured them."""
    demo = json.loads(SUMMARY.read_text())
    [(staleness, mode)] = {
        (run["summary"]["config"]["max_staleness"], run["summary"]["config"]["async_is_mode"]) for run in demo["runs"]
    }
    return {
        "name": row_name(staleness, mode),
        "source": f"benchmarks/results/{SUMMARY.name}, {demo['measured_by']} on {demo['machine']['date']}",
        "heldout_after": {run["seed"]: run["summary"]["heldout_after"][ENV_ID] for run in demo["runs"]},
    }


def compare(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per K and correction the held-out successes after training (seed order), and whether each K >= 1 lies within
    K = 0's seed-to-seed range (min to max over its seeds); the main job's row is the runs ``demo_cpu.py`` kept."""
    main = kept_main()
    after: dict[str, dict[int, float]] = {}
    for run in runs:
        after.setdefault(row_name(run["max_staleness"], mode_of(run)), {})[run["seed"]] = run["heldout_after"]
    after[main["name"]] = main["heldout_after"]  # a kept run of the main job's own K and correction: superseded
    table: dict[str, Any] = {f"{main['name']} source": main["source"]}
    baseline = sorted(after.get("K=0", {}).values())
    for name, by_seed in sorted(after.items()):
        values = [by_seed[seed] for seed in sorted(by_seed)]
        row: dict[str, Any] = {"seeds": sorted(by_seed), "heldout_after": values, "mean": sum(values) / len(values)}
        if name != "K=0" and len(baseline) >= 2:
            row["within_k0_range"] = all(baseline[0] <= value <= baseline[-1] for value in values)
            row["at_or_above_k0_min"] = all(value >= baseline[0] for value in values)
        table[name] = row
    return table


def report(results: dict[str, Any]) -> str:
    lines = []
    for name, row in results["comparison"].items():
        if not isinstance(row, dict):
            lines.append(f"{name}: {row}")
            continue
        lakes = ", ".join(f"{round(value * 64)}/64" for value in row["heldout_after"])
        extra = f" within K=0's range: {row['within_k0_range']}" if "within_k0_range" in row else ""
        lines.append(f"{name} seeds {row['seeds']}: held-out after {lakes}{extra}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--staleness", type=int, nargs="+", default=list(STALENESS), help=f"K values (default {STALENESS})"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="seeds (default 0 1 2)")
    parser.add_argument(
        "--modes",
        nargs="+",
        default=[DEFAULT_MODE],
        choices=MODES,
        help=f"async_is_mode values (default {DEFAULT_MODE})",
    )
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side (default 2)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds one run may take (default 3600)")
    parser.add_argument("--report", action="store_true", help="print the comparison of the kept results, run nothing")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if min(args.staleness) < 0:
        parser.error(f"--staleness takes K >= 0, got {args.staleness}")
    if MAIN in args.staleness and DEFAULT_MODE in args.modes:
        parser.error(
            f"--staleness {MAIN} with --modes {DEFAULT_MODE} is the main job itself ({CONFIG}), whose seeds "
            "`python benchmarks/demo_cpu.py` runs and keeps, and the comparison takes from there"
        )
    if not args.report:
        lock = threading.Lock()
        # K = 0 once, with the first of --modes recorded: it corrects nothing.
        grid = [(k, seed, mode) for mode in args.modes for k in args.staleness for seed in args.seeds]
        grid = [(k, seed, mode) for k, seed, mode in grid if k > 0 or mode == args.modes[0]]
        code = commit()  # the code every run starts from
        print(f"{len(grid)} runs, {args.jobs} at a time, commit {code}, {machine()}", flush=True)

        def run_and_keep(staleness: int, seed: int, mode: str) -> bool:
            name = f"{row_name(staleness, mode)} seed {seed}"
            try:
                run = one_run(staleness, seed, mode, args.timeout, code)
            except (SystemExit, subprocess.TimeoutExpired) as error:  # the others go on; this one is said, not kept
                print(f"{name} failed: {error}", flush=True)
                return False
            keep(run, lock)
            print(f"{name}: held-out {run['heldout_after']:.3f} in {run['wall_s']} s", flush=True)
            return True

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            finished = [future.result() for future in [pool.submit(run_and_keep, *run) for run in grid]]
    print(report(kept()))
    return 0 if args.report or all(finished) else 1


if __name__ == "__main__":
    sys.exit(main())
