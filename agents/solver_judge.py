"""The solver and judge agents of the solver-judge setup: solvers answer a problem, a judge picks the answer it trusts.

The judge's observation lists the problem and the numbered solutions (:func:`judge_observation`), each quoted line by
line so that solver text reaches the judge as data; its reply ends with a verdict ``<verdict>k</verdict>`` naming
solution ``k`` (1-based). The multi-agent env parses that verdict and
grades the judge by the solution it picked. The protocol (the judge's view, its system prompt, the verdict format)
belongs to the env, :mod:`rllm_gym.envs.solver_judge`; it is re-exported here for the agents' users.
"""

from __future__ import annotations

from rllm_gym.agents.base import BaseAgent
from rllm_gym.agents.math import SYSTEM_PROMPT as MATH_SYSTEM_PROMPT
from rllm_gym.envs.solver_judge import JUDGE_SYSTEM_PROMPT, judge_observation

__all__ = ["JUDGE_SYSTEM_PROMPT", "JudgeAgent", "SolverAgent", "judge_observation"]


class SolverAgent(BaseAgent):
    """Answers the problem on its own, like :class:`~rllm_gym.agents.math.MathAgent`; its trajectory is "solver"."""

    name = "solver"
    system_prompt = MATH_SYSTEM_PROMPT


class JudgeAgent(BaseAgent):
    """Reads the numbered solutions and names the one it trusts; its trajectory is "judge"."""

    name = "judge"
    system_prompt = JUDGE_SYSTEM_PROMPT
