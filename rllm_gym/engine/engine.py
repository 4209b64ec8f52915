"""The engines that run many episodes concurrently on one asyncio loop against one policy.

:class:`AgentWorkflowEngine` keeps a pool of workflow instances (each with its own agents and envs, reused across
episodes), feeds them ``(task, rollout)`` pairs, retries episodes that end in ``ERROR`` or ``INFRA_FAILED`` up to
``retry_limit`` times (env-caused ends are outcomes, not retried; an episode still infra-failed after its last try is
kept with that reason, which the trainer leaves out of the advantages), and streams finished Episodes out as they
complete, appending each to an episode file when given one. Rerunning with the same file resumes: finished episodes
are read back, not redone. :class:`AgentExecutionEngine` is the simple path, one agent class and one env id.

Tasks are dicts (passed to ``env.reset(options={"task": task})``; the id is ``task["id"]``, else ``task-<index>``)
or ints (a reset seed: the env draws its own task; the id is ``seed-<n>``). Episode ids are
``"{task_id}:{rollout_idx}"``. Each episode is an :class:`~rllm_gym.engine.seeds.EpisodeSpec` ``(task, id, seed)``:
the seed its env resets with is derived from the engine's ``seed``, the task and the rollout index
(:func:`~rllm_gym.engine.seeds.episode_seed`), never read out of the id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor
from os import PathLike
from typing import Any

import gymnasium as gym

from rllm_gym.agent import BaseAgent
from rllm_gym.engine.common import EnvThreadPool, call_in_executor, default_env_workers, max_turns_of, task_id_of
from rllm_gym.engine.interpreter import responsive_loop
from rllm_gym.engine.seeds import EpisodeSpec, check_seed, episode_specs, reset_seed
from rllm_gym.engine.workflow import MultiTurnWorkflow, Workflow
from rllm_gym.policies.base import Policy
from rllm_gym.store import EpisodeWriter, read_episodes
from rllm_gym.types import Episode, TerminationReason

logger = logging.getLogger(__name__)

__all__ = ["AgentExecutionEngine", "AgentWorkflowEngine", "EnvThreadPool", "task_id_of"]

_DONE = object()  # end-of-stream marker on the results queue
_ADMIT_BATCH = 64  # workers started per event-loop iteration
_BUILDERS = 2  # workflows built at once (in the env pool's threads)
# When the first workflow of a run builds in less than this, the others are built on the loop too: a thread hop per
# build cost more than the build (64 Math-v0 workflows take ~5 ms, 64 hops through the env pool ~10 ms of a training
# step's rollout); an admission batch (_ADMIT_BATCH) of such builds holds the loop for tens of milliseconds at most.
_CHEAP_BUILD_S = 0.001
# Retried: an exception, or a reward that came from the infrastructure (info["infra_failed"]), not from the model.
_RETRIED = (TerminationReason.ERROR, TerminationReason.INFRA_FAILED)


class AgentWorkflowEngine:
    """Runs ``workflow_cls(policy=policy, **workflow_args)`` instances over tasks, ``n_parallel`` episodes at a time.

    ``out``: an episode JSONL file; finished episodes are appended as they complete and skipped when the run is
    repeated (resume). ``env_workers``: threads for env calls that must not block the loop (sandboxed code, grading);
    at most this many env calls run at once and the rest wait on the loop (backpressure). The default
    (:func:`~rllm_gym.engine.common.default_env_workers`) is twice the CPUs this process may run on, at least 4: the
    sandbox's default ``max_parallel`` is the same count of ``os.cpu_count()`` (more under a CPU-affinity mask), so
    more threads would only queue in the sandbox, and each busy one competes with the event loop for the GIL (32 on 2
    cores made the loop's 99th-percentile lag 10x worse). Raise it for envs that wait on the network.
    ``seed``: the run's seed; episode ``k`` of a task dict resets its env with
    ``episode_seed(seed, task_id, k)`` (an int task is the reset seed itself); ``None``: unseeded resets.
    ``tune_interpreter``: off by default, as it changes process-wide state. On, while episodes run the garbage
    collector's generation-0 threshold is raised to 50,000, objects that survive a collection are frozen so later
    passes skip them (only one automatic collection in eight scans the objects allocated since the last), and the GIL
    switch interval drops to 1 ms: with thousands of episodes in flight, full collections over the live envs stalled
    the event loop for a quarter of a second and collection was a third of the engine's CPU per LLM call
    (``benchmarks/bench_engine.py``). Everything is restored exactly when the last overlapping run ends, and objects
    the caller froze are never unfrozen (see :func:`~rllm_gym.engine.interpreter.responsive_loop`). Turn it on in a
    process that runs mostly the engine (``rllm-gym eval`` and the trainer do).
    ``executor``: an :class:`EnvThreadPool` (or any executor) for env calls that the caller keeps across runs, instead
    of a pool each run starts and shuts down (the trainer passes one: thread starts were a tenth of its rollout time).
    With one, the workflows a run leaves in good order (not abandoned mid-call) are kept for the next run of this
    engine, as workflows already serve episode after episode within a run: the trainer's steps reuse them instead of
    building an env and an agent per episode every step.
    """

    def __init__(
        self,
        workflow_cls: type[Workflow],
        policy: Policy,
        *,
        workflow_args: dict[str, Any] | None = None,
        n_parallel: int = 128,
        retry_limit: int = 3,
        out: str | PathLike[str] | None = None,
        fsync: bool = False,
        env_workers: int | None = None,
        seed: int | None = 0,
        tune_interpreter: bool = False,
        executor: Executor | None = None,
    ):
        if not (isinstance(workflow_cls, type) and issubclass(workflow_cls, Workflow)):
            raise TypeError(
                f"workflow_cls must be a Workflow subclass (the class, not an instance), got {workflow_cls!r}"
            )
        if workflow_args is not None and not isinstance(workflow_args, dict):
            raise TypeError(f"workflow_args must be a dict of the workflow's keyword arguments, got {workflow_args!r}")
        env_workers = default_env_workers() if env_workers is None else env_workers
        for name, value in (("n_parallel", n_parallel), ("retry_limit", retry_limit), ("env_workers", env_workers)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if n_parallel < 1:
            raise ValueError(f"n_parallel must be >= 1, got {n_parallel}")
        if retry_limit < 1:
            raise ValueError(f"retry_limit must be >= 1 (1 = no retry), got {retry_limit}")
        if env_workers < 1:
            raise ValueError(f"env_workers must be >= 1, got {env_workers}")
        if not isinstance(tune_interpreter, bool):
            raise ValueError(f"tune_interpreter must be True or False, got {tune_interpreter!r}")
        if "seed" in (workflow_args or {}):
            raise ValueError("seed is the engine's, not a workflow argument: pass AgentWorkflowEngine(..., seed=N)")
        if seed is not None:
            check_seed(seed)
        self.workflow_cls = workflow_cls
        self.policy = policy
        self.workflow_args = dict(workflow_args or {})
        self.n_parallel = n_parallel
        self.retry_limit = retry_limit
        self.out = out
        self.fsync = fsync
        self.env_workers = env_workers
        self.seed = seed
        self.tune_interpreter = tune_interpreter
        self.executor = executor
        self._executor: Executor | None = None
        self._idle: list[Workflow] = []  # workflows an earlier run left in good order (with a caller-kept executor)
        self._cheap_to_build: bool | None = None  # measured on the first workflow this engine built
        self._logged_errors: set[tuple[str, str]] = set()  # each distinct error is a warning once, then debug

    def _new_workflow(self) -> Workflow:
        return self.workflow_cls(policy=self.policy, executor=self._executor, **self.workflow_args)

    def _first_workflow(self) -> Workflow:
        """A run's first workflow: one an earlier run left, or a new one (bad workflow arguments fail here, before
        any episode starts), whose build time says whether the others are built on the loop."""
        if self._idle:
            return self._idle.pop()
        started = time.perf_counter()
        workflow = self._new_workflow()
        if self._cheap_to_build is None:
            self._cheap_to_build = workflow.cheap_to_build or time.perf_counter() - started < _CHEAP_BUILD_S
        return workflow

    async def _run_with_retry(self, workflow: Workflow, spec: EpisodeSpec) -> tuple[Episode, Workflow]:
        attempts = 0
        while True:
            attempts += 1
            episode = await workflow.run_with_termination_handling(spec.task, spec.id, seed=spec.seed)
            if workflow.needs_replacement:  # its env may still be busy in a thread: never reuse it
                workflow = self._new_workflow()
            failed = episode.termination_reason in _RETRIED
            if failed:
                self._log_error(episode, attempts)
            if not failed or attempts == self.retry_limit:
                episode.metadata["attempts"] = attempts
                return episode, workflow

    def _log_error(self, episode: Episode, attempt: int) -> None:
        reason = episode.termination_reason or TerminationReason.ERROR
        if reason is TerminationReason.INFRA_FAILED:
            error = {"type": "infra_failed", "message": (episode.metadata.get("infra_failure") or {}).get("error")}
        else:
            error = episode.metadata.get("error") or {}
        key = (str(error.get("type")), str(error.get("message")))
        level = logging.DEBUG if key in self._logged_errors else logging.WARNING
        self._logged_errors.add(key)
        retry = "retrying" if attempt < self.retry_limit else "no retries left"
        logger.log(
            level,
            "episode %s (attempt %d of %d, %s) ended in %s: %s: %s",
            episode.id,
            attempt,
            self.retry_limit,
            retry,
            reason.value.upper(),
            key[0],
            key[1],
        )
        logger.debug("traceback of episode %s:\n%s", episode.id, error.get("traceback", "(none recorded)"))

    def pairs(self, tasks: Sequence[Any], n_rollouts: int = 1) -> list[EpisodeSpec]:
        """An :class:`EpisodeSpec` ``(task, episode id, reset seed)`` for every rollout of every task, in order."""
        return episode_specs(tasks, n_rollouts, self.seed)

    def spec_of(self, item: EpisodeSpec | tuple[Any, str]) -> EpisodeSpec:
        """An :class:`EpisodeSpec` as given, or one for a ``(task, episode id)`` pair: its seed derived from the
        engine's seed and the whole id as the key (ids are unique within a run, so are the seeds)."""
        if len(item) == 3:
            return EpisodeSpec(*item)
        task, uid = item
        return EpisodeSpec(task, uid, reset_seed(self.seed, task, uid, 0))

    async def stream(self, tasks: Sequence[Any], n_rollouts: int = 1) -> AsyncIterator[Episode]:
        """Yield each newly finished Episode as soon as it is done (episodes already in ``out`` are skipped)."""
        done = {episode.id for episode in self._previous()}
        async for episode in self.stream_pairs([p for p in self.pairs(tasks, n_rollouts) if p.id not in done]):
            yield episode

    async def run_pairs(self, pairs: Sequence[EpisodeSpec | tuple[Any, str]]) -> list[Episode]:
        """Run one episode per :class:`EpisodeSpec` (or ``(task, episode id)`` pair) and return them in the given
        order (``train/vllm_server.py`` uses this for its episodes); ``out`` is appended to but not consulted."""
        specs = [self.spec_of(item) for item in pairs]
        episodes = {episode.id: episode async for episode in self.stream_pairs(specs)}
        return [episodes[spec.id] for spec in specs]

    async def stream_pairs(self, pairs: Sequence[EpisodeSpec | tuple[Any, str]]) -> AsyncIterator[Episode]:
        """Yield the episode of each :class:`EpisodeSpec` (or ``(task, episode id)`` pair) as soon as it finishes."""
        specs = [self.spec_of(item) for item in pairs]
        uids = [spec.id for spec in specs]
        if len(set(uids)) != len(uids):
            raise ValueError("episode ids must be unique within one run; got duplicates")
        work: asyncio.Queue[EpisodeSpec] = asyncio.Queue()
        for spec in specs:
            work.put_nowait(spec)
        if work.empty():
            return
        results: asyncio.Queue[Any] = asyncio.Queue()
        n_workers = min(self.n_parallel, work.qsize())

        owned = self.executor is None
        self._executor = self.executor or EnvThreadPool(
            max_workers=self.env_workers, thread_name_prefix="rllm-gym-env"
        )
        first = self._first_workflow()
        builders = asyncio.Semaphore(_BUILDERS)

        async def worker(workflow: Workflow | None) -> None:
            if workflow is None and self._idle:
                workflow = self._idle.pop()
            elif workflow is None and self._cheap_to_build:
                workflow = self._new_workflow()
            elif workflow is None:
                # Built in a thread: thousands of env constructors (data files, sandboxes) must not stall the loop.
                # Constructors are mostly Python (parsing, schema checks) that the GIL runs one at a time anyway, so
                # running more of them at once adds no speed, only threads that keep the loop from the GIL.
                async with builders:
                    workflow = await call_in_executor(self._executor, self._new_workflow)
            try:
                while not work.empty():
                    episode, workflow = await self._run_with_retry(workflow, work.get_nowait())
                    await results.put(episode)
                if not owned:  # its env calls run in the caller's executor, which the next run uses too
                    self._idle.append(workflow)
            finally:
                await results.put(_DONE)

        writer = EpisodeWriter(self.out, fsync=self.fsync) if self.out is not None else None
        workers: list[asyncio.Task[None]] = []

        async def admit() -> None:
            # A batch of workers per loop iteration: thousands started (and first stepped) in one iteration held the
            # loop for hundreds of milliseconds. Past admission, the env pool's slots pace the episodes.
            for i in range(n_workers):
                workers.append(asyncio.create_task(worker(first if i == 0 else None)))
                if i % _ADMIT_BATCH == _ADMIT_BATCH - 1:
                    await asyncio.sleep(0)

        with responsive_loop() if self.tune_interpreter else contextlib.nullcontext():
            admitter = asyncio.create_task(admit())
            try:
                finished = 0
                while finished < n_workers:
                    item = await results.get()
                    if item is _DONE:
                        finished += 1
                        continue
                    if writer is not None:  # JSON and file writes off the loop; one at a time keeps the file's order
                        await asyncio.to_thread(writer.write, item)
                    yield item
                admitter.result()
                for task_handle in workers:
                    task_handle.result()  # re-raise a bug in the engine itself rather than lose episodes silently
            finally:
                admitter.cancel()
                for task_handle in workers:
                    task_handle.cancel()
                if writer is not None:
                    writer.close()
                if owned:
                    self._executor.shutdown(wait=False, cancel_futures=True)

    async def run(self, tasks: Sequence[Any], n_rollouts: int = 1, progress: Callable[[Episode], None] | None = None):
        """Every episode of every task (those read back from ``out`` included), in task and rollout order.

        ``progress``, if given, is called with each episode as it finishes, in finishing order, from the event loop
        that runs the engine. Episodes read back from ``out`` are not passed to it (a bar over all the episodes starts
        at their count). It suits a progress bar::

            bar = tqdm(total=len(tasks) * n_rollouts, unit="ep")
            episodes = asyncio.run(engine.run(tasks, n_rollouts=n_rollouts, progress=lambda episode: bar.update()))

        Keep it quick: it runs on the engine's event loop, where no episode moves on while it does.
        """
        episodes = {episode.id: episode for episode in self._previous()}
        specs = self.pairs(tasks, n_rollouts)
        async for episode in self.stream_pairs([spec for spec in specs if spec.id not in episodes]):
            episodes[episode.id] = episode
            if progress is not None:
                progress(episode)
        return [episodes[spec.id] for spec in specs if spec.id in episodes]

    def _previous(self) -> list[Episode]:
        if self.out is None:
            return []
        try:
            return list(read_episodes(self.out))
        except FileNotFoundError:
            return []


