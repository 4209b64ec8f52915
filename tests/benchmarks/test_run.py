"""``rllm-gym eval --benchmark``: usage errors before any model loads, and a run of the embedded tiny model on two
benchmarks from fixture files, reported per benchmark and per subset on the terminal, in the results JSON and in one
episode file per benchmark."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rllm_gym.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "benchmarks"


def usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        main(["eval", *argv])
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--benchmark", "gsm8k", "--env", "rllm/Math-v0"], "--env cannot be combined with --benchmark"),
        (["--benchmark", "gsm8k", "--env-args", "{}"], "--env-args cannot be combined with --benchmark"),
        (["--benchmark", "gsm8", "--data-dir", str(FIXTURES)], "Did you mean 'gsm8k'?"),
        (["--benchmark", "gsm8k", "--data-dir", "/no/such/folder"], "--data-dir /no/such/folder does not exist"),
        (["--env", "rllm/Math-v0", "--data-dir", str(FIXTURES)], "--data-dir and --results go with --benchmark"),
    ],
)
def test_options_that_cannot_work_are_usage_errors(capsys, argv, message):
    assert message in usage_error(capsys, *argv)


def test_a_results_path_that_cannot_be_written_is_refused_before_the_run(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    err = usage_error(capsys, "--benchmark", "gsm8k", "--results", str(tmp_path / "file" / "r.json"))
    assert "a folder on its path is a file" in err
    assert "is a folder" in usage_error(capsys, "--benchmark", "gsm8k", "--results", str(tmp_path))


def test_a_data_folder_in_the_wrong_layout_is_one_line_and_status_2_before_the_model_loads(capsys, tmp_path):
    shutil.copytree(FIXTURES / "gsm8k", tmp_path / "gsm8k")
    (tmp_path / "gsm8k" / "main" / "test-00000-of-00001.parquet").unlink()
    status = main(["eval", "--benchmark", "math500", "--benchmark", "gsm8k", "--data-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2
    # math500 is read first: the folder has no copy of it, so that is the one line (the model never loads)
    assert err.count("\n") == 1 and err.startswith(f"rllm-gym eval: math500: {tmp_path} has no 'test' split")


def test_a_benchmark_is_scored_whole_unless_tasks_is_given():
    from rllm_gym.benchmarks.run import task_cap
    from rllm_gym.cli import build_parser, commands_of

    parser = build_parser()
    eval_parser = commands_of(parser)["eval"]
    assert task_cap(eval_parser, parser.parse_args(["eval", "--benchmark", "gsm8k"])) is None
    assert task_cap(eval_parser, parser.parse_args(["eval", "--benchmark", "gsm8k", "--tasks", "3"])) == 3


@pytest.mark.slow  # loads the embedded model and runs 10 episodes: about 20 s on 2 cores
def test_two_benchmarks_in_one_call_report_per_benchmark_and_per_subset(capsys, tmp_path):
    results, out = tmp_path / "results" / "run.json", tmp_path / "episodes.jsonl"
    argv = ["eval", "--benchmark", "math500", "--benchmark", "aime2025", "--data-dir", str(FIXTURES), "--n", "2"]
    argv += ["--max-tokens", "4", "--results", str(results), "--out", str(out), "--no-progress", "--tasks", "3"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "rllm-gym eval: math500: the first 3 of 4 tasks (--tasks)" in captured.err
    assert "math500" in captured.out and "aime2025" in captured.out and "level=1" in captured.out
    written = json.loads(results.read_text())
    assert written["n"] == 2 and written["sampling"]["max_tokens"] == 4 and written["versions"]["reasoning-gym"]
    math500, aime = written["benchmarks"]["math500"], written["benchmarks"]["aime2025"]
    assert (math500["tasks"], math500["summary"]["episodes"], aime["tasks"], aime["summary"]["episodes"]) == (
        3,
        6,
        2,
        4,
    )
    assert set(math500["subsets"]) == {"level", "subject"}
    assert sum(s["tasks"] for s in math500["subsets"]["level"].values()) == 3
    assert math500["benchmark"]["prompt"].startswith("{problem}\nPlease reason step by step")
    assert math500["benchmark"]["agent_args"] == {"system_prompt": ""}
    [message] = math500["benchmark"]["prompt_example"]  # one user message, no system message
    assert message["role"] == "user" and message["content"].startswith("Convert the point $(0,3)$")
    assert message["content"].endswith("\nPlease reason step by step, and put your final answer within \\boxed{}.")
    for key in ("pass@1", "pass@2", "mean_response_tokens", "termination_reasons"):
        assert key in math500["summary"] and key in aime["summary"]
    assert math500["summary"]["termination_reasons"] == {"env_done": 6}  # one reply per math episode
    assert math500["summary"]["replies_cut_at_max_tokens"] == 1.0 and math500["summary"]["max_response_tokens"] == 4
    assert math500["subsets"]["subject"]["Algebra"]["replies"] == 2  # one task x n=2
    assert [len(path.read_text().splitlines()) for path in (out.with_name("episodes.math500.jsonl"),)] == [6]
    assert len(out.with_name("episodes.aime2025.jsonl").read_text().splitlines()) == 4 and not out.exists()
