"""Executions per second of a trivial program: the sandbox (all isolation on) vs a bare ``python -c`` subprocess.

Run: ``python benchmarks/bench_sandbox.py [--quick] [--runs N] [--json PATH]``. Three sides run the same program one
at a time (sequential) and with the same number of runs in flight (concurrent): a bare ``python -c`` subprocess, the
sandbox with every isolation layer on, and the same sandbox runner with the isolation layers off
(``Sandbox(isolate=False, strict=False)``: the zygote's forks, rlimits and scrubbed environment only). The ratio is
sandbox throughput over bare throughput in the same mode (the goal is >= 3); the cost of isolation itself is the
per-run time with the layers on minus the time with them off.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from rllm_gym.sandbox import Sandbox

PROGRAM = "print(sum(range(100)))"


def bare_run() -> None:
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True)
    assert result.stdout == "4950\n"


def throughput(run_once, runs: int, parallel: int, budget_s: float) -> tuple[float, int]:
    """Runs per second over at most ``runs`` runs or ``budget_s`` seconds, whichever ends first."""
    done = 0
    start = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        while done < runs and time.perf_counter() - start < budget_s:
            batch = min(parallel, runs - done)
            list(pool.map(lambda _: run_once(), range(batch)))
            done += batch
    return done / (time.perf_counter() - start), done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds in all (each phase capped at ~1 s)")
    parser.add_argument("--runs", type=int, default=300, help="runs per phase (default 300)")
    parser.add_argument("--parallel", type=int, default=4, help="runs in flight in the concurrent phases")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()
    budget = 1.0 if args.quick else 60.0
    runs = min(args.runs, 100) if args.quick else args.runs

    with (
        Sandbox(max_parallel=args.parallel) as sandbox,
        Sandbox(max_parallel=args.parallel, isolate=False, strict=False) as open_box,
    ):
        sandbox.start()
        open_box.start()

        def runner(box: Sandbox):
            def run_once() -> None:
                result = box.run(PROGRAM)
                assert result.ok and result.stdout == "4950\n", result

            return run_once

        sandbox_run, open_run = runner(sandbox), runner(open_box)
        sandbox_run()  # warm
        open_run()
        bare_run()
        results = {"isolation": sandbox.isolation, "program": PROGRAM, "parallel": args.parallel}
        for mode, parallel in (("sequential", 1), ("concurrent", args.parallel)):
            bare, bare_n = throughput(bare_run, runs, parallel, budget)
            boxed, boxed_n = throughput(sandbox_run, runs, parallel, budget)
            layers_off, off_n = throughput(open_run, runs, parallel, budget)
            cost_ms = 1000 / boxed - 1000 / layers_off
            results[mode] = {
                "bare_per_s": round(bare, 1),
                "sandbox_per_s": round(boxed, 1),
                "layers_off_per_s": round(layers_off, 1),
                "bare_runs": bare_n,
                "sandbox_runs": boxed_n,
                "layers_off_runs": off_n,
                "ratio": round(boxed / bare, 2),
                "isolation_cost_ms": round(cost_ms, 2),
            }
            print(
                f"{mode:>10}: bare python -c {bare:7.1f}/s ({1000 / bare:5.1f} ms)   sandbox {boxed:7.1f}/s "
                f"({1000 / boxed:5.1f} ms)   ratio {boxed / bare:.2f}x   layers off {layers_off:7.1f}/s "
                f"(isolation costs {cost_ms:+.2f} ms a run)"
            )
    print(f"isolation: {', '.join(results['isolation'])}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
