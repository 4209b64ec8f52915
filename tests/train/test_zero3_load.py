"""DeepSpeed ZeRO-3's ``zero3_init_flag`` takes effect in train/grpo.py: the model loads after the training arguments,
whose DeepSpeed plugin is what makes ``from_pretrained`` partition the weights as it loads them (deepspeed.zero.Init).
Checked on the CPU in a subprocess (the plugin's config is process-global), with the environment `accelerate launch`
sets for train/accelerate/zero3.yaml."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
from unittest.mock import patch
from transformers.integrations import is_deepspeed_zero3_enabled
from rllm_gym.train import grpo

seen = []

class Loaded(Exception):
    pass

def from_pretrained(*args, **kwargs):
    seen.append(is_deepspeed_zero3_enabled())  # what transformers checks to load under deepspeed.zero.Init
    raise Loaded

with patch.object(grpo.AutoModelForCausalLM, "from_pretrained", from_pretrained):
    try:
        grpo.main(sys.argv[1:])
    except Loaded:
        pass
print(json.dumps(seen))
"""


def test_the_model_loads_partitioned_when_zero3_init_flag_is_set(tmp_path):
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        "ACCELERATE_USE_DEEPSPEED": "true",
        "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
        "ACCELERATE_DEEPSPEED_ZERO3_INIT": "true",  # zero3.yaml's zero3_init_flag
        "ACCELERATE_MIXED_PRECISION": "no",
    }
    flags = ["--config", str(REPO / "train" / "configs" / "test_tiny.yaml"), "--output_dir", str(tmp_path / "run")]
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *flags], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [True]
