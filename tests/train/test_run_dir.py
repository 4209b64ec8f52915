"""One run per output folder: the trainer refuses a folder holding another run unless told to continue (--resume)
or replace it (--overwrite), resumes only the same run (keeping its "before" evaluation and metrics), and stops on
Ctrl-C with one line and a checkpoint to resume from. Driven as the command line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rllm_gym.train.run_dir import last_checkpoint

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "train" / "configs" / "test_tiny.yaml"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "CUDA_VISIBLE_DEVICES": ""}


def command(output_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "rllm_gym.train.grpo", "--config", str(TINY), "--output_dir", str(output_dir), *args]


def train(output_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(command(output_dir, *args), capture_output=True, text=True, env=ENV, timeout=300)


def steps_printed(stdout: str) -> list[int]:
    return [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("step ")]


@pytest.mark.slow
def test_a_second_run_into_the_same_folder_is_refused_then_overwrite_replaces_it(tmp_path):
    output_dir = tmp_path / "run"
    first = train(output_dir, "--max_steps", "1")
    assert first.returncode == 0, first.stderr
    (output_dir / "notes.txt").write_text("mine")

    again = train(output_dir, "--max_steps", "1")
    assert again.returncode == 2
    assert f"rllm-gym train: output_dir {output_dir} holds another run (run.json, metrics.jsonl" in again.stderr
    assert "pass --resume true to continue it, --overwrite true to replace it" in again.stderr
    assert "Traceback" not in again.stderr and "Loading weights" not in again.stderr  # refused before the model

    replaced = train(output_dir, "--max_steps", "2", "--overwrite", "true")
    assert replaced.returncode == 0, replaced.stderr
    logged = [json.loads(line)["step"] for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2]
    assert (output_dir / "notes.txt").read_text() == "mine"  # only the run's own files were replaced


@pytest.mark.slow
def test_resume_without_a_checkpoint_is_an_error(tmp_path):
    result = train(tmp_path / "empty", "--resume", "true")
    assert result.returncode == 2
    assert f"--resume true: {tmp_path / 'empty'} has no complete checkpoint-N folder to continue from" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_resume_says_where_it_starts_keeps_the_before_score_and_refuses_other_settings(tmp_path):
    output_dir = tmp_path / "run"
    first = train(output_dir, "--max_steps", "2", "--save_steps", "1", "--eval_greedy", "true")
    assert first.returncode == 0, first.stderr
    before = json.loads((output_dir / "run.json").read_text())["evaluation_before"]
    (output_dir / "checkpoint-2").rename(output_dir / "checkpoint-2.bak")  # as if killed before its checkpoint

    other = train(output_dir, "--max_steps", "3", "--resume", "true", "--seed", "5", "--eval_greedy", "true")
    assert other.returncode == 2
    assert "holds a run with other settings (seed: 0 there, 5 now)" in other.stderr

    resumed = train(output_dir, "--max_steps", "3", "--resume", "true", "--eval_greedy", "true")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {output_dir / 'checkpoint-1'} (step 1 of 3)" in resumed.stdout
    assert f"greedy success before (recorded): training tasks {before['eval_train/greedy']:.3f}" in resumed.stdout
    assert steps_printed(resumed.stdout) == [2, 3]
    summary = json.loads((output_dir / "summary.json").read_text())
    assert summary["evaluation_before"] == before and "greedy_after" in summary
    logged = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    # The first run's step 2 (after its last checkpoint) was redone, not repeated; evaluations at 0 and at the end.
    assert [record["step"] for record in logged if "reward" in record] == [1, 2, 3]
    assert [record["step"] for record in logged if "eval_train/greedy" in record] == [0, 3]


@pytest.mark.slow
def test_ctrl_c_stops_with_one_line_and_a_checkpoint_to_resume_from(tmp_path):
    output_dir = tmp_path / "run"
    metrics = output_dir / "metrics.jsonl"
    process = subprocess.Popen(
        command(output_dir, "--max_steps", "200", "--save_steps", "1000"),
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert process.poll() is None and time.monotonic() < deadline, "training did not get going"
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    notices = [line for line in stdout.splitlines() + stderr.splitlines() if "Ctrl-C" in line]
    assert len(notices) == 1 and "with a checkpoint (continue with --resume true" in notices[0], stdout + stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    checkpoint = last_checkpoint(output_dir)
    assert checkpoint is not None
    stopped_at = int(checkpoint.name.removeprefix("checkpoint-"))
    assert steps_printed(stdout)[-1] == stopped_at
    assert not (output_dir / "final").exists()

    resumed = train(output_dir, "--max_steps", str(stopped_at + 1), "--resume", "true")
    assert resumed.returncode == 0, resumed.stderr
    assert steps_printed(resumed.stdout) == [stopped_at + 1]
    assert (output_dir / "final").is_dir()
