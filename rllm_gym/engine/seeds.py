"""Episode seeds as values: every env reset gets a seed derived from the run's seed, the task and the rollout.

An episode is planned as an :class:`EpisodeSpec` ``(task, id, seed)``; the engine passes ``seed`` to ``env.reset``.
:func:`episode_seed` derives it with ``numpy.random.SeedSequence`` from the run's seed, a key of the task and the
rollout index (any tuple of ints: the trainer adds its call and process), so the same run seed gives the same resets
and no two rollouts share a seed by arithmetic accident (``seed + rollout`` made rollout 1 of run seed 0 the same as
rollout 0 of run seed 1). An int task is the env's reset seed itself (the env draws its task from it), so every
rollout of it resets alike, as a GRPO group needs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from rllm_gym.engine.common import task_id_of

__all__ = ["EpisodeSpec", "check_seed", "episode_seed", "episode_specs", "reset_seed"]


class EpisodeSpec(NamedTuple):
    """One episode to run: its task (a dict or an int reset seed), its id, and the seed its env resets with."""

    task: Any
    id: str
    seed: int | None


def check_seed(run_seed: Any) -> None:
    """Raise ``ValueError`` unless ``run_seed`` is an int >= 0."""
    if isinstance(run_seed, bool) or not isinstance(run_seed, int) or run_seed < 0:
        raise ValueError(f"seed must be an int >= 0 (the run's seed) or None (unseeded resets), got {run_seed!r}")


def episode_seed(run_seed: int, task_key: str | int, rollout: int | Sequence[int]) -> int:
    """The reset seed of rollout ``rollout`` of the task keyed ``task_key`` (its id) in a run seeded ``run_seed``.

    A 63-bit int from ``SeedSequence(run_seed, spawn_key=(hash of the task key, *rollout))``: distinct inputs give
    independent seeds (a collision is a 2**-63 chance), and the same inputs give the same seed in any process.
    """
    check_seed(run_seed)
    rollouts = (rollout,) if isinstance(rollout, int) else tuple(rollout)
    if not rollouts or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in rollouts):
        raise ValueError(f"rollout must be an int >= 0 or a non-empty tuple of them, got {rollout!r}")
    # A str key hashed (Python's hash() differs between processes); ints and strs never share a key ("7" vs 7).
    digest = hashlib.sha256(f"{type(task_key).__name__}:{task_key}".encode()).digest()
    key = int.from_bytes(digest[:8], "little")
    high, low = np.random.SeedSequence(run_seed, spawn_key=(key, *rollouts)).generate_state(2, np.uint32)
    return (int(high) << 31) ^ int(low)


def reset_seed(run_seed: int | None, task: Any, task_key: str | int, rollout: int | Sequence[int]) -> int | None:
    """The seed ``env.reset`` gets for one episode: an int task is the reset seed itself; a task dict gets
    :func:`episode_seed` (``None`` when ``run_seed`` is ``None``: unseeded resets, asked for explicitly)."""
    if isinstance(task, int) and not isinstance(task, bool):
        return task
    if run_seed is None:
        return None
    return episode_seed(run_seed, task_key, rollout)


def episode_specs(tasks: Sequence[Any], n_rollouts: int = 1, seed: int | None = 0) -> list[EpisodeSpec]:
    """Every rollout of every task, in order: ids ``"{task_id}:{rollout}"``, seeds from :func:`reset_seed`."""
    if isinstance(n_rollouts, bool) or not isinstance(n_rollouts, int) or n_rollouts < 1:
        raise ValueError(f"n_rollouts must be an int >= 1, got {n_rollouts!r}")
    if seed is not None:
        check_seed(seed)
    specs = []
    for index, task in enumerate(tasks):
        task_id = task_id_of(task, index)
        for rollout in range(n_rollouts):
            specs.append(EpisodeSpec(task, f"{task_id}:{rollout}", reset_seed(seed, task, task_id, rollout)))
    return specs
