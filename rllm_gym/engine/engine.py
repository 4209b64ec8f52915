"""The engines that run many episodes concurrently on one asyncio loop against one policy.

:class:`AgentWorkflowEngine` keeps a pool of workflow instances (each with its own agents and envs, reused across
episodes), feeds them ``(task, rollout)`` pairs, retries episodes that end in ``ERROR`` up to ``retry_limit`` times
(env-caused ends are outcomes, not retried), and streams finished Episodes out as they complete, appending each to an
episode file when given one. Rerunning with the same file resumes: finished episodes are read back, not redone.
:class:`AgentExecutionEngine` is the simple path, one agent class and one env id.

Tasks are dicts (passed to ``env.reset(options={"task": task})``; the id is ``task["id"]``, else ``task-<index>``)
or ints (a reset seed: the env draws its own task; the id is ``seed-<n>``). Episode ids are
``"{task_id}:{rollout_idx}"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor, Future
from os import PathLike
from typing import Any

import gymnasium as gym

from rllm_gym.agents.base import BaseAgent
from rllm_gym.engine.arguments import check_arguments
from rllm_gym.engine.workflow import MultiTurnWorkflow, Workflow
from rllm_gym.policies.base import Policy
from rllm_gym.store import EpisodeWriter, read_episodes
from rllm_gym.types import Episode, TerminationReason

logger = logging.getLogger(__name__)

__all__ = ["AgentExecutionEngine", "AgentWorkflowEngine", "EnvThreadPool", "engine_for", "task_id_of"]

_DONE = object()  # end-of-stream marker on the results queue


class EnvThreadPool(Executor):
    """A thread pool for env calls whose threads never keep the process alive.

    ``concurrent.futures.ThreadPoolExecutor`` joins its threads at interpreter exit, so one env call abandoned at an
    episode's timeout (a user reward function that never returns) kept the process from exiting after the run had
    ended. These threads are daemons: an abandoned call is dropped at exit instead. Idle threads are reused and new
    ones started up to ``max_workers``, as in the standard pool. ``busy`` counts the calls running now: a pool kept
    across runs (the trainer's) with calls still busy between runs holds abandoned calls and should be replaced.
    """

    def __init__(self, max_workers: int, thread_name_prefix: str):
        self._max_workers = max_workers
        self._prefix = thread_name_prefix
        self._work: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self.busy = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot run env calls after the engine's thread pool shut down")
            future: Future = Future()
            self._work.put((future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max_workers:
                name = f"{self._prefix}_{len(self._threads)}"
                thread = threading.Thread(target=self._worker, name=name, daemon=True)
                thread.start()
                self._threads.append(thread)
            return future

    def _worker(self) -> None:
        while (item := self._work.get()) is not None:
            future, fn, args, kwargs = item
            result: Any = None
            error: BaseException | None = None
            if future.set_running_or_notify_cancel():
                with self._lock:
                    self.busy += 1
                try:
                    result = fn(*args, **kwargs)
                except BaseException as caught:  # the caller sees it through the future, as with any executor
                    error = caught
                with self._lock:  # before the caller wakes up: a finished call is never counted as busy
                    self.busy -= 1
                if error is None:
                    future.set_result(result)
                else:
                    future.set_exception(error)
            del item, future, fn, args, kwargs, result, error  # do not hold the finished call's objects while waiting
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            if cancel_futures:
                with contextlib.suppress(queue.Empty):
                    while True:
                        self._work.get_nowait()[0].cancel()
            for _ in self._threads:
                self._work.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


def task_id_of(task: Any, index: int) -> str:
    """The id episodes of ``task`` carry: ``task["id"]``, ``seed-<n>`` for an int task, else ``task-<index>``."""
    if isinstance(task, bool) or not isinstance(task, (dict, int)):
        raise TypeError(f"tasks[{index}] must be a task dict or an int seed, got {type(task).__name__}")
    if isinstance(task, int):
        return f"seed-{task}"
    task_id = task.get("id")
    return str(task_id) if task_id not in (None, "") else f"task-{index}"


class AgentWorkflowEngine:
    """Runs ``workflow_cls(policy=policy, **workflow_args)`` instances over tasks, ``n_parallel`` episodes at a time.

    ``out``: an episode JSONL file; finished episodes are appended as they complete and skipped when the run is
    repeated (resume). ``env_workers``: threads for env calls that must not block the loop (sandboxed code, grading).
    ``gc_threshold``: while episodes run, Python's generation-0 collection threshold is raised to at least this
    (restored afterwards): every Step allocates objects that live on, and the default threshold (700) made garbage
    collection a third of the engine's CPU per LLM call in ``benchmarks/bench_engine.py``. ``None`` leaves it alone.
    ``executor``: an :class:`EnvThreadPool` (or any executor) for env calls that the caller keeps across runs, instead
    of a pool each run starts and shuts down (the trainer passes one: thread starts were a tenth of its rollout time).
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
        env_workers: int = 32,
        gc_threshold: int | None = 50_000,
        executor: Executor | None = None,
    ):
        if not (isinstance(workflow_cls, type) and issubclass(workflow_cls, Workflow)):
            raise TypeError(
                f"workflow_cls must be a Workflow subclass (the class, not an instance), got {workflow_cls!r}"
            )
        if workflow_args is not None and not isinstance(workflow_args, dict):
            raise TypeError(f"workflow_args must be a dict of the workflow's keyword arguments, got {workflow_args!r}")
        for name, value in (("n_parallel", n_parallel), ("retry_limit", retry_limit), ("env_workers", env_workers)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if n_parallel < 1:
            raise ValueError(f"n_parallel must be >= 1, got {n_parallel}")
        if retry_limit < 1:
            raise ValueError(f"retry_limit must be >= 1 (1 = no retry), got {retry_limit}")
        if env_workers < 1:
            raise ValueError(f"env_workers must be >= 1, got {env_workers}")
        self.workflow_cls = workflow_cls
        self.policy = policy
        self.workflow_args = dict(workflow_args or {})
        self.n_parallel = n_parallel
        self.retry_limit = retry_limit
        self.out = out
        self.fsync = fsync
        self.env_workers = env_workers
        self.gc_threshold = gc_threshold
        self.executor = executor
        self._executor: Executor | None = None
        self._logged_errors: set[tuple[str, str]] = set()  # each distinct error is a warning once, then debug

    def _new_workflow(self) -> Workflow:
        return self.workflow_cls(policy=self.policy, executor=self._executor, **self.workflow_args)

    async def _run_with_retry(self, workflow: Workflow, task: Any, uid: str) -> tuple[Episode, Workflow]:
        attempts = 0
        while True:
            attempts += 1
            episode = await workflow.run_with_termination_handling(task, uid)
            if workflow.needs_replacement:  # its env may still be busy in a thread: never reuse it
                workflow = self._new_workflow()
            if episode.termination_reason is TerminationReason.ERROR:
                self._log_error(episode, attempts)
            if episode.termination_reason is not TerminationReason.ERROR or attempts == self.retry_limit:
                episode.metadata["attempts"] = attempts
                return episode, workflow

    def _log_error(self, episode: Episode, attempt: int) -> None:
        error = episode.metadata.get("error") or {}
        key = (str(error.get("type")), str(error.get("message")))
        level = logging.DEBUG if key in self._logged_errors else logging.WARNING
        self._logged_errors.add(key)
        retry = "retrying" if attempt < self.retry_limit else "no retries left"
        logger.log(
            level,
            "episode %s (attempt %d of %d, %s) ended in ERROR: %s: %s",
            episode.id,
            attempt,
            self.retry_limit,
            retry,
            key[0],
            key[1],
        )
        logger.debug("traceback of episode %s:\n%s", episode.id, error.get("traceback", "(none recorded)"))

    @staticmethod
    def pairs(tasks: Sequence[Any], n_rollouts: int = 1) -> list[tuple[Any, str]]:
        """``(task, episode id)`` for every rollout of every task, in order."""
        if n_rollouts < 1:
            raise ValueError(f"n_rollouts must be >= 1, got {n_rollouts}")
        return [(task, f"{task_id_of(task, i)}:{r}") for i, task in enumerate(tasks) for r in range(n_rollouts)]

    async def stream(self, tasks: Sequence[Any], n_rollouts: int = 1) -> AsyncIterator[Episode]:
        """Yield each newly finished Episode as soon as it is done (episodes already in ``out`` are skipped)."""
        done = {episode.id for episode in self._previous()}
        async for episode in self.stream_pairs([p for p in self.pairs(tasks, n_rollouts) if p[1] not in done]):
            yield episode

    async def run_pairs(self, pairs: Sequence[tuple[Any, str]]) -> list[Episode]:
        """Run one episode per ``(task, episode id)`` pair and return them in the pairs' order (the trainer uses this
        to give each prompt slot its own id); ``out`` is appended to but not consulted."""
        episodes = {episode.id: episode async for episode in self.stream_pairs(pairs)}
        return [episodes[uid] for _, uid in pairs]

    async def stream_pairs(self, pairs: Sequence[tuple[Any, str]]) -> AsyncIterator[Episode]:
        """Yield the episode of each ``(task, episode id)`` pair as soon as it finishes."""
        uids = [uid for _, uid in pairs]
        if len(set(uids)) != len(uids):
            raise ValueError("episode ids must be unique within one run; got duplicates")
        work: asyncio.Queue[tuple[Any, str]] = asyncio.Queue()
        for pair in pairs:
            work.put_nowait(pair)
        if work.empty():
            return
        results: asyncio.Queue[Any] = asyncio.Queue()
        n_workers = min(self.n_parallel, work.qsize())

        owned = self.executor is None
        self._executor = self.executor or EnvThreadPool(
            max_workers=self.env_workers, thread_name_prefix="rllm-gym-env"
        )
        first = self._new_workflow()  # bad workflow arguments fail here, before any episode starts

        loop = asyncio.get_running_loop()

        async def worker(workflow: Workflow | None) -> None:
            if workflow is None and first.cheap_to_build:
                workflow = self._new_workflow()
            elif workflow is None:
                # Built in a thread: thousands of env constructors (data files, sandboxes) must not stall the loop.
                workflow = await loop.run_in_executor(self._executor, self._new_workflow)
            try:
                while not work.empty():
                    task, uid = work.get_nowait()
                    episode, workflow = await self._run_with_retry(workflow, task, uid)
                    await results.put(episode)
            finally:
                await results.put(_DONE)

        writer = EpisodeWriter(self.out, fsync=self.fsync) if self.out is not None else None
        thresholds = gc.get_threshold()
        if self.gc_threshold is not None:
            gc.set_threshold(max(thresholds[0], self.gc_threshold), *thresholds[1:])
        workers = [asyncio.create_task(worker(first if i == 0 else None)) for i in range(n_workers)]
        try:
            finished = 0
            while finished < n_workers:
                item = await results.get()
                if item is _DONE:
                    finished += 1
                    continue
                if writer is not None:
                    writer.write(item)
                yield item
            for task_handle in workers:
                task_handle.result()  # re-raise a bug in the engine itself rather than lose episodes silently
        finally:
            gc.set_threshold(*thresholds)
            for task_handle in workers:
                task_handle.cancel()
            if writer is not None:
                writer.close()
            if owned:
                self._executor.shutdown(wait=False, cancel_futures=True)

    async def run(self, tasks: Sequence[Any], n_rollouts: int = 1, progress: Callable[[Episode], None] | None = None):
        """Every episode of every task (those read back from ``out`` included), in task and rollout order."""
        episodes = {episode.id: episode for episode in self._previous()}
        pairs = self.pairs(tasks, n_rollouts)
        async for episode in self.stream_pairs([p for p in pairs if p[1] not in episodes]):
            episodes[episode.id] = episode
            if progress is not None:
                progress(episode)
        return [episodes[uid] for _, uid in pairs if uid in episodes]

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
                                      n_parallel=256, max_steps=8)
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
        max_steps: int = 10,
        n_parallel: int = 128,
        retry_limit: int = 3,
        out: str | PathLike[str] | None = None,
        executor: Executor | None = None,
        **workflow_kwargs: Any,
    ):
        # The workflow (and its env) is built when a run starts: check the arguments a typo breaks now instead.
        if isinstance(env_id, str):
            from rllm_gym.registry import _spec, env_ids

            if env_id not in env_ids() and env_id not in gym.registry:
                _spec(env_id)  # raises UnknownEnvError naming the registered ids
        elif not callable(env_id):
            raise TypeError(f"env_id must be a registered env id or an env class/factory, got {env_id!r}")
        if not callable(agent_cls):
            raise TypeError(f"agent_cls must be a BaseAgent subclass (or a factory of agents), got {agent_cls!r}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps!r} (an int: LLM calls per episode)")
        workflow_args = {
            "env": env_id,
            "agent_cls": agent_cls,
            "env_args": env_args,
            "agent_args": agent_args,
            "max_steps": max_steps,
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
        )


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
    **workflow_kwargs: Any,
) -> AgentWorkflowEngine:
    """The engine that plays a registered id, as ``rllm-gym eval`` and the trainer run it.

    A single-agent id gets :class:`AgentExecutionEngine` with ``agent`` (``"module:Class"``) or the id's registered
    agent; a multi-agent (PettingZoo) id gets :class:`AgentWorkflowEngine` over its registered workflow (default
    :class:`~rllm_gym.engine.MultiAgentWorkflow`), one registered agent per role, ``agent_args`` keyed by role
    (``{"judge": {...}}``). ``executor`` is the engine's (see :class:`AgentWorkflowEngine`); ``workflow_kwargs`` are
    the workflow options (``max_steps``, ``sampling_params``, ...).
    """
    from rllm_gym.engine.multi_agent import MultiAgentWorkflow
    from rllm_gym.registry import _spec, default_agent, env_ids, load

    check_arguments(env_id, agent=agent, agent_args=agent_args, env_args=env_args)

    if env_id in env_ids(multi_agent=True):
        if agent is not None:
            raise ValueError(f"agent={agent!r} is for single-agent envs; {env_id} plays its registered agent per role")
        roles = sorted(default_agent(env_id))
        strays = sorted(set(agent_args or {}) - set(roles))
        if strays:
            raise ValueError(
                f"agent_args for {env_id} are keyed by role ({roles}), e.g. {{{roles[0]!r}: {{...}}}}; "
                f"got keys {strays}"
            )
        workflow_args = {"env": env_id, "env_args": env_args, "agent_args": agent_args, **workflow_kwargs}
        workflow = _spec(env_id).workflow
        return AgentWorkflowEngine(
            load(workflow) if workflow else MultiAgentWorkflow,
            policy,
            workflow_args=workflow_args,
            n_parallel=n_parallel,
            out=out,
            executor=executor,
        )
    return AgentExecutionEngine(
        env_id=env_id,
        agent_cls=load(agent) if agent else default_agent(env_id),
        agent_args=agent_args,
        env_args=env_args,
        policy=policy,
        n_parallel=n_parallel,
        out=out,
        executor=executor,
        **workflow_kwargs,
    )
