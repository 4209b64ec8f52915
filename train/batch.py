"""What one training step trains on, as one typed value: :func:`build_training_batch` turns the step's episodes (this
process's rows and every process's episodes, after the gather), the advantage settings and the tokenizer's padding
facts into a :class:`TrainingBatch`.

This is the whole of a step's data: the token rows, which tokens the model sampled (``env_mask``) and which the loss
trains (``loss_mask``), each token's advantage, the behaviour log-probabilities the policy sampled with, the policy
version that sampled each row, each row's task and advantage group, and the step's metrics. The trainer's adapter
(:mod:`rllm_gym.train.trainer`) hands the rows to TRL and puts the advantages and the loss mask into TRL's batch;
nothing else decides what is trained. Pure: numpy only, no torch, TRL or transformers, tested without a model.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from rllm_gym.train.advantages import AdvantageConfig, compute_advantages
from rllm_gym.train.sequences import TrainingSequence
from rllm_gym.types import Episode, Trajectory

__all__ = [
    "PaddingFacts",
    "RowCounts",
    "Staleness",
    "TrainingBatch",
    "build_training_batch",
    "episode_metrics",
    "row_counts",
    "training_view",
]


@dataclass(frozen=True)
class PaddingFacts:
    """The tokenizer's facts a batch is padded with: its pad token, and the multiple widths are rounded up to (TRL's
    ``pad_to_multiple_of``; None: no rounding)."""

    pad_token_id: int
    pad_to_multiple_of: int | None = None

    def width(self, lengths: Sequence[int]) -> int:
        """The padded width of rows of ``lengths``: the longest, rounded up to the multiple."""
        widest = max(lengths, default=0)
        multiple = self.pad_to_multiple_of
        return -(-widest // multiple) * multiple if multiple else widest


class RowCounts(NamedTuple):
    """One process's counts for the step's metrics, summed over every process after the gather."""

    split_trajectories: int  # trajectories cut into several rows (a prompt that did not extend the previous one)
    trained_rows: int  # rows that train a trajectory (not padding)
    rows: int  # every row, padding included
    model_tokens: int  # tokens the model sampled (env_mask 1)
    text_rendered: int  # LLM calls that a server rendered from chat text
    calls: int  # LLM calls


def row_counts(sequences: Sequence[TrainingSequence], episodes: Sequence[Episode]) -> RowCounts:
    """This process's :class:`RowCounts` from its rows and its (full) episodes, each episode counted once."""
    unique = {episode.id: episode for episode in episodes}.values()  # the slots of one multi-agent episode share it
    calls = [step.model_output for episode in unique for t in episode.trajectories for step in t.steps]
    return RowCounts(
        split_trajectories=len({s.source for s in sequences if s.prefix_mismatch}),
        trained_rows=sum(s.source >= 0 for s in sequences),
        rows=len(sequences),
        model_tokens=sum(sum(s.env_mask) for s in sequences),
        text_rendered=sum(o is not None and o.text_rendered for o in calls),
        calls=len(calls),
    )


def training_view(episode: Episode, slot: int) -> Episode:
    """The episode as advantage computation needs it, small enough to gather: id, termination reason, correctness and
    the trained trajectory (``slot``) with its rewards, without chats or model outputs."""
    trajectory = episode.trajectories[slot] if slot < len(episode.trajectories) else Trajectory()
    steps = [step.model_copy(update={"chat_completions": [], "model_output": None}) for step in trajectory.steps]
    trimmed = trajectory.model_copy(update={"steps": steps, "task": None})
    metadata = {"env": episode.metadata.get("env")}
    if "error" in episode.metadata:  # type and message only: the traceback stays in the process that ran it
        metadata["error"] = {key: episode.metadata["error"].get(key) for key in ("type", "message")}
    return Episode(
        id=episode.id,
        termination_reason=episode.termination_reason,
        is_correct=episode.is_correct,
        trajectories=[trimmed],
        metadata=metadata,
    )


