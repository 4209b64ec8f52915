"""Throughput of rllm-gym's math grader against calling math-verify's parse + verify directly, in the same run.

The answer mix is 80% plain numbers (integers, decimals, simple fractions) and 20% LaTeX answers (fractions,
radicals, multiples of pi, intervals, and symbolic forms only math-verify decides), about half of them correct and
some of the correct ones written in another form than the ground truth. Both graders see the same (ground truth,
reply) pairs, one at a time on the calling thread; math-verify gets the ground truth wrapped in ``$...$`` as it
needs. The verdicts must be identical.

    python benchmarks/bench_math_reward.py            # 2000 answers
    python benchmarks/bench_math_reward.py --quick    # 200 answers, a few seconds (also RLLM_GYM_BENCH_QUICK=1)
    python benchmarks/bench_math_reward.py --json results.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import sys
import time
from fractions import Fraction
from pathlib import Path

from math_verify import parse, verify

from rllm_gym.rewards.math import MathGrader


def _plain(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(3)
    if kind == 0:
        gold = rng.randint(-50, 5000)
        answer = gold if rng.random() < 0.5 else gold + rng.choice([-10, -1, 1, 2, 100])
        text = f"{answer:,}" if abs(answer) >= 1000 and rng.random() < 0.3 else str(answer)
        return str(gold), text
    if kind == 1:
        gold = rng.randint(1, 9999) / 100
        answer = gold if rng.random() < 0.5 else round(gold + rng.choice([0.01, 0.1, 1.0]), 2)
        return f"{gold:g}", f"{answer:g}"
    value = Fraction(rng.randint(1, 30), rng.randint(2, 12))
    gold = f"{value.numerator}/{value.denominator}" if value.denominator > 1 else str(value.numerator)
    right = rng.random() < 0.5
    answer = value if right else value + Fraction(1, rng.randint(2, 9))
    if value.denominator in (2, 4, 5, 8, 10) and rng.random() < 0.5:
        return gold, f"{float(answer):g}"  # the same number written as a decimal
    return gold, f"{answer.numerator}/{answer.denominator}" if answer.denominator > 1 else str(answer.numerator)


def _latex(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(6)
    right = rng.random() < 0.5
    if kind == 0:
        n, d = rng.randint(1, 20), rng.randint(2, 15)
        forms = (
            [f"\\frac{{{n}}}{{{d}}}", f"\\dfrac{{{n}}}{{{d}}}", f"{n}/{d}"] if right else [f"\\frac{{{n + 1}}}{{{d}}}"]
        )
        return f"\\frac{{{n}}}{{{d}}}", rng.choice(forms)
    if kind == 1:
        k, m = rng.randint(2, 9), rng.choice([2, 3, 5, 6, 7])
        forms = (
            [f"{k}\\sqrt{{{m}}}", f"\\sqrt{{{k * k * m}}}"]
            if right
            else [f"{k + 1}\\sqrt{{{m}}}", f"{k}\\sqrt{{{m + 1}}}"]
        )
        return f"{k}\\sqrt{{{m}}}", rng.choice(forms)
    if kind == 2:
        k = rng.randint(2, 12)
        forms = [f"\\frac{{\\pi}}{{{k}}}", f"\\pi/{k}"] if right else [f"\\frac{{\\pi}}{{{k + 1}}}"]
        return f"\\frac{{\\pi}}{{{k}}}", rng.choice(forms)
    if kind == 3:
        a, b = sorted(rng.sample(range(-20, 20), 2))
        return f"[{a}, {b})", f"[{a},{b})" if right else f"({a},{b})"
    # Symbolic forms no fast path decides: math-verify grades these.
    if kind == 4:
        m = rng.choice([2, 3, 5, 6, 7])
        return f"\\frac{{\\sqrt{{{m}}}}}{{{m}}}", f"\\frac{{1}}{{\\sqrt{{{m if right else m + 1}}}}}"
    k = rng.randint(2, 9)
    return f"x^2+{k}x", f"x(x+{k})" if right else f"x^2+{k + 1}x"


def make_mix(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` (ground truth, reply) pairs: 80% plain numbers, 20% LaTeX."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        gold, answer = (_plain if rng.random() < 0.8 else _latex)(rng)
        pairs.append((gold, f"Working through it step by step, the result is \\boxed{{{answer}}}."))
    return pairs


def run(n: int, seed: int = 0) -> dict:
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    pairs = make_mix(n, seed)
    grader = MathGrader()
    for gold, reply in make_mix(20, seed + 1):  # warm up both: worker start-up and imports are not throughput
        grader({"ground_truth": gold}, reply)
        verify(parse(f"${gold}$"), parse(reply))

    start = time.perf_counter()
    baseline = [bool(verify(parse(f"${gold}$"), parse(reply))) for gold, reply in pairs]
    baseline_s = time.perf_counter() - start

    start = time.perf_counter()
    outputs = [grader({"ground_truth": gold}, reply) for gold, reply in pairs]
    ours_s = time.perf_counter() - start

    ours = [bool(out.is_correct) for out in outputs]
    mismatches = [(g, r, b) for (g, r), b, o in zip(pairs, baseline, ours, strict=False) if b != o]
    paths: dict[str, int] = {}
    for out in outputs:
        paths[out.metadata["path"]] = paths.get(out.metadata["path"], 0) + 1
    return {
        "benchmark": "math_reward",
        "n_answers": n,
        "mix": "80% plain numbers, 20% LaTeX",
        "math_verify_answers_per_s": n / baseline_s,
        "ours_answers_per_s": n / ours_s,
        "speedup": baseline_s / ours_s,
        "math_verify_ms_per_answer": 1e3 * baseline_s / n,
        "ours_ms_per_answer": 1e3 * ours_s / n,
        "identical_verdicts": not mismatches,
        "mismatches": [{"ground_truth": g, "reply": r, "math_verify": b} for g, r, b in mismatches[:20]],
        "n_correct": sum(ours),
        "paths": paths,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=None, help="number of answers (default 2000, 200 with --quick)")
    parser.add_argument("--quick", action="store_true", help="a bounded run of a few seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    quick = args.quick or os.environ.get("RLLM_GYM_BENCH_QUICK", "") not in ("", "0")
    result = run(args.n or (200 if quick else 2000), args.seed)
    print(f"math grading, {result['n_answers']} answers ({result['mix']})")
    print(
        f"  math-verify parse+verify: {result['math_verify_answers_per_s']:9.0f} answers/s "
        f"({result['math_verify_ms_per_answer']:.3f} ms/answer)"
    )
    print(
        f"  rllm-gym MathGrader:      {result['ours_answers_per_s']:9.0f} answers/s "
        f"({result['ours_ms_per_answer']:.3f} ms/answer)"
    )
    print(
        f"  speedup: {result['speedup']:.1f}x   identical verdicts: {result['identical_verdicts']}   "
        f"paths: {result['paths']}"
    )
    for mismatch in result["mismatches"]:
        print(f"  MISMATCH {mismatch}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["identical_verdicts"] else 1


if __name__ == "__main__":
    sys.exit(main())
