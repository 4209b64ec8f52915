"""The solver and judge agents of the solver-judge setup: solvers answer a problem, a judge picks the answer it trusts.

The judge's observation lists the problem and the numbered solutions (:func:`judge_observation`); its reply ends with
a verdict ``<verdict>k</verdict>`` naming solution ``k`` (1-based). The multi-agent env parses that verdict and
grades the judge by the solution it picked.
"""

from __future__ import annotations

from collections.abc import Sequence

from rllm_gym.agents.base import BaseAgent
from rllm_gym.agents.math import SYSTEM_PROMPT as MATH_SYSTEM_PROMPT

__all__ = ["JUDGE_SYSTEM_PROMPT", "JudgeAgent", "SolverAgent", "judge_observation"]

JUDGE_SYSTEM_PROMPT = (
    "You are a judge. You will see a problem and several candidate solutions, numbered from 1. Check them, decide "
    "which one reaches the correct final answer, and end your reply with its number as <verdict>k</verdict>."
)


def judge_observation(problem: str, solutions: Sequence[str]) -> str:
    """The judge's view: the problem, then each solution under its number."""
    parts = [f"Problem:\n{problem}"]
    parts += [f"Solution {number}:\n{solution}" for number, solution in enumerate(solutions, 1)]
    parts.append(f"Which solution is correct? End with <verdict>k</verdict>, k from 1 to {len(solutions)}.")
    return "\n\n".join(parts)


class SolverAgent(BaseAgent):
    """Answers the problem on its own, like :class:`~rllm_gym.agents.math.MathAgent`; its trajectory is "solver"."""

    name = "solver"
    system_prompt = MATH_SYSTEM_PROMPT


class JudgeAgent(BaseAgent):
    """Reads the numbered solutions and names the one it trusts; its trajectory is "judge"."""

    name = "judge"
    system_prompt = JUDGE_SYSTEM_PROMPT
