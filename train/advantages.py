"""Advantage estimators over TrajectoryGroups: GRPO, Dr. GRPO, RLOO and REINFORCE, broadcast or per step.

Pure functions of the rewards in the Episodes, testable without a model. Trajectories are compared only within their
group ``{task_id}:{trajectory.name}``, so in a solver-judge episode the solvers are compared with solvers and the judge
with judges. Estimators, for the rewards ``r_1..r_n`` of one group:

* ``grpo`` (Shao et al. 2024, DeepSeekMath): ``(r_i - mean(r)) / (std(r) + eps)``, ``std`` the sample standard
  deviation (as TRL computes it); ``norm_by_std=False`` leaves the division out.
* ``drgrpo`` (Liu et al. 2025, "Understanding R1-Zero-Like Training"): ``r_i - mean(r)``, never divided by the std.
* ``rloo`` (Ahmadian et al. 2024): ``r_i - mean(r_j, j != i)``, the leave-one-out baseline.
* ``reinforce``: ``r_i - b`` with ``b`` the mean reward of every trajectory of the same role in the batch.

A group of one trajectory gets advantage 0 from the group estimators (nothing to compare with). Multi-turn:
``broadcast`` gives each step its trajectory's advantage; ``per_step`` groups the steps of a group by step index and
compares their ``mc_return`` (the engine's discounted return-to-go; with ``gamma=0`` it is the step's own reward);
``state`` gives each step its trajectory's advantage (as ``broadcast``) plus a step-level one: the steps of a group
that acted on the same observation (an anchor state, whichever turn it came at) are compared by their ``mc_return``
with the same estimator, a state met once adding nothing (GiGPO: Feng et al. 2025, "Group-in-Group Policy
Optimization for LLM Agent Training"). With ``gamma < 1`` a move that reaches the goal sooner, or that does not walk
into a hole, is told apart from the others taken from the same state: credit goes to the step that earned it.
Trajectories of episodes whose termination reason is in ``exclude_termination`` (default ``error`` and
``infra_failed``) are masked: they enter no group statistic, get advantage 0 and a False mask. With
``drop_uniform_groups``, a group whose rewards are all equal (no signal) is dropped the same way and counted.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from rllm_gym.types import Episode, TerminationReason, Trajectory

__all__ = [
    "ESTIMATORS",
    "MODES",
    "AdvantageConfig",
    "AdvantageResult",
    "TrajectoryAdvantage",
    "compute_advantages",
    "group_advantages",
]

ESTIMATORS = ("grpo", "drgrpo", "rloo", "reinforce")
MODES = ("broadcast", "per_step", "state")


@dataclass(frozen=True)
class AdvantageConfig:
    """How advantages are computed; see the module docstring for the maths."""

    estimator: str = "grpo"
    mode: str = "broadcast"
    norm_by_std: bool = True
    drop_uniform_groups: bool = False
    # An exception or the infrastructure ended these, not the model: a reward of 0 there would teach nothing true.
    exclude_termination: tuple[str, ...] = ("error", "infra_failed")
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {list(ESTIMATORS)}, got {self.estimator!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {self.mode!r}")
        reasons = {reason.value for reason in TerminationReason}
        if isinstance(self.exclude_termination, str):
            raise ValueError(
                f"exclude_termination must be a tuple of reasons, got the string {self.exclude_termination!r}: "
                f"write ({self.exclude_termination!r},); allowed: {sorted(reasons)}"
            )
        excluded = tuple(TerminationReason(r).value if r in reasons else r for r in self.exclude_termination)
        unknown = [r for r in excluded if r not in reasons]
        if unknown:
            raise ValueError(f"exclude_termination has unknown reasons {unknown}; allowed: {sorted(reasons)}")
        object.__setattr__(self, "exclude_termination", excluded)
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or not 0 < self.eps < math.inf:
            raise ValueError(f"eps must be > 0, got {self.eps}")


@dataclass
class TrajectoryAdvantage:
    """One trajectory's advantage per step, and per step whether it is trained on (False: masked or dropped)."""

    advantages: list[float]
    mask: list[bool]


@dataclass
class AdvantageResult:
    """Advantages by trajectory uid, and metrics (``advantages/mean``, ``groups/dropped_uniform``, ...)."""

    by_uid: dict[str, TrajectoryAdvantage] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def group_advantages(
    rewards: Sequence[float],
    estimator: str = "grpo",
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    baseline: float | None = None,
) -> list[float]:
    """The advantages of one group's rewards (``baseline`` is required by, and only used by, ``reinforce``)."""
    n = len(rewards)
    if estimator == "reinforce":
        if baseline is None:
            raise ValueError("the reinforce estimator needs baseline= (the batch's mean reward for this role)")
        return [r - baseline for r in rewards]
    if n <= 1:
        return [0.0] * n
    if estimator == "rloo":
        total = sum(rewards)
        return [r - (total - r) / (n - 1) for r in rewards]
    mean = _mean(rewards)
    centred = [r - mean for r in rewards]  # (G,)
    if estimator == "drgrpo" or not norm_by_std:
        return centred
    if estimator != "grpo":
        raise ValueError(f"estimator must be one of {list(ESTIMATORS)}, got {estimator!r}")
    std = math.sqrt(sum(c * c for c in centred) / (n - 1))  # sample std, as torch.std and TRL
    return [c / (std + eps) for c in centred]


