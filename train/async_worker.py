"""The body of a generation worker process (``max_staleness: K >= 1``, train/async_generation.py's CPU worker and
train/async_vllm.py's): :func:`run_worker` starts its backend and :func:`serve` answers the trainer's requests,
several steps' rollouts at once, each in a :class:`Lane` of its own, so that one step's env latency (sandboxed tests,
tools) no longer holds back the next step's episodes.

Why: a worker that ran one step's episodes at a time stepped no faster than one step's generation plus its slowest
env calls. On Code-v0 (``benchmarks/bench_async.py``, every reply run by the sandbox, K = 2) that was ~0.6 s a step,
~0.2 s generating and ~0.4 s waiting on sandbox runs, never idle, while the trainer waited for it at every step.

How: a lane is a thread with its own copy of the worker's :class:`~rllm_gym.train.rollout.EpisodeRollout` (its own
asyncio loop, env thread pool and engines) and its own generation backend on the trainer's shared weights
(:meth:`~rllm_gym.train.async_generation.WorkerGeneration.another`). The lanes' LLM batches take turns on the cores
(:class:`Turns`: one batch at a time, the oldest step's first and kept by it for a moment after each of its
batches, each batch sampled by the version of the weights its step was pinned to), while each lane's env calls run
in its own pool. A request ``(ticket, prompts, version)`` goes to an idle lane, or to a new one while fewer than
``rollouts`` exist; a lane numbers its call ``first_call + ticket``, so episode ids and reset seeds are those a
one-step-at-a-time worker gives, also after a restart (which submits the steps in flight again with their tickets
and versions). Answers go out in ticket order; a failure goes out at once, and the worker stops.

Why threads rather than several steps on one event loop: a rollout call owns its loop's run (``collect`` is
synchronous: its engines and its batching policy's "every episode in flight has asked" rule are per call), so one
loop would need an asynchronous ``collect`` and a policy that batches across calls; a lane reuses the rollout as it
is, and each step's LLM batches stay as large as its own episodes.
"""

from __future__ import annotations

import copy
import heapq
import os
import queue
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from rllm_gym.train.rollout import EpisodeRollout, RolloutBatch

if TYPE_CHECKING:
    from rllm_gym.train.async_generation import WorkerGeneration, WorkerLink

__all__ = ["Lane", "Turns", "run_worker", "sandbox_runs", "serve"]

# An answer to the trainer: (ticket, batch, None), (ticket, None, why it failed).
Answer = tuple[int, RolloutBatch | None, str | None]


RUN_MEMORY_BYTES = 512 * 2**20  # a sandbox run's default memory limit (SandboxLimits.memory_mb)


