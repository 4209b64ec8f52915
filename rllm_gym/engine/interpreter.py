"""Opt-in interpreter settings that keep the engine's event loop responsive with thousands of episodes in flight.

They are process-wide (the garbage collector and the GIL switch interval belong to the interpreter, not to one
engine), so the engine changes them only when asked (``tune_interpreter=True``), and :func:`responsive_loop` restores
exactly what it found: several runs may overlap (the trainer runs one engine per env on one loop), so the settings are
applied by the first run that enters and restored by the last one that leaves, and a setting the caller changed while
the runs went on is the caller's and is left as it is. Objects the caller froze (``gc.freeze``) are never unfrozen:
``gc.unfreeze`` cannot tell them from the engine's, so with anything frozen already the engine does not freeze.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["GC_THRESHOLD", "SWITCH_INTERVAL_S", "responsive_loop"]

logger = logging.getLogger(__name__)

GC_THRESHOLD = 50_000  # generation-0 threshold with tune_interpreter=True (CPython's default is 700)
SWITCH_INTERVAL_S = 0.001  # GIL switch interval with tune_interpreter=True (CPython's default is 5 ms)
_SCAN_EVERY = 8  # while episodes run, one automatic generation-0 collection in this many scans; the others freeze


@dataclass
class _Applied:
    """What the first run that entered found and set; the last one to leave restores from it."""

    runs: int = 0
    threshold: tuple[int, ...] | None = None
    set_threshold: tuple[int, ...] | None = None
    interval: float | None = None
    set_interval: float | None = None
    freezing: bool = False
    young_collections: int = 0


_state = _Applied()
_lock = threading.Lock()


def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop":
        gc.freeze()
    elif info["generation"] == 0:  # an automatic collection: explicit gc.collect() calls (generation 2) still scan
        _state.young_collections += 1
        if _state.young_collections % _SCAN_EVERY:
            # Nearly everything an episode allocates lives until the episode ends (its Steps, chat and info dicts), so
            # scanning it finds no garbage; frozen first, the collection has nothing to scan.
            gc.freeze()


def _enter(gc_threshold: int | None, gc_freeze: bool, switch_interval_s: float | None) -> None:
    with _lock:
        _state.runs += 1
        if _state.runs > 1:  # an overlapping run: the settings are on already, and the first run's record stays
            return
        if gc_threshold is not None:
            found = gc.get_threshold()
            _state.threshold = found
            _state.set_threshold = (max(found[0], gc_threshold), *found[1:])
            gc.set_threshold(*_state.set_threshold)
        if switch_interval_s is not None:
            _state.interval = sys.getswitchinterval()
            _state.set_interval = min(_state.interval, switch_interval_s)
            sys.setswitchinterval(_state.set_interval)
        # With objects frozen already (the caller's, e.g. a server that froze its start-up state before forking),
        # gc.unfreeze at the end would hand the caller's objects back too: leave freezing off instead.
        _state.freezing = gc_freeze and gc.get_freeze_count() == 0
        if gc_freeze and not _state.freezing:
            logger.debug("gc.freeze skipped: %d objects were frozen before the run", gc.get_freeze_count())
        if _state.freezing:
            gc.callbacks.append(_freeze_survivors)
            gc.freeze()


def _leave() -> None:
    global _state
    with _lock:
        _state.runs -= 1
        if _state.runs:
            return
        # A setting that no longer has the value set here was changed by the caller during the run: theirs stays.
        if _state.threshold is not None and gc.get_threshold() == _state.set_threshold:
            gc.set_threshold(*_state.threshold)
        if _state.interval is not None and sys.getswitchinterval() == _state.set_interval:
            sys.setswitchinterval(_state.interval)
        if _state.freezing:
            gc.callbacks.remove(_freeze_survivors)
            gc.unfreeze()  # nothing was frozen when the run began, so all of it is the run's
        _state = _Applied()  # nothing applied: the next run records afresh


@contextlib.contextmanager
def responsive_loop(
    gc_threshold: int | None = GC_THRESHOLD,
    gc_freeze: bool = True,
    switch_interval_s: float | None = SWITCH_INTERVAL_S,
) -> Iterator[None]:
    """Process settings that keep the event loop's pauses short while episodes run; restored exactly afterwards.

    The engine enters it only with ``tune_interpreter=True``. ``gc_threshold``: the generation-0 threshold is raised to
    at least this (fewer collections: every Step allocates objects that live on; the default 700 made collection a
    third of the engine's CPU per LLM call in ``benchmarks/bench_engine.py``). ``gc_freeze``: what is alive when the
    run starts, and what survives each collection during it, moves to the permanent generation (``gc.freeze``), so no
    collection scans it again: a generation-1 or -2 pass over thousands of live envs held the GIL for 100-300 ms and
    the event loop with it. Of the automatic generation-0 collections, only one in ``_SCAN_EVERY`` (8) scans the young
    objects; the others freeze them first (what episodes allocate lives until they end). Cycles that become garbage
    unscanned are collected after the run (``gc.unfreeze``); ``gc.collect()`` scans as usual. Skipped when objects
    are frozen already (see the module docstring). ``switch_interval_s``: ``sys.setswitchinterval`` (at most this),
    how long the loop waits for the GIL while an env thread runs Python (CPython's default is 5 ms).
    """
    _enter(gc_threshold, gc_freeze, switch_interval_s)
    try:
        yield
    finally:
        _leave()
