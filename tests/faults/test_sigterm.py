"""SIGTERM half-way through ``rllm-gym eval`` and through GRPO training, then a resume.

Eval: the episode file keeps the episodes finished before the signal, and ``--resume`` completes the set with none
twice. Training (a checkpoint every step): the signal often lands while a checkpoint is being written, leaving a
checkpoint folder without its trainer state; ``--resume true`` must continue from the last complete checkpoint to
``max_steps``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rllm_gym.store import ReadReport, read_episodes
from rllm_gym.train.grpo import last_checkpoint

REPO = Path(__file__).resolve().parents[2]
TINY_CONFIG = REPO / "train" / "configs" / "test_tiny.yaml"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "CUDA_VISIBLE_DEVICES": ""}


def terminate_when(process: subprocess.Popen, ready, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert process.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.005)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) != 0, "the run finished before the signal reached it"


def eval_command(model: Path, out: Path, tasks: int) -> list[str]:
    args = ["--env", "rllm/FrozenLake-v0", "--model", str(model), "--tasks", str(tasks), "--n", "1"]
    args += ["--max-turns", "2", "--max-tokens", "6", "--temperature", "0", "--n-parallel", "1", "--out", str(out)]
    return [sys.executable, "-m", "rllm_gym.cli", "eval", *args]


def test_sigterm_during_eval_then_resume_completes_the_set_none_twice(tiny_model_dir, tmp_path):
    out = tmp_path / "episodes.jsonl"
    command = eval_command(tiny_model_dir, out, tasks=10)
    with open(tmp_path / "killed.log", "wb") as log:
        process = subprocess.Popen(command, env=ENV, stdout=log, stderr=subprocess.STDOUT)
        terminate_when(process, lambda: out.exists() and out.read_bytes().count(b"\n") >= 3, "3 stored episodes")

    report = ReadReport()
    finished = {episode.id: episode.to_json() for episode in read_episodes(out, report)}
    assert 3 <= len(finished) < 10, "the signal should land half-way"
    resumed = subprocess.run([*command, "--resume", "--json"], env=ENV, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["episodes"] == 10
    episodes = list(read_episodes(out))
    ids = [episode.id for episode in episodes]
    assert len(ids) == len(set(ids)) == 10
    assert sorted(ids) == sorted(f"seed-{i}:0" for i in range(10))
    # Nothing finished was lost or redone: the episodes stored before the signal are still there, unchanged.
    assert {e.id: e.to_json() for e in episodes if e.id in finished} == finished


def test_last_checkpoint_skips_folders_a_kill_left_half_written(tmp_path):
    assert last_checkpoint(tmp_path) is None
    for step in (1, 2, 10):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (tmp_path / "checkpoint-11").mkdir()  # killed before the trainer state was written
    (tmp_path / "checkpoint-11" / "config.json").write_text("{}")
    (tmp_path / "checkpoint-12").mkdir()  # killed while writing it
    (tmp_path / "checkpoint-12" / "trainer_state.json").write_text('{"global_step": 1')
    (tmp_path / "checkpoint-x").mkdir()
    assert last_checkpoint(tmp_path) == tmp_path / "checkpoint-10"


@pytest.mark.slow
def test_sigterm_during_training_then_resume_reaches_max_steps(tmp_path):
    output_dir = tmp_path / "run"
    max_steps = 16
    command = [sys.executable, "-m", "rllm_gym.train.grpo", "--config", str(TINY_CONFIG)]
    command += ["--output_dir", str(output_dir), "--max_steps", str(max_steps), "--save_steps", "1"]
    with open(tmp_path / "killed.log", "wb") as log:
        process = subprocess.Popen(command, cwd=REPO, env=ENV, stdout=log, stderr=subprocess.STDOUT)
        # Signal as soon as the 5th checkpoint folder appears: most often while it is still being written.
        terminate_when(process, lambda: (output_dir / "checkpoint-5").exists(), "the 5th checkpoint")
    complete = last_checkpoint(output_dir)
    assert complete is not None and complete.name in ("checkpoint-4", "checkpoint-5")
    resume_from = int(complete.name.removeprefix("checkpoint-"))

    resumed = subprocess.run(
        [*command, "--resume", "true"], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    steps = [int(line.split()[1]) for line in resumed.stdout.splitlines() if line.startswith("step ")]
    assert steps == list(range(resume_from + 1, max_steps + 1)), "training must go on from the last checkpoint"
    state = json.loads((output_dir / f"checkpoint-{max_steps}" / "trainer_state.json").read_text())
    assert state["global_step"] == max_steps
    assert last_checkpoint(output_dir) == output_dir / f"checkpoint-{max_steps}"
    assert (output_dir / "final" / "model.safetensors").is_file()
    summary = json.loads((output_dir / "summary.json").read_text())
    assert summary["config"]["resume"] is True
    # metrics.jsonl covers the whole run, each step once: the steps the killed run logged after its last checkpoint
    # were dropped and redone.
    logged = [json.loads(line)["step"] for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    assert logged == list(range(1, max_steps + 1))