def sandbox_runs(env_calls: int, memory_bytes: int | None) -> int:
    """The worker's sandbox runs at once: ``env_calls``, but no more than fit in half the machine's memory at a run's
    default limit (each may hold 512 MB: a policy that writes code filling it in every run must not exhaust the
    host), and never fewer than the sandbox's own default (:class:`~rllm_gym.sandbox.Sandbox`'s ``max_parallel``)."""
    floor = max(4, 2 * (os.cpu_count() or 1))
    if memory_bytes is None:  # unknown: the sandbox's default
        return min(env_calls, floor)
    return max(min(floor, env_calls), min(env_calls, memory_bytes // (2 * RUN_MEMORY_BYTES)))


def _memory_bytes() -> int | None:
    """This machine's physical memory, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def run_worker(link: WorkerLink, start: Callable[[], WorkerGeneration]) -> None:
    """The body of every worker process: its generation backend from ``start()`` (a failure answered ``(None, None,
    traceback)``), then :func:`serve` the requests, then stop at once (see below)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; close() stops this process
    settings = link.settings
    torch.set_num_threads(settings.threads)
    # A spawned process starts from torch's fixed default seed: the run's seed and the rank make each run's samples
    # its own (seeds 0, 1, 2 sampled the same stream before) and each rank's different.
    torch.manual_seed(settings.run_seed * 1_000_003 + settings.process_index)
    # This process's own env concurrency (its env pool, its sandbox), unless the user set them (see WorkerSettings).
    if link.rollout.env_workers is None:
        link.rollout.env_workers = settings.env_calls
    os.environ.setdefault("RLLM_GYM_SANDBOX_MAX_PARALLEL", str(sandbox_runs(settings.env_calls, _memory_bytes())))
    # The answers go out from a thread of their own (a large batch fills the pipe until the trainer reads it), so
    # that the next step's generation starts at once.
    outbox: queue.Queue[Any] = queue.Queue()
    sender = threading.Thread(target=_send, args=(outbox, link.results), name="rllm-gym-generator-send", daemon=True)
    sender.start()
    try:
        generation = start()
    except Exception:
        outbox.put((None, None, traceback.format_exc()))
    else:  # each lane closes its own rollout's loop and env pool
        serve(link.rollout, generation, link.requests, outbox.put, parent=link.parent, first_call=link.first_call,
              rollouts=settings.rollouts, busy=link.busy)  # fmt: skip
    # A clean stop ends here once the answers are sent: the interpreter's own teardown (native, after torch and
    # the tokenizers, or vLLM's) took 10-15 s on a loaded 2-core machine, which close() would otherwise wait out.
    outbox.put(None)
    sender.join()
    os._exit(0)


def _send(outbox: queue.Queue[Any], results: Any) -> None:
    """Send each answer of ``outbox`` through the ``results`` pipe until ``None`` (or a trainer that is gone)."""
    while (answer := outbox.get()) is not None:
        try:
            results.send(answer)
        except OSError:
            return


class Turns:
    """Turns on the cores for the LLM batches of several lanes: one batch at a time, and among those waiting the
    one with the lowest ``priority`` (its call number: the oldest step, which the trainer needs first) goes next.

    After a batch its call keeps the turn for ``hold_s`` against younger calls, or until :meth:`done`: a multi-turn
    step's episodes ask again as soon as their envs answer, and handing each gap to the next step would make the two
    alternate batch by batch, so that the step the trainer waits for ends later (the main job stepped 5-35% slower).
    A younger step's batch goes where the older one's episodes wait on their envs for longer (Code-v0's sandbox runs).
    """

    def __init__(self, hold_s: float = 0.1) -> None:
        self.hold_s = hold_s
        self._condition = threading.Condition()
        self._waiting: list[int] = []  # a heap of the priorities waiting for a turn
        self._taken = False
        self._held: tuple[int, float] | None = None  # the call that had the last turn, and until when it keeps it

    @property
    def waiting(self) -> int:
        """How many batches wait for a turn."""
        with self._condition:
            return len(self._waiting)

    def _wait_s(self, priority: int) -> float | None:
        """0 where ``priority`` may take the turn now, else how long to wait at most (None: until notified)."""
        if self._taken or self._waiting[0] != priority:
            return None
        if self._held is None or priority <= self._held[0]:
            return 0.0
        return max(0.0, self._held[1] - time.monotonic())

    @contextmanager
    def turn(self, priority: int) -> Iterator[None]:
        with self._condition:
            heapq.heappush(self._waiting, priority)
            while (wait_s := self._wait_s(priority)) != 0.0:
                self._condition.wait(wait_s)
            heapq.heappop(self._waiting)
            self._taken = True
        try:
            yield
        finally:
            with self._condition:
                self._taken = False
                self._held = (priority, time.monotonic() + self.hold_s)
                self._condition.notify_all()

    def done(self, priority: int) -> None:
        """The call ``priority`` asks for no more turns: it no longer keeps one."""
        with self._condition:
            if self._held is not None and self._held[0] == priority:
                self._held = None
                self._condition.notify_all()


class Lane:
    """A thread that runs one step's rollout at a time (requests given to :meth:`put`) with its own ``rollout`` and
    ``generation``; each answer goes to ``done`` as ``(lane, ticket, batch, error)``; :meth:`stop` stops it (its
    rollout's loop and env pool closed by its own thread). An ``inline`` lane has no thread: :meth:`put` runs the
    rollout in the caller's thread, for a backend that runs one step at a time (vLLM's engine, started in the worker's
    main thread, hangs when driven from another)."""

    def __init__(
        self,
        rollout: EpisodeRollout,
        generation: WorkerGeneration,
        first_call: int,
        done: queue.Queue,
        *,
        inline: bool = False,
    ):
        self.rollout, self.generation, self.first_call, self._done = rollout, generation, first_call, done
        self.inbox: queue.Queue[tuple[int, list[Any], int] | None] = queue.Queue()
        # torch's thread count is each thread's own (OpenMP's): a lane generates with the worker's, not the default of
        # every core (which took the trainer's core).
        self.threads = torch.get_num_threads()
        self.thread: threading.Thread | None = None
        if not inline:
            self.thread = threading.Thread(target=self._run, name="rllm-gym-generator-lane", daemon=True)
            self.thread.start()

    def put(self, request: tuple[int, list[Any], int]) -> None:
        """Run ``request`` (ticket, prompts, version): in the lane's thread, or here for an inline lane."""
        if self.thread is None:
            self._done.put((self, *self._collect(*request)))
        else:
            self.inbox.put(request)

    def stop(self) -> None:
        if self.thread is None:
            self.rollout.close()
        else:
            self.inbox.put(None)

    def _run(self) -> None:
        torch.set_num_threads(self.threads)
        try:
            while (request := self.inbox.get()) is not None:
                self._done.put((self, *self._collect(*request)))
        finally:
            self.rollout.close()

    def _collect(self, ticket: int, prompts: list[Any], version: int) -> Answer:
        call = self.first_call + ticket
        self.rollout.calls = call  # episode ids and reset seeds number the call
        self.generation.begin_call(call, version)
        try:
            batch = self.rollout.collect(prompts, self.generation)
        except Exception:
            return ticket, None, traceback.format_exc()
        finally:
            self.generation.end_call(call)
        failure = self.generation.failure()  # infrastructure, not the episodes' fault: never trained on
        return (ticket, None, failure) if failure else (ticket, batch, None)


def serve(
    rollout: EpisodeRollout,
    generation: WorkerGeneration,
    requests: Any,
    answer: Callable[[Answer], None],
    *,
    parent: int,
    first_call: int,
    rollouts: int,
    busy: Any = None,
) -> None:
    """Answer each request ``(ticket, prompts, version)`` of ``requests`` through ``answer`` in ticket order, up to
    ``rollouts`` of them running at once (fewer where ``generation.another()`` gives no second backend); return after
    a failed one (answered at once), at ``None``, or once the trainer (process ``parent``) is gone. ``busy`` (a shared
    int, where given) counts the requests running now: the trainer takes the worker's cores while it is 0."""
    events: queue.Queue[tuple[Any, ...]] = queue.Queue()
    reader = threading.Thread(target=_read, args=(requests, parent, events), name="rllm-gym-generator-requests",
                              daemon=True)  # fmt: skip
    reader.start()
    template = copy.deepcopy(rollout)  # the settings each further lane copies (a rollout's loop and pool stay its own)
    inline = rollouts == 1 or not generation.concurrent  # one step at a time: in this thread, as the backend started
    lanes = [Lane(rollout, generation, first_call, events, inline=inline)]
    idle = [lanes[0]]
    _count(busy, 0)  # started: the trainer had every core but the worker's while it did
    waiting: deque[tuple[int, list[Any], int]] = deque()  # requests no lane was free for yet
    unanswered: deque[int] = deque()  # tickets received, in order
    finished: dict[int, RolloutBatch] = {}
    try:
        while (event := events.get())[0] != "stop":
            if event[0] == "request":
                _, ticket, prompts, version = event
                unanswered.append(ticket)
                waiting.append((ticket, prompts, version))
            else:
                lane, ticket, batch, error = event
                idle.append(lane)
                _count(busy, len(lanes) - len(idle))
                if error is not None:
                    answer((ticket, None, error))
                    return
                finished[ticket] = batch
                while unanswered and unanswered[0] in finished:
                    done = unanswered.popleft()
                    answer((done, finished.pop(done), None))
            while waiting:
                if not idle:
                    another = generation.another() if len(lanes) < rollouts else None
                    if another is None:
                        break
                    lanes.append(Lane(copy.deepcopy(template), another, first_call, events))
                    idle.append(lanes[-1])
                lane = idle.pop()
                _count(busy, len(lanes) - len(idle))
                lane.put(waiting.popleft())
    finally:
        _count(busy, 0)
        for lane in lanes:
            lane.stop()
        for lane in idle:  # a busy lane may wait on a hung env call: the worker's exit ends it
            if lane.thread is not None:
                lane.thread.join(5.0)


def _count(busy: Any, running: int) -> None:
    if busy is not None:
        busy.value = running


def _read(requests: Any, parent: int, events: queue.Queue) -> None:
    """Each request of ``requests`` put in ``events``, then ``("stop",)`` at ``None``, a closed queue, or once the
    trainer (process ``parent``) is gone."""
    while True:
        try:
            request = requests.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:
                break
            continue
        except (EOFError, OSError, ValueError):
            break
        if request is None:
            break
        events.put(("request", *request))
    events.put(("stop",))
