"""Reading a benchmark's rows from a local copy: every layout the hub uses is found, and a missing split, a missing
file or a row in another layout is one BenchmarkDataError line naming what was expected."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rllm_gym.benchmarks import BenchmarkDataError, load_benchmark
from rllm_gym.benchmarks.base import HubSource, read_rows

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "benchmarks"


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_a_missing_split_names_the_split_the_files_expected_and_the_splits_found(tmp_path):
    copy = tmp_path / "gsm8k"
    shutil.copytree(FIXTURES / "gsm8k", copy)
    (copy / "main" / "test-00000-of-00001.parquet").unlink()
    with pytest.raises(BenchmarkDataError) as error:
        load_benchmark("gsm8k", tmp_path)
    assert one_line(error) == (
        f"gsm8k: {copy / 'main'} has no 'test' split (it has the split(s) train); expected main/test-*.parquet or "
        "data/test-*.parquet (the hub's layout), test.jsonl, test.parquet, or a datasets.save_to_disk folder with a "
        "'test' split"
    )


def test_a_folder_without_data_files_says_so(tmp_path):
    (tmp_path / "notes.txt").write_text("not data")
    with pytest.raises(BenchmarkDataError, match=re.escape("has no 'test' split (it holds no data files)")):
        load_benchmark("math500", tmp_path)


def test_a_row_in_another_layout_names_the_columns_expected_and_found(tmp_path):
    rows = [{"question": "1+1?", "answer": "#### 2"}]  # GSM8K's layout given as MATH-500
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(BenchmarkDataError) as error:
        load_benchmark("math500", tmp_path)
    assert one_line(error) == (
        f"math500: row 0 of {tmp_path} is not in the HuggingFaceH4/MATH-500 layout: it lacks problem, subject, level, "
        "unique_id (expected columns problem, answer, subject, level, unique_id; it has ['answer', 'question'])"
    )


def test_a_bad_value_in_the_right_columns_names_the_row(tmp_path):
    (tmp_path / "test.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "2, no marker"}) + "\n")
    with pytest.raises(BenchmarkDataError, match=re.escape("gsm8k: row 0 of ") + ".*has no '#### N' line"):
        load_benchmark("gsm8k", tmp_path)


def test_livecodebench_names_the_release_files_that_are_missing(tmp_path):
    shutil.copytree(FIXTURES / "livecodebench", tmp_path / "livecodebench")
    (tmp_path / "livecodebench" / "test4.jsonl").unlink()
    with pytest.raises(BenchmarkDataError) as error:
        load_benchmark("livecodebench", tmp_path)
    assert one_line(error).startswith(
        f"livecodebench: {tmp_path / 'livecodebench'} lacks test4.jsonl; expected the files test.jsonl, test2.jsonl, "
        "test3.jsonl, test4.jsonl, test5.jsonl (from livecodebench/code_generation_lite@0fe84c3)"
    )


def test_a_save_to_disk_folder_is_read_and_its_missing_split_named(tmp_path):
    import datasets

    rows = [json.loads(line) for line in (FIXTURES / "math500" / "test.jsonl").read_text().splitlines()]
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "saved"))
    assert load_benchmark("math500", tmp_path / "saved") == load_benchmark("math500", FIXTURES)
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "wrong"))
    with pytest.raises(BenchmarkDataError, match=re.escape("has the split(s) train, not 'test'; expected")):
        load_benchmark("math500", tmp_path / "wrong")


def test_a_copy_is_found_under_the_benchmark_name_the_repo_id_or_as_the_folder_itself(tmp_path):
    expected = load_benchmark("aime2024", FIXTURES)
    shutil.copytree(FIXTURES / "aime2024", tmp_path / "HuggingFaceH4" / "aime_2024")  # --local-dir DIR/REPO
    assert load_benchmark("aime2024", tmp_path) == expected
    assert load_benchmark("aime2024", FIXTURES / "aime2024") == expected


def test_files_that_are_not_data_and_paths_that_do_not_exist_are_refused(tmp_path):
    source = HubSource("org/data", "test", "0" * 40)
    with pytest.raises(BenchmarkDataError, match=re.escape("--data-dir /nowhere/at/all does not exist; expected")):
        read_rows(source, "x", Path("/nowhere/at/all"))
    (tmp_path / "test.csv").write_text("a,b\n")
    with pytest.raises(BenchmarkDataError, match=re.escape("is not a data file: expected a name ending in .parquet")):
        read_rows(source, "x", tmp_path / "test.csv")
    (tmp_path / "test.jsonl").write_text("{not json\n")
    with pytest.raises(BenchmarkDataError, match=re.escape("is not a readable data file (JSONDecodeError")):
        read_rows(source, "x", tmp_path / "test.jsonl")


def test_without_a_network_the_hub_path_says_to_pass_a_local_copy(tmp_path):
    """The hub path is real ``datasets.load_dataset`` at the pinned revision; offline it ends in one clear line."""
    code = "from rllm_gym.benchmarks import load_benchmark\nload_benchmark('gsm8k')"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("rllm_gym.benchmarks.base.BenchmarkDataError: gsm8k: cannot read ")
    assert "openai/gsm8k[main]:test@740312a" in last and "offline, pass --data-dir with a local copy" in last
