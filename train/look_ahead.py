"""The trainer's batches drawn ahead (asynchronous GRPO, ``max_staleness: K >= 1``): :class:`LookAhead` hands the
generation worker (train/async_generation.py) the prompts of the next ``K`` steps as it draws them from TRL's epoch
iterator, so that their episodes are generated while a step trains."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["LookAhead"]


class LookAhead:
    """The trainer's batches, drawn from its epoch iterator ``depth`` steps ahead: each generation batch's prompts go
    to ``submit`` when it is drawn. ``generate_every`` is TRL's batches per generation (the first of each such run
    is the one TRL generates for; its repeats are the same prompts).

    :meth:`batches` gives the iterator the trainer takes a step's batches from; a new epoch iterator (a new epoch, or
    the one a resume fast-forwarded) starts the look-ahead again from it."""

    def __init__(self, depth: int, submit: Callable[[list[Any]], None], generate_every: int = 1):
        self.depth, self.submit, self.generate_every = depth, submit, generate_every
        self._iterator: Iterator[Any] | None = None
        self._drawn: deque[Any] = deque()
        self._count = 0  # batches drawn from the epoch iterator
        self._taken = 0  # batches the trainer took

    def batches(self, epoch_iterator: Iterator[Any]) -> Iterator[Any]:
        if epoch_iterator is not self._iterator:
            self._iterator, self._count, self._taken = epoch_iterator, 0, 0
            self._drawn.clear()
        return self._next_batches()

    def _next_batches(self) -> Iterator[Any]:
        while True:
            # Drawn ahead only as a step starts (its first batch of ``generate_every``), when the weights it trains
            # are the newest published: then the step ``depth`` ahead is pinned to weights exactly ``depth``
            # versions older than the ones that train it. Drawing again at each of a step's other batches handed
            # over a step one further ahead, whose rows were all too old to train (dropped) with gradient
            # accumulation.
            if self._taken % self.generate_every == 0:
                self._fill()
            if not self._drawn:
                return
            self._taken += 1
            yield self._drawn.popleft()

    def _fill(self) -> None:
        assert self._iterator is not None
        while len(self._drawn) < (self.depth + 1) * self.generate_every:
            try:
                batch = next(self._iterator)
            except StopIteration:
                return
            if self._count % self.generate_every == 0:
                self.submit([example["prompt"] for example in batch])
            self._count += 1
            self._drawn.append(batch)
