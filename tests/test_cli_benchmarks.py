"""``rllm-gym benchmarks``: one line per benchmark with its env, answer format, grader, metric, size and pinned source;
``--json`` the whole card of each, prompt format included."""

from __future__ import annotations

import json

from rllm_gym.benchmarks import BENCHMARKS
from rllm_gym.cli import main


def test_benchmarks_prints_one_aligned_line_per_benchmark(capsys):
    assert main(["benchmarks"]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.split()[:4] == ["name", "env", "answer", "format"]
    assert [line.split()[0] for line in lines] == [bench.name for bench in BENCHMARKS]
    gsm8k = next(line for line in lines if line.startswith("gsm8k "))
    for cell in ("rllm/Math-v0", "MathGrader", "1319", "openai/gsm8k[main]:test@740312a"):
        assert cell in gsm8k
    humaneval = next(line for line in lines if line.startswith("humaneval "))
    assert "CodeReward" in humaneval and "openai/openai_humaneval:test@7dce605" in humaneval


def test_benchmarks_json_gives_each_card_with_its_prompt_and_full_revision(capsys):
    assert main(["benchmarks", "--json"]) == 0
    cards = {card["name"]: card for card in json.loads(capsys.readouterr().out)}
    assert cards["math500"]["hub"] == {
        "repo": "HuggingFaceH4/MATH-500",
        "config": None,
        "split": "test",
        "revision": "6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be",
    }
    assert cards["math500"]["subsets"] == ["level", "subject"]
    assert "\\boxed{}" in cards["aime2025"]["prompt"] and cards["rg-logic"]["hub"] is None
