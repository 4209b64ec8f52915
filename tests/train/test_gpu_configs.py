"""The GPU starting points (train/configs/qwen_*.yaml): what they ask for, and that they validate without a GPU.

test_grpo.py's shipped-configs test loads every YAML in train/configs/; this file checks what a GPU user relies on:
vLLM colocate, bf16, gradient accumulation that divides the batch on the documented launcher, a Qwen model that the
user can replace by a local folder, and a clear error when that folder is missing.
"""

from __future__ import annotations

import re
from pathlib import Path

import gymnasium as gym
import pytest
import torch
import yaml

from rllm_gym.train.config import load_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "train" / "configs"
LAUNCHERS = {"qwen_math_1gpu.yaml": "single_gpu.yaml", "qwen_math_zero3.yaml": "zero3.yaml"}


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_gpu_config_asks_for_vllm_bf16_and_a_qwen_model(name):
    config, _ = load_config(["--config", str(CONFIGS / name)])
    trl_args = config.trl_args
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
    accumulation = config.trl_args["gradient_accumulation_steps"]
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


class ReplyLength(gym.Env):
    """One turn; the reward is the reply's length, so a group of different replies gets nonzero advantages."""

    observation_space = action_space = gym.spaces.Text(256)

    def reset(self, *, seed=None, options=None):
        return "Say something.", {}

    def step(self, action):
        return "", float(len(str(action))), True, False, {}


gym.register(id="test/ReplyLength-v0", entry_point=ReplyLength)


@pytest.mark.parametrize("dtype", ["shipped", "bf16"])
def test_the_single_gpu_dtype_setup_lets_lr_1e_6_move_the_weights(dtype, tiny_model_dir, tmp_path, make_trainer):
    """qwen_math_1gpu.yaml's lr (1e-6) with its dtype setup changes every weight matrix in one step; bf16 weights
    (the earlier setup, dtype: bf16) keep nearly all of theirs, the update rounding away."""
    import itertools

    from rllm_gym.policies.scripted import ScriptedPolicy
    from rllm_gym.train.grpo import grpo_args, load_model
    from rllm_gym.train.trainer import EnvSetup, EpisodeRollout, encode_prompt

    flags = ["--config", str(CONFIGS / "qwen_math_1gpu.yaml"), "--model", str(tiny_model_dir), "--use_vllm", "false"]
    flags += ["--prompts_per_step", "2", "--num_generations", "4", "--max_steps", "1", "--max_completion_length", "8"]
    flags += ["--warmup_ratio", "0", "--output_dir", str(tmp_path / "run")]
    config, _ = load_config([*flags, *(["--dtype", "bf16"] if dtype == "bf16" else [])])
    assert config.learning_rate == 1e-6
    model, tokenizer, _ = load_model(config)
    args = grpo_args(config, tmp_path / "run", model.dtype)
    assert args.bf16  # bf16 compute either way; the weights' dtype differs
    assert model.dtype == (torch.bfloat16 if dtype == "bf16" else torch.float32)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    answers = itertools.count()
    policy = ScriptedPolicy(lambda messages: ["a", "bb bb bb", "ccc", "d d"][next(answers) % 4], tokenizer=tokenizer)
    task = encode_prompt("test/ReplyLength-v0", 0)
    rollout = EpisodeRollout(
        [EnvSetup("test/ReplyLength-v0", agent="rllm_gym.agents.math:MathAgent")],
        max_turns=1,
        policy_factory=lambda trainer: policy,
    )
    trainer = make_trainer(model, tokenizer, args, [{"prompt": task}] * 2, rollout, estimator="grpo")
    trainer.train()
    matrices = {name: p for name, p in model.named_parameters() if p.ndim == 2}
    moved = sum(int((before[name] != p).sum()) for name, p in matrices.items())
    if dtype == "shipped":
        assert all(not torch.equal(before[name], p) for name, p in matrices.items())
        assert moved > 0.9 * sum(p.numel() for p in matrices.values())
    else:
        assert moved < 0.05 * sum(p.numel() for p in matrices.values())


def test_config_headers_pair_vllm_with_the_torch_the_readme_installs():
    """A header that names a torch version for its vLLM names the one the README installs (vLLM pins torch)."""
    import re

    readme_torch = re.search(r"pip install torch==(\d+\.\d+)", (CONFIGS.parents[1] / "README.md").read_text())[1]
    for path in CONFIGS.glob("*.yaml"):
        header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
        if re.search(r"vLLM [\d.]+-[\d.]+ with torch", header):
            assert f"with torch {readme_torch}" in header, path.name
