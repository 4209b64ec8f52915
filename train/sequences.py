"""Training rows from episodes, without torch or TRL: the dataset prompt that names a task, and the token sequences a
trajectory becomes (one sequence of the episode's tokens; a new row only where the chat itself did not continue), and
the groups of similar length that the trainer scores those rows in (:func:`width_groups`).

:mod:`rllm_gym.train.trainer` feeds these rows to TRL; they are pure functions, tested without a model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rllm_gym.types import Trajectory

__all__ = [
    "TrainingSequence",
    "decode_prompt",
    "encode_prompt",
    "placeholder_sequence",
    "trajectory_to_sequences",
    "width_groups",
]


def encode_prompt(env_id: str, task: Any, slot: int = 0) -> str:
    """The dataset ``prompt`` for a task: which env, which task (a dict or an int seed), which trajectory slot."""
    return json.dumps({"env": env_id, "task": task, "slot": slot}, sort_keys=True)


def decode_prompt(prompt: Any) -> tuple[str, Any, int]:
    try:
        data = json.loads(prompt)
        return data["env"], data["task"], int(data.get("slot", 0))
    except (TypeError, ValueError, KeyError) as error:
        raise ValueError(
            f"a training prompt must be made by rllm_gym.train.trainer.encode_prompt(env_id, task), got {prompt!r}"
        ) from error


@dataclass
class TrainingSequence:
    """One row of TRL's batch: ``env_mask`` 1 on model tokens; ``spans[i]`` are the reply tokens of the trajectory's
    step ``first_step + i``; ``source`` is the prompt (trajectory) it trains, -1 for a row that only pads the batch;
    ``policy_version`` the oldest policy version that sampled one of its replies (``ModelOutput.policy_version``)."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    first_step: int = 0
    source: int = 0
    prefix_mismatch: bool = False  # this row starts at a step whose prompt did not extend the previous row's tokens
    policy_version: int = 0


def placeholder_sequence(filler_id: int, source: int = -1) -> TrainingSequence:
    """A one-token row with ``env_mask`` 0: nothing of it is trained (TRL needs a row where there is nothing)."""
    return TrainingSequence(
        prompt_ids=[filler_id], completion_ids=[filler_id], env_mask=[0], logprobs=[0.0], source=source
    )


def trajectory_to_sequences(trajectory: Trajectory, filler_id: int = 0, source: int = 0) -> list[TrainingSequence]:
    """The training rows of a trajectory: the first step's prompt, then each reply (``env_mask`` 1) and the tokens
    added before the next reply (``env_mask`` 0), as one row while each step's prompt extends the previous prompt and
    reply token for token; a new row (that step's full prompt, masked) where it does not.

    The policies build each prompt from the previous call's tokens (token in, token out:
    :mod:`rllm_gym.policies.tokens`), so a trajectory of the default agents with their full history is one row by
    construction. A row splits where the chat itself did not continue: the agent dropped earlier turns by design
    (``max_history_turns``), the policy re-rendered the chat with its template (``token_history="template"``), or a
    server rendered chat text (``ModelOutput.text_rendered``). No step is ever dropped. A trajectory without steps (its
    episode failed before the first LLM call) becomes a one-token placeholder with ``env_mask`` 0.
    """
    if not trajectory.steps:
        return [placeholder_sequence(filler_id, source)]
    rows: list[TrainingSequence] = []
    context: list[int] = []
    for index, step in enumerate(trajectory.steps):
        version = step.model_output.policy_version if step.model_output is not None else 0
        if rows and step.prompt_ids[: len(context)] == context:
            added = step.prompt_ids[len(context) :]
            row = rows[-1]
            row.completion_ids += added
            row.env_mask += [0] * len(added)
            row.logprobs += [0.0] * len(added)
            row.policy_version = min(row.policy_version, version)
        else:
            row = TrainingSequence(
                prompt_ids=list(step.prompt_ids),
                first_step=index,
                source=source,
                prefix_mismatch=bool(rows),
                policy_version=version,
            )
            rows.append(row)
        start = len(row.completion_ids)
        row.completion_ids += step.response_ids
        row.env_mask += [1] * len(step.response_ids)
        logprobs = step.logprobs if len(step.logprobs) == len(step.response_ids) else [0.0] * len(step.response_ids)
        row.logprobs += logprobs
        row.spans.append((start, len(row.completion_ids)))
        context = row.prompt_ids + row.completion_ids
    return rows


# What one more forward and backward call costs, counted in padded tokens: the Python and kernel-launch overhead of a
# call is worth a few hundred tokens of a 0.5M-parameter model on a CPU, and about a hundred of a 7B one on a GPU.
CALL_COST_TOKENS = 1024


def width_groups(widths: Sequence[int], call_cost: int = CALL_COST_TOKENS) -> list[list[int]]:
    """The rows (by index, ascending in each group) split into groups that are each padded to their own widest row,
    chosen to spend the fewest padded tokens plus ``call_cost`` per group.

    One row of an unusual length pads a whole batch to itself: in the main job a reply the env cannot parse brings its
    error message into the next prompt (~108 tokens against ~48), which doubled the tokens of every row of that step.
    Groups are runs of the sorted widths (an optimal partition has that form); found exactly by dynamic programming
    over the distinct widths. All the rows in one group when splitting would not save more than a call costs.
    """
    distinct = np.unique(np.asarray(widths, dtype=np.int64))  # (K,) ascending
    rows_below = np.searchsorted(np.sort(np.asarray(widths, dtype=np.int64)), distinct, side="right")  # (K,)
    rows_below = np.concatenate([[0], rows_below])  # rows_below[j]: rows of the widths distinct[:j]
    best = np.zeros(len(distinct) + 1)  # best[j]: the least cost of the rows of the widths distinct[:j]
    cut = np.zeros(len(distinct) + 1, dtype=np.int64)  # cut[j]: where the last group of that best starts
    for j in range(1, len(distinct) + 1):
        # the last group holds the widths distinct[i:j], all padded to distinct[j - 1], for each i < j
        costs = best[:j] + (rows_below[j] - rows_below[:j]) * distinct[j - 1] + call_cost  # (j,)
        cut[j] = int(np.argmin(costs))
        best[j] = costs[cut[j]]
    highs = []  # the widest width of each group, from the last group back
    j = len(distinct)
    while j > 0:
        highs.append(int(distinct[j - 1]))
        j = int(cut[j])
    groups: list[list[int]] = [[] for _ in highs]
    for row, group in enumerate(np.searchsorted(highs[::-1], widths).tolist()):
        groups[group].append(row)
    return groups
