"""The math benchmarks read from fixture files in each hub layout: their reference answers score 1.0 through the
benchmark's env and grader, a wrong answer 0.0, and each task is posed in the benchmark's recorded prompt format."""

from __future__ import annotations

from pathlib import Path

import pytest

from rllm_gym.benchmarks import benchmark, load_benchmark
from rllm_gym.benchmarks.math import MATH_PROMPT
from rllm_gym.registry import make

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "benchmarks"
SIZES = {"gsm8k": 3, "math500": 4, "aime2024": 2, "aime2025": 2, "amc2023": 2}


@pytest.mark.parametrize("name", sorted(SIZES))
def test_reference_answers_score_one_and_wrong_answers_zero(name):
    bench = benchmark(name)
    tasks = load_benchmark(name, FIXTURES)
    assert len(tasks) == SIZES[name]
    env = make(bench.env, **bench.env_args)
    for task in tasks:
        assert task["id"].startswith(f"{name}/")
        assert task["question"] == MATH_PROMPT.format(problem=task["problem"])
        env.reset(options={"task": task})
        _, reward, terminated, _, info = env.step(
            f"Working it out.\n\nThe answer is $\\boxed{{{task['ground_truth']}}}$."
        )
        assert (reward, info["is_correct"], terminated) == (1.0, True, True), (task["id"], info)
        env.reset(options={"task": task})
        _, reward, _, _, info = env.step("So the answer is $\\boxed{123456789}$.")
        assert (reward, info["is_correct"]) == (0.0, False), task["id"]


def test_rows_are_mapped_to_the_ground_truth_their_layout_holds():
    gsm8k = load_benchmark("gsm8k", FIXTURES)
    assert [task["ground_truth"] for task in gsm8k] == ["18", "3", "1000"]  # after '####', commas dropped
    amc = load_benchmark("amc2023", FIXTURES / "amc2023")
    assert [task["ground_truth"] for task in amc] == ["27", "0.75"]  # AMC 2023 stores answers as floats
    aime = load_benchmark("aime2025", FIXTURES / "aime2025" / "data" / "train-00000-of-00001.parquet")
    assert [(task["id"], task["ground_truth"]) for task in aime] == [("aime2025/1", "70"), ("aime2025/2", "117")]
    math500 = load_benchmark("math500", FIXTURES)
    assert math500[0]["id"] == "math500/test/precalculus/807.json"
    assert (math500[0]["level"], math500[0]["subject"]) == (2, "Precalculus")


def test_the_prompt_is_one_user_message_without_a_system_message():
    """The zero-shot format math reference numbers use: the instruction follows the problem in the user message."""
    from rllm_gym.registry import default_agent

    bench = benchmark("gsm8k")
    agent = default_agent(bench.env)(**bench.resolved_agent_args())
    agent.reset()
    task = load_benchmark("gsm8k", FIXTURES)[1]
    agent.update_from_env(task["question"], 0.0, False, {})
    assert agent.chat_completions == [
        {"role": "user", "content": bench.prompt.replace("{problem}", task["problem"])},
    ]
    assert bench.prompt.endswith("Please reason step by step, and put your final answer within \\boxed{}.")
