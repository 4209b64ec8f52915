"""VLLMPolicy with a LoRA adapter on vLLM's CPU build: the engine applies it (logprobs of the adapter merged into the
weights by PEFT, not of the base model)."""

from __future__ import annotations

import asyncio

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from rllm_gym.policies.base import SamplingParams


def _logprobs(model, prompt_ids, completion_ids):
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion_ids)[:, None])[:, 0]


def test_lora_adapter_is_applied(vllm_model_dir, tmp_path):
    from rllm_gym.policies.vllm import VLLMPolicy

    torch.manual_seed(0)
    adapter = get_peft_model(
        AutoModelForCausalLM.from_pretrained(vllm_model_dir),
        LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False),
    )
    adapter.save_pretrained(tmp_path / "adapter")
    policy = VLLMPolicy(vllm_model_dir, lora_path=tmp_path / "adapter", max_lora_rank=8)
    try:
        chat = [{"role": "user", "content": "move left"}]
        out = asyncio.run(policy.generate(chat, SamplingParams(temperature=1.0, max_tokens=12, seed=2)))
    finally:
        policy.shutdown()
    got = torch.tensor(out.logprobs)
    merged = _logprobs(adapter.merge_and_unload().eval(), out.prompt_ids, out.completion_ids)
    base = _logprobs(AutoModelForCausalLM.from_pretrained(vllm_model_dir).eval(), out.prompt_ids, out.completion_ids)
    assert float((merged - got).abs().max()) < 1e-3
    assert float((base - got).abs().max()) > 0.1  # the adapter changes the model: the check above is not vacuous
