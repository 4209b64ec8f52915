"""Issue 34, points 1 and 5, driven as ``rllm-gym train`` in a subprocess: a finished run resumed as it was changes
nothing (it says it is finished, exit 0), resumed with a larger max_steps it is extended and keeps every earlier
result, resumed with other settings it is refused with each difference named; a resume does not report the tied
lm_head as missing, no "Loading weights" bar is drawn off a terminal, the last step's line comes before its eval and
checkpoint lines, and a taken output_dir is refused before torch and TRL are imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "train" / "configs" / "test_tiny.yaml"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
# The first run: 2 steps evaluated before and after; logging_steps 5 so the last step is not a logging step.
RUN = ("--eval_greedy", "true", "--eval_limit", "2", "--logging_steps", "5", "--save_steps", "1000")
KEPT = (
    "summary.json",
    "metrics.jsonl",
    "reward_curve.png",
    "run.json",
    "final/rllm_gym_training.json",
    "final/README.md",
)


def train(output_dir: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "rllm_gym.cli", "train", "--config", str(TINY), "--output_dir", str(output_dir)]
    return subprocess.run([*command, *RUN, *args], capture_output=True, text=True, env=ENV, timeout=300, cwd=REPO)


def snapshot(output_dir: Path) -> dict[str, bytes]:
    return {name: (output_dir / name).read_bytes() for name in KEPT}


def line_index(stdout: str, start: str) -> int:
    return next(number for number, line in enumerate(stdout.splitlines()) if line.startswith(start))


@pytest.mark.slow
def test_a_finished_run_is_left_as_it_is_refused_with_other_settings_and_extended_with_more_steps(tmp_path):
    output_dir = tmp_path / "run"
    first = train(output_dir, "--max_steps", "2")
    assert first.returncode == 0, first.stderr
    # The last step's line first, then its evaluation and its checkpoint (the trainer logs, evaluates, saves).
    assert line_index(first.stdout, "step     2") < line_index(first.stdout, "eval      2")
    assert line_index(first.stdout, "eval      2") < line_index(first.stdout, "saved checkpoint-2")
    assert "Loading weights" not in first.stderr  # stderr is a pipe here, not a terminal
    finished = snapshot(output_dir)
    summary = json.loads(finished["summary.json"])
    assert summary["greedy_after"] and summary["evaluation_after"]["step"] == 2

    again = train(output_dir, "--max_steps", "2", "--resume", "true")
    assert again.returncode == 0, again.stderr
    assert f"{output_dir} holds a finished run (step 2 of 2" in again.stdout
    assert "resume with a larger --max_steps (above 2)" in again.stdout
    assert snapshot(output_dir) == finished  # nothing rewritten: the results after step 2 are all there

    other = train(output_dir, "--max_steps", "3", "--resume", "true", "--learning_rate", "0.01", "--seed", "4")
    assert other.returncode == 2
    assert "holds a run with other settings (learning_rate: 0.001 there, 0.01 now; seed: 0 there, 4 now)" in (
        other.stderr
    )
    assert snapshot(output_dir) == finished

    extended = train(output_dir, "--max_steps", "3", "--resume", "true")
    assert extended.returncode == 0, extended.stderr
    assert "missing keys" not in extended.stderr and "lm_head" not in extended.stderr
    assert f"resuming from {output_dir / 'checkpoint-2'} (step 2 of 3)" in extended.stdout
    assert line_index(extended.stdout, "step     3") < line_index(extended.stdout, "saved checkpoint-3")
    now = json.loads((output_dir / "summary.json").read_text())
    [earlier] = now["earlier"]
    assert earlier["steps"] == 2
    for key in ("greedy_after", "evaluation_after", "reward_first", "reward_last"):
        assert earlier[key] == summary[key], key
    assert now["evaluation_after"]["step"] == 3 and now["greedy_after"] is not None
    record = json.loads((output_dir / "final" / "rllm_gym_training.json").read_text())
    assert record["steps"] == 3 and record["greedy_after"] is not None
    assert record["earlier"] == [{"steps": 2, "greedy_after": summary["greedy_after"], "heldout_after": None}]
    assert "Earlier, when the run ended at step 2" in (output_dir / "final" / "README.md").read_text()
    # The checkpoint of step 2 holds the weights final/ held: it now carries final/'s record and scores after.
    at_two = json.loads((output_dir / "checkpoint-2" / "rllm_gym_training.json").read_text())
    assert at_two == json.loads(finished["final/rllm_gym_training.json"])
    assert "not measured at a checkpoint" not in (output_dir / "checkpoint-2" / "README.md").read_text()


@pytest.mark.slow
def test_a_resume_below_the_step_reached_is_refused(tmp_path):
    output_dir = tmp_path / "run"
    first = train(output_dir, "--max_steps", "2", "--eval_greedy", "false", "--save_steps", "1")
    assert first.returncode == 0, first.stderr
    (output_dir / "final").rename(output_dir / "final.bak")  # as if it stopped before the end
    shorter = train(output_dir, "--max_steps", "1", "--resume", "true", "--eval_greedy", "false", "--save_steps", "1")
    assert shorter.returncode == 2
    assert f"{output_dir} reached step 2, past --max_steps 1: resume with --max_steps 2 or more" in shorter.stderr


def imported_modules(stderr: str) -> set[str]:
    """The modules ``python -X importtime`` says were imported."""
    lines = [line.rpartition("|")[2].strip() for line in stderr.splitlines() if line.startswith("import time:")]
    return {name.split(".")[0] for name in lines}


@pytest.mark.parametrize("entry", [["-m", "rllm_gym.cli", "train"], ["-m", "rllm_gym.train.grpo"]])
def test_a_taken_output_dir_is_refused_before_torch_and_trl_load(tmp_path, entry):
    output_dir = tmp_path / "run"
    output_dir.mkdir()
    (output_dir / "metrics.jsonl").write_text("")
    config = tmp_path / "run.yaml"  # the folder named by the YAML, not a flag
    text = TINY.read_text().replace("output_dir: runs/test_tiny", f"output_dir: {output_dir}")
    maps = TINY.parent / "frozenlake_demo_maps.jsonl"  # named by an absolute path: the copy is in another folder
    config.write_text(text.replace("[frozenlake_demo_maps.jsonl]", f"[{maps}]"))
    command = [sys.executable, "-X", "importtime", *entry, "--config", str(config)]
    result = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=120)
    assert result.returncode == 2
    assert f"rllm-gym train: output_dir {output_dir} holds another run (metrics.jsonl)" in result.stderr
    modules = imported_modules(result.stderr)
    assert "rllm_gym" in modules and not modules & {"torch", "trl", "transformers", "accelerate"}


@pytest.mark.slow
def test_eval_draws_no_loading_bar_with_no_progress_even_on_a_terminal(tmp_path):
    import fcntl
    import pty
    import struct
    import termios

    from rllm_gym.tiny_model import default_model_path

    model = str(default_model_path())  # a folder: loaded with from_pretrained, which draws the bar

    def stderr_on_a_terminal(*flags: str) -> str:
        primary, secondary = pty.openpty()
        fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 0 columns: empty bars
        command = [sys.executable, "-m", "rllm_gym.cli", "eval", "--model", model, "--tasks", "1", "--n", "1"]
        with subprocess.Popen([*command, *flags], stdout=subprocess.DEVNULL, stderr=secondary, env=ENV) as process:
            os.close(secondary)
            chunks = []
            while True:
                try:
                    chunk = os.read(primary, 4096)
                except OSError:  # the terminal closed with the process
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            assert process.wait(timeout=120) == 0
        os.close(primary)
        return b"".join(chunks).decode(errors="replace")

    assert "Loading weights" in stderr_on_a_terminal()  # the bar this test looks for is drawn on a terminal
    assert "Loading weights" not in stderr_on_a_terminal("--no-progress")
