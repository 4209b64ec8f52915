"""How the gateway records a call: one Step per call (per choice), and which recorded call a new chat continues.

A chat continues the latest recorded call whose messages plus reply it starts with (:func:`previous_step`); the
gateway then continues that call's prompt and sampled ids token for token (:mod:`rllm_gym.policies.tokens`).
"""

from __future__ import annotations

import contextlib
from typing import Any

from rllm_gym.policies.base import Policy
from rllm_gym.types import ModelOutput, Step, Trajectory

__all__ = ["model_context", "previous_step", "record_step", "vocab_size"]


def model_context(policy: Policy) -> int | None:
    """The context length of the policy's model (``config.max_position_embeddings``), or None where it has none."""
    config = getattr(getattr(policy, "model", None), "config", None)
    value = getattr(config, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def vocab_size(policy: Policy) -> int | None:
    """How many token ids the policy can take: the smaller of its tokenizer's size and its model's ``vocab_size``
    (either may be the larger: padded embeddings, or added tokens the model has no row for); ``None`` when it has
    neither."""
    sizes = []
    tokenizer = getattr(policy, "tokenizer", None)
    if tokenizer is not None:
        with contextlib.suppress(TypeError):  # a tokenizer without a size
            sizes.append(len(tokenizer))
    config = getattr(getattr(policy, "model", None), "config", None)
    value = getattr(config, "vocab_size", None)
    if isinstance(value, int) and value > 0:
        sizes.append(value)
    return min(sizes, default=None)


def previous_step(trajectory: Trajectory, messages: list[dict[str, Any]]) -> Step | None:
    """The latest recorded chat call whose messages and reply ``messages`` starts with (the call it continues)."""
    for step in reversed(trajectory.steps):
        chat = step.chat_completions
        if chat and len(chat) <= len(messages) and messages[: len(chat)] == chat:
            return step
    return None


def record_step(trajectory: Trajectory, output: ModelOutput, chat: list[dict[str, Any]], tools: Any) -> None:
    """Append one call to ``trajectory`` as a Step: ``chat`` (its messages and the reply the client got; empty for a
    ``completions`` call), the exact prompt and completion ids and log-probabilities, and the call's tools."""
    step = Step(
        chat_completions=chat,
        prompt_ids=output.prompt_ids,
        response_ids=output.completion_ids,
        logprobs=output.logprobs,
        model_response=output.text,
        thought=output.reasoning,
        action=chat[-1] if chat else output.text,
        model_output=output,
        info={"tools": tools} if tools else {},
    )
    trajectory.steps.append(step)
