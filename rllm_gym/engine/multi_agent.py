"""The PettingZoo multi-agent runner: one LLM agent per PettingZoo agent, one Episode with a Trajectory per agent.

:class:`MultiAgentWorkflow` plays any PettingZoo env, AEC or parallel, as a :class:`~rllm_gym.engine.Workflow`, so
:class:`~rllm_gym.engine.AgentWorkflowEngine` runs many episodes concurrently with retries, limits and termination
reasons. The AEC loop is PettingZoo's own::

    for agent_id in env.agent_iter():
        observation, reward, terminated, truncated, info = env.last()
        agent = agents[agent_id]                                   # a BaseAgent, e.g. SolverAgent
        agent.update_from_env(observation, reward, terminated or truncated, info)
        action = None if terminated or truncated else agent.update_from_model(await policy.generate(...))
        env.step(action)

PettingZoo agent ids follow ``"<role>_<n>"`` (``solver_0``, ``solver_1``, ``judge_0``): every agent of a role gets an
agent object of that role's class, one policy per role (or one shared policy) answers it, and its trajectory is named
after the role, so training groups trajectories by ``{task_id}:{role}``. Env-specific runners subclass
:class:`MultiAgentWorkflow` next to their env's agents (``rllm_gym.agents.solver_judge.SolverJudgeWorkflow``); this
module knows only :class:`~rllm_gym.agent.BaseAgent`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from pettingzoo import AECEnv, ParallelEnv

from rllm_gym.agent import BaseAgent
from rllm_gym.engine.common import max_turns_of, task_id_of
from rllm_gym.engine.seeds import reset_seed
from rllm_gym.engine.workflow import TerminationEvent, Workflow, make_env, reset_kwargs
from rllm_gym.policies.base import Messages, Policy, SamplingParams
from rllm_gym.types import Episode, ModelOutput, TerminationReason

__all__ = ["MultiAgentWorkflow", "RolePolicies", "role_of", "run_multi_agent_episode"]

AnyEnv = AECEnv | ParallelEnv


def role_of(agent_id: str) -> str:
    """The role of a PettingZoo agent id: ``"solver_1"`` -> ``"solver"``; an id without a ``_<n>`` suffix is its own
    role."""
    head, sep, tail = agent_id.rpartition("_")
    return head if sep and head and tail.isdigit() else agent_id


class RolePolicies:
    """One policy per role behind the :class:`~rllm_gym.policies.Policy` interface.

    ``generate(..., role="judge")`` asks the judge's policy; roles not in ``policies`` use ``default``. Example::

        policies = RolePolicies({"judge": judge_policy}, default=solver_policy)
        output = await policies.generate(messages, role="judge")
    """

    def __init__(self, policies: Mapping[str, Policy], default: Policy | None = None):
        self.policies = dict(policies)
        self.default = default

    @classmethod
    def of(cls, policy: Policy | Mapping[str, Policy] | RolePolicies) -> RolePolicies:
        """Routing for one shared policy, a ``{role: policy}`` dict, or an existing RolePolicies."""
        if isinstance(policy, RolePolicies):
            return policy
        if isinstance(policy, Mapping):
            return cls(policy)
        return cls({}, default=policy)

    def for_role(self, role: str) -> Policy:
        policy = self.policies.get(role, self.default)
        if policy is None:
            raise ValueError(
                f"no policy for role {role!r}: pass a policy for every role ({{{role!r}: policy, ...}}, "
                f"roles given: {sorted(self.policies)}) or one shared policy"
            )
        return policy

    async def generate(
        self,
        messages: Messages | None = None,
        sampling_params: SamplingParams | None = None,
        *,
        role: str | None = None,
        **kwargs: Any,
    ) -> ModelOutput:
        if role is None:
            if self.default is None:
                raise ValueError("RolePolicies.generate needs role= when there is no default policy")
            return await self.default.generate(messages, sampling_params, **kwargs)
        return await self.for_role(role).generate(messages, sampling_params, **kwargs)


class MultiAgentWorkflow(Workflow):
    """Plays a PettingZoo env (AEC or parallel) with one LLM agent per PettingZoo agent.

    Args:
        policy: one shared Policy, or ``{role: policy}`` (see :class:`RolePolicies`).
        env: a registered multi-agent id (``"rllm/SolverJudge-v0"``), a factory (``solver_judge.parallel_env``),
            or an env instance; built once and reused across episodes.
        env_args: keyword arguments of the env (ids and factories only).
        parallel: with an id, build the parallel-API env. With a factory or an instance, the env's type decides.
        agent_classes: ``{role: BaseAgent subclass}``; by default the agents registered for the id.
        agent_args: ``{role: {keyword: value}}`` for the agent constructors.
        max_turns: at most this many LLM calls per episode (all agents together), then ``MAX_TURNS_EXCEEDED``
            (``max_steps``: its deprecated name).
        **kwargs: the :class:`~rllm_gym.engine.Workflow` options (``sampling_params``, ``max_prompt_length``,
            ``timeout_s``, ``gamma``, ...).

    In the parallel API, all agents whose info does not say ``"active": False`` act at once (their replies are
    generated concurrently); a waiting agent gets no message and sends no action, and any reward it receives waits
    for its next turn. The episode ends with ``ENV_DONE`` when every agent terminated, ``MAX_TURNS_EXCEEDED`` if any
    was truncated or ``max_turns`` was reached. The env resets with the seed the engine planned for the episode
    (:mod:`rllm_gym.engine.seeds`).
    """

    def __init__(
        self,
        policy: Policy | Mapping[str, Policy],
        *,
        env: str | Callable[..., AnyEnv] | AnyEnv,
        env_args: dict[str, Any] | None = None,
        parallel: bool = False,
        agent_classes: Mapping[str, type[BaseAgent]] | None = None,
        agent_args: Mapping[str, dict[str, Any]] | None = None,
        max_turns: int | None = None,
        max_steps: int | None = None,
        **kwargs: Any,
    ):
        super().__init__(RolePolicies.of(policy), **kwargs)
        max_turns = max_turns_of(max_turns, max_steps, type(self).__name__)
        self.env = self._build_env(env, env_args, parallel)
        if agent_classes is None:
            if not isinstance(env, str):
                raise ValueError("agent_classes={role: AgentClass, ...} is needed unless env is a registered id")
            from rllm_gym.registry import default_agent  # the registry names the agents: imported when needed

            agent_classes = default_agent(env)
        self.agents: dict[str, BaseAgent] = {}
        for agent_id in self.env.possible_agents:
            role = role_of(agent_id)
            if role not in agent_classes:
                raise ValueError(
                    f"no agent class for role {role!r} (PettingZoo agent {agent_id!r}): "
                    f"pass agent_classes={{{role!r}: AgentClass, ...}}"
                )
            self.agents[agent_id] = agent_classes[role](name=role, **dict((agent_args or {}).get(role, {})))
            self.policy.for_role(role)  # a missing policy fails here, before any episode runs
        self.max_turns = max_turns

    @staticmethod
    def _build_env(env: str | Callable[..., AnyEnv] | AnyEnv, env_args: dict[str, Any] | None, parallel: bool):
        if isinstance(env, (AECEnv, ParallelEnv)):
            if env_args:
                raise ValueError("env_args only apply when env is an id or a factory, not an env instance")
            return env
        args = dict(env_args or {})
        if isinstance(env, str) and parallel:
            args["parallel"] = True
        built = make_env(env, args)
        if not isinstance(built, (AECEnv, ParallelEnv)):
            raise TypeError(
                f"{env!r} made a {type(built).__name__}, not a PettingZoo AECEnv or ParallelEnv; "
                "single-agent envs run with MultiTurnWorkflow"
            )
        return built

    @property
    def parallel(self) -> bool:
        return isinstance(self.env, ParallelEnv)

    async def _reply(self, agent: BaseAgent) -> str:
        output = await self.generate(agent, role=agent.name, tools=agent.tools_schema)
        return agent.update_from_model(output)

    async def run(self, task: Any, uid: str) -> None:
        for agent_id, agent in self.agents.items():
            agent.reset()
            agent.trajectory.metadata = {"agent_id": agent_id}
            self.commit(agent=agent)
        truncated = await (self._run_parallel(task, uid) if self.parallel else self._run_aec(task, uid))
        raise TerminationEvent(TerminationReason.MAX_TURNS_EXCEEDED if truncated else TerminationReason.ENV_DONE)

    async def _run_aec(self, task: Any, uid: str) -> bool:
        env, calls, truncated_any = self.env, 0, False
        await self.call_env(env, "reset", **reset_kwargs(task, self.episode_seed))
        for agent_id in env.agent_iter():
            observation, reward, terminated, truncated, info = env.last()
            agent = self.agents[agent_id]
            done = terminated or truncated
            truncated_any |= truncated
            agent.update_from_env(observation, reward, done, info)
            action = None
            if not done:
                calls += 1
                if calls > self.max_turns:
                    raise TerminationEvent(TerminationReason.MAX_TURNS_EXCEEDED, f"max_turns={self.max_turns} reached")
                action = await self._reply(agent)
            await self.call_env(env, "step", action)
        return truncated_any

    async def _run_parallel(self, task: Any, uid: str) -> bool:
        env, calls = self.env, 0
        observations, infos = await self.call_env(env, "reset", **reset_kwargs(task, self.episode_seed))
        owed = dict.fromkeys(env.possible_agents, 0.0)  # rewards that reached an agent while it was waiting
        no_reward = dict.fromkeys(observations, 0.0)
        acting = self._deliver(observations, no_reward, {}, {}, infos, owed)
        truncated_any = False
        while env.agents:
            if not acting:
                raise RuntimeError(f"live agents {env.agents} are all waiting (info 'active' False): nobody can act")
            calls += len(acting)
            if calls > self.max_turns:
                raise TerminationEvent(TerminationReason.MAX_TURNS_EXCEEDED, f"max_turns={self.max_turns} reached")
            replies = await asyncio.gather(*(self._reply(self.agents[agent_id]) for agent_id in acting))
            step = await self.call_env(env, "step", dict(zip(acting, replies, strict=True)))
            observations, rewards, terminations, truncations, infos = step
            truncated_any |= any(truncations.values())
            acting = self._deliver(observations, rewards, terminations, truncations, infos, owed)
        return truncated_any

    def _deliver(
        self,
        observations: Mapping[str, Any],
        rewards: Mapping[str, float],
        terminations: Mapping[str, bool],
        truncations: Mapping[str, bool],
        infos: Mapping[str, dict[str, Any]],
        owed: dict[str, float],
    ) -> list[str]:
        """Hand one parallel step's results to the agents; return the agents that act next, in env order."""
        acting = []
        for agent_id in observations:
            info = infos.get(agent_id, {})
            done = terminations.get(agent_id, False) or truncations.get(agent_id, False)
            owed[agent_id] += rewards.get(agent_id, 0.0)
            if done or info.get("active", True):
                self.agents[agent_id].update_from_env(observations[agent_id], owed[agent_id], done, info)
                owed[agent_id] = 0.0
                if not done:
                    acting.append(agent_id)
        return acting


