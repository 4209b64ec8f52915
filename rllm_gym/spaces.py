"""Gymnasium spaces for free text, the observation and action spaces of every rllm-gym environment.

Gymnasium's own :class:`gymnasium.spaces.Text` only admits strings over a finite character set (alphanumerics by
default, no spaces), so an LLM's reply would fall outside it. :class:`TextSpace` admits any unicode string up to a
maximum length, samples printable text, and is registered with Gymnasium's vector utilities (``batch_space``,
``concatenate``, ``create_empty_array``, ``batch_differing_spaces`` and the shared-memory trio) so that
``gym.make_vec`` works in every vectorization mode: a batch of text is a tuple of strings, its space a ``Tuple`` of
TextSpaces, and ``iterate`` over that batched space splits it back into strings.

Shared memory (``AsyncVectorEnv(..., shared_memory=True)``, Gymnasium's default) gives each sub-env a fixed slot of
``max_length`` code points (4 bytes each, plus one for the length), so the buffer of a vector env holds
``num_envs * (max_length + 1) * 4`` bytes. Text longer than ``max_length`` is an error that names the limit, never
silently cut.

Some tools assume numpy observations (PettingZoo's ``api_test`` checks each observation's ``dtype``):
:class:`TextAsArrayWrapper` shows any text-observation AEC env to them as int32 arrays of unicode code points
(:class:`CodePointSpace`, :func:`encode_text`, :func:`decode_text`), losslessly.
"""

from __future__ import annotations

import multiprocessing
import string
from collections.abc import Iterable, Sequence
from copy import deepcopy
from types import ModuleType
from typing import Any

import numpy as np
from gymnasium.spaces import Space, Tuple
from gymnasium.vector.utils import (
    batch_differing_spaces,
    batch_space,
    concatenate,
    create_empty_array,
    create_shared_memory,
    read_from_shared_memory,
    write_to_shared_memory,
)
from pettingzoo import AECEnv
from pettingzoo.utils.wrappers import BaseWrapper

__all__ = ["CodePointSpace", "SharedTextBatch", "TextAsArrayWrapper", "TextSpace", "decode_text", "encode_text"]

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

    ``max_length`` is also the fixed size of the text's slot in a vector env's shared memory (see the module
    docstring): keep it close to the longest text an env really produces.

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


# Vectorization. A batch of text is a tuple of strings, as for Gymnasium's own Text space: ``batch_space`` gives a
# ``Tuple`` of TextSpaces, and ``iterate`` over that batched space is Gymnasium's own. TextSpace itself is left out of
# ``iterate``'s registry on purpose: Gymnasium's Tuple iterate treats a tuple of registered subspaces as a tuple of
# batches, which would split each text into characters.


def _check_text(space: TextSpace, text: Any, where: str) -> str:
    if not isinstance(text, str):
        raise TypeError(f"{where}: a {space!r} holds str, got {type(text).__name__}")
    if len(text) > space.max_length:
        raise ValueError(
            f"{where}: text of {len(text)} characters exceeds the {space!r} limit of {space.max_length}; "
            "text is never cut: make the space's max_length larger or the text shorter"
        )
    return text


@batch_space.register(TextSpace)
def _batch_text_space(space: TextSpace, n: int = 1) -> Tuple:
    # Each copy gets its own seeded generator, so sampling the batch never draws the single space's numbers.
    batched = Tuple(tuple(deepcopy(space) for _ in range(n)), seed=deepcopy(space.np_random))
    batched.seed([int(seed) for seed in deepcopy(space.np_random).integers(0, 10**8, n)])
    return batched


@batch_differing_spaces.register(TextSpace)
def _batch_differing_text_spaces(spaces: Sequence[TextSpace]) -> Tuple:
    # Vector envs whose sub-envs declare different text limits batch into a tuple, like Gymnasium's own Text.
    return Tuple([deepcopy(space) for space in spaces], seed=deepcopy(spaces[0].np_random))


@concatenate.register(TextSpace)
def _concatenate_text(space: TextSpace, items: Iterable[str], out: Any = None) -> tuple[str, ...]:
    return tuple(items)


@create_empty_array.register(TextSpace)
def _create_empty_text_array(space: TextSpace, n: int = 1, fn: Any = np.zeros) -> tuple[str, ...]:
    return tuple(" " * space.min_length for _ in range(n))


