"""The code agent: a programming problem in, a Python solution in a fenced block out, test feedback in between."""

from __future__ import annotations

from rllm_gym.agents.base import BaseAgent

__all__ = ["CodeAgent"]

SYSTEM_PROMPT = (
    "You are a careful Python programmer. Think about the problem and its edge cases, then give your complete "
    "solution in one ```python code block."
)


class CodeAgent(BaseAgent):
    """Plays ``rllm/Code-v0``: the problem (and, in multi-turn mode, the failing test's feedback) as user messages;
    the action is the reply without its reasoning, from which the env grades the last fenced block."""

    name = "agent"
    system_prompt = SYSTEM_PROMPT
