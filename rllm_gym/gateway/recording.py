"""How the gateway records a call: one Step per call (per choice), and which recorded call a new chat continues.

A chat continues the latest recorded call whose messages plus reply it starts with (:func:`previous_step`); the
gateway then continues that call's prompt and sampled ids token for token (:mod:`rllm_gym.policies.tokens`).
"""

from __future__ import annotations

from typing import Any

from rllm_gym.policies.base import Policy
from rllm_gym.types import ModelOutput, Step, Trajectory

__all__ = ["model_context", "previous_step", "record_step"]


def model_context(policy: Policy) -> int | None:
    """The context length of the policy's model (``config.max_position_embeddings``), or None where it has none."""
    config = getattr(getattr(policy, "model", None), "config", None)
    value = getattr(config, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


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