def _trajectory_reward(trajectory: Trajectory) -> float:
    if trajectory.reward is not None:
        return float(trajectory.reward)
    return float(sum(step.reward for step in trajectory.steps))


def _anchor(observation: object) -> str:
    """The key of an anchor state: the observation a step acted on (its text, or its repr)."""
    return observation if isinstance(observation, str) else repr(observation)


def compute_advantages(episodes: Sequence[Episode], config: AdvantageConfig | None = None) -> AdvantageResult:
    """Advantages for every step of every trajectory; also written to each ``Step.advantage``."""
    config = config or AdvantageConfig()
    result = AdvantageResult()
    # Samples: (group key, trajectory, step index or None for the whole trajectory, value, included)
    samples: dict[str, list[tuple[Trajectory, int | None, float]]] = defaultdict(list)
    # mode "state": (group key, anchor state) -> the steps taken from it, added on top of the trajectory advantages
    state_groups: dict[tuple[str, str], list[tuple[Trajectory, int, float]]] = defaultdict(list)
    masked = 0
    trajectories: list[Trajectory] = []
    for episode in episodes:
        excluded = episode.termination_reason is not None and episode.termination_reason.value in set(
            config.exclude_termination
        )
        for trajectory in episode.trajectories:
            trajectories.append(trajectory)
            n_steps = len(trajectory.steps)
            result.by_uid[trajectory.uid] = TrajectoryAdvantage([0.0] * n_steps, [False] * n_steps)
            if excluded:
                masked += 1
                continue
            key = f"{episode.task_id}:{trajectory.name}"
            if config.mode == "per_step":
                for index, step in enumerate(trajectory.steps):
                    samples[f"{key}:{index}"].append((trajectory, index, float(step.mc_return)))
                continue
            samples[key].append((trajectory, None, _trajectory_reward(trajectory)))  # broadcast, and state's base
            if config.mode == "state":
                for index, step in enumerate(trajectory.steps):
                    state_groups[(key, _anchor(step.observation))].append((trajectory, index, float(step.mc_return)))

    baselines: dict[str, float] = {}
    if config.estimator == "reinforce":
        by_role: dict[str, list[float]] = defaultdict(list)
        for group in samples.values():
            for trajectory, _, value in group:
                by_role[trajectory.name].append(value)
        baselines = {role: _mean(values) for role, values in by_role.items()}

    dropped = 0
    for group in samples.values():
        values = [value for _, _, value in group]
        if config.drop_uniform_groups and max(values) == min(values):
            dropped += 1
            continue
        advantages = group_advantages(
            values,
            config.estimator,
            norm_by_std=config.norm_by_std,
            eps=config.eps,
            baseline=baselines.get(group[0][0].name),
        )
        for (trajectory, index, _), advantage in zip(group, advantages, strict=True):
            entry = result.by_uid[trajectory.uid]
            indices = range(len(trajectory.steps)) if index is None else [index]
            for i in indices:
                entry.advantages[i] = advantage
                entry.mask[i] = True
    anchored = 0
    for group in state_groups.values():
        # Only trained steps enter a state's statistic (not those of masked or dropped trajectories).
        live = [(result.by_uid[trajectory.uid], index, value) for trajectory, index, value in group]
        live = [(entry, index, value) for entry, index, value in live if entry.mask[index]]
        if len(live) < 2:
            continue  # a state met once: nothing to compare it with
        values = [value for _, _, value in live]
        advantages = group_advantages(
            values, config.estimator, norm_by_std=config.norm_by_std, eps=config.eps, baseline=_mean(values)
        )
        anchored += len(live)
        for (entry, index, _), advantage in zip(live, advantages, strict=True):
            entry.advantages[index] += advantage

    for trajectory in trajectories:
        entry = result.by_uid[trajectory.uid]
        for step, advantage in zip(trajectory.steps, entry.advantages, strict=True):
            step.__dict__["advantage"] = advantage  # a float by construction; skips per-assignment validation

    trained = [a for entry in result.by_uid.values() for a, m in zip(entry.advantages, entry.mask, strict=True) if m]
    result.metrics = {
        "groups/total": float(len(samples)),
        "groups/dropped_uniform": float(dropped),
        "groups/anchored_steps": float(anchored),
        "trajectories/total": float(len(trajectories)),
        "trajectories/masked": float(masked),
        "advantages/mean": _mean(trained) if trained else 0.0,
        "advantages/std": math.sqrt(_mean([(a - _mean(trained)) ** 2 for a in trained])) if trained else 0.0,
        "advantages/min": min(trained, default=0.0),
        "advantages/max": max(trained, default=0.0),
    }
    return result
