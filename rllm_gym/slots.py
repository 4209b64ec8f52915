"""A worker thread's place, lent while its call waits for work done elsewhere: how a bounded thread pool and the code
it runs agree that a wait costs the pool nothing.

The engine's :class:`~rllm_gym.engine.EnvThreadPool` runs at most ``max_workers`` env calls at a time, so that CPU
work (sandboxed code, grading) stays bounded. A call that submits a sandbox run whose result waits for its release
level (a verdict run, :mod:`rllm_gym.sandbox._gate`) uses no CPU of the pool's until that result comes: the sandbox
bounds the run's own work. Around such a wait the code enters :func:`slot_lent`: the pool admits another call in its
place, and when the wait is over the call takes a place back (before any new call) and goes on. The place changes
hands when the wait starts and when its result comes, moments the caller and the release grid decide; never when the
run ends, which its hidden input decides. Outside a worker that offers it (a plain thread, the loop's default
executor) :func:`slot_lent` does nothing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Protocol

__all__ = ["Lender", "set_lender", "slot_lent"]


class Lender(Protocol):
    """What a pool's worker thread offers the call it runs: ``lend()`` gives the call's place to another call,
    ``take_back()`` waits until the call has a place again."""

    def lend(self) -> None: ...

    def take_back(self) -> None: ...


class _Current(threading.local):
    lender: Lender | None = None


_current = _Current()


def set_lender(lender: Lender | None) -> None:
    """For a pool's worker thread: the call it runs next may lend its place through ``lender`` (None: no call, or one
    that cannot lend)."""
    _current.lender = lender


@contextlib.contextmanager
def slot_lent() -> Iterator[None]:
    """Around a wait that uses no CPU here: the pool running this call (if any) lets another call take its place
    meanwhile; on the way out the call waits for a place again. Nested uses lend nothing more."""
    lender, _current.lender = _current.lender, None
    if lender is None:
        yield
        return
    lender.lend()
    try:
        yield
    finally:
        lender.take_back()
        _current.lender = lender
