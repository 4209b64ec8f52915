"""The math agent: a problem in, a worked solution with a boxed answer out, with thinking on or off."""

from __future__ import annotations

from rllm_gym.agents.base import BaseAgent

__all__ = ["MathAgent"]

SYSTEM_PROMPT = "Solve the problem step by step. Put your final answer within \\boxed{}."


class MathAgent(BaseAgent):
    """Plays ``rllm/Math-v0`` (and its multi-turn variant): the problem, then any feedback, as user messages.

    The action is the reply without its ``<think>`` block; the env's grader extracts the boxed answer from it.
    """

    name = "agent"
    system_prompt = SYSTEM_PROMPT
