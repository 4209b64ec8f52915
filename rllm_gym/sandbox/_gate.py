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

One gate per process (:data:`GATE`), shared by every :class:`~rllm_gym.sandbox.Sandbox` of the process; runs of two
processes are not ordered by it. A forked child starts with a gate of its own.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import itertools
import math
import os
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


class RunGate:
    """Admits runs by class in fair phases and releases verdict runs on the grid (see the module's docstring).

    ``enabled=False`` (for measuring what the gate costs and closes, never for training) admits every run at once
    and releases it when it ends.
    """

    def __init__(self, grid_s: float = GRID_S, enabled: bool = True):
        self.grid_s, self.enabled = grid_s, enabled
        self._lock = threading.Lock()
        self._waiting: collections.deque[Ticket] = collections.deque()
        self._phase: str | None = None
        self._members = 0
        self._seq = itertools.count()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_ids = itertools.count()
        self._wake = threading.Condition(self._lock)
        self._timer_thread: threading.Thread | None = None
        self.history: collections.deque[dict[str, Any]] = collections.deque(maxlen=HISTORY)

    # Admission

    def enter(self, ticket: Ticket) -> None:
        """Admit ``ticket`` now (its ``start`` runs in this thread) or queue it until its phase."""
        with self._lock:
            admitted = self._may_join(ticket.run_class)
            if admitted:
                self._admit(ticket)
            else:
                self._waiting.append(ticket)
        if admitted:
            ticket.start()

    def _may_join(self, run_class: str) -> bool:
        if not self.enabled or self._members == 0:
            return True
        return run_class == self._phase and run_class != "exclusive" and not self._waiting

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
                starting = self._next_phase() if self._members == 0 else []
            for waiting in starting:
                waiting.start()

    def _next_phase(self) -> list[Ticket]:
        """Every waiting ticket of the class at the head of the queue (only the head, when it is exclusive)."""
        if not self._waiting:
            self._phase = None
            return []
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
            if self._timer_thread is None:
                self._timer_thread = threading.Thread(target=self._run_timers, name="sandbox-gate", daemon=True)
                self._timer_thread.start()
            self._wake.notify()

    def _run_timers(self) -> None:
        while True:
            with self._lock:
                while not self._timers or self._timers[0][0] > time.monotonic():
                    self._wake.wait(None if not self._timers else self._timers[0][0] - time.monotonic())
                _, _, function = heapq.heappop(self._timers)
            with contextlib.suppress(Exception):  # one timer's failure must not stop the others
                function()


GATE = RunGate()


def _reset_after_fork() -> None:
    global GATE
    GATE = RunGate(GATE.grid_s, GATE.enabled)


os.register_at_fork(after_in_child=_reset_after_fork)
