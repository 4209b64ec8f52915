"""The GPU starting points (train/configs/qwen_*.yaml): what they ask for, and that they validate without a GPU.

test_grpo.py's shipped-configs test loads every YAML in train/configs/; this file checks what a GPU user relies on:
vLLM colocate, bf16, gradient accumulation that divides the batch on the documented launcher, a Qwen model that the
user can replace by a local folder, and a clear error when that folder is missing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from rllm_gym.train.config import load_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "train" / "configs"
LAUNCHERS = {"qwen_math_1gpu.yaml": "single_gpu.yaml", "qwen_math_zero3.yaml": "zero3.yaml"}


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_gpu_config_asks_for_vllm_bf16_and_a_qwen_model(name):
    config, _ = load_config(["--config", str(CONFIGS / name)])
    trl_args = json.loads(config.trl_args)
    assert config.env == ["rllm/Math-v0"] and config.max_turns == 1
    assert config.use_vllm and config.vllm_mode == "colocate"
    assert trl_args["bf16"] is True and config.gradient_checkpointing
    assert re.fullmatch(r"Qwen/Qwen2\.5-(0\.5|1\.5)B-Instruct", config.model)
    assert config.learning_rate <= 1e-5  # a billion-parameter model, not the tiny one's 1e-3


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_batch_divides_among_the_documented_launchers_processes(name):
    from accelerate.commands.config.config_args import load_config_from_file

    launcher = LAUNCHERS[name]
    text = (CONFIGS / name).read_text()
    assert f"accelerate launch --config_file train/accelerate/{launcher} train/grpo.py" in text.replace("\\\n", "")
    config, _ = load_config(["--config", str(CONFIGS / name)])
    accumulation = json.loads(config.trl_args)["gradient_accumulation_steps"]
    accelerate = load_config_from_file(str(REPO / "train" / "accelerate" / launcher))
    rollouts = config.prompts_per_step * config.num_generations
    assert rollouts % (accelerate.num_processes * accumulation) == 0
    if accelerate.deepspeed_config:
        # transformers stops when TrainingArguments and the DeepSpeed config disagree on accumulation.
        assert accumulation == accelerate.deepspeed_config["gradient_accumulation_steps"]


def test_single_gpu_config_accumulates_and_toggles_lora():
    values = yaml.safe_load((CONFIGS / "qwen_math_1gpu.yaml").read_text())
    assert values["gradient_accumulation_steps"] > 1 and values["lora"] is False
    config, _ = load_config(["--config", str(CONFIGS / "qwen_math_1gpu.yaml"), "--lora", "true"])
    assert config.lora and config.lora_r == 16


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_a_missing_local_model_folder_fails_at_once_naming_it(name):
    with pytest.raises(ValueError, match=re.escape("model /path/to/Qwen2.5-0.5B-Instruct: no such folder")):
        load_config(["--config", str(CONFIGS / name), "--model", "/path/to/Qwen2.5-0.5B-Instruct"])


def test_a_local_random_qwen_folder_replaces_the_hub_id(tmp_path):
    from rllm_gym.qwen_random import build_random_qwen

    folder = build_random_qwen(
        tmp_path / "qwen", num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=1536, dtype="float32",
    )  # fmt: skip
    config, _ = load_config(["--config", str(CONFIGS / "qwen_math_1gpu.yaml"), "--model", str(folder)])
    assert config.model == str(folder)