@dataclass(frozen=True)
class TrainingBatch:
    """This process's rows of one step and what the loss does with each token.

    Shapes: ``B`` rows (padding rows included), ``P`` the widest prompt and ``C`` the widest completion, each rounded
    up to :attr:`PaddingFacts.pad_to_multiple_of`. Prompts are padded on the left, completions on the right, as TRL
    pads them. A row's completion is the trajectory's replies (``env_mask`` 1) with the tokens the env added between
    them (``env_mask`` 0); ``loss_mask`` is ``env_mask`` less the steps the advantages masked (excluded terminations,
    dropped groups) and less every padding row. ``advantages`` holds each reply token's step advantage;
    ``row_advantages`` a row's first step's (in ``broadcast`` mode every step of a trajectory has the same one).
    """

    rows: list[TrainingSequence]  # (B,) the ragged rows TRL is handed
    prompt_ids: np.ndarray  # (B, P) int64, left-padded with the pad token
    prompt_mask: np.ndarray  # (B, P) int64, 1 on prompt tokens
    completion_ids: np.ndarray  # (B, C) int64, right-padded with the pad token
    completion_mask: np.ndarray  # (B, C) int64, 1 on completion tokens
    env_mask: np.ndarray  # (B, C) int64, 1 on tokens the model sampled
    loss_mask: np.ndarray  # (B, C) int64, 1 on tokens the loss trains
    advantages: np.ndarray  # (B, C) float32, the step advantage of each reply token, 0 elsewhere
    row_advantages: np.ndarray  # (B,) float32, the advantage of each row's first step, 0 for padding rows
    behaviour_logprobs: np.ndarray  # (B, C) float32, the sampling policy's log-probabilities (0 where unknown)
    policy_versions: np.ndarray  # (B,) int64, the oldest policy version that sampled a row's replies
    task_ids: list[str | None]  # (B,) the task each row trains, None for padding rows
    group_keys: list[tuple[str, str] | None]  # (B,) the advantage group: (task id, trajectory name)
    rewards: list[float]  # (B,) the trajectory reward each row trains (0 for padding rows)
    mode: str  # the advantage mode: "broadcast" trains row_advantages, the others the per-token ones
    metrics: dict[str, float]  # the step's metrics over every process

    @property
    def loss_advantages(self) -> np.ndarray:
        """What the loss multiplies: ``row_advantages`` (B,) in broadcast mode, else ``advantages`` (B, C)."""
        return self.row_advantages if self.mode == "broadcast" else self.advantages

    def trl_output(self) -> dict[str, Any]:
        """The rows in the form of TRL's ``rollout_func`` output (``trajectory_reward`` feeds TRL's logs only)."""
        return {
            "prompt_ids": [row.prompt_ids for row in self.rows],
            "completion_ids": [row.completion_ids for row in self.rows],
            "logprobs": [row.logprobs for row in self.rows],
            "env_mask": [row.env_mask for row in self.rows],
            "trajectory_reward": list(self.rewards),
        }


@dataclass(frozen=True)
class Staleness:
    """The policy ``version`` a step trains and the most versions (``limit``, the run's ``max_staleness``) a row may
    have been sampled before it: a row's staleness is ``version - row.policy_version`` (its oldest reply's)."""

    version: int
    limit: int

    def stale_rows(self, rows: Sequence[TrainingSequence]) -> list[int]:
        """The indices of the trained rows sampled more than ``limit`` versions ago."""
        return [i for i, row in enumerate(rows) if row.source >= 0 and self.version - row.policy_version > self.limit]

    def metrics(self, rows: Sequence[TrainingSequence], dropped: int) -> dict[str, float]:
        """``async/staleness_mean`` and ``_max`` over the step's rows (the dropped ones too: a max above the limit
        says rows were dropped), and the share of them ``dropped``."""
        ages = [self.version - row.policy_version for row in rows if row.source >= 0]
        return {
            "async/staleness_mean": sum(ages) / max(len(ages), 1),
            "async/staleness_max": float(max(ages, default=0)),
            "async/dropped_rows": dropped / max(len(ages), 1),
        }


