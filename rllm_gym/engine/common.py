"""What the engines share: the thread pool for env calls and the ids of tasks.

Both :mod:`rllm_gym.engine.engine` and :mod:`rllm_gym.engine.multi_agent` import this module, and it imports neither,
so the imports between the engine modules run one way. :class:`EnvThreadPool` is written for an event loop that must
never wait: :meth:`EnvThreadPool.submit` takes no lock a worker thread may hold and never waits for a thread to
start, and :meth:`EnvThreadPool.call` admits at most ``max_workers`` calls at a time, so calls beyond that wait as
suspended coroutines (backpressure) instead of piling up in the pool's queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from rllm_gym.types import DEFAULT_MAX_TURNS

__all__ = ["EnvThreadPool", "call_in_executor", "default_env_workers", "max_turns_of", "task_id_of"]


def default_env_workers() -> int:
    """Twice the CPUs this process may run on, at least 4: as the sandbox's default ``max_parallel`` counts them, but
    from the affinity mask (``os.cpu_count()``, which the sandbox uses, counts CPUs the process may not run on)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    return max(4, 2 * cpus)


class EnvThreadPool(Executor):
    """A thread pool for env calls whose threads never keep the process alive, and that never stalls the caller.

    Why not ``concurrent.futures.ThreadPoolExecutor`` (or ``asyncio.to_thread``, which uses one): the standard pool
    joins its threads at interpreter exit (an exit hook registered with ``threading._register_atexit``), so one env
    call abandoned at an episode's timeout (a user reward function that never returns) kept the process from exiting
    after the run had ended; and its ``submit`` takes a lock and starts threads inline, which stalls the event loop
    (below). These threads are daemons: an abandoned call is dropped at exit instead. Idle threads are reused and new
    ones started up to ``max_workers``, as in the standard pool. ``busy`` counts the calls running now: a pool kept
    across runs (the trainer's) with calls still busy between runs holds abandoned calls and should be replaced.

    The event loop submits thousands of calls, so :meth:`submit` does no blocking work: taking a lock that a worker
    thread holds means waiting until that thread gets the GIL back (milliseconds per call with 32 busy workers), and
    ``Thread.start`` waits until the new thread has run. New threads are started by a starter thread instead, and
    the queues are ``queue.SimpleQueue`` (no Python-level lock). :meth:`call` is the asyncio way in, with
    backpressure: at most ``max_workers`` of its calls are in the pool at a time.
    """

    def __init__(self, max_workers: int, thread_name_prefix: str):
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(f"EnvThreadPool max_workers must be an int >= 1, got {max_workers!r}")
        self._max_workers = max_workers
        self._prefix = thread_name_prefix
        self._work: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._idle: queue.SimpleQueue[None] = queue.SimpleQueue()  # one token per worker that finished a call
        self._starts: queue.SimpleQueue[bool] = queue.SimpleQueue()  # requests to the starter thread
        self._threads: list[threading.Thread] = []
        self._requested = 0  # worker threads asked for (started or about to be)
        self._lock = threading.Lock()  # thread list and shutdown: never taken by submit or by a call
        self._start_lock = threading.Lock()  # the rare path of submit that asks for a new thread
        self._starter: threading.Thread | None = None
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self._closed = False
        self._running: set[Future] = set()

    @property
    def busy(self) -> int:
        """Calls running in a worker thread now."""
        return len(self._running)

    @property
    def max_workers(self) -> int:
        return self._max_workers

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        if self._closed:
            raise RuntimeError("cannot run env calls after the engine's thread pool shut down")
        future: Future = Future()
        self._work.put((future, fn, args, kwargs))
        try:
            self._idle.get_nowait()  # a worker that is (or is about to be) waiting for work takes this call
        except queue.Empty:
            if self._requested < self._max_workers:
                self._request_thread()
        return future

    async def call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in a worker thread, awaited; at most ``max_workers`` such calls are admitted at a
        time (per event loop), the rest wait here rather than in the pool's queue."""
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:  # a semaphore belongs to one loop (one asyncio.run)
            self._slots = (loop, asyncio.Semaphore(self._max_workers))
        async with self._slots[1]:
            return await asyncio.wrap_future(self.submit(fn, *args, **kwargs))

    def _request_thread(self) -> None:
        with self._start_lock:
            if self._requested >= self._max_workers:
                return
            self._requested += 1
            if self._starter is None:
                # The starter waits out each Thread.start (until the new thread runs) so that the caller never does.
                name = f"{self._prefix}_starter"
                self._starter = threading.Thread(target=self._start_workers, name=name, daemon=True)
                self._starter.start()
        self._starts.put(True)

    def _start_workers(self) -> None:
        while self._starts.get():
            name = f"{self._prefix}_{len(self._threads)}"
            thread = threading.Thread(target=self._worker, name=name, daemon=True)
            with self._lock:  # started under the lock, so that shutdown never joins a thread not yet started
                if self._closed:
                    return
                self._threads.append(thread)
                thread.start()

    def _worker(self) -> None:
        while (item := self._work.get()) is not None:
            future, fn, args, kwargs = item
            result: Any = None
            error: BaseException | None = None
            if future.set_running_or_notify_cancel():
                self._running.add(future)  # a set's add and discard are atomic: no lock for workers to queue on
                try:
                    result = fn(*args, **kwargs)
                except BaseException as caught:  # the caller sees it through the future, as with any executor
                    error = caught
                self._running.discard(future)  # before the caller wakes up: a finished call is never counted as busy
                if error is None:
                    future.set_result(result)
                else:
                    future.set_exception(error)
            del item, future, fn, args, kwargs, result, error  # do not hold the finished call's objects while waiting
            self._idle.put(None)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        if cancel_futures:
            with contextlib.suppress(queue.Empty):
                while True:
                    item = self._work.get_nowait()
                    if item is not None:
                        item[0].cancel()
        for _ in range(self._max_workers):  # every thread there is or may yet be gets its end-of-work marker
            self._work.put(None)
        self._starts.put(False)
        if wait:
            for thread in threads:
                thread.join()


