"""Grading several replies at once within one time budget, for envs whose step grades more than one reply.

:func:`grade_side_by_side` runs a :class:`~rllm_gym.rewards.RewardFunction` on every reply in threads of its own and
waits at most ``time_limit`` seconds for all of them together, so a step costs one budget, not one grader's worst case
per reply. A grade that raised, returned something other than a :class:`~rllm_gym.types.RewardOutput` (or one whose
reward is NaN or infinite) or was not back in time is the infrastructure's failure: reward 0.0, ``is_correct`` None
and ``metadata["infra_failed"]`` True, with the reason in ``metadata["error"]``.
"""

from __future__ import annotations

import concurrent.futures
import math
from collections.abc import Mapping
from typing import Any

from rllm_gym.rewards import RewardFunction
from rllm_gym.types import RewardOutput

__all__ = ["grade_side_by_side"]


def grade_side_by_side(
    grader: RewardFunction, task: dict[str, Any], replies: Mapping[str, str], time_limit: float
) -> dict[str, RewardOutput]:
    """``{key: grade}`` for every reply, the graders running side by side for at most ``time_limit`` seconds.

    A grader still running past the limit keeps its thread until it returns (its result is dropped): give a grader
    that may never return a time limit of its own, as :class:`~rllm_gym.rewards.math.MathGrader` has.

        >>> exact = lambda task, reply: RewardOutput(reward=float(reply == task["answer"]))
        >>> {k: g.reward for k, g in grade_side_by_side(exact, {"answer": "4"}, {"a": "4", "b": "5"}, 5.0).items()}
        {'a': 1.0, 'b': 0.0}
    """
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(replies)), thread_name_prefix="grade")
    futures = {key: pool.submit(grader, task, reply) for key, reply in replies.items()}
    done, _ = concurrent.futures.wait(futures.values(), timeout=time_limit)
    pool.shutdown(wait=False, cancel_futures=True)
    return {key: _grade_of(future, future in done, time_limit) for key, future in futures.items()}


def _grade_of(future: concurrent.futures.Future, done: bool, time_limit: float) -> RewardOutput:
    if not done:
        error = f"the grader did not finish within {time_limit:g} s"
    elif future.exception() is not None:
        exc = future.exception()
        error = f"the grader crashed: {type(exc).__name__}: {str(exc)[:300]}"
    elif not isinstance(future.result(), RewardOutput):
        error = f"the grader returned {type(future.result()).__name__}, not a RewardOutput"
    elif not math.isfinite(future.result().reward):
        error = f"the grader returned a non-finite reward {future.result().reward!r}"
    else:
        return future.result()
    return RewardOutput(reward=0.0, is_correct=None, metadata={"error": error, "infra_failed": True})
