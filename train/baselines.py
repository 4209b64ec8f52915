"""The blind baseline of a run's held-out tasks: what a policy that ignores the observation can reach there.

A trained policy's held-out success means something only next to what needs no reading at all. On FrozenLake that is
the best fixed sequence of moves (:func:`rllm_gym.envs.frozenlake.best_fixed_moves`, exact): since every lake starts
top-left and ends bottom-right, "right, right, down, down, right, down" alone solves a good share of random lakes.
The trainer puts the figure into ``summary.json`` (``heldout_blind_baseline``, ``heldout_blind_moves``) and the model
card. Envs without such a baseline (math, code, a slippery lake) get none: the fields are then absent.
"""

from __future__ import annotations

import json
from typing import Any

import rllm_gym
from rllm_gym.envs.frozenlake import FrozenLakeEnv, best_fixed_moves

__all__ = ["blind_baselines", "describe_blind_baselines", "task_maps"]


def task_maps(env_id: str, env_args: dict[str, Any], tasks: list[Any]) -> list[list[str]] | None:
    """The FrozenLake map of each task (a seed or a task dict) as the env poses it, or None when ``env_id`` is not a
    non-slippery FrozenLake env (no exact blind baseline there)."""
    env = rllm_gym.make(env_id, **env_args)
    try:
        lake = env.unwrapped
        if not isinstance(lake, FrozenLakeEnv) or lake.is_slippery:
            return None
        maps = []
        for task in tasks:
            _, info = env.reset(**({"seed": task} if isinstance(task, int) else {"options": {"task": task}}))
            maps.append(info["task"]["map"])
        return maps
    finally:
        env.close()


def blind_baselines(
    env_ids: list[str], env_args: str | dict[str, Any], heldout: dict[str, list[Any]], max_turns: int
) -> dict[str, dict[str, Any]]:
    """``{"heldout_blind_baseline": {env: share solved}, "heldout_blind_moves": {env: moves}}`` for the envs among
    ``env_ids`` whose held-out tasks have a blind baseline (the best fixed sequence of at most ``max_turns`` moves);
    empty when none has."""
    arguments = json.loads(env_args) if isinstance(env_args, str) else dict(env_args)
    shares: dict[str, float] = {}
    sequences: dict[str, list[str]] = {}
    for env_id in env_ids:
        tasks = heldout.get(env_id)
        maps = task_maps(env_id, arguments, tasks) if tasks else None
        if not maps:
            continue
        moves, solved = best_fixed_moves(maps, max_turns)
        shares[env_id], sequences[env_id] = solved / len(maps), moves
    if not shares:
        return {}
    return {"heldout_blind_baseline": shares, "heldout_blind_moves": sequences}


def describe_blind_baselines(summary: dict[str, Any]) -> list[str]:
    """The console's line per env on its blind baseline (none when the summary has none): what the greedy success on
    held-out tasks must beat to show that the policy reads the observation."""
    moves = summary.get("heldout_blind_moves", {})
    return [
        f"blind baseline on the held-out tasks ({env_id}): the best fixed moves ({', '.join(moves.get(env_id, []))}) "
        f"solve {share:.3f}"
        for env_id, share in summary.get("heldout_blind_baseline", {}).items()
    ]
