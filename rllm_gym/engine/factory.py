"""``engine_for``: the engine that plays a registered id, single-agent or multi-agent.

It sits above both engine modules (:mod:`rllm_gym.engine.engine` and :mod:`rllm_gym.engine.multi_agent`), which do not
import each other.
"""

from __future__ import annotations

from concurrent.futures import Executor
from os import PathLike
from typing import Any

from rllm_gym.engine.arguments import check_arguments
from rllm_gym.engine.engine import AgentExecutionEngine, AgentWorkflowEngine
from rllm_gym.engine.multi_agent import MultiAgentWorkflow
from rllm_gym.policies.base import Policy

__all__ = ["engine_for"]


def engine_for(
    env_id: str,
    policy: Policy,
    *,
    agent: str | None = None,
    agent_args: dict[str, Any] | None = None,
    env_args: dict[str, Any] | None = None,
    n_parallel: int = 128,
    out: str | PathLike[str] | None = None,
    executor: Executor | None = None,
    seed: int | None = 0,
    tune_interpreter: bool = False,
    **workflow_kwargs: Any,
) -> AgentWorkflowEngine:
    """The engine that plays a registered id, as ``rllm-gym eval`` and the trainer run it.

    A single-agent id gets :class:`AgentExecutionEngine` with ``agent`` (``"module:Class"``) or the id's registered
    agent; a multi-agent (PettingZoo) id gets :class:`AgentWorkflowEngine` over its registered workflow (default
    :class:`~rllm_gym.engine.MultiAgentWorkflow`), one registered agent per role, ``agent_args`` keyed by role
    (``{"judge": {...}}``). ``executor``, ``seed`` and ``tune_interpreter`` are the engine's (see
    :class:`AgentWorkflowEngine`; both ``rllm-gym eval`` and the trainer turn ``tune_interpreter`` on);
    ``workflow_kwargs`` are the workflow options (``max_turns``, ``sampling_params``, ...).
    """
    from rllm_gym.registry import default_agent, env_ids, env_spec, load

    check_arguments(env_id, agent=agent, agent_args=agent_args, env_args=env_args)
    engine_args: dict[str, Any] = {
        "n_parallel": n_parallel,
        "out": out,
        "executor": executor,
        "seed": seed,
        "tune_interpreter": tune_interpreter,
    }
    if env_id not in env_ids(multi_agent=True):
        agent_cls = load(agent) if agent else default_agent(env_id)
        return AgentExecutionEngine(
            env_id=env_id, agent_cls=agent_cls, agent_args=agent_args, env_args=env_args, policy=policy,
            **engine_args, **workflow_kwargs,
        )  # fmt: skip
    if agent is not None:
        raise ValueError(f"agent={agent!r} is for single-agent envs; {env_id} plays its registered agent per role")
    roles = sorted(default_agent(env_id))
    strays = sorted(set(agent_args or {}) - set(roles))
    if strays:
        raise ValueError(
            f"agent_args for {env_id} are keyed by role ({roles}), e.g. {{{roles[0]!r}: {{...}}}}; got keys {strays}"
        )
    workflow = env_spec(env_id).workflow
    workflow_args = {"env": env_id, "env_args": env_args, "agent_args": agent_args, **workflow_kwargs}
    return AgentWorkflowEngine(
        load(workflow) if workflow else MultiAgentWorkflow, policy, workflow_args=workflow_args, **engine_args
    )