async def run_multi_agent_episode(
    env: str | Callable[..., AnyEnv] | AnyEnv,
    policy: Policy | Mapping[str, Policy],
    task: dict[str, Any] | int,
    *,
    rollout_idx: int = 0,
    seed: int | None = 0,
    workflow_cls: type[MultiAgentWorkflow] = MultiAgentWorkflow,
    **workflow_args: Any,
) -> Episode:
    """One episode of a PettingZoo env, outside the engine: ``task`` is a task dict or a reset seed.

    The episode id is ``"{task_id}:{rollout_idx}"``, and its env resets as the engine's would with run seed ``seed``
    (:func:`~rllm_gym.engine.seeds.reset_seed`); errors end the episode with ``ERROR`` (see ``metadata["error"]``)
    rather than raise, as in the engine. Example::

        episode = await run_multi_agent_episode("rllm/SolverJudge-v0", policy, {"id": "t", "question": "1+1?",
                                                "ground_truth": "2"}, workflow_cls=SolverJudgeWorkflow)
    """
    workflow = workflow_cls(policy, env=env, **workflow_args)
    task_id = task_id_of(task, 0)
    episode_seed = reset_seed(seed, task, task_id, rollout_idx)
    return await workflow.run_with_termination_handling(task, f"{task_id}:{rollout_idx}", seed=episode_seed)