class AgentExecutionEngine(AgentWorkflowEngine):
    """The simple path: one agent class against one env, ``n_parallel`` episodes in flight.

    Example::

        engine = AgentExecutionEngine(env_id="rllm/FrozenLake-v0", agent_cls=FrozenLakeAgent, policy=policy,
                                      n_parallel=256, max_turns=8)
        episodes = await engine.run(tasks=list(range(100)), n_rollouts=4)
    """

    def __init__(
        self,
        *,
        env_id: str | Callable[..., gym.Env],
        agent_cls: type[BaseAgent],
        policy: Policy,
        env_args: dict[str, Any] | None = None,
        agent_args: dict[str, Any] | None = None,
        max_turns: int | None = None,
        n_parallel: int = 128,
        retry_limit: int = 3,
        out: str | PathLike[str] | None = None,
        executor: Executor | None = None,
        env_workers: int | None = None,
        seed: int | None = 0,
        tune_interpreter: bool = False,
        max_steps: int | None = None,
        **workflow_kwargs: Any,
    ):
        # The workflow (and its env) is built when a run starts: check the arguments a typo breaks now instead.
        if isinstance(env_id, str):
            from rllm_gym.registry import env_ids, env_spec

            if env_id not in env_ids() and env_id not in gym.registry:
                env_spec(env_id)  # raises UnknownEnvError naming the registered ids
        elif not callable(env_id):
            raise TypeError(f"env_id must be a registered env id or an env class/factory, got {env_id!r}")
        if not callable(agent_cls):
            raise TypeError(f"agent_cls must be a BaseAgent subclass (or a factory of agents), got {agent_cls!r}")
        max_turns = max_turns_of(max_turns, max_steps, type(self).__name__)
        workflow_args = {
            "env": env_id,
            "agent_cls": agent_cls,
            "env_args": env_args,
            "agent_args": agent_args,
            "max_turns": max_turns,
            **workflow_kwargs,
        }
        super().__init__(
            MultiTurnWorkflow,
            policy,
            workflow_args=workflow_args,
            n_parallel=n_parallel,
            retry_limit=retry_limit,
            out=out,
            executor=executor,
            env_workers=env_workers,
            seed=seed,
            tune_interpreter=tune_interpreter,
        )
