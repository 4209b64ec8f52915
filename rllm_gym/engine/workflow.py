"""Workflows: the code that runs one episode, from ``env.reset`` to the finished :class:`~rllm_gym.types.Episode`.

A :class:`Workflow` instance runs one episode at a time and is reused from a pool by
:class:`~rllm_gym.engine.AgentWorkflowEngine`. Its :meth:`Workflow.run` drives agents, envs and the policy and ends by
raising :class:`TerminationEvent` (or returning); :meth:`Workflow.run_with_termination_handling` turns every way an
episode can end (the env is done, a limit is hit, the wall time runs out, anything raises) into a
:class:`~rllm_gym.types.TerminationReason` and post-processes the episode: trajectory rewards, optional reward shaping,
Monte Carlo returns, ``is_correct`` and per-role metrics. An error never escapes: it ends that episode with ``ERROR``
and a recorded error.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import traceback
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import gymnasium as gym

from rllm_gym.agent import BaseAgent
from rllm_gym.engine.common import call_in_executor, max_turns_of
from rllm_gym.policies.base import Policy, SamplingParams
from rllm_gym.types import Episode, ModelOutput, Step, TerminationReason, Trajectory

__all__ = [
    "MultiTurnWorkflow",
    "SingleTurnWorkflow",
    "TerminationEvent",
    "Workflow",
    "inline_call",
    "make_env",
    "reset_kwargs",
]

_DEFAULT_SAMPLING = SamplingParams()  # frozen: one instance serves every workflow
INLINE_STEP_KEY = "rllm_gym.inline_step"  # env metadata: reset/step take microseconds, call them on the loop


class TerminationEvent(Exception):  # rLLM's name (not ...Error), kept for users coming from it
    """Raised inside :meth:`Workflow.run` to end the episode with ``reason``."""

    def __init__(self, reason: TerminationReason = TerminationReason.ENV_DONE, message: str = ""):
        super().__init__(message or reason.value)
        self.reason = TerminationReason(reason)


def inline_steps(env: gym.Env) -> bool:
    """Whether the env's metadata declares microsecond steps (``INLINE_STEP_KEY``); read once per env object."""
    inline = getattr(env, "_rllm_gym_inline", None)
    if inline is None:
        inline = bool(env.unwrapped.metadata.get(INLINE_STEP_KEY, False))
        with contextlib.suppress(AttributeError):  # an env with __slots__ is asked every time
            env._rllm_gym_inline = inline
    return inline


def inline_call(env: gym.Env, method: str, *args: Any, **kwargs: Any) -> bool:
    """Whether ``env.<method>(*args, **kwargs)`` is bounded to microseconds and may run on the event loop: every
    call of an env that declares ``INLINE_STEP_KEY``, or this one call when the env answers True from its optional
    ``inline_call(method, *args, **kwargs)`` (Math-v0: a reset, or a step its grader decides without math-verify).
    Wrappers are not asked: the gymnasium ones (TimeLimit, order and passive checks) add microseconds."""
    if inline_steps(env):
        return True
    decide = getattr(env.unwrapped, "inline_call", None)
    return bool(decide(method, *args, **kwargs)) if callable(decide) else False


def make_env(env: str | Callable[..., gym.Env], env_args: dict[str, Any] | None = None) -> gym.Env:
    """An env from a registered id (``"rllm/Math-v0"``) or from a class / factory."""
    if isinstance(env, str):
        import rllm_gym

        return rllm_gym.make(env, **(env_args or {}))
    return env(**(env_args or {}))


