"""Models and checkpoints load in the dtype the config asks for, train in it, and are saved and reloaded in it."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from unittest.mock import patch

import gymnasium as gym
import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from rllm_gym.envs.base import MultiTurnEnv
from rllm_gym.policies.scripted import ScriptedPolicy
from rllm_gym.train.grpo import TrainConfig, grpo_args, load_model, main
from rllm_gym.train.trainer import EnvSetup, EpisodeRollout, RLLMGRPOTrainer, encode_prompt
from rllm_gym.types import RewardOutput

TINY = Path(__file__).resolve().parents[2] / "train" / "configs" / "test_tiny.yaml"


def long_reply(task_info, action):
    right = len(action) > 2
    return RewardOutput(reward=float(right), is_correct=right)


class OneTurnEnv(MultiTurnEnv):
    def __init__(self):
        super().__init__(long_reply, tasks=[{"id": "t0", "question": "Say something."}], max_turns=1)


gym.register(id="test/OneTurn-v0", entry_point=OneTurnEnv)


def test_a_bf16_step_changes_the_weights_and_the_saved_model_reloads_the_same(tiny_model_dir, tmp_path, make_trainer):
    config = TrainConfig(
        model=str(tiny_model_dir), dtype="bf16", prompts_per_step=2, num_generations=4, max_steps=1,
        max_completion_length=8, learning_rate=1e-2, output_dir=str(tmp_path / "run"),
    )  # fmt: skip
    model, tokenizer, _ = load_model(config)
    assert model.dtype == torch.bfloat16
    args = grpo_args(config, tmp_path / "run", model.dtype)
    assert args.bf16
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    answers = itertools.count()
    policy = ScriptedPolicy(lambda messages: ["ok", "sure thing"][next(answers) % 2], tokenizer=tokenizer)
    rows = [{"prompt": encode_prompt("test/OneTurn-v0", {"id": "t0", "question": "Say something."})}] * 2
    rollout = EpisodeRollout(
        [EnvSetup("test/OneTurn-v0", agent="rllm_gym.agents.math:MathAgent")],
        max_turns=1,
        policy_factory=lambda trainer: policy,
    )
    trainer = make_trainer(model, tokenizer, args, rows, rollout, estimator="drgrpo")
    trainer.train()
    # With lr 1e-2 an Adam step moves each weight by about 1e-2, more than bf16's spacing (2^-8 relative): a tiny lr
    # (1e-6) would round back to the same bf16 values, and this would fail.
    changed = [name for name, p in model.named_parameters() if not torch.equal(before[name], p)]
    matrices = [name for name, p in model.named_parameters() if p.ndim == 2]
    assert set(matrices) <= set(changed), sorted(set(matrices) - set(changed))
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())

    trainer.save_model(str(tmp_path / "final"))
    for requested, dtype in (("auto", torch.bfloat16), ("fp32", torch.float32)):
        reloaded, _, _ = load_model(TrainConfig(model=str(tmp_path / "final"), dtype=requested))
        assert reloaded.dtype == dtype
        if requested == "auto":  # the saved model is the trained one, tensor for tensor
            saved = dict(reloaded.named_parameters())
            for name, p in model.named_parameters():
                assert saved[name].dtype == torch.bfloat16 and torch.equal(saved[name], p), name


def test_dtype_and_chat_template_kwargs_reach_the_run_its_checkpoints_and_its_resume(tmp_path):
    output_dir = tmp_path / "run"
    flags = [
        "--config", str(TINY), "--output_dir", str(output_dir), "--dtype", "bf16", "--save_steps", "1",
        "--chat_template_kwargs", '{"enable_thinking": false}',
    ]  # fmt: skip
    prompts = []
    original = RLLMGRPOTrainer.collect

    def spy(self, inputs):
        batch = original(self, inputs)
        assert self.model.dtype == torch.bfloat16  # the first run and the resumed one train in bf16
        steps = [step for e in batch.episodes for t in e.trajectories for step in t.steps]
        prompts.extend(self.processing_class.decode(step.prompt_ids) for step in steps)
        return batch

    with patch.object(RLLMGRPOTrainer, "collect", spy):
        main([*flags, "--max_steps", "1"])
        summary = main([*flags, "--max_steps", "2", "--resume", "true"])
    assert summary["config"]["dtype"] == "bf16"
    # The tiny model's template shows enable_thinking=false as an empty think block after the generation prompt.
    assert prompts and all(p.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") for p in prompts)
    for folder in ("checkpoint-1", "checkpoint-2", "final"):
        with safe_open(output_dir / folder / "model.safetensors", "pt") as weights:
            assert {weights.get_tensor(key).dtype for key in weights.keys()}  # noqa: SIM118 == {torch.bfloat16}, folder
        record = json.loads((output_dir / folder / "rllm_gym_training.json").read_text())
        assert record["dtype"] == "bf16" and record["chat_template_kwargs"] == {"enable_thinking": False}
    assert AutoModelForCausalLM.from_pretrained(output_dir / "final").dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtype": "half"}, "dtype must be one of auto, bf16, bfloat16, fp16, float16, fp32, float32"),
        ({"chat_template_kwargs": "{oops"}, 'chat_template_kwargs must be a JSON object, e.g. \'{"enable_thinking"'),
        ({"chat_template_kwargs": "[1]"}, "chat_template_kwargs must be a JSON object, e.g. "),
        ({"dtype": "fp16", "trl_args": '{"fp16": true}'}, "dtype: fp16 with fp16: true cannot train"),
    ],
)
def test_bad_dtype_and_template_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TrainConfig(**kwargs)
