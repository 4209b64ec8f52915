"""Reward functions: the :class:`RewardFunction` protocol and the built-in graders (math, code)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from rllm_gym.types import RewardOutput

__all__ = ["RewardFunction", "RewardOutput"]


@runtime_checkable
class RewardFunction(Protocol):
    """Grades one model reply against one task.

    Any callable with this signature is a reward function; envs that take a ``reward_fn`` accept it::

        >>> def exact(task_info: dict, action: str) -> RewardOutput:
        ...     ok = action.strip() == str(task_info["answer"])
        ...     return RewardOutput(reward=float(ok), is_correct=ok)
        >>> exact({"answer": 4}, " 4 ").reward
        1.0
    """

    def __call__(self, task_info: dict[str, Any], action: str) -> RewardOutput: ...
