"""What scoring a reasoning-gym answer costs: in process (string scorers), sandboxed with reasoning-gym preloaded in
the zygote (what rllm/ReasoningGym-v0 does), and sandboxed with a fresh import per answer (what it would cost
without the preload).

Run: ``python benchmarks/reasoning_gym_scoring.py [--answers 20] [--json PATH]``. Each side scores the same answers
one after the other (the latency a single env.step sees) and reports the median and 90th percentile in ms.
"""

from __future__ import annotations

import argparse
import base64
import json
import pickle
import statistics
from typing import Any

import reasoning_gym
from _measure import timings_ms, write_json

from rllm_gym.envs.reasoning_gym import ReasoningGymScorer
from rllm_gym.rewards import reasoning_gym as scoring
from rllm_gym.sandbox import Sandbox


def _task(name: str) -> dict[str, Any]:
    entry = reasoning_gym.create_dataset(name, size=1, seed=0)[0]
    return {
        "question": entry["question"],
        "ground_truth": entry["answer"],
        "dataset": name,
        "metadata": entry["metadata"],
    }


def _time(score: Any, n: int) -> dict[str, float]:
    times = timings_ms(score, n)  # after a warm-up call: the sandbox's zygote starts on first use
    return {"median_ms": round(statistics.median(times), 1), "p90_ms": round(times[int(0.9 * (n - 1))], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=20)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results: dict[str, Any] = {}
    for name in ("gcd", "chain_sum", "puzzle24"):
        task = _task(name)
        dataset = reasoning_gym.create_dataset(name, size=1, seed=0)
        scorer = ReasoningGymScorer({name: dataset.score_answer}, configs={name: {}})
        side = "in_process" if scoring.runs_in_process(name, dataset.score_answer) else "sandbox_preloaded"
        reply = f"\\boxed{{{task['ground_truth']}}}"
        results[f"{name}/{side}"] = _time(
            lambda scorer=scorer, task=task, reply=reply: scorer(task, reply), args.answers
        )
    cold = Sandbox(max_parallel=2, read_view=True)  # no preload: every run imports reasoning-gym itself
    task = _task("chain_sum")
    entry = {"question": task["question"], "answer": task["ground_truth"], "metadata": task["metadata"]}
    request = {
        "dataset": "chain_sum",
        "config": {"size": 1, "seed": 0},
        "answer": task["ground_truth"],
        "entry": entry,
    }
    payload = base64.b64encode(pickle.dumps(request)).decode()
    run = lambda: cold.run(scoring.SCORING_HARNESS, stdin=payload, timeout=30, memory_mb=scoring.SCORE_MEMORY_MB)  # noqa: E731
    results["chain_sum/sandbox_cold_import"] = _time(run, max(3, args.answers // 4))
    cold.close()
    print(json.dumps(results, indent=2))
    write_json(args.json, results)


if __name__ == "__main__":
    main()
