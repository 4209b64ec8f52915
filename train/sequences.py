"""Training rows from episodes, without torch or TRL: the dataset prompt that names a task, and the token sequences a
trajectory becomes (one cumulative sequence while the chat template keeps its history, a new row where it does not).

:mod:`rllm_gym.train.trl_rollout` feeds these rows to TRL; they are pure functions, tested without a model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rllm_gym.types import Trajectory

__all__ = ["TrainingSequence", "decode_prompt", "encode_prompt", "placeholder_sequence", "trajectory_to_sequences"]


def encode_prompt(env_id: str, task: Any, slot: int = 0) -> str:
    """The dataset ``prompt`` for a task: which env, which task (a dict or an int seed), which trajectory slot."""
    return json.dumps({"env": env_id, "task": task, "slot": slot}, sort_keys=True)


def decode_prompt(prompt: Any) -> tuple[str, Any, int]:
    try:
        data = json.loads(prompt)
        return data["env"], data["task"], int(data.get("slot", 0))
    except (TypeError, ValueError, KeyError) as error:
        raise ValueError(
            f"a training prompt must be made by rllm_gym.train.trl_rollout.encode_prompt(env_id, task), got {prompt!r}"
        ) from error


@dataclass
class TrainingSequence:
    """One row of TRL's batch: ``env_mask`` 1 on model tokens; ``spans[i]`` are the reply tokens of the trajectory's
    step ``first_step + i``; ``source`` is the prompt (trajectory) it trains, -1 for a row that only pads the batch."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    first_step: int = 0
    source: int = 0
    prefix_mismatch: bool = False  # this row starts at a step whose prompt did not extend the previous row's tokens
    retokenized: bool = False  # a later step's prompt re-tokenized an earlier reply (same text, other tokens)


def placeholder_sequence(filler_id: int, source: int = -1) -> TrainingSequence:
    """A one-token row with ``env_mask`` 0: nothing of it is trained (TRL needs a row where there is nothing)."""
    return TrainingSequence(
        prompt_ids=[filler_id], completion_ids=[filler_id], env_mask=[0], logprobs=[0.0], source=source
    )


def trajectory_to_sequences(
    trajectory: Trajectory,
    filler_id: int = 0,
    source: int = 0,
    decode: Callable[[list[int]], str] | None = None,
) -> list[TrainingSequence]:
    """The training rows of a trajectory: one cumulative sequence while each step's prompt extends the previous
    prompt and reply, a new row (the step's full prompt) at each step where it does not.

    No step is ever dropped: a template that re-renders the history (Qwen3 drops earlier ``<think>`` blocks) gives one
    row per turn, each with the prompt the model saw and its own reply trained. With ``decode`` (the tokenizer's,
    special tokens kept), a step whose prompt only spells an earlier reply with other tokens of the same text (a BPE
    tokenizer re-encoding sampled tokens, ``"le" "ft"`` -> ``"left"``) extends the row all the same: the row keeps the
    sampled tokens and takes the new messages after them, and is marked ``retokenized``. Without this, a tiny model's
    multi-turn rows split at every such reply and each split row pads the whole batch to its full prompt. A trajectory
    without steps (its episode failed before the first LLM call) becomes a one-token placeholder with ``env_mask`` 0.
    """
    if not trajectory.steps:
        return [placeholder_sequence(filler_id, source)]
    rows: list[TrainingSequence] = []
    context: list[int] = []
    for index, step in enumerate(trajectory.steps):
        if rows and step.prompt_ids[: len(context)] == context:
            new_messages: list[int] | None = step.prompt_ids[len(context) :]
        elif rows and decode is not None:
            new_messages = _after_same_text(step.prompt_ids, context, decode)
            rows[-1].retokenized |= new_messages is not None
        else:
            new_messages = None
        if new_messages is None:
            rows.append(
                TrainingSequence(
                    prompt_ids=list(step.prompt_ids), first_step=index, source=source, prefix_mismatch=bool(rows)
                )
            )
        else:
            rows[-1].completion_ids += new_messages
            rows[-1].env_mask += [0] * len(new_messages)
            rows[-1].logprobs += [0.0] * len(new_messages)
        row = rows[-1]
        start = len(row.completion_ids)
        row.completion_ids += step.response_ids
        row.env_mask += [1] * len(step.response_ids)
        logprobs = step.logprobs if len(step.logprobs) == len(step.response_ids) else [0.0] * len(step.response_ids)
        row.logprobs += logprobs
        row.spans.append((start, len(row.completion_ids)))
        context = row.prompt_ids + row.completion_ids
    return rows


def _after_same_text(prompt: list[int], context: list[int], decode: Callable[[list[int]], str]) -> list[int] | None:
    """The tokens of ``prompt`` after a prefix that decodes to the same text as ``context``, or None when no prefix
    does (the template changed the text, not only its tokens)."""
    text = decode(context)
    common = next((i for i, (a, b) in enumerate(zip(prompt, context, strict=False)) if a != b), len(context))
    for end in range(common, len(prompt) + 1):
        spelled = decode(prompt[:end])
        if spelled == text:
            return prompt[end:]
        if len(spelled) > len(text) or not text.startswith(spelled[: len(spelled) - 8]):
            return None
    return None