class Workflow(ABC):
    """Runs one episode at a time: subclass and write :meth:`run`.

    ``run`` calls :meth:`reset`, registers the agents whose trajectories make the episode with :meth:`commit`, gets
    replies with :meth:`generate`, calls envs with :meth:`call_env`, and ends with ``raise TerminationEvent(reason)``
    (returning normally means ``ENV_DONE``). Example::

        class GuessWorkflow(Workflow):
            async def run(self, task, uid):
                self.reset(task, uid)
                agent = MathAgent()
                self.commit(agent=agent)
                agent.update_from_env(task["question"], 0.0, False, {})
                output = await self.generate(agent)
                agent.update_from_model(output)
                verdict = math_reward_fn(task, output.text)
                agent.update_from_env("", verdict.reward, True, {"is_correct": verdict.is_correct})
                raise TerminationEvent(TerminationReason.ENV_DONE)
    """

    def __init__(
        self,
        policy: Policy,
        *,
        sampling_params: SamplingParams | None = None,
        executor: Executor | None = None,
        max_prompt_length: int | None = None,
        max_response_length: int | None = None,
        timeout_s: float | None = None,
        gamma: float = 0.0,
        reward_bonus_coeff: float = 0.0,
    ):
        if not callable(getattr(policy, "generate", None)):  # what isinstance(policy, Policy) checks, 10x faster
            raise TypeError(f"policy must be a Policy (an object with an async generate() method), got {policy!r}")
        if sampling_params is not None and not isinstance(sampling_params, SamplingParams):
            raise TypeError(
                f"sampling_params must be a SamplingParams (e.g. temperature=0 for greedy), got {sampling_params!r}"
            )
        for name, value in (("max_prompt_length", max_prompt_length), ("max_response_length", max_response_length)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be >= 1 or None (no limit), got {value!r}")
        if timeout_s is not None and (
            isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0
        ):
            raise ValueError(f"timeout_s must be > 0 or None (no limit), got {timeout_s!r}")
        for name, value in (("gamma", gamma), ("reward_bonus_coeff", reward_bonus_coeff)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must lie in [0, 1] (0 = no Monte Carlo returns), got {gamma}")
        self.policy = policy
        sampling_params = sampling_params or _DEFAULT_SAMPLING
        if max_response_length is not None:
            sampling_params = dataclasses.replace(sampling_params, max_tokens=max_response_length)
        self.sampling_params = sampling_params
        self.executor = executor
        self.max_prompt_length = max_prompt_length
        self.timeout_s = timeout_s
        self.gamma = gamma
        self.reward_bonus_coeff = reward_bonus_coeff
        self.needs_replacement = False  # set when an env call was abandoned mid-flight: the engine makes a new one
        self.task: Any = None
        self.uid = ""
        self.episode_seed: int | None = None  # the seed the engine planned for this episode's env resets
        self._agents: list[BaseAgent] = []
        self._trajectories: list[Trajectory] = []

    @property
    def cheap_to_build(self) -> bool:
        """Whether new instances take microseconds to build (the engine then builds them on the event loop)."""
        return False

    # The workflow author's API

    @abstractmethod
    async def run(self, task: Any, uid: str) -> Episode | None:
        """Run one episode; end with ``raise TerminationEvent(reason)`` or return."""

    def reset(self, task: Any = None, uid: str = "") -> None:
        self.task, self.uid = task, uid
        self._agents, self._trajectories = [], []

    def commit(self, *, agent: BaseAgent | None = None, trajectory: Trajectory | None = None) -> None:
        """Make an agent's trajectory (read when the episode ends, so steps recorded later count) or a finished
        trajectory part of the episode."""
        if (agent is None) == (trajectory is None):
            raise ValueError("commit() takes exactly one of agent= or trajectory=")
        if agent is not None:
            self._agents.append(agent)
        else:
            self._trajectories.append(trajectory)

    async def generate(self, agent: BaseAgent, **kwargs: Any) -> ModelOutput:
        """The policy's reply to the agent's chat; a prompt over ``max_prompt_length`` ends the episode.

        The agent's last Step goes with it (``previous``), so that a token backend continues the tokens of that call
        instead of re-rendering the chat (token in, token out; see :mod:`rllm_gym.policies.tokens`)."""
        previous = agent.get_current_state()
        output = await self.policy.generate(agent.chat_completions, self.sampling_params, previous=previous, **kwargs)
        if self.max_prompt_length is not None and output.prompt_length > self.max_prompt_length:
            raise TerminationEvent(
                TerminationReason.MAX_PROMPT_LENGTH_EXCEEDED,
                f"prompt of {output.prompt_length} tokens exceeds max_prompt_length={self.max_prompt_length}",
            )
        return output

    async def call_env(self, env: gym.Env, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``env.<method>(...)``: inline when the call is bounded to microseconds (:func:`inline_call`: the env's
        metadata declares microsecond steps, ``"rllm_gym.inline_step": True``, or the env says so for this call),
        otherwise in the executor so a slow env never blocks the event loop."""
        fn = getattr(env, method)
        if inline_call(env, method, *args, **kwargs):
            return fn(*args, **kwargs)
        return await call_in_executor(self.executor, lambda: fn(*args, **kwargs))

    # What the engine calls

    async def run_with_termination_handling(self, task: Any, uid: str, *, seed: int | None = None) -> Episode:
        """Run the episode and always return it: its termination reason says how it ended.

        ``seed``: what the episode's env resets with (``self.episode_seed``; see :mod:`rllm_gym.engine.seeds`);
        an int task is the reset seed itself."""
        self.reset(task, uid)
        self.episode_seed = seed
        error: dict[str, str] | None = None
        episode: Episode | None = None
        try:
            if self.timeout_s is None:
                episode = await self.run(task, uid)
            else:
                episode = await asyncio.wait_for(self.run(task, uid), self.timeout_s)
            returned = episode.termination_reason if episode is not None else None
            reason = returned or TerminationReason.ENV_DONE
        except TerminationEvent as event:
            reason = event.reason
        except TimeoutError:
            reason = TerminationReason.TIMEOUT
            self.needs_replacement = True  # an env call may still be running in a worker thread
        except Exception as exception:  # an env, agent or policy failed: this episode only
            reason = TerminationReason.ERROR
            error = {
                "type": type(exception).__name__,
                "message": str(exception),
                "traceback": traceback.format_exc(limit=20),
            }
        if episode is None:
            episode = Episode(id=uid, task=task, trajectories=self.collect_trajectories())
        failure = infra_failure(episode) if reason is not TerminationReason.ERROR else None
        if failure is not None:  # the reward came from the infrastructure, not from the model: retried, not trained
            reason = TerminationReason.INFRA_FAILED
            episode.metadata["infra_failure"] = failure
        episode.termination_reason = reason
        if error is not None:
            episode.metadata["error"] = error
        self.postprocess_episode(episode)
        return episode

    def collect_trajectories(self) -> list[Trajectory]:
        return [agent.trajectory for agent in self._agents] + self._trajectories

    def postprocess_episode(self, episode: Episode) -> None:
        """Trajectory rewards, reward shaping, Monte Carlo returns, ``is_correct`` and metrics."""
        for trajectory in episode.trajectories:
            steps = trajectory.steps
            # Floats computed from typed floats: written to __dict__, as pydantic's per-assignment validation costs
            # microseconds per step and thousands of episodes end in the same instant.
            if self.reward_bonus_coeff:
                # Reward the improvement over the previous step (rLLM's shaping), computed from the raw rewards.
                raw = [step.reward for step in steps]
                for i in range(1, len(steps)):
                    steps[i].__dict__["reward"] = raw[i] + self.reward_bonus_coeff * (raw[i] - raw[i - 1])
            if trajectory.reward is None:
                trajectory.reward = float(sum(step.reward for step in steps))
            ret = 0.0
            for step in reversed(steps):
                ret = step.reward + self.gamma * ret
                step.__dict__["mc_return"] = ret
        episode.is_correct = self.is_correct(episode)
        episode.metrics.update(episode_metrics(episode))

    @staticmethod
    def is_correct(episode: Episode) -> bool:
        """The env's verdict (``info["is_correct"]`` of a trajectory's last step) when it gives one, else reward > 0.

        An episode with several roles is correct when every role that was graded is.
        """
        verdicts = []
        for trajectory in episode.trajectories:
            if not trajectory.steps:
                continue
            verdict = trajectory.steps[-1].info.get("is_correct")
            verdicts.append(bool(verdict) if verdict is not None else (trajectory.reward or 0.0) > 0)
        return bool(verdicts) and all(verdicts) and episode.termination_reason is not TerminationReason.ERROR


def infra_failure(episode: Episode) -> dict[str, Any] | None:
    """The first step whose ``info["infra_failed"]`` is true (its trajectory's name, index and error), or None."""
    for trajectory in episode.trajectories:
        for index, step in enumerate(trajectory.steps):
            if step.info.get("infra_failed"):
                error = step.info.get("error") or step.info.get("grading_error")
                if error is None and isinstance(step.info.get("reward_metadata"), dict):
                    error = step.info["reward_metadata"].get("error")
                return {"trajectory": trajectory.name, "step": index, "error": None if error is None else str(error)}
    return None


def _prompt_tokens(step: Step) -> int:
    """The step's token ids, or, without them (a server policy without a tokenizer), the count the server gave."""
    return len(step.prompt_ids) or (step.model_output.prompt_length if step.model_output else 0)


def _response_tokens(step: Step) -> int:
    return len(step.response_ids) or (step.model_output.completion_length if step.model_output else 0)


def episode_metrics(episode: Episode) -> dict[str, float]:
    """Per-role numbers (several trajectories may share a role, e.g. two solvers): ``<role>/reward`` and
    ``<role>/accuracy`` are means over the role's trajectories, ``<role>/turns`` and the token counts are totals,
    ``<role>/count`` is the number of trajectories; ``turns``, ``response_tokens`` and ``text_rendered_calls`` (LLM
    calls a server rendered from chat text, see ``ModelOutput.text_rendered``) are episode totals."""
    by_role = defaultdict(list)
    for trajectory in episode.trajectories:
        by_role[trajectory.name].append(trajectory)
    metrics: dict[str, float] = {}
    for role, trajectories in by_role.items():
        steps = [step for trajectory in trajectories for step in trajectory.steps]
        metrics[f"{role}/count"] = float(len(trajectories))
        metrics[f"{role}/reward"] = sum(t.reward or 0.0 for t in trajectories) / len(trajectories)
        metrics[f"{role}/turns"] = float(len(steps))
        metrics[f"{role}/prompt_tokens"] = float(sum(map(_prompt_tokens, steps)))
        metrics[f"{role}/response_tokens"] = float(sum(map(_response_tokens, steps)))
        finals = [t.steps[-1].info for t in trajectories if t.steps]
        verdicts = [info["is_correct"] for info in finals if "is_correct" in info]
        if verdicts:
            metrics[f"{role}/accuracy"] = sum(map(bool, verdicts)) / len(verdicts)
    metrics["turns"] = float(sum(len(t.steps) for t in episode.trajectories))
    # LLM calls whose server rendered the chat as text (no token prompts): not token in, token out.
    metrics["text_rendered_calls"] = float(
        sum(s.model_output is not None and s.model_output.text_rendered for t in episode.trajectories for s in t.steps)
    )
    metrics["response_tokens"] = float(sum(metrics[f"{role}/response_tokens"] for role in by_role))
    return metrics


def reset_kwargs(task: Any, seed: int | None) -> dict[str, Any]:
    """``env.reset`` arguments for an episode: an int task is the reset seed; a task dict is pinned
    (``options={"task": task}``) and reset with the episode's ``seed``."""
    if isinstance(task, int) and not isinstance(task, bool):
        return {"seed": task}
    return {"seed": seed, "options": {"task": task} if task is not None else None}


def keep_final_observation(trajectory: Trajectory, observation: Any) -> None:
    """Record on the last step the observation the episode ended in, which no later prompt shows (``rllm-gym view``
    prints it): ``step.metadata["final_observation"]``, text as it is, anything else as its repr."""
    if not trajectory.steps:
        return
    step = trajectory.steps[-1]
    final = observation if isinstance(observation, str) else repr(observation)
    step.__dict__["metadata"] = {**(step.metadata or {}), "final_observation": final}  # a str: no validation needed


class MultiTurnWorkflow(Workflow):
    """One agent, one env, up to ``max_turns`` LLM calls: the loop of the architecture's rollout flow.

    Ends with ``ENV_DONE`` when the env terminates, ``MAX_TURNS_EXCEEDED`` at ``max_turns`` or when the env is
    truncated (its ``TimeLimit``), ``MAX_RESPONSE_LENGTH_EXCEEDED`` when a reply is cut off by the length limit and the
    env did not end on it (the cut reply is still stepped, so the env grades it); with ``stop_on_truncation=False``
    the episode goes on after a cut reply instead. ``max_steps`` is the deprecated name of ``max_turns``. The env
    resets with the seed the engine planned for the episode (``run_with_termination_handling(..., seed=)``).
    """

    def __init__(
        self,
        policy: Policy,
        *,
        env: str | Callable[..., gym.Env],
        agent_cls: type[BaseAgent],
        env_args: dict[str, Any] | None = None,
        agent_args: dict[str, Any] | None = None,
        max_turns: int | None = None,
        stop_on_truncation: bool = True,
        max_steps: int | None = None,
        **kwargs: Any,
    ):
        super().__init__(policy, **kwargs)
        max_turns = max_turns_of(max_turns, max_steps, type(self).__name__)
        if not callable(agent_cls):
            raise TypeError(f"agent_cls must be a BaseAgent subclass (or a factory of agents), got {agent_cls!r}")
        self.stop_on_truncation = stop_on_truncation
        self.env = make_env(env, env_args)
        self.agent = agent_cls(**(agent_args or {}))
        self.max_turns = max_turns

    @property
    def cheap_to_build(self) -> bool:
        return inline_steps(self.env)

    async def run(self, task: Any, uid: str) -> None:
        agent, env = self.agent, self.env
        agent.reset()
        self.commit(agent=agent)
        observation, info = await self.call_env(env, "reset", **reset_kwargs(task, self.episode_seed))
        agent.update_from_env(observation, 0.0, False, info)
        for turn in range(self.max_turns):
            output = await self.generate(agent, tools=agent.tools_schema)
            action = agent.update_from_model(output)
            observation, reward, terminated, truncated, info = await self.call_env(env, "step", action)
            agent.update_from_env(observation, reward, terminated or truncated, info)
            reason = None
            if terminated:
                reason = TerminationReason.ENV_DONE
            elif truncated:
                reason = TerminationReason.MAX_TURNS_EXCEEDED
            elif output.finish_reason == "length" and self.stop_on_truncation:
                reason = TerminationReason.MAX_RESPONSE_LENGTH_EXCEEDED
            elif turn == self.max_turns - 1:
                reason = TerminationReason.MAX_TURNS_EXCEEDED
            if reason is not None:
                keep_final_observation(agent.trajectory, observation)
                raise TerminationEvent(reason)
        raise TerminationEvent(TerminationReason.MAX_TURNS_EXCEEDED)  # max_turns < 1: no call at all


class SingleTurnWorkflow(MultiTurnWorkflow):
    """One LLM call, one env step: the episode ends after it (``ENV_DONE`` if the env terminated)."""

    def __init__(self, policy: Policy, **kwargs: Any):
        kwargs.pop("max_steps", None)  # one call, whatever the (deprecated) limit says
        kwargs["max_turns"] = 1
        super().__init__(policy, **kwargs)
