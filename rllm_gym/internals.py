"""How an adapter names a third party's private internal it uses: :class:`Internal`.

Private names of other projects are used only in adapters (``train/trl_adapter.py`` for TRL, vLLM, torch and
DeepSpeed; :mod:`rllm_gym.policies.transformers_adapter` for transformers), each listed in its adapter's ``INTERNALS``
table with a check that the name is still there and the public path that replaces it when it is not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Internal"]


@dataclass(frozen=True)
class Internal:
    """A private name an adapter uses: where it lives, what it is used for, and what replaces it when it moved
    (``present()`` says whether it is still there)."""

    where: str
    used_for: str
    fallback: str
    present: Callable[[], bool]
