"""What the engines share: the thread pool for env calls and the ids of tasks.

Both :mod:`rllm_gym.engine.engine` and :mod:`rllm_gym.engine.multi_agent` import this module, and it imports neither,
so the imports between the engine modules run one way. :class:`EnvThreadPool` is written for an event loop that must
never wait: :meth:`EnvThreadPool.submit` takes no lock a worker thread may hold and never waits for a thread to
start, and :meth:`EnvThreadPool.call` admits at most ``max_workers`` calls at a time, so calls beyond that wait as
suspended coroutines (backpressure) instead of piling up in the pool's queue. A call that only waits (the sandbox
holding a verdict's result for its release level) lends its place meanwhile (:mod:`rllm_gym.slots`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import queue
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from rllm_gym.slots import set_lender
from rllm_gym.types import DEFAULT_MAX_TURNS

__all__ = ["EnvThreadPool", "call_in_executor", "default_env_workers", "max_turns_of", "task_id_of"]

LOANS_PER_WORKER = 4  # calls that may lend their place at once, per worker: what bounds the work they start elsewhere


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (``os.cpu_count()`` counts CPUs it may not run on)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def default_env_workers() -> int:
    """Twice the CPUs this process may run on, at least 4: as the sandbox's default ``max_parallel`` counts them, but
    from the affinity mask (:func:`usable_cpus`; ``os.cpu_count()``, which the sandbox uses, counts them all)."""
    return max(4, 2 * usable_cpus())


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
    backpressure: at most ``max_workers`` of its calls are in the pool at a time, not counting those that lent their
    place while they wait for work done elsewhere (:func:`rllm_gym.slots.slot_lent`: a sandbox run whose result
    waits for its release level); the pool runs a thread more for each such loan (``lending`` counts them, at most
    :data:`LOANS_PER_WORKER` times ``max_workers``), and a call back from its loan gets the next free place before any
    new call.
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
        self._places: _Places | None = None  # the places of one event loop's calls (one asyncio.run)
        self._closed = False
        self._running: set[Future] = set()
        self._lending = 0  # loans of a place not over yet: changed on the event loop's thread only

    @property
    def busy(self) -> int:
        """Calls running in a worker thread now."""
        return len(self._running)

    @property
    def max_workers(self) -> int:
        return self._max_workers

    @property
    def lending(self) -> int:
        """Calls that lent their place (they only wait) and have not taken one back: each beside ``max_workers``."""
        return self._lending

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        return self._submit(fn, args, kwargs, None)

    def _submit(self, fn: Callable[..., Any], args: Any, kwargs: Any, place: _Place | None) -> Future:
        if self._closed:
            raise RuntimeError("cannot run env calls after the engine's thread pool shut down")
        future: Future = Future()
        self._work.put((future, fn, args, kwargs, place))
        try:
            self._idle.get_nowait()  # a worker that is (or is about to be) waiting for work takes this call
        except queue.Empty:
            if self._requested < self._max_workers + self._lending:
                self._request_thread()
        return future

    async def call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in a worker thread, awaited; at most ``max_workers`` such calls are admitted at a
        time (per event loop), the rest wait here rather than in the pool's queue."""
        loop = asyncio.get_running_loop()
        if self._places is None or self._places.loop is not loop:
            self._places = _Places(self, loop, self._max_workers)
        places = self._places
        await places.enter()
        place = _Place(places)
        try:
            return await asyncio.wrap_future(self._submit(fn, args, kwargs, place))
        finally:
            place.end()

    def _request_thread(self) -> None:
        with self._start_lock:
            if self._requested >= self._max_workers + self._lending:
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
            future, fn, args, kwargs, place = item
            result: Any = None
            error: BaseException | None = None
            if future.set_running_or_notify_cancel():
                self._running.add(future)  # a set's add and discard are atomic: no lock for workers to queue on
                set_lender(place)
                try:
                    result = fn(*args, **kwargs)
                except BaseException as caught:  # the caller sees it through the future, as with any executor
                    error = caught
                set_lender(None)
                self._running.discard(future)  # before the caller wakes up: a finished call is never counted as busy
                if error is None:
                    future.set_result(result)
                else:
                    future.set_exception(error)
            del item, future, fn, args, kwargs, place, result, error  # do not hold the finished call's objects
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
        with self._start_lock:
            threads_asked = max(self._max_workers, self._requested)
        for _ in range(threads_asked):  # every thread there is or may yet be gets its end-of-work marker
            self._work.put(None)
        self._starts.put(False)
        if wait:
            for thread in threads:
                thread.join()


class _Places:
    """The ``max_workers`` places of one event loop's :meth:`EnvThreadPool.call` calls. Every change happens on the
    loop's thread (a worker thread posts its loans with ``call_soon_threadsafe``), so no lock is shared with the loop.
    A place that comes free goes to a call back from a loan first, then to the oldest new call."""

    def __init__(self, pool: EnvThreadPool, loop: asyncio.AbstractEventLoop, count: int):
        self.pool, self.loop, self.free = pool, loop, count
        self.new: collections.deque[asyncio.Future[None]] = collections.deque()
        self.back: collections.deque[_Place] = collections.deque()

    async def enter(self) -> None:
        if self.free > 0 and not self.new:
            self.free -= 1
            return
        waiter = self.loop.create_future()
        self.new.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed a place as it was cancelled: pass it on
                self.give()
            raise

    def give(self) -> None:
        while self.back:
            place = self.back.popleft()
            if place.state == "returning":
                place.returned_with_place()
                return
        while self.new:
            waiter = self.new.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1


class _Place:
    """One call's place among its loop's :class:`_Places`: ``held`` by the call, ``lent`` while it only waits,
    ``returning`` while it waits for a place again, ``gone`` once the call's coroutine has ended. The worker thread
    that runs the call lends it and takes it back (:class:`rllm_gym.slots.Lender`); the rest runs on the loop."""

    __slots__ = ("ended", "places", "returned", "state")

    def __init__(self, places: _Places):
        self.places, self.state, self.ended = places, "held", False
        self.returned = threading.Event()

    # In the worker thread

    def lend(self) -> None:
        self.returned.clear()
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits for a place any more
            self.places.loop.call_soon_threadsafe(self._lent)

    def take_back(self) -> None:
        try:
            self.places.loop.call_soon_threadsafe(self._take)
        except RuntimeError:
            return
        while not self.returned.wait(1.0):
            if self.places.loop.is_closed():
                return

    # On the loop's thread

    def _lent(self) -> None:
        if self.state == "held":
            pool = self.places.pool
            if pool._lending >= LOANS_PER_WORKER * pool.max_workers:
                return  # enough waits elsewhere at once: this call keeps its place
            self.state = "lent"
            pool._lending += 1  # before the place goes: the call let in may need a thread more
            self.places.give()

    def _take(self) -> None:
        if self.state != "lent":  # never lent (it had ended), or its coroutine is gone: it needs no place
            self.returned.set()
        elif self.ended:
            self._end_loan("gone")
        elif self.places.free > 0:
            self.places.free -= 1
            self._end_loan("held")
        else:
            self.state = "returning"
            self.places.back.append(self)

    def returned_with_place(self) -> None:
        self._end_loan("held")

    def _end_loan(self, state: str) -> None:
        self.places.pool._lending -= 1
        self.state = state
        self.returned.set()

    def end(self) -> None:
        """The call's coroutine has ended (the call is done, or it was cancelled): its place, if held, is free."""
        self.ended = True
        if self.state == "held":
            self.state = "gone"
            self.places.give()
        elif self.state == "returning":
            self._end_loan("gone")


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
