"""The one place that lists every rllm-gym environment id and registers it.

``import rllm_gym`` calls :func:`register_envs`, so ``gym.make("rllm/FrozenLake-v0")`` works after the import and
``gym.make("rllm_gym:rllm/FrozenLake-v0")`` works without it (Gymnasium imports the module named before the colon).
Multi-agent (PettingZoo) ids live in the same table; Gymnasium's ``gym.make`` cannot return a PettingZoo env, so
:func:`make` builds both kinds.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
from gymnasium.error import NameNotFound

__all__ = [
    "ENV_SPECS",
    "EnvSpec",
    "UnknownEnvError",
    "default_agent",
    "env_ids",
    "env_spec",
    "load",
    "make",
    "register_envs",
]


@dataclass(frozen=True)
class EnvSpec:
    """One registered environment: its versioned id, ``module:Class`` entry point, default arguments, and the
    ``module:Class`` of the agent that plays it by default (``rllm-gym eval`` and the trainer use it); a multi-agent
    id may name its runner (``workflow``, a MultiAgentWorkflow subclass that e.g. decides episode correctness).
    ``description`` is the one line ``rllm-gym list`` prints, and ``extras`` the pip extras it needs beyond the core
    install (``pip install "rllm-gym[extra]"``)."""

    id: str
    entry_point: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    max_episode_steps: int | None = None
    multi_agent: bool = False
    agent: str | None = None
    workflow: str | None = None
    description: str = ""
    extras: tuple[str, ...] = ()


ENV_SPECS: tuple[EnvSpec, ...] = (
    EnvSpec(
        "rllm/FrozenLake-v0",
        "rllm_gym.envs.frozenlake:FrozenLakeEnv",
        max_episode_steps=100,
        agent="rllm_gym.agents.frozenlake:FrozenLakeAgent",
        description="walk a random frozen-lake grid from S to G around the holes, one move per turn",
    ),
    EnvSpec(
        "rllm/Math-v0",
        "rllm_gym.envs.math:MathEnv",
        agent="rllm_gym.agents.math:MathAgent",
        description="math problems, graded exactly (math-verify for symbolic answers); retries with max_turns",
    ),
    EnvSpec(
        "rllm/Tool-v0",
        "rllm_gym.envs.tool:ToolEnv",
        max_episode_steps=16,
        agent="rllm_gym.agents.tool:ToolAgent",
        description="answer a question by calling tools (calculator, search, python) over several turns",
    ),
    EnvSpec(
        "rllm/Code-v0",
        "rllm_gym.envs.code:CodeEnv",
        max_episode_steps=10,
        agent="rllm_gym.agents.code:CodeAgent",
        description="write Python that passes the task's tests, run in the sandbox (fully isolated on Linux)",
    ),
    EnvSpec(
        "rllm/ReasoningGym-v0",
        "rllm_gym.envs.reasoning_gym:ReasoningGymEnv",
        agent="rllm_gym.agents.math:MathAgent",  # asks for a final \boxed{} answer, the env's default format
        description="any reasoning-gym dataset or weighted mix, scored by the dataset's own score_answer",
        extras=("reasoning-gym",),
    ),
    EnvSpec(
        "rllm/OpenEnv-v0",
        "rllm_gym.envs.openenv:OpenEnvEnv",
        max_episode_steps=100,
        agent="rllm_gym.agents.base:BaseAgent",  # the observation is the user message, the reply the action
        description="any OpenEnv server as a text env (base_url=..., or replicas' URLs balanced)",
        extras=("integrations",),
    ),
    EnvSpec(
        "rllm/SolverJudge-v0",
        "rllm_gym.envs.solver_judge:env",
        multi_agent=True,
        agent="rllm_gym.agents.solver_judge:SOLVER_JUDGE_AGENTS",  # {role: agent class}
        workflow="rllm_gym.agents.solver_judge:SolverJudgeWorkflow",  # correct = the judge picked a correct solution
        description="multi-agent (PettingZoo): solvers answer a task, a judge picks the correct solution",
    ),
)


class UnknownEnvError(NameNotFound):
    """An environment id that is not registered; the message suggests the closest registered ids."""


_MULTI_AGENT_IDS = frozenset(spec.id for spec in ENV_SPECS if spec.multi_agent)


def env_ids(multi_agent: bool | None = None) -> list[str]:
    """Every registered id, or only the single-agent (``False``) or multi-agent (``True``) ones."""
    return [spec.id for spec in ENV_SPECS if multi_agent is None or spec.multi_agent == multi_agent]


def register_envs() -> None:
    """Register every single-agent id with Gymnasium; calling it again is a no-op."""
    for spec in ENV_SPECS:
        if not spec.multi_agent and spec.id not in gym.registry:
            gym.register(
                id=spec.id,
                entry_point=spec.entry_point,
                kwargs=dict(spec.kwargs),
                max_episode_steps=spec.max_episode_steps,
                disable_env_checker=True,  # the test suite runs the full check_env on every id instead
            )


def env_spec(env_id: str) -> EnvSpec:
    """The registration of ``env_id``; raises :class:`UnknownEnvError` naming the closest registered ids."""
    for spec in ENV_SPECS:
        if spec.id == env_id:
            return spec
    suggestions = difflib.get_close_matches(env_id, env_ids(), n=3, cutoff=0.8)
    hint = f" Did you mean {' or '.join(repr(s) for s in suggestions)}?" if suggestions else ""
    raise UnknownEnvError(f"Environment {env_id!r} doesn't exist.{hint} Registered ids: {', '.join(env_ids())}.")


def load(entry_point: str) -> Any:
    """The object a ``"module.path:Name"`` string names."""
    module_name, sep, attr = entry_point.partition(":")
    if not sep or not attr:
        raise ValueError(f"entry point {entry_point!r} must look like 'package.module:Name'")
    return getattr(importlib.import_module(module_name), attr)


def default_agent(env_id: str) -> Any:
    """The agent class registered for ``env_id``."""
    spec = env_spec(env_id)
    if spec.agent is None:
        raise ValueError(f"no default agent is registered for {env_id!r}: pass an agent class explicitly")
    return load(spec.agent)


def make(env_id: str, **kwargs: Any) -> Any:
    """Make any rllm-gym env by id: a Gymnasium env for single-agent ids, a PettingZoo env for multi-agent ones.

    Multi-agent ids take ``parallel=True`` for the parallel API; the default is the (wrapped) AEC env. Ids that users
    registered with Gymnasium themselves (``gym.register("my/Env-v0", ...)``) are made with ``gym.make``.
    """
    registered = gym.registry.get(env_id)
    if registered is not None and env_id not in _MULTI_AGENT_IDS:
        # The registered EnvSpec itself: gym.make then skips parsing the id (engines make thousands of envs).
        return gym.make(registered, **kwargs)
    spec = env_spec(env_id)
    if not spec.multi_agent:
        register_envs()
        return gym.make(env_id, **kwargs)
    factory = load(spec.entry_point)
    if kwargs.pop("parallel", False):
        factory = importlib.import_module(spec.entry_point.partition(":")[0]).parallel_env
    return factory(**{**spec.kwargs, **kwargs})
