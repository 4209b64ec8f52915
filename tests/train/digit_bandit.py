"""A one-step env whose reward is the share of digits in the reply, for tests/train/test_async_learning.py.

The embedded model's replies hold digits now and then (its corpus has numbers), so a few GRPO steps at a high learning
rate raise the share measurably. The generation worker of ``max_staleness >= 1`` is a spawned process: it imports this
module when it loads :class:`DigitAgent` (the rollout names it as ``digit_bandit:DigitAgent``, with this folder on
``sys.path``), and the import registers :data:`ENV_ID` there too.
"""

from __future__ import annotations

import gymnasium as gym

from rllm_gym.agent import BaseAgent
from rllm_gym.envs.base import SingleTurnEnv
from rllm_gym.types import RewardOutput

ENV_ID = "test/DigitBandit-v0"
AGENT = "digit_bandit:DigitAgent"


def digit_share(task: dict, action: str) -> RewardOutput:
    """The share of the reply's characters that are digits (0 for an empty reply)."""
    share = sum(char.isdigit() for char in action) / len(action) if action else 0.0
    return RewardOutput(reward=share, is_correct=share == 1.0)


class DigitBandit(SingleTurnEnv):
    """One question, every time the same; the reward is the share of digits in the reply."""

    def __init__(self, render_mode: str | None = None):
        super().__init__(digit_share, tasks=[{"question": "Write a number."}], render_mode=render_mode)


class DigitAgent(BaseAgent):
    """The question as the only user message, no system prompt."""


if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point=DigitBandit)