def _padded(rows: Sequence[Sequence[float]], width: int, value: float, dtype: Any, left: bool = False) -> np.ndarray:
    """``rows`` in one (B, width) array, each padded with ``value`` on the right (or the left)."""
    out = np.full((len(rows), width), value, dtype=dtype)  # (B, width)
    for index, row in enumerate(rows):
        if row:
            columns = slice(width - len(row), width) if left else slice(0, len(row))
            out[index, columns] = row
    return out


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Pass rate, turns, the reward per role and per env, and the share of each termination reason."""
    n = max(len(episodes), 1)
    metrics = {
        "rollout/pass_rate": sum(e.is_correct for e in episodes) / n,
        "rollout/turns": sum(len(e.trajectories[0].steps) for e in episodes) / n,
    }
    by_role: dict[str, list[float]] = defaultdict(list)
    by_env: dict[str, list[float]] = defaultdict(list)
    for episode in episodes:
        for trajectory in episode.trajectories:
            by_role[trajectory.name].append(float(trajectory.reward or 0.0))
    for episode in episodes:
        by_env[str(episode.metadata.get("env"))].extend(float(t.reward or 0.0) for t in episode.trajectories)
    for prefix, groups in (("role", by_role), ("env", by_env)):
        for name, rewards in groups.items():
            metrics[f"train/reward/{prefix}/{name}"] = sum(rewards) / len(rewards)
    reasons = Counter(e.termination_reason.value if e.termination_reason else "unknown" for e in episodes)
    for reason, count in reasons.items():
        metrics[f"rollout/termination/{reason}"] = count / n
    metrics["rollout/infra_failed"] = float(reasons["infra_failed"])  # episodes, not a share: left out of the loss
    return metrics


def _row_metrics(counts: Sequence[RowCounts], episodes: int, seconds: float) -> dict[str, float]:
    """The row metrics over every process's :class:`RowCounts` (``episodes``: every process's, each once per slot)."""
    total = RowCounts(*(sum(column) for column in zip(*counts, strict=True))) if counts else RowCounts(*[0] * 6)
    n = max(episodes, 1)
    return {
        "rollout/prefix_mismatch": total.split_trajectories / n,
        "rollout/text_rendered": total.text_rendered / max(total.calls, 1),
        "rollout/rows_per_trajectory": total.trained_rows / n,
        "rollout/padding_rows": (total.rows - total.trained_rows) / max(total.rows, 1),
        "rollout/model_tokens_per_s": total.model_tokens / max(seconds, 1e-9),
    }


def build_training_batch(
    rows: Sequence[TrainingSequence],
    local: Sequence[Episode],
    everyone: Sequence[Episode],
    config: AdvantageConfig,
    padding: PaddingFacts,
    *,
    rewards: Sequence[float],
    counts: Sequence[RowCounts] = (),
    seconds: float = 0.0,
    backend_metrics: dict[str, float] | None = None,
    staleness: Staleness | None = None,
) -> TrainingBatch:
    """The step's :class:`TrainingBatch` for this process's ``rows``.

    ``local[i]`` is the (:func:`training_view` of the) episode whose trained trajectory is prompt ``i``, the one a row
    with ``source == i`` trains, and ``rewards[i]`` its reward; ``everyone`` is every process's ``local`` after the
    gather (advantage groups span processes); ``counts`` every process's :func:`row_counts`, ``seconds`` the
    rollout's wall time and ``backend_metrics`` the generation backend's own metrics, for the batch's ``metrics``.
    Writes each step's advantage into the ``everyone`` episodes' ``Step.advantage``
    (:func:`~rllm_gym.train.advantages.compute_advantages`). With ``staleness`` (asynchronous generation), a row
    sampled more than ``staleness.limit`` versions before the trained one is not trained (its ``loss_mask`` is 0;
    its episode still counts in its group's statistics, its reward being a real one), and the ``async/`` metrics say
    how stale the rows were and how many were dropped.
    """
    result = compute_advantages(list(everyone), config)
    completion_width = padding.width([len(row.completion_ids) for row in rows])
    env_mask = _padded([row.env_mask for row in rows], completion_width, 0, np.int64)  # (B, C)
    loss_mask = env_mask.copy()  # (B, C)
    advantages = np.zeros((len(rows), completion_width), dtype=np.float32)  # (B, C)
    row_advantages = np.zeros(len(rows), dtype=np.float32)  # (B,)
    task_ids: list[str | None] = []
    group_keys: list[tuple[str, str] | None] = []
    for index, row in enumerate(rows):
        trajectory = local[row.source].trajectories[0] if row.source >= 0 else None
        task_ids.append(local[row.source].task_id if trajectory is not None else None)
        group_keys.append((local[row.source].task_id, trajectory.name) if trajectory is not None else None)
        if trajectory is None or not row.spans:
            loss_mask[index] = 0
            continue
        entry = result.by_uid[trajectory.uid]
        steps = range(row.first_step, row.first_step + len(row.spans))
        for (start, end), step in zip(row.spans, steps, strict=True):
            advantages[index, start:end] = entry.advantages[step]
            if not entry.mask[step]:
                loss_mask[index, start:end] = 0
        row_advantages[index] = entry.advantages[row.first_step]
    async_metrics = {}
    if staleness is not None:
        dropped = staleness.stale_rows(rows)
        loss_mask[dropped] = 0
        async_metrics = staleness.metrics(rows, len(dropped))
    prompt_width = padding.width([len(row.prompt_ids) for row in rows])
    metrics = {
        **async_metrics,
        **result.metrics,
        **_row_metrics(counts, len(everyone), seconds),
        **(backend_metrics or {}),
        **episode_metrics(everyone),
    }
    return TrainingBatch(
        rows=list(rows),
        prompt_ids=_padded([row.prompt_ids for row in rows], prompt_width, padding.pad_token_id, np.int64, left=True),
        prompt_mask=_padded([[1] * len(row.prompt_ids) for row in rows], prompt_width, 0, np.int64, left=True),
        completion_ids=_padded([row.completion_ids for row in rows], completion_width, padding.pad_token_id, np.int64),
        completion_mask=_padded([[1] * len(row.completion_ids) for row in rows], completion_width, 0, np.int64),
        env_mask=env_mask,
        loss_mask=loss_mask,
        advantages=advantages,
        row_advantages=row_advantages,
        behaviour_logprobs=_padded([row.logprobs for row in rows], completion_width, 0.0, np.float32),
        policy_versions=np.array([row.policy_version for row in rows], dtype=np.int64),
        task_ids=task_ids,
        group_keys=group_keys,
        rewards=[float(rewards[row.source]) if row.source >= 0 else 0.0 for row in rows],
        mode=config.mode,
        metrics=metrics,
    )
