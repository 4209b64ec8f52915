"""reasoning-gym suites as benchmarks: fixed mixes of reasoning-gym's generators, one suite per category of its own
(arithmetic, algebra, logic, graphs), drawn with seed 0 from the eval split of ``rllm/ReasoningGym-v0`` and scored by
each dataset's ``score_answer``. They are generated offline, so they read no data folder; their tasks depend on the
installed reasoning-gym version, which the results record. The prompt is reasoning-gym's own ``default`` system
prompt with the answer in ``<answer></answer>`` tags, as its published evaluations use.
"""

from __future__ import annotations

from typing import Any

from rllm_gym.benchmarks.base import Benchmark, BenchmarkDataError

__all__ = ["REASONING_GYM_BENCHMARKS", "SUITES"]

TASKS_PER_DATASET = 25
SEED = 0
SUITES: dict[str, tuple[str, ...]] = {
    "arithmetic": (
        "basic_arithmetic",
        "chain_sum",
        "decimal_arithmetic",
        "fraction_simplification",
        "gcd",
        "lcm",
        "prime_factorization",
        "products",
    ),
    "algebra": ("complex_arithmetic", "polynomial_multiplication", "simple_equations"),
    # propositional_logic is left out: its scorer pays the premises restated (rllm/ReasoningGym-v0 refuses it).
    "logic": ("aiw", "circuit_logic", "knights_knaves", "syllogism"),
    "graphs": ("course_schedule", "family_relationships", "largest_island", "shortest_path"),
}


def env_args(datasets: tuple[str, ...]) -> dict[str, Any]:
    mix = {name: 1.0 for name in datasets}
    return {
        "dataset": mix,
        "split": "eval",
        "size": TASKS_PER_DATASET * len(datasets),
        "seed": SEED,
        "answer_format": "answer_tag",
    }


def system_prompt() -> dict[str, Any]:
    """reasoning-gym's ``default`` system prompt, read from the installed package."""
    try:
        from reasoning_gym.utils import SYSTEM_PROMPTS
    except ImportError:
        from rllm_gym.envs.reasoning_gym import INSTALL_HINT

        raise BenchmarkDataError(f"the reasoning-gym suites need the reasoning-gym package: {INSTALL_HINT}") from None
    return {"system_prompt": SYSTEM_PROMPTS["default"]}


def suite_tasks(suite: str, datasets: tuple[str, ...]) -> list[dict[str, Any]]:
    """The suite's tasks: the eval split of ``rllm/ReasoningGym-v0`` with the suite's mix, ids ``rg-<suite>/<i>``."""
    from rllm_gym.registry import make

    env = make("rllm/ReasoningGym-v0", **env_args(datasets))
    try:
        tasks = env.unwrapped.tasks
    finally:
        env.close()
    return [{**task, "id": f"rg-{suite}/{index}"} for index, task in enumerate(tasks)]


def _suite(suite: str, datasets: tuple[str, ...]) -> Benchmark:
    return Benchmark(
        name=f"rg-{suite}",
        title=f"reasoning-gym {suite} suite ({', '.join(datasets)})",
        env="rllm/ReasoningGym-v0",
        answer_format="<answer></answer> tags",
        grader="score_answer (each reasoning-gym dataset's own; sandboxed unless a plain string comparison)",
        metric="pass@1 over n samples, pass@k (correct: score 1.0)",
        source=f"reasoning-gym generators ({', '.join(datasets)}), eval split, seed {SEED}",
        size=TASKS_PER_DATASET * len(datasets),
        prompt="system: reasoning-gym's SYSTEM_PROMPTS['default'] (think step by step, then <answer>answer here"
        "</answer>)\nuser: {question}",
        env_args=env_args(datasets),
        agent_args=system_prompt,
        subsets=("dataset",),
        generate=lambda: suite_tasks(suite, datasets),
    )


REASONING_GYM_BENCHMARKS = tuple(_suite(suite, datasets) for suite, datasets in SUITES.items())
