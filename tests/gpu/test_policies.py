"""Generation on a GPU: HFPolicy on CUDA in bf16, and vLLM (VLLMPolicy's in-process engine) on the same model."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("gpu_helpers", Path(__file__).with_name("helpers.py"))
gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu)

pytestmark = [pytest.mark.gpu, gpu.requires_cuda]
CHATS = [[{"role": "user", "content": f"What is {a} + {b}?"}] for a, b in ((1, 2), (30, 12), (7, 7), (100, 5))]


def generate_all(policy, params) -> list:
    async def main():
        return await asyncio.gather(*(policy.generate(chat, params) for chat in CHATS))

    return asyncio.run(main())


def test_hf_policy_generates_on_cuda_in_bf16(qwen_dir):
    import torch

    from rllm_gym.policies.base import SamplingParams
    from rllm_gym.policies.hf import HFPolicy

    policy = HFPolicy(str(qwen_dir), device="cuda", dtype="bfloat16")
    assert policy.model.device.type == "cuda" and policy.model.dtype == torch.bfloat16
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    first, again = generate_all(policy, greedy), generate_all(policy, greedy)
    assert [o.completion_ids for o in first] == [o.completion_ids for o in again]  # greedy is deterministic
    assert all(o.completion_length == len(o.completion_ids) > 0 for o in first)
    assert len({tuple(o.prompt_ids) for o in first}) == len(CHATS)
    assert max(policy.batch_sizes) > 1  # concurrent requests were batched into one generate call


@gpu.requires("vllm", "vllm")
def test_vllm_policy_generates_with_logprobs(qwen_dir):
    from rllm_gym.policies.base import SamplingParams
    from rllm_gym.policies.vllm import VLLMPolicy

    policy = VLLMPolicy(str(qwen_dir), gpu_memory_utilization=0.3, max_model_len=1024, enforce_eager=True)
    outputs = generate_all(policy, SamplingParams(temperature=1.0, max_tokens=16, seed=0))
    for output in outputs:
        assert 0 < output.completion_length <= 16
        assert len(output.logprobs) == output.completion_length and all(lp <= 0 for lp in output.logprobs)
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    assert [o.completion_ids for o in generate_all(policy, greedy)] == [
        o.completion_ids for o in generate_all(policy, greedy)
    ]
