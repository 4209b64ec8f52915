"""The benchmark registry: the benchmarks people report, each with its env, grader, metric, pinned source, size and
prompt format, and names that are looked up with typo suggestions."""

from __future__ import annotations

import re

import pytest

from rllm_gym.benchmarks import BENCHMARKS, HubSource, UnknownBenchmarkError, benchmark, benchmark_names
from rllm_gym.registry import env_spec

REPORTED = ("gsm8k", "math500", "aime2024", "aime2025", "amc2023", "humaneval", "mbpp", "livecodebench")
SIZES = {"gsm8k": 1319, "math500": 500, "aime2024": 30, "aime2025": 30, "amc2023": 40, "humaneval": 164, "mbpp": 257}


def test_the_reported_benchmarks_and_reasoning_gym_suites_are_registered():
    names = benchmark_names()
    assert set(REPORTED) <= set(names) and len(names) == len(set(names))
    assert {name for name in names if name.startswith("rg-")} >= {"rg-arithmetic", "rg-logic"}
    assert {name: benchmark(name).size for name in SIZES} == SIZES


@pytest.mark.parametrize("bench", BENCHMARKS, ids=lambda bench: bench.name)
def test_each_benchmark_names_a_registered_env_a_pinned_source_and_its_prompt(bench):
    env_spec(bench.env)  # raises for an unknown id
    card = bench.card()
    for key in ("name", "env", "answer_format", "grader", "metric", "source", "size", "prompt"):
        assert card[key], (bench.name, key)
    if isinstance(bench.source, HubSource):
        assert re.fullmatch(r"[0-9a-f]{40}", bench.source.revision), bench.name  # a commit, not a branch
        assert card["hub"]["repo"] == bench.source.repo and card["hub"]["split"] == bench.source.split
        assert bench.to_task is not None and bench.columns
    else:
        assert bench.generate is not None and card["hub"] is None


def test_an_unknown_name_suggests_the_closest():
    with pytest.raises(
        UnknownBenchmarkError, match=re.escape("Benchmark 'math-500' doesn't exist. Did you mean 'math500'")
    ):
        benchmark("math-500")
    assert benchmark("GSM8K").name == "gsm8k"


def test_the_module_example_runs():
    import doctest

    import rllm_gym.benchmarks

    result = doctest.testmod(rllm_gym.benchmarks)
    assert result.attempted == 3 and result.failed == 0