async def call_in_executor(executor: Executor | None, fn: Callable[..., Any], /, *args: Any) -> Any:
    """``fn(*args)`` in ``executor``, awaited: through :meth:`EnvThreadPool.call` (with its backpressure) when the
    executor is one, else ``loop.run_in_executor`` (``None``: the loop's default executor)."""
    if isinstance(executor, EnvThreadPool):
        return await executor.call(fn, *args)
    return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)


def task_id_of(task: Any, index: int) -> str:
    """The id episodes of ``task`` carry: ``task["id"]``, ``seed-<n>`` for an int task, else ``task-<index>``."""
    if isinstance(task, bool) or not isinstance(task, (dict, int)):
        raise TypeError(f"tasks[{index}] must be a task dict or an int seed, got {type(task).__name__}")
    if isinstance(task, int):
        return f"seed-{task}"
    task_id = task.get("id")
    return str(task_id) if task_id not in (None, "") else f"task-{index}"


def max_turns_of(max_turns: int | None, max_steps: int | None, owner: str, default: int = DEFAULT_MAX_TURNS) -> int:
    """The per-episode LLM-call limit from ``max_turns``, or from ``max_steps``, its deprecated name (a warning)."""
    if max_steps is not None:
        if max_turns is not None:
            raise ValueError(f"{owner} got max_turns={max_turns!r} and max_steps={max_steps!r}: pass only max_turns")
        warnings.warn(
            f"{owner}(max_steps=...) is deprecated: pass max_turns= (LLM calls per episode) instead",
            FutureWarning,
            stacklevel=3,
        )
        max_turns = max_steps
    max_turns = default if max_turns is None else max_turns
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns!r} (an int: LLM calls per episode)")
    return max_turns
