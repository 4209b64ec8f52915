"""A short GRPO run on rllm/ReasoningGym-v0 through the real trainer, as a user launches it.

train/configs/reasoning_gym_cpu.yaml (aiw siblings questions), cut to 3 steps of 2 tasks x 4 rollouts after a short
format warm start, runs the command line in a subprocess on the embedded model's tiny shape instead of the config's
small one (about 10 seconds) and checks what the run leaves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("reasoning_gym", reason='reasoning-gym is an optional extra: pip install -e ".[reasoning-gym]"')

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "train" / "configs" / "reasoning_gym_cpu.yaml"
ENV_ID = "rllm/ReasoningGym-v0"


@pytest.mark.slow
def test_a_short_grpo_run_on_reasoning_gym_trains_the_model(tmp_path, tiny_model_dir):
    output_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "rllm_gym.train.grpo", "--config", str(CONFIG), "--output_dir", str(output_dir),
        "--model", str(tiny_model_dir), "--model_shape", "tiny", "--max_steps", "3", "--warm_start_steps", "20",
        "--num_generations", "4", "--prompts_per_step", "2", "--tasks", "seeds:16", "--eval_greedy", "false",
        "--save_steps", "1000", "--logging_steps", "1",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"

    summary = json.loads((output_dir / "summary.json").read_text())
    assert summary["config"]["env"] == [ENV_ID]
    assert summary["errors"] == []
    assert summary["termination_reasons"] == {"env_done": 3 * 2 * 4}  # one reply per task, every episode graded
    metrics = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [record for record in metrics if "step" in record and f"train/reward/env/{ENV_ID}" in record]
    assert [record["step"] for record in steps] == [1, 2, 3]
    assert all(0.0 <= record[f"train/reward/env/{ENV_ID}"] <= 1.0 for record in steps)  # score_answer's range

    # The warm start and GRPO changed the weights that the run saved.
    before = load_file(Path(tiny_model_dir) / "model.safetensors")
    after = load_file(output_dir / "final" / "model.safetensors")
    assert any(not torch.equal(before[name], after[name]) for name in before)
