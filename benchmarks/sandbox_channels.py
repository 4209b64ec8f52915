"""What crosses from a hidden-test run to a run the model sees, by timing, with the sandbox's run gate off and on.

Run: ``python benchmarks/sandbox_channels.py [--trials 60] [--json benchmarks/results/sandbox_channels.json]``.

Two attacks, each a random secret bit per trial, held by a ``verdict`` run (what a hidden test's run of model code
holds) and decoded from the output of a ``visible`` run (what public-test feedback or a ``python`` tool call shows):

* ``cpu``: the verdict run loads every CPU (twelve forked busy loops per CPU) for 0.5 s for a bit of 1 and sleeps for a
  0; a visible run submitted right after it spins for 0.3 s and prints the share of a CPU it got (its CPU time over
  the wall-clock time).
* ``wall_clock``: the verdict run sleeps 0.21 s for a 0 and 0.31 s for a 1; a visible run before it and one after it
  print ``time.time()`` (a model sees both, in two revisions' feedback), and the gap is decoded. Both durations are
  within one release level of the gate (0.2-0.4 s).
* ``wall_clock_levels``: the same with 0.05 s and 0.45 s, levels apart: what the gate leaves, one bit of
  the ``log2(levels)`` a verdict run can carry by choosing its level.

A decoder picks the threshold that best separates the bits on the first half of the trials (the attacker's
calibration) and is scored on the second half. ``bits_per_run`` is the capacity of a binary symmetric channel with
that error rate, ``1 - H(error)`` (0 at chance; clipped to 0 when the accuracy is below one half); ``bits_per_episode``
multiplies it by ``--runs-per-episode`` (verdict runs whose timing a model's visible runs can observe in one episode,
default 3: Code-v0 with ``max_revisions=3``). The ``gate off`` side sets the private switch ``_gate.GATE.enabled``
(for this measurement only; never for training). ``cost`` times episodes of Code-v0's shape (a visible run, then a
verdict run) with several at once, gate off and on. The machine's load changes the figures: the JSON says how many
CPUs were idle.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _measure import write_json

from rllm_gym.sandbox import Sandbox, _gate

_BUSY = """import os, time
end = time.time() + {seconds}
workers = []
for _ in range({workers} - 1):
    pid = os.fork()
    if pid == 0:
        while time.time() < end:
            pass
        os._exit(0)
    workers.append(pid)
while time.time() < end:
    pass
for pid in workers:
    os.waitpid(pid, 0)
"""
_SLEEP = "import time\ntime.sleep({seconds})\n"
_COUNT = """import time
start, cpu = time.perf_counter(), time.process_time()
while time.perf_counter() < start + 0.3:
    pass
