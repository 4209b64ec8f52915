"""Engines that run agents in envs against a policy and produce Episodes: workflows, pools, retries, streaming."""

from typing import Any

from rllm_gym.engine.common import EnvThreadPool, task_id_of
from rllm_gym.engine.engine import AgentExecutionEngine, AgentWorkflowEngine
from rllm_gym.engine.factory import engine_for
from rllm_gym.engine.multi_agent import MultiAgentWorkflow, RolePolicies, run_multi_agent_episode
from rllm_gym.engine.seeds import EpisodeSpec, episode_seed, episode_specs, reset_seed
from rllm_gym.engine.workflow import MultiTurnWorkflow, SingleTurnWorkflow, TerminationEvent, Workflow, make_env

__all__ = [
    "AgentExecutionEngine",
    "AgentWorkflowEngine",
    "EnvThreadPool",
    "EpisodeSpec",
    "MultiAgentWorkflow",
    "MultiTurnWorkflow",
    "RolePolicies",
    "SingleTurnWorkflow",
    "TerminationEvent",
    "Workflow",
    "engine_for",
    "episode_seed",
    "episode_specs",
    "make_env",
    "reset_seed",
    "run_multi_agent_episode",
    "task_id_of",
]


def __getattr__(name: str) -> Any:
    # SolverJudgeWorkflow moved next to its agents; the old import path still finds it (with a warning), without the
    # engine importing any env-specific agent when it loads.
    if name == "SolverJudgeWorkflow":
        import warnings

        from rllm_gym.agents.solver_judge import SolverJudgeWorkflow

        warnings.warn(
            "rllm_gym.engine.SolverJudgeWorkflow is deprecated: import it from rllm_gym.agents.solver_judge",
            DeprecationWarning,
            stacklevel=2,
        )

        return SolverJudgeWorkflow
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