class SharedTextBatch(Sequence[str]):
    """A live, read-only view of the texts in a vector env's shared memory; ``copy.deepcopy`` gives a tuple.

    ``AsyncVectorEnv`` reads its shared observation buffer once, at construction, and hands out a deep copy of
    that object after every ``reset``/``step`` (a view of the buffer is what Box spaces get too); so this view
    decodes the current texts whenever it is read, and its deep copy is the plain ``tuple[str, ...]`` that
    ``SyncVectorEnv`` returns.
    """

    def __init__(self, space: TextSpace, shared_memory: Any, n: int):
        self.space, self.n = space, n
        self._slots = np.frombuffer(shared_memory.get_obj(), dtype=np.int32).reshape(n, space.max_length + 1)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(self.n)))
        slot = self._slots[index]
        return slot[1 : 1 + int(slot[0])].tobytes().decode("utf-32-le", errors="surrogatepass")

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[str, ...]:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]  # mutable: it changes with every step

    def __repr__(self) -> str:
        return f"SharedTextBatch({tuple(self)!r})"


@create_shared_memory.register(TextSpace)
def _create_text_shared_memory(space: TextSpace, n: int = 1, ctx: ModuleType = multiprocessing) -> Any:
    # One slot per sub-env: the length, then up to max_length unicode code points.
    return ctx.Array(np.dtype(np.int32).char, n * (space.max_length + 1))


@read_from_shared_memory.register(TextSpace)
def _read_text_from_shared_memory(space: TextSpace, shared_memory: Any, n: int = 1) -> SharedTextBatch:
    return SharedTextBatch(space, shared_memory, n)


@write_to_shared_memory.register(TextSpace)
def _write_text_to_shared_memory(space: TextSpace, index: int, value: str, shared_memory: Any) -> None:
    text = _check_text(space, value, f"write_to_shared_memory (sub-env {index})")
    codes = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.int32)
    slot = np.frombuffer(shared_memory.get_obj(), dtype=np.int32)[index * (space.max_length + 1) :]
    slot[0] = len(codes)
    slot[1 : 1 + len(codes)] = codes


# Text as numbers, for tools that only take numpy observations.

_MAX_CODE_POINT = 0x10FFFF


def encode_text(text: str) -> np.ndarray:
    """``text`` as a 1-d int32 array of its code points followed by one 0, so that ``""`` is ``[0]``, never empty.

    Example::

        >>> encode_text("hé")
        array([104, 233,   0], dtype=int32)
        >>> decode_text(encode_text("hé"))
        'hé'
    """
    codes = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.int32)
    return np.append(codes, np.int32(0))


def decode_text(codes: np.ndarray) -> str:
    """The text :func:`encode_text` encoded (the final 0 dropped)."""
    return np.asarray(codes[:-1], dtype="<i4").tobytes().decode("utf-32-le", errors="surrogatepass")


class CodePointSpace(Space[np.ndarray]):
    """The texts of a :class:`TextSpace` as :func:`encode_text` arrays: int32, 1-d, ending in 0, at most
    ``max_length + 1`` long."""

    def __init__(self, text_space: TextSpace):
        self.text_space = text_space
        super().__init__(dtype=np.int32, seed=deepcopy(text_space.np_random))

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        return (
            isinstance(x, np.ndarray)
            and x.dtype == np.int32
            and x.ndim == 1
            and self.text_space.min_length + 1 <= len(x) <= self.text_space.max_length + 1
            and x[-1] == 0
            and bool(((x >= 0) & (x <= _MAX_CODE_POINT)).all())
        )

    def sample(self, mask: int | None = None, probability: None = None) -> np.ndarray:
        return encode_text(self.text_space.sample(mask, probability))

    def seed(self, seed: int | None = None) -> int | list[int] | dict[str, int]:
        self.text_space.seed(seed)
        return super().seed(seed)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CodePointSpace) and self.text_space == other.text_space

    def __hash__(self) -> int:
        return hash((CodePointSpace, self.text_space))

    def __repr__(self) -> str:
        return f"CodePointSpace({self.text_space!r})"


class TextAsArrayWrapper(BaseWrapper):
    """A PettingZoo AEC env whose :class:`TextSpace` observations are shown as :func:`encode_text` arrays.

    Actions, rewards and infos pass through unchanged; observation spaces that are not text are kept. Example::

        >>> from pettingzoo.test import api_test
        >>> from rllm_gym.envs import solver_judge
        >>> api_test(TextAsArrayWrapper(solver_judge.env()), num_cycles=5)  # doctest: +SKIP
    """

    def __init__(self, env: AECEnv):
        super().__init__(env)
        self._observation_spaces: dict[Any, Space] = {}

    def observation_space(self, agent: Any) -> Space:
        # The same object for every call, as PettingZoo requires (seeding a space must stick).
        if agent not in self._observation_spaces:
            space = self.env.observation_space(agent)
            self._observation_spaces[agent] = CodePointSpace(space) if isinstance(space, TextSpace) else space
        return self._observation_spaces[agent]

    def observe(self, agent: Any) -> Any:
        observation = self.env.observe(agent)
        return encode_text(observation) if isinstance(observation, str) else observation
