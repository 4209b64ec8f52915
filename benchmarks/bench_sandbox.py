"""What isolation costs: the same programs fully isolated, with the isolation layers off, and as ``python -c``.

Run: ``python benchmarks/bench_sandbox.py [--quick] [--in-flight 1 4 16 64] [--json PATH]``. Each program runs on
three sides, with 1, 4, 16 and 64 runs in flight:

* ``isolated``: :class:`~rllm_gym.sandbox.Sandbox` with every isolation layer on (the default, strict);
* ``layers_off``: the same runner (the warm zygote's forks, rlimits, scrubbed environment, capture) with the
  namespace, view, uid, cgroup and seccomp layers off (``Sandbox(isolate=False, strict=False)``);
* ``bare``: a ``python -c`` subprocess, no sandbox at all.

The sides take turns, a block of runs each (:func:`measure`), so a load that changes during the benchmark (a shared
machine) weighs on all of them alike. The cost of isolation is ``isolated`` against ``layers_off`` (same runner, layers
on vs off). ``bare`` against ``layers_off`` is a different question: what the warm fork server saves over a cold
interpreter start, not what isolation costs. Programs: ``trivial`` (a print) and ``cpu`` (about 0.1 s of pure-Python
arithmetic), so the fixed cost per run shows next to a run whose own work dominates. Memory per run is the mean peak
RSS of the run's process (the sandbox's ``max_rss_mb``; ``wait4``'s for ``python -c``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _measure import write_json

from rllm_gym.sandbox import Sandbox

PROGRAMS = {
    "trivial": ("print(sum(range(100)))", "4950\n"),
    "cpu": ("total = 0\nfor i in range(1_500_000):\n    total += i * i % 7\nprint(total)", None),
}


def bare_run(program: str) -> tuple[str, float]:
    """Run ``python -c program``; its stdout and peak RSS in MB."""
    process = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    stdout = process.stdout.read().decode()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    process.stdout.close()
    assert process.returncode == 0, process.returncode
    return stdout, usage.ru_maxrss / 1024


def sandbox_run(box: Sandbox, program: str) -> tuple[str, float]:
    result = box.run(program, timeout=60, run_class="visible")  # one class: runs in parallel, released at once
    assert result.ok, result
    return result.stdout, result.max_rss_mb or 0.0


def measure(
    sides: dict[str, Callable[[str], tuple[str, float]]],
    program: str,
    expected: str,
    runs: int,
    in_flight: int,
    budget_s: float,
) -> dict[str, dict[str, float]]:
    """Each side's runs/s and mean peak RSS, ``in_flight`` runs at a time, in alternating rounds (a block of
    ``in_flight`` runs per side, the order reversed each round) until every side has done ``runs`` or ``budget_s``
    per side is spent: a change of the machine's load meanwhile falls on every side alike, so their ratio holds."""
    done = dict.fromkeys(sides, 0)
    seconds, rss = dict.fromkeys(sides, 0.0), dict.fromkeys(sides, 0.0)
    order = list(sides)
    start = time.perf_counter()
    with ThreadPoolExecutor(in_flight) as pool:
        while min(done.values()) < runs and time.perf_counter() - start < budget_s * len(sides):
            for side in order:
                block = time.perf_counter()
                for stdout, peak in pool.map(lambda _, run_once=sides[side]: run_once(program), range(in_flight)):
                    assert stdout == expected, stdout
                    rss[side] += peak
                seconds[side] += time.perf_counter() - block
                done[side] += in_flight
            order.reverse()
    return {
        side: {
            "per_s": round(done[side] / seconds[side], 1),
            "ms_per_run": round(1000 * seconds[side] / done[side], 2),
            "runs": done[side],
            "rss_mb": round(rss[side] / done[side], 1),
        }
        for side in sides
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about a minute in all (each phase capped at ~1.5 s)")
    parser.add_argument("--runs", type=int, default=256, help="most runs per phase (default 256)")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 4, 16, 64], help="runs in flight")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()
    budget = 1.5 if args.quick else 30.0
    most = max(args.in_flight)
    results: dict[str, Any] = {"in_flight": args.in_flight, "programs": {}, "cpu_count": os.cpu_count()}
    with (
        Sandbox(max_parallel=most) as isolated,
        Sandbox(max_parallel=most, isolate=False, strict=False) as open_box,
    ):
        isolated.start()
        open_box.start()
        sides = {
            "isolated": lambda program: sandbox_run(isolated, program),
            "layers_off": lambda program: sandbox_run(open_box, program),
            "bare": bare_run,
        }
        results["isolation"] = isolated.isolation
        print(f"{'program':>8} {'in flight':>9} {'side':>10} {'runs/s':>8} {'ms/run':>8} {'RSS MB':>7}")
        for name, (program, expected) in PROGRAMS.items():
            expected = expected if expected is not None else bare_run(program)[0]
            for run_once in sides.values():
                run_once(program)  # warm
            rows = []
            for in_flight in args.in_flight:
                row: dict[str, Any] = {"in_flight": in_flight}
                row.update(measure(sides, program, expected, args.runs, in_flight, budget))
                for side in sides:
                    m = row[side]
                    print(
                        f"{name:>8} {in_flight:>9} {side:>10} {m['per_s']:>8.1f} {m['ms_per_run']:>8.2f} "
                        f"{m['rss_mb']:>7.1f}"
                    )
                # Same runner, layers on vs off: the price of isolation, per run and as a throughput ratio.
                row["isolation_cost_ms"] = round(row["isolated"]["ms_per_run"] - row["layers_off"]["ms_per_run"], 2)
                row["isolated_vs_layers_off"] = round(row["isolated"]["per_s"] / row["layers_off"]["per_s"], 2)
                # Warm fork server vs a cold interpreter start: start-up savings, not an isolation figure.
                row["layers_off_vs_bare"] = round(row["layers_off"]["per_s"] / row["bare"]["per_s"], 2)
                rows.append(row)
                print(
                    f"{'':>8} {'':>9} isolation costs {row['isolation_cost_ms']:+.2f} ms a run "
                    f"({row['isolated_vs_layers_off']:.2f}x the layers-off throughput)"
                )
            results["programs"][name] = {"code": program, "rows": rows}
    results["load_average"] = round(os.getloadavg()[0], 2)
    print(f"isolation: {', '.join(results['isolation'])}; load average {results['load_average']}")
    write_json(args.json, results)


if __name__ == "__main__":
    main()
