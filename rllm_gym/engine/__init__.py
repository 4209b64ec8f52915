"""Engines that run agents in envs against a policy and produce Episodes: workflows, pools, retries, streaming."""

from rllm_gym.engine.engine import AgentExecutionEngine, AgentWorkflowEngine, task_id_of
from rllm_gym.engine.workflow import MultiTurnWorkflow, SingleTurnWorkflow, TerminationEvent, Workflow, make_env

__all__ = [
    "AgentExecutionEngine",
    "AgentWorkflowEngine",
    "MultiTurnWorkflow",
    "SingleTurnWorkflow",
    "TerminationEvent",
    "Workflow",
    "make_env",
    "task_id_of",
]