print((time.process_time() - cpu) / (time.perf_counter() - start))
"""
_CLOCK = "import time\nprint(repr(time.time()))\n"


def _value(result: Any) -> float:
    assert result.ok, result
    return float(result.stdout.strip())


def cpu_trial(box: Sandbox, bit: int, cpus: int) -> float:
    program = _BUSY.format(seconds=0.5, workers=12 * cpus) if bit else _SLEEP.format(seconds=0.5)
    verdict = box.submit(program, run_class="verdict", timeout=10)
    time.sleep(0.05)  # the verdict run has started (gate off) or holds its phase (gate on)
    count = _value(box.run(_COUNT, run_class="visible"))
    verdict.result()
    return count


def wall_clock_trial(box: Sandbox, bit: int, zero_s: float, one_s: float) -> float:
    before = _value(box.run(_CLOCK, run_class="visible"))
    assert box.run(_SLEEP.format(seconds=one_s if bit else zero_s), run_class="verdict").ok
    return _value(box.run(_CLOCK, run_class="visible")) - before


def decode(values: list[float], bits: list[int]) -> dict[str, float]:
    """Calibrate a threshold (and its direction) on the first half, score it on the second half."""
    half = len(values) // 2
    train = list(zip(values[:half], bits[:half], strict=True))
    test = list(zip(values[half:], bits[half:], strict=True))

    def accuracy(pairs: list[tuple[float, int]], threshold: float, sign: int) -> float:
        return sum((sign * (v - threshold) > 0) == bool(b) for v, b in pairs) / len(pairs)

    best = max(((t, s) for t, _ in train for s in (1, -1)), key=lambda ts: accuracy(train, *ts))
    held_out = accuracy(test, *best)
    error = 1 - held_out if held_out >= 0.5 else 0.5  # worse than chance carries nothing the attacker can use
    capacity = 1.0 if error == 0 else 1 + error * math.log2(error) + (1 - error) * math.log2(1 - error)
    return {"accuracy": round(held_out, 3), "bits_per_run": round(capacity, 3)}


def attack(box: Sandbox, name: str, trials: int, cpus: int) -> dict[str, float]:
    rng = random.Random(1234)
    bits = [rng.randrange(2) for _ in range(trials)]
    trials_by_name = {
        "cpu": lambda b: cpu_trial(box, b, cpus),
        "wall_clock": lambda b: wall_clock_trial(box, b, 0.21, 0.31),
        "wall_clock_levels": lambda b: wall_clock_trial(box, b, 0.05, 0.45),
    }
    trial = trials_by_name[name]
    values = [trial(bit) for bit in bits]
    ones = [v for v, b in zip(values, bits, strict=True) if b]
    zeros = [v for v, b in zip(values, bits, strict=True) if not b]
    return {
        **decode(values, bits),
        "median_bit_0": round(statistics.median(zeros), 4),
        "median_bit_1": round(statistics.median(ones), 4),
    }


def cost(box: Sandbox, episodes: int, at_once: int) -> float:
    """Seconds for ``episodes`` episodes of a visible run then a verdict run (trivial programs), ``at_once`` at a
    time."""

    def episode(_: int) -> None:
        assert box.run("print(sum(range(1000)))", run_class="visible").ok
        assert box.run("print(sum(range(1000)))", run_class="verdict").ok

    start = time.perf_counter()
    with ThreadPoolExecutor(at_once) as pool:
        list(pool.map(episode, range(episodes)))
    return round(time.perf_counter() - start, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=60, help="secret bits per attack and side (default 60)")
    parser.add_argument("--runs-per-episode", type=int, default=3, help="verdict runs one episode observes")
    parser.add_argument("--json", default=str(Path(__file__).parent / "results" / "sandbox_channels.json"))
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0))
    results: dict[str, Any] = {
        "cpus": cpus,
        "load_average_1min": round(os.getloadavg()[0], 2),
        "trials": args.trials,
        "runs_per_episode": args.runs_per_episode,
        "grid_s": _gate.GRID_S,
        # A verdict run of a 5 s timeout ends by 5 s (or, at worst, the host's watchdog 30 s later).
        "wall_clock_bound_bits_per_run_5s_timeout": round(_gate.bits_per_run(5.0), 3),
        "wall_clock_bound_bits_per_run_60s_timeout": round(_gate.bits_per_run(60.0), 3),
    }
    with Sandbox(max_parallel=max(4, cpus)) as box:
        box.run("pass", run_class="visible")  # the zygote's start is not part of any trial
        for side, enabled in (("gate_off", False), ("gate_on", True)):
            _gate.GATE.enabled = enabled
            try:
                for name in ("cpu", "wall_clock", "wall_clock_levels"):
                    row = attack(box, name, args.trials, cpus)
                    row["bits_per_episode"] = round(row["bits_per_run"] * args.runs_per_episode, 3)
                    results[f"{name}/{side}"] = row
                    print(f"{name:10s} {side:8s} {row}", flush=True)
                results[f"cost_s/{side}"] = cost(box, episodes=32, at_once=8)
                seconds = results[f"cost_s/{side}"]
                print(f"cost       {side:8s} 32 episodes (a visible run, a verdict run), 8 at once: {seconds} s")
            finally:
                _gate.GATE.enabled = True
    results["load_average_1min_after"] = round(os.getloadavg()[0], 2)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
