"""Gymnasium spaces for free text, the observation and action spaces of every rllm-gym environment.

Gymnasium's own :class:`gymnasium.spaces.Text` only admits strings over a finite character set (alphanumerics by
default, no spaces), so an LLM's reply would fall outside it. :class:`TextSpace` admits any unicode string up to a
maximum length, samples printable text, and is registered with Gymnasium's vector utilities so that vector envs
batch text observations as tuples of strings.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from copy import deepcopy
from typing import Any

import numpy as np
from gymnasium.spaces import Space, Tuple
from gymnasium.vector.utils import batch_differing_spaces

__all__ = ["TextSpace"]

_PRINTABLE = np.array(list(string.ascii_letters + string.digits + string.punctuation + " \n"))


class TextSpace(Space[str]):
    """Any unicode string whose length lies in ``[min_length, max_length]``.

    Example::

        >>> space = TextSpace(max_length=16)
        >>> space.contains("Action: Left ✓")
        True
        >>> space.contains("x" * 17), space.contains(b"bytes")
        (False, False)
        >>> len(space.sample(mask=5))
        5

    ``sample()`` draws printable ASCII (letters, digits, punctuation, space, newline) of a random length up to
    ``min(max_length, sample_max_length)``, so sampling a space of a million characters stays cheap; ``mask`` may
    be an int that fixes the sampled length.
    """

    def __init__(
        self,
        max_length: int = 100_000,
        *,
        min_length: int = 0,
        sample_max_length: int = 64,
        seed: int | np.random.Generator | None = None,
    ):
        for name, value in (("max_length", max_length), ("min_length", min_length)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"TextSpace {name} must be a non-negative int, got {value!r}")
        if min_length > max_length:
            raise ValueError(f"TextSpace min_length ({min_length}) must not exceed max_length ({max_length})")
        if (
            not isinstance(sample_max_length, int)
            or isinstance(sample_max_length, bool)
            or sample_max_length < min_length
        ):
            raise ValueError(
                f"TextSpace sample_max_length must be an int >= min_length ({min_length}), got {sample_max_length!r}"
            )
        self.max_length = max_length
        self.min_length = min_length
        self.sample_max_length = sample_max_length
        super().__init__(dtype=str, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: int | None = None, probability: None = None) -> str:
        if probability is not None:
            raise ValueError("TextSpace.sample does not take `probability`; pass `mask=<length>` to fix the length")
        if mask is None:
            high = min(self.max_length, max(self.sample_max_length, self.min_length))
            length = int(self.np_random.integers(self.min_length, high + 1))
        elif self.min_length <= mask <= self.max_length:
            length = int(mask)
        else:
            raise ValueError(f"TextSpace.sample mask (a length) must lie in [{self.min_length}, {self.max_length}]")
        return "".join(self.np_random.choice(_PRINTABLE, size=length))

    def to_jsonable(self, sample_n: Sequence[str]) -> list[str]:
        return list(sample_n)

    def from_jsonable(self, sample_n: Sequence[str]) -> list[str]:
        return list(sample_n)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TextSpace)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )

    def __hash__(self) -> int:
        return hash((TextSpace, self.min_length, self.max_length))

    def __repr__(self) -> str:
        return f"TextSpace(min_length={self.min_length}, max_length={self.max_length})"


@batch_differing_spaces.register(TextSpace)
def _batch_differing_text_spaces(spaces: Sequence[TextSpace]) -> Tuple:
    # Vector envs whose sub-envs declare different text limits batch into a tuple, like Gymnasium's own Text.
    return Tuple([deepcopy(space) for space in spaces], seed=deepcopy(spaces[0].np_random))
