"""A one-step env whose grading waits until several of its calls run at once (tests/train/test_async_generation.py).

Each reply's grading waits on one barrier of :data:`PARTIES` calls (at most 60 s): it rewards 1.0 where that many env
calls ran at once in the process and its default sandbox admits that many runs at once, 0.0 where they did not (the
barrier broke at its timeout). The generation worker is a spawned process: it imports this module when it loads
:class:`BarrierAgent` (named ``barrier_env:BarrierAgent``, with this folder on ``sys.path``), which registers
:data:`ENV_ID` there too.
"""

from __future__ import annotations

import threading

import gymnasium as gym

from rllm_gym.agent import BaseAgent
from rllm_gym.envs.base import SingleTurnEnv
from rllm_gym.sandbox import default_sandbox
from rllm_gym.types import RewardOutput

ENV_ID = "test/Barrier-v0"
AGENT = "barrier_env:BarrierAgent"
PARTIES = 8

_barrier = threading.Barrier(PARTIES, timeout=60.0)


def all_at_once(task: dict, action: str) -> RewardOutput:
    """1.0 where :data:`PARTIES` gradings ran at once and the sandbox admits as many runs at once, else 0.0."""
    try:
        _barrier.wait()
    except threading.BrokenBarrierError:
        return RewardOutput(reward=0.0, is_correct=False)
    together = default_sandbox().max_parallel >= PARTIES
    return RewardOutput(reward=float(together), is_correct=together)


class BarrierEnv(SingleTurnEnv):
    """One question, every time the same; graded by :func:`all_at_once`."""

    def __init__(self, render_mode: str | None = None):
        super().__init__(all_at_once, tasks=[{"question": "Wait for the others."}], render_mode=render_mode)


class BarrierAgent(BaseAgent):
    """The question as the only user message, no system prompt."""


if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point=BarrierEnv)
