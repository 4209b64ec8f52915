"""The math agent: a problem in, a worked solution with a boxed answer out, with thinking on or off."""

from __future__ import annotations

from rllm_gym.agents.base import BaseAgent
from rllm_gym.types import ModelOutput

__all__ = ["MathAgent"]

SYSTEM_PROMPT = "Solve the problem step by step. Put your final answer within \\boxed{}."


class MathAgent(BaseAgent):
    """Plays ``rllm/Math-v0`` (and its multi-turn variant): the problem, then any feedback, as user messages.

    The action is the whole reply, as Math-v0 defines its action: the env's grader applies the reasoning rules
    itself (only the text after the last ``</think>`` counts; an unclosed ``<think>`` is a format error) and extracts
    the boxed answer, so a reply is graded exactly as a reward function on the completion text grades it.
    """

    name = "agent"
    system_prompt = SYSTEM_PROMPT

    def parse_action(self, output: ModelOutput) -> str:
        # Not the base class's content (the reply without reasoning and tool-call blocks): the math agent offers no
        # tools, so tool-call markup is text, and the text before an unclosed <think> is no answer.
        return output.text
