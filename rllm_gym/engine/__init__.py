"""Engines that run agents in envs against a policy and produce Episodes: workflows, pools, retries, streaming."""

from rllm_gym.engine.common import EnvThreadPool, task_id_of
from rllm_gym.engine.engine import AgentExecutionEngine, AgentWorkflowEngine
from rllm_gym.engine.factory import engine_for
from rllm_gym.engine.multi_agent import MultiAgentWorkflow, RolePolicies, SolverJudgeWorkflow, run_multi_agent_episode
from rllm_gym.engine.workflow import MultiTurnWorkflow, SingleTurnWorkflow, TerminationEvent, Workflow, make_env

__all__ = [
    "AgentExecutionEngine",
    "AgentWorkflowEngine",
    "EnvThreadPool",
    "MultiAgentWorkflow",
    "MultiTurnWorkflow",
    "RolePolicies",
    "SingleTurnWorkflow",
    "SolverJudgeWorkflow",
    "TerminationEvent",
    "Workflow",
    "engine_for",
    "make_env",
    "run_multi_agent_episode",
    "task_id_of",
]
