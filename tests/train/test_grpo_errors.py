"""The trainer says what failed: its summary counts termination reasons and errors, and a run whose episodes all
error stops after ``max_error_steps`` steps with exit status 1 and the reason (driven as the command line)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "train" / "configs" / "test_tiny.yaml"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "CUDA_VISIBLE_DEVICES": ""}


def train(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "rllm_gym.train.grpo", "--config", str(TINY), *args]
    return subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)


def test_training_stops_after_max_error_steps_of_errors_and_says_why(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "bad", "map": ["SXG"]}\n')
    output_dir = tmp_path / "run"
    result = train("--output_dir", str(output_dir), "--tasks", str(tasks), "--max_error_steps", "2")
    assert result.returncode == 1, result.stderr
    assert (
        "rllm-gym train: training stopped at step 2: every episode of the last 2 steps ended in ERROR "
        "(max_error_steps=2):\n4 x ValueError: task['map'] may only use the letters" in result.stderr
    )
    assert "Traceback" not in result.stderr
    assert "ERROR episodes 100%" in result.stdout  # the step line says it too
    summary = json.loads((output_dir / "summary.json").read_text())
    assert summary["termination_reasons"] == {"error": 8}  # 2 steps x 2 prompts x 2 generations
    assert summary["errors"][0]["count"] == 8 and summary["errors"][0]["example"].startswith("bad:")
    assert summary["stopped"].startswith("training stopped at step 2")


def test_a_healthy_run_records_its_termination_reasons_and_no_errors(tmp_path):
    output_dir = tmp_path / "run"
    result = train("--output_dir", str(output_dir), "--max_steps", "2")
    assert result.returncode == 0, result.stderr
    summary = json.loads((output_dir / "summary.json").read_text())
    assert sum(summary["termination_reasons"].values()) == 2 * 2 * 2  # steps x prompts x generations
    assert "error" not in summary["termination_reasons"] and summary["errors"] == []
    assert summary["infra_failed"] == 0  # episodes whose reward the infrastructure gave: none here
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["rollout/infra_failed"] for record in records if "rollout/infra_failed" in record] == [0.0, 0.0]
