"""The math benchmarks: GSM8K, MATH-500, AIME 2024, AIME 2025 and AMC 2023, scored by ``rllm/Math-v0``'s grader.

Each is posed in the zero-shot format their reported numbers use (DeepSeek-R1, Qwen2.5-Math, rLLM): the problem,
then "Please reason step by step, and put your final answer within \\boxed{}." as the one user message, without a
system message. The revisions are the data sets' hub commits these tasks are read from.
"""

from __future__ import annotations

from typing import Any

from rllm_gym.benchmarks.base import Benchmark, HubSource
from rllm_gym.data import map_math_row

__all__ = ["MATH_BENCHMARKS", "MATH_PROMPT"]

MATH_PROMPT = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
GRADER = "rllm_gym.rewards.math.MathGrader (exact, numeric, then math-verify equivalence)"
ANSWER = "\\boxed{} final answer"
METRIC = "pass@1 over n samples, pass@k (unbiased, Chen et al. 2021)"


def _posed(task: dict[str, Any], name: str, task_id: Any) -> dict[str, Any]:
    """The task with its id made unique across benchmarks and its question in the benchmark's prompt format."""
    task["id"] = f"{name}/{task_id}"
    task["problem"] = task["question"]
    task["question"] = MATH_PROMPT.format(problem=task["question"])
    task["data_source"] = name
    return task


def _number(value: Any) -> str:
    """An answer column's value as text: ``27.0`` (AMC 2023 stores floats) is ``27``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def gsm8k_task(row: dict[str, Any], index: int) -> dict[str, Any]:
    return _posed(map_math_row(row, "gsm8k", index=index, source="gsm8k"), "gsm8k", index)


def math500_task(row: dict[str, Any], index: int) -> dict[str, Any]:
    task = map_math_row({**row, "answer": _number(row["answer"])}, "deepscaler", index=index, source="math500")
    return _posed(task, "math500", row.get("unique_id") or index)


def aime2024_task(row: dict[str, Any], index: int) -> dict[str, Any]:
    task = map_math_row({**row, "answer": _number(row["answer"])}, "deepscaler", index=index, source="aime2024")
    return _posed(task, "aime2024", row.get("id", index))


def aime2025_task(row: dict[str, Any], index: int) -> dict[str, Any]:
    task = map_math_row({**row, "answer": _number(row["answer"])}, "deepscaler", index=index, source="aime2025")
    return _posed(task, "aime2025", row.get("problem_idx", index))


def amc2023_task(row: dict[str, Any], index: int) -> dict[str, Any]:
    task = map_math_row({**row, "ground_truth": _number(row["answer"])}, "none", index=index, source="amc2023")
    task.pop("answer")
    return _posed(task, "amc2023", row.get("id", index))


def _math(
    name: str, title: str, source: HubSource, size: int, columns: tuple[str, ...], to_task, **kwargs
) -> Benchmark:
    return Benchmark(
        name=name,
        title=title,
        env="rllm/Math-v0",
        answer_format=ANSWER,
        grader=GRADER,
        metric=METRIC,
        source=source,
        size=size,
        prompt=MATH_PROMPT.replace("{{}}", "{}"),
        columns=columns,
        to_task=to_task,
        agent_args={"system_prompt": ""},  # no system message: the instruction is in the user message
        **kwargs,
    )


MATH_BENCHMARKS = (
    _math(
        "gsm8k",
        "GSM8K (test)",
        HubSource("openai/gsm8k", "test", "740312add88f781978c0658806c59bc2815b9866", config="main"),
        1319,
        ("question", "answer"),
        gsm8k_task,
    ),
    _math(
        "math500",
        "MATH-500",
        HubSource("HuggingFaceH4/MATH-500", "test", "6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be"),
        500,
        ("problem", "answer", "subject", "level", "unique_id"),
        math500_task,
        subsets=("level", "subject"),
    ),
    _math(
        "aime2024",
        "AIME 2024 (I and II)",
        HubSource("HuggingFaceH4/aime_2024", "train", "2fe88a2f1091d5048c0f36abc874fb997b3dd99a"),
        30,
        ("id", "problem", "answer"),
        aime2024_task,
    ),
    _math(
        "aime2025",
        "AIME 2025 (I and II)",
        HubSource("MathArena/aime_2025", "train", "c94da77eb22bbd6439e62a323bec18493a421302"),
        30,
        ("problem_idx", "problem", "answer"),
        aime2025_task,
    ),
    _math(
        "amc2023",
        "AMC 2023",
        HubSource("zwhe99/amc23", "test", "f9810c0439cd3c670ec885d328a2f06a87f3694a"),
        40,
        ("id", "question", "answer"),
        amc2023_task,
    ),
)
