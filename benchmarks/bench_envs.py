"""FrozenLake reset+step cost: rllm/FrozenLake-v0 (text in, text out) against Gymnasium's FrozenLake-v1, same run.

Both envs play the same fixed 4x4 map with the same cycle of moves, resetting whenever an episode ends; the cost per
step counts those resets. Ours parses the action text and renders the grid as text on every step; Gymnasium's takes
an int and returns an int. The goal is a ratio (ours / Gymnasium) of at most 2.0.

    python benchmarks/bench_envs.py            # ~200k steps per variant
    python benchmarks/bench_envs.py --quick    # a few seconds
    python benchmarks/bench_envs.py --json results.json
"""

from __future__ import annotations

import argparse
import platform
import time

import gymnasium as gym
from _measure import write_json

import rllm_gym  # noqa: F401 - registers rllm/ ids

MAP = ["SFFF", "FHFH", "FFFH", "HFFG"]
TEXT_MOVES = ["down", "down", "right", "right", "down", "right", "Action: Left", "```up```"]
INT_MOVES = [1, 1, 2, 2, 1, 2, 0, 3]


def per_step_seconds(env: gym.Env, moves: list, options: dict | None, n_steps: int, repeats: int) -> float:
    """Best of ``repeats`` timings of ``n_steps`` steps (resets included), in seconds per step."""
    best = float("inf")
    for _ in range(repeats):
        env.reset(seed=0, options=options)
        n_moves = len(moves)
        start = time.perf_counter()
        for i in range(n_steps):
            _, _, terminated, truncated, _ = env.step(moves[i % n_moves])
            if terminated or truncated:
                env.reset(options=options)
        best = min(best, (time.perf_counter() - start) / n_steps)
    return best


def run(n_steps: int, repeats: int) -> dict:
    rows = []
    for slippery in (False, True):
        theirs = gym.make("FrozenLake-v1", desc=MAP, is_slippery=slippery, disable_env_checker=True).unwrapped
        ours = gym.make("rllm/FrozenLake-v0", is_slippery=slippery).unwrapped
        theirs_s = per_step_seconds(theirs, INT_MOVES, None, n_steps, repeats)
        ours_s = per_step_seconds(ours, TEXT_MOVES, {"task": {"map": MAP}}, n_steps, repeats)
        rows.append(
            {
                "variant": f"4x4 {'slippery' if slippery else 'deterministic'}",
                "gymnasium_us_per_step": theirs_s * 1e6,
                "rllm_gym_us_per_step": ours_s * 1e6,
                "ratio": ours_s / theirs_s,
            }
        )
    return {
        "benchmark": "bench_envs",
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine()},
        "n_steps": n_steps,
        "goal": "ratio <= 2.0",
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20k steps per variant instead of 200k")
    parser.add_argument("--json", metavar="PATH", help="also write the results to this JSON file")
    args = parser.parse_args()
    results = run(n_steps=20_000 if args.quick else 200_000, repeats=3)
    print(f"{'variant':<20} {'gymnasium us/step':>18} {'rllm-gym us/step':>17} {'ratio':>6}")
    for row in results["rows"]:
        print(
            f"{row['variant']:<20} {row['gymnasium_us_per_step']:>18.2f} {row['rllm_gym_us_per_step']:>17.2f} "
            f"{row['ratio']:>6.2f}"
        )
    write_json(args.json, results)


if __name__ == "__main__":
    main()
