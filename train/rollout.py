"""The episodes of a training step as a value: :meth:`EpisodeRollout.collect` runs TRL's prompt slots through our
envs, agents and engine and returns a :class:`RolloutBatch` (rows, episodes, rewards, metrics).

Each slot is a task (the prompt string is the task as JSON, see :func:`~rllm_gym.train.sequences.encode_prompt`) and
trains one trajectory of one episode run by :class:`~rllm_gym.engine.AgentExecutionEngine`. A multi-turn trajectory
is one token sequence by construction: every policy builds each call's prompt from the previous call's prompt and
sampled ids plus the new messages' tokens (token in, token out, :mod:`rllm_gym.policies.tokens`), so the row is the
first step's prompt, then each reply (``env_mask`` 1, trained) followed by the tokens of the next observation
(``env_mask`` 0, never trained), exactly the tokens the model saw and sampled. A row splits only where the chat did
not continue: the agent dropped earlier turns by design (``max_history_turns``), the policy re-renders the whole chat
(``token_history="template"``, e.g. to let Qwen3's template drop earlier ``<think>`` blocks), or a server rendered
chat text. Then a new training row starts with that step's full prompt (masked) and its reply trained, so no turn is
ever dropped, and every row carries its trajectory's advantages (groups and statistics stay one entry per trajectory).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import weakref
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rllm_gym.engine import AgentWorkflowEngine, EnvThreadPool, engine_for, reset_seed
from rllm_gym.engine.common import default_env_workers
from rllm_gym.policies.base import Policy, SamplingParams
from rllm_gym.policies.hf import BatchingPolicy
from rllm_gym.policies.tokens import TokenHistory, check_token_history
from rllm_gym.registry import env_ids
from rllm_gym.train.generation import Generation, generation_for
from rllm_gym.train.sequences import (
    TrainingSequence,
    decode_prompt,
    placeholder_sequence,
    trajectory_to_sequences,
)
from rllm_gym.types import DEFAULT_MAX_TURNS, Episode, Trajectory

__all__ = ["EnvSetup", "EpisodeRollout", "RolloutBatch"]


@dataclass
class EnvSetup:
    """How episodes of one env are run in training: the agent (default: the env's registered one) and arguments."""

    env_id: str
    agent: str | None = None
    agent_args: dict[str, Any] = field(default_factory=dict)
    env_args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RolloutBatch:
    """What one :meth:`EpisodeRollout.collect` call gave: ``episodes``, ``slots`` and ``rewards`` follow the prompts
    (the slots of one multi-agent episode repeat it), ``sequences`` are the training rows (one or more per prompt,
    each naming its prompt in ``source``; padding rows have source -1), ``metrics`` the generation backend's (e.g.
    vLLM server rounds) and ``seconds`` the call's wall time."""

    sequences: list[TrainingSequence]
    episodes: list[Episode]
    slots: list[int]
    rewards: list[float]
    metrics: dict[str, float]
    seconds: float
    filler_id: int = 0

    def padded(self, rows: int) -> RolloutBatch:
        """This batch with placeholder rows (nothing trained) added until there are ``rows``."""
        missing = [placeholder_sequence(self.filler_id) for _ in range(rows - len(self.sequences))]
        return dataclasses.replace(self, sequences=[*self.sequences, *missing])

    def trl_output(self) -> dict[str, Any]:
        """The rows in the form of TRL's ``rollout_func`` output (``trajectory_reward`` feeds TRL's logs only)."""
        sequences = self.sequences
        return {
            "prompt_ids": [s.prompt_ids for s in sequences],
            "completion_ids": [s.completion_ids for s in sequences],
            "logprobs": [s.logprobs for s in sequences],
            "env_mask": [s.env_mask for s in sequences],
            "trajectory_reward": [self.rewards[s.source] if s.source >= 0 else 0.0 for s in sequences],
        }


class EpisodeRollout:
    """Runs the episodes of TRL's prompt slots through our engine: :meth:`collect` gives a :class:`RolloutBatch`.

    ``chat_template_kwargs`` (e.g. ``{"enable_thinking": False}``) and ``token_history`` (``"sampled"``, token in,
    token out; or ``"template"``, the chat re-rendered each call, rows split where the template rewrites history) go
    to every policy the trainer's backend builds (:meth:`generation_for`, chosen once per trainer);
    ``policy_factory(trainer)`` substitutes any other policy. With ``agent_program`` (``module:function``), the envs
    only supply tasks: each episode is that program run through a gateway on the policy
    (:class:`~rllm_gym.sdk.AgentProgramEngine`), rewarded by ``reward_fn`` or by what the program posts.

    Prompt slots that name the same env and task share episodes: the ``k``-th slot of ``(env, task, slot s)`` in a
    call trains trajectory ``s`` of the ``k``-th episode of ``(env, task)``. For a single-agent env that is one
    episode per slot; for a multi-agent env (``rllm/SolverJudge-v0``: slot 0 and 1 the solvers, slot 2 the judge)
    the slots of a task that reach the same call train the trajectories of the same episodes, so K roles cost one
    set of episodes, not K (``train/grpo.py`` keeps a task's slots next to each other in the data for that).

    ``env_workers`` bounds the env calls running at once (the env thread pool's size; default
    :func:`~rllm_gym.engine.common.default_env_workers`). One event loop and one env thread pool serve every call
    (their threads are reused from step to step; a pool left with a hung env call is replaced), and each env's engine
    with its workflows (envs and agents) serves every call with the same policy, sampling parameters and pool (the
    trainer's own model keeps its policy from step to step).
    ``calls`` numbers the calls, for episode ids.
    """

    def __init__(
        self,
        envs: list[EnvSetup],
        *,
        max_turns: int = DEFAULT_MAX_TURNS,
        n_parallel: int = 256,
        gamma: float = 1.0,
        timeout_s: float | None = None,
        stop_on_truncation: bool = True,
        policy_factory: Callable[[Any], Policy] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        token_history: TokenHistory = "sampled",
        agent_program: str | None = None,
        reward_fn: str | None = None,
        env_workers: int | None = None,
    ):
        if not envs:
            raise ValueError("EpisodeRollout needs at least one EnvSetup")
        self.envs = {setup.env_id: setup for setup in envs}
        self.max_turns = max_turns
        self.n_parallel = n_parallel
        self.gamma = gamma
        self.timeout_s = timeout_s
        self.stop_on_truncation = stop_on_truncation
        self.policy_factory = policy_factory
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.token_history = check_token_history(token_history, "EpisodeRollout")
        self.agent_program, self.reward_fn = agent_program, reward_fn
        if env_workers is not None and (isinstance(env_workers, bool) or not isinstance(env_workers, int)
                                        or env_workers < 1):  # fmt: skip
            raise ValueError(f"EpisodeRollout env_workers must be a positive int or None, got {env_workers!r}")
        self.env_workers = env_workers
        self.calls = 0
        self._runner: asyncio.Runner | None = None
        self._pool: EnvThreadPool | None = None
        # env id -> ((policy, sampling, pool), engine): the engine the next call with the same three reuses.
        self._engines: dict[str, tuple[tuple[Any, SamplingParams, EnvThreadPool | None], AgentWorkflowEngine]] = {}

    def __getstate__(self) -> dict[str, Any]:
        """What a copy in another process gets (the asynchronous generator's worker): the settings, not the event
        loop, env pool and engines of this process (the copy opens its own)."""
        return {**self.__dict__, "_runner": None, "_pool": None, "_engines": {}}

    def generation_for(self, trainer: Any) -> Generation:
        """The generation backend of ``trainer`` with this rollout's policy settings (see train/generation.py)."""
        return generation_for(
            trainer,
            chat_template_kwargs=self.chat_template_kwargs,
            token_history=self.token_history,
            policy_factory=self.policy_factory,
        )

    def close(self) -> None:
        """Close the event loop and the env thread pool the calls run on (a later call opens new ones)."""
        if self._runner is not None:
            self._runner.close()
            self._runner = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._engines.clear()

    def _engine(self, env_id: str, policy: Any, sampling: SamplingParams) -> AgentWorkflowEngine:
        """The engine that runs ``env_id``'s episodes of a call: the previous call's (its workflows kept, see
        :class:`~rllm_gym.engine.AgentWorkflowEngine`) when it had the same policy object, sampling parameters and
        env pool, else a new one."""
        key = (policy, sampling, self._pool)
        kept = self._engines.get(env_id)
        if kept is not None and kept[0][0] is policy and kept[0][1] == sampling and kept[0][2] is self._pool:
            return kept[1]
        if self.agent_program is not None:  # the env's tasks, played by the program through a gateway (rllm_gym.sdk)
            from rllm_gym.sdk import AgentProgramEngine

            engine = AgentProgramEngine(
                self.agent_program, policy, reward_fn=self.reward_fn, sampling_params=sampling,
                max_turns=self.max_turns, timeout_s=self.timeout_s, n_parallel=self.n_parallel, executor=self._pool,
                tune_interpreter=True,
            )  # fmt: skip
            self._engines[env_id] = (key, engine)
            return engine
        setup = self.envs[env_id]
        # Multi-agent episodes have no per-reply truncation rule (every agent must get its turn).
        single_agent = env_id not in env_ids(multi_agent=True)
        options = {"stop_on_truncation": self.stop_on_truncation} if single_agent else {}
        settings = {"n_parallel": self.n_parallel, "gamma": self.gamma, "timeout_s": self.timeout_s, **options}
        engine = engine_for(
            env_id, policy, agent=setup.agent, agent_args=setup.agent_args, env_args=setup.env_args,
            max_turns=self.max_turns, sampling_params=sampling, executor=self._pool, **settings,
            tune_interpreter=True,  # the trainer's process: keeps the loop's pauses short (engine docs)
        )  # fmt: skip
        self._engines[env_id] = (key, engine)
        return engine

    def _run_sync(self, coroutine: Any) -> Any:
        if self._runner is None:
            self._runner = asyncio.Runner()
            weakref.finalize(self, self._runner.close)
        if self._pool is None or self._pool.busy:  # busy between calls: a hung env call holds a thread
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
            workers = default_env_workers() if self.env_workers is None else self.env_workers
            self._pool = EnvThreadPool(max_workers=workers, thread_name_prefix="rllm-gym-train-env")
        return self._runner.run(coroutine)

    def collect(self, prompts: list[Any], generation: Generation) -> RolloutBatch:
        """The episodes of ``prompts`` (TRL's prompt slots) run with ``generation``, and their training rows."""
        decoded = [decode_prompt(prompt) for prompt in prompts]
        unknown = sorted({env_id for env_id, _, _ in decoded} - set(self.envs))
        if unknown:
            raise ValueError(f"prompts name envs {unknown} that this rollout was not set up for: {sorted(self.envs)}")
        # One episode per (env, task, k): the k-th slot of each trajectory index of a task shares it. Episode ids are
        # the task's id, then the process, the call and the episode's number.
        process = generation.process_index
        occurrences: Counter[tuple[str, str, int]] = Counter()
        plan: dict[tuple[str, str, int], tuple[str, Any, str, int | None]] = {}
        keys = []
        for env_id, task, slot in decoded:
            canonical = json.dumps(task, sort_keys=True)
            key = (env_id, canonical, occurrences[env_id, canonical, slot])
            occurrences[env_id, canonical, slot] += 1
            if key not in plan:
                task_id = str(task["id"]) if isinstance(task, dict) and task.get("id") else f"seed-{task}"
                # Reset seed from the run's seed, the task and the rollout (this call, process and occurrence).
                seed = reset_seed(generation.run_seed, task, f"{env_id}\n{canonical}", (self.calls, process, key[2]))
                plan[key] = (env_id, task, f"{task_id}:p{process}s{self.calls}e{len(plan)}", seed)
            keys.append(key)
        self.calls += 1
        start = time.monotonic()
        sampling = generation.sampling_params()
        runs = list(plan.values())
        episodes, metrics = generation.episodes(
            lambda policy: self._run(runs, policy, sampling), self._run_sync, len(runs)
        )
        by_key = dict(zip(plan, episodes, strict=True))
        row_episodes = [by_key[key] for key in keys]
        slots = [slot for _, _, slot in decoded]
        trajectories = [
            ep.trajectories[slot] if slot < len(ep.trajectories) else Trajectory()
            for ep, slot in zip(row_episodes, slots, strict=True)
        ]
        filler_id = generation.filler_id
        return RolloutBatch(
            sequences=[
                row
                for source, trajectory in enumerate(trajectories)
                for row in trajectory_to_sequences(trajectory, filler_id, source)
            ],
            episodes=row_episodes,
            slots=slots,
            rewards=[float(t.reward or 0.0) for t in trajectories],
            metrics=metrics,
            seconds=time.monotonic() - start,
            filler_id=filler_id,
        )

    async def _run(
        self, runs: list[tuple[str, Any, str, int | None]], policy: Any, sampling: SamplingParams
    ) -> list[Episode]:
        """The episodes of ``runs`` (env id, task, episode id, reset seed), in order, every env's engine on this one
        loop."""
        active = len(runs)
        if isinstance(policy, BatchingPolicy):
            # A batch goes out once every episode still running has asked, rather than after batch_wait_s.
            policy.expected_requests = lambda: active

        async def run_env(env_id: str, items: list[tuple[int, Any, str, int | None]]) -> list[tuple[int, Episode]]:
            nonlocal active
            engine = self._engine(env_id, policy, sampling)
            finished = {}
            async for episode in engine.stream_pairs([(task, uid, seed) for _, task, uid, seed in items]):
                finished[episode.id] = episode
                active -= 1
                if isinstance(policy, BatchingPolicy):
                    policy.requests_changed()  # a batch waiting on this episode goes now
            return [(position, finished[uid]) for position, _, uid, _ in items]

        by_env: dict[str, list[tuple[int, Any, str, int | None]]] = defaultdict(list)
        for position, (env_id, task, uid, seed) in enumerate(runs):
            by_env[env_id].append((position, task, uid, seed))
        ordered: list[Episode | None] = [None] * len(runs)
        try:
            for pairs in await asyncio.gather(*(run_env(env_id, items) for env_id, items in by_env.items())):
                for position, episode in pairs:
                    episode.metadata["env"] = runs[position][0]
                    ordered[position] = episode
        finally:
            if isinstance(policy, BatchingPolicy):
                policy.expected_requests = None
                await policy.aclose()
        return ordered  # type: ignore[return-value]
