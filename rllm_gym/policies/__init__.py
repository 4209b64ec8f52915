"""Policies: the Policy protocol and its backends (vLLM, OpenAI-compatible HTTP, transformers, scripted).

Backends are imported on first use, so ``import rllm_gym.policies`` pulls in neither torch nor vLLM::

    from rllm_gym.policies import HFPolicy, OpenAIPolicy, SamplingParams, ScriptedPolicy, VLLMPolicy
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rllm_gym.policies.base import (
    Policy,
    PolicyError,
    SamplingParams,
    build_model_output,
    parse_hermes_tool_calls,
    split_reasoning,
)
from rllm_gym.policies.scripted import ScriptedPolicy

if TYPE_CHECKING:
    from rllm_gym.policies.hf import HFPolicy
    from rllm_gym.policies.openai import OpenAIPolicy
    from rllm_gym.policies.vllm import VLLMPolicy

__all__ = [
    "HFPolicy",
    "OpenAIPolicy",
    "Policy",
    "PolicyError",
    "SamplingParams",
    "ScriptedPolicy",
    "VLLMPolicy",
    "build_model_output",
    "parse_hermes_tool_calls",
    "split_reasoning",
]

_LAZY = {
    "HFPolicy": "rllm_gym.policies.hf",
    "OpenAIPolicy": "rllm_gym.policies.openai",
    "VLLMPolicy": "rllm_gym.policies.vllm",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rllm_gym.policies' has no attribute {name!r}")
