"""The order of sandbox runs in one process: runs whose output may reach the model never share the CPU or the wall
clock with runs that hold hidden inputs.

Every run has a class (``run_class``):

* ``"visible"``: its output may reach the model (Code-v0's public tests, revision feedback, Tool-v0's ``python``
  tool);
* ``"verdict"``: only a verdict comes out of it (hidden tests, ``CodeReward``'s grading, reasoning-gym's scorers);
* ``"exclusive"`` (what a run without a class gets): it may be either, so it runs alone, with no other run beside it,
  and its result is released on the grid below like a verdict's.

:class:`RunGate` admits runs in phases of one class: any number of ``visible`` runs at once, or any number of
``verdict`` runs, or one ``exclusive`` run, never two classes together. So a run that times itself (a visible one)
never runs while a hidden input decides how busy the CPU is. Phases are fair: once a run of another class waits, the
phase in progress takes no new runs, and when it ends every waiting run of the class at the head of the queue starts
together, so a run waits for at most the phase in progress and one phase of the other class.

The wall clock: a later visible run can read the time (``time.time`` is read without a system call, so it cannot be
refused) and print it, so how long a verdict run took must not show. A verdict (or exclusive) run's result, and the
end of its part of the phase, are released at ``admitted + level``, ``level`` the smallest of ``GRID_S * 2**k`` not
below what it took: a run that took 0.03 s or 0.09 s is released at 0.1 s, one of 3 s at 3.2 s. What a verdict run's
duration tells a later run is its level: ``log2(levels)`` bits, where ``levels`` counts the levels up to its timeout
(:func:`bits_per_run`). Visible runs are released when they end.

One gate per process (:data:`GATE`), shared by every :class:`~rllm_gym.sandbox.Sandbox` of the process, and the gates
of one user's processes on one host take their phases in turn through :class:`HostLocks` (``flock`` on three files in
a folder of that user's), so the ranks of a multi-process trainer never run a visible run beside a verdict run either.
A forked child starts with a gate of its own.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import heapq
import itertools
import math
import os
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

RUN_CLASSES = ("visible", "verdict", "exclusive")
GRID_S = 0.1  # the shortest release level of a verdict run; the others double it
HISTORY = 4096  # schedule records a gate keeps


def check_run_class(run_class: Any) -> str:
    """``run_class`` checked: one of :data:`RUN_CLASSES`, None for ``"exclusive"``; otherwise a ValueError."""
    if run_class is None:
        return "exclusive"
    if not isinstance(run_class, str) or run_class not in RUN_CLASSES:
        raise ValueError(
            f"sandbox run_class must be 'visible' (the output may reach the model), 'verdict' (only a verdict comes "
            f"out: hidden tests, scorers) or None (run alone), got {run_class!r}"
        )
    return run_class


def release_level(elapsed_s: float, grid_s: float = GRID_S) -> float:
    """The smallest ``grid_s * 2**k`` (k >= 0) that is at least ``elapsed_s``."""
    if elapsed_s <= grid_s:
        return grid_s
    return grid_s * 2 ** math.ceil(math.log2(elapsed_s / grid_s) - 1e-12)


def bits_per_run(longest_s: float, grid_s: float = GRID_S) -> float:
    """What the release time of one verdict run can tell, at most: log2 of the levels up to ``longest_s``."""
    levels = 1 + max(0, math.ceil(math.log2(max(longest_s, grid_s) / grid_s) - 1e-12))
    return math.log2(levels)


class Ticket:
    """One run's passage through the gate. ``start`` is called (outside the gate's lock) when it is admitted."""

    __slots__ = (
        "admitted_at",
        "admitted_seq",
        "finished_at",
        "label",
        "level_s",
        "released_seq",
        "run_class",
        "start",
    )

    def __init__(self, run_class: str, start: Callable[[], None], label: dict[str, Any] | None = None):
        self.run_class, self.start, self.label = run_class, start, dict(label or {})
        self.admitted_seq: int | None = None
        self.admitted_at: float | None = None
        self.finished_at: float | None = None
        self.level_s: float | None = None
        self.released_seq: int | None = None

    def record(self, released_at: float) -> dict[str, Any]:
        """What the host saw of this run: its class, when it was admitted and released (a sequence number shared by
        every run of the process, and ``time.monotonic()``), when it ended and the release level it waited for."""
        return {
            **self.label,
            "run_class": self.run_class,
            "admitted_seq": self.admitted_seq,
            "released_seq": self.released_seq,
            "admitted_at": self.admitted_at,
            "finished_at": self.finished_at,
            "released_at": released_at,
            "level_s": self.level_s,
        }


class HostLocks:
    """The phases of every gate of one user on one host: ``flock`` on three files of a private folder.

    A process's gate holds ``visible`` shared during a visible phase and ``verdict`` shared during a verdict phase; it
    enters one through ``turnstile`` (exclusive), taking its class's lock shared and then the other class's
    exclusive and back (which waits until no process is in a phase of the other class), so a class that waits holds
    the turnstile and no process starts a phase of the other class meanwhile. An exclusive run holds both locks
    exclusive. Locks die with their process, whatever ends it.
    """

    NAMES = ("turnstile", "visible", "verdict")

    def __init__(self, folder: str | None = None):
        folder = folder or os.path.join(tempfile.gettempdir(), f"rllm-sandbox-gate-{os.getuid()}")
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
            raise OSError(f"{folder} is not a private folder of this user's")
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        self.fds = {name: os.open(os.path.join(folder, name), flags, 0o600) for name in self.NAMES}
        # The turnstile once more, as a description of its own: a probe through it conflicts with this process's own
        # hold of the turnstile too (flock locks belong to an open file description, not to a process).
        self.fds["probe"] = os.open(os.path.join(folder, "turnstile"), flags, 0o600)
        self.held: list[str] = []

    def acquire(self, run_class: str) -> None:
        """Wait until no process of this user is in a phase that excludes ``run_class``, then hold its lock."""
        turnstile, visible, verdict = (self.fds[name] for name in self.NAMES)
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            if run_class == "exclusive":
                fcntl.flock(visible, fcntl.LOCK_EX)
                fcntl.flock(verdict, fcntl.LOCK_EX)
                self.held = ["visible", "verdict"]
                return
            own, other = (visible, verdict) if run_class == "visible" else (verdict, visible)
            fcntl.flock(own, fcntl.LOCK_SH)
            fcntl.flock(other, fcntl.LOCK_EX)
            fcntl.flock(other, fcntl.LOCK_UN)
            self.held = [run_class]
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)

    def release(self) -> None:
        for name in self.held:
            fcntl.flock(self.fds[name], fcntl.LOCK_UN)
        self.held = []

    def contended(self) -> bool:
        """Whether a process waits to start a phase (it holds the turnstile)."""
        try:
            fcntl.flock(self.fds["probe"], fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:  # dropped by the phase thread after a failure: this process goes on by itself
            return False
        fcntl.flock(self.fds["probe"], fcntl.LOCK_UN)
        return False

    def forget(self) -> None:
        """In a forked child: close the inherited descriptors without unlocking what the parent holds."""
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)


class RunGate:
    """Admits runs by class in fair phases and releases verdict runs on the grid (see the module's docstring).

    ``enabled=False`` (for measuring what the gate costs and closes, never for training) admits every run at once
    and releases it when it ends.
    """

    def __init__(self, grid_s: float = GRID_S, enabled: bool = True, host_folder: str | None = None):
        self.grid_s, self.enabled, self.host_folder = grid_s, enabled, host_folder
        self.host: HostLocks | None = None  # opened by the first phase; None where it cannot be (then per process)
        self._host_tried = False
        self._lock = threading.Lock()
        self._phase_wake = threading.Condition(self._lock)
        self._phase_thread: threading.Thread | None = None
        self._waiting: collections.deque[Ticket] = collections.deque()
        self._phase: str | None = None
        self._members = 0
        self._seq = itertools.count()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_ids = itertools.count()
        self._wake = threading.Condition(self._lock)
        self._timer_thread: threading.Thread | None = None
        self.history: collections.deque[dict[str, Any]] = collections.deque(maxlen=HISTORY)

    @property
    def phase(self) -> str | None:
        """The class of the runs in the gate now, None when it is empty."""
        return self._phase

    # Admission

    def enter(self, ticket: Ticket) -> None:
        """Admit ``ticket`` now (its ``start`` runs in this thread) or queue it until its phase."""
        with self._lock:
            admitted = self._may_join(ticket.run_class)
            if admitted:
                self._admit(ticket)
            else:
                self._waiting.append(ticket)
                self._wake_phases()
        if admitted:
            ticket.start()

    def _may_join(self, run_class: str) -> bool:
        """Whether a run may join the phase in progress: its class, nothing waiting here or in another process."""
        if not self.enabled:
            return True
        if self._members == 0 or run_class != self._phase or run_class == "exclusive" or self._waiting:
            return False
        host = self.host  # the phase thread may drop it meanwhile
        return host is None or not host.contended()

    def _admit(self, ticket: Ticket) -> None:
        self._phase = ticket.run_class
        self._members += 1
        ticket.admitted_seq, ticket.admitted_at = next(self._seq), time.monotonic()

    def finish(self, ticket: Ticket, deliver: Callable[[], None]) -> None:
        """The run of ``ticket`` has ended: ``deliver`` its result and leave the gate, at once for a visible run, at
        its release level for the others."""
        ticket.finished_at = time.monotonic()
        elapsed = ticket.finished_at - ticket.admitted_at
        if ticket.run_class == "visible" or not self.enabled:
            self._release(ticket, deliver)
            return
        ticket.level_s = release_level(elapsed, self.grid_s)
        self.call_at(ticket.admitted_at + ticket.level_s, lambda: self._release(ticket, deliver))

    def _release(self, ticket: Ticket, deliver: Callable[[], None]) -> None:
        try:
            deliver()
        finally:
            with self._lock:
                ticket.released_seq = next(self._seq)
                self.history.append(ticket.record(time.monotonic()))
                self._members -= 1
                if self._members == 0:
                    self._phase = None
                    self._wake_phases()

    # Phases: started by a thread of the gate's own, as taking the host's lock can wait for other processes

    def _wake_phases(self) -> None:
        self._phase_thread = _running(self._phase_thread, self._run_phases, "sandbox-phases")
        self._phase_wake.notify()

    def _run_phases(self) -> None:
        while True:
            with self._lock:
                while self._members or not (self._waiting or (self.host is not None and self.host.held)):
                    self._phase_wake.wait()
                head = self._waiting[0].run_class if self._waiting else None
            self._host_step(head)
            if head is None:
                continue
            with self._lock:
                starting = self._next_phase()
            for ticket in starting:
                ticket.start()

    def _host_step(self, head: str | None) -> None:
        """Leave the host's phase this process held; then, for ``head``, wait for the host's turn and take it. Where
        the locks cannot be had (no private folder, a failing ``flock``) the gate orders this process's runs only."""
        try:
            if self.host is not None:
                self.host.release()
            if head is not None and not self._host_tried:
                self._host_tried = True
                self.host = HostLocks(self.host_folder)
            if head is not None and self.host is not None:
                self.host.acquire(head)
        except OSError:
            if self.host is not None:
                self.host.forget()  # closing the descriptors drops whatever they held
            self.host = None

    def _next_phase(self) -> list[Ticket]:
        """Every waiting ticket of the class at the head of the queue (only the head, when it is exclusive)."""
        head = self._waiting[0].run_class
        if head == "exclusive":
            starting = [self._waiting.popleft()]
        else:
            starting = [t for t in self._waiting if t.run_class == head]
            self._waiting = collections.deque(t for t in self._waiting if t.run_class != head)
        for ticket in starting:
            self._admit(ticket)
        return starting

    # Timers (release levels, the host's watchdogs)

    def call_at(self, when: float, function: Callable[[], None]) -> None:
        """Call ``function`` on the gate's timer thread at ``time.monotonic() == when`` (at once if past)."""
        with self._lock:
            heapq.heappush(self._timers, (when, next(self._timer_ids), function))
            self._timer_thread = _running(self._timer_thread, self._run_timers, "sandbox-gate")
            self._wake.notify()

    def _run_timers(self) -> None:
        while True:
            with self._lock:
                while not self._timers or self._timers[0][0] > time.monotonic():
                    self._wake.wait(None if not self._timers else self._timers[0][0] - time.monotonic())
                _, _, function = heapq.heappop(self._timers)
            with contextlib.suppress(Exception):  # one timer's failure must not stop the others
                function()


def _running(thread: threading.Thread | None, target: Callable[[], None], name: str) -> threading.Thread:
    """``thread``, or a daemon thread started now on ``target`` when there is none yet."""
    if thread is None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
    return thread


GATE = RunGate()


def _reset_after_fork() -> None:
    global GATE
    if GATE.host is not None:
        GATE.host.forget()
    GATE = RunGate(GATE.grid_s, GATE.enabled, GATE.host_folder)


os.register_at_fork(after_in_child=_reset_after_fork)
