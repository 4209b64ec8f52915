"""The one module of the policies that uses transformers' private or semi-private names, each behind a version check.

The prompt path (:mod:`rllm_gym.policies.tokens`) renders and tokenizes a prompt per LLM call on the event loop,
and two steps of transformers' public path are a large share of that cost: ``apply_chat_template`` copies every
message before it renders (a quarter of its cost per call), and ``encode`` wraps the Rust tokenizer's call in argument
checks and a BatchEncoding (a third of its cost). This module takes the shorter way to the same result where the
installed transformers is one whose code was read for it (:data:`SUPPORTED_TRANSFORMERS`) and the name it uses is
still where it was (:data:`INTERNALS`); otherwise each function returns ``None`` and the caller takes transformers'
public path. A name that moved inside the supported range warns once.
``tests/policies/test_transformers_adapter.py`` fails loudly when any of them moved or when the installed
transformers is outside the range.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any

from rllm_gym.internals import Internal

__all__ = ["INTERNALS", "SUPPORTED_TRANSFORMERS", "available", "backend_encode", "render_plain_chat"]

# transformers releases whose apply_chat_template(tokenize=False) on a chat of plain strings is exactly
# render_jinja_template over the tokenizer's template, special tokens and template arguments, and whose fast
# tokenizer's encode(add_special_tokens=False) is its backend's encode when no truncation or padding is left on the
# backend (read in 5.17 and 5.24: apply_chat_template's other steps, turning message objects into dicts and dropping
# None values, change nothing in such a chat).
SUPPORTED_TRANSFORMERS = (">=5.17", "<6")


def _render_jinja_template_present() -> bool:
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError:
        return False
    return callable(render_jinja_template)


def _backend_tokenizer_present() -> bool:
    from transformers import PreTrainedTokenizerFast

    return isinstance(getattr(PreTrainedTokenizerFast, "backend_tokenizer", None), property)


INTERNALS: dict[str, Internal] = {
    "render_jinja_template": Internal(
        "transformers.utils.chat_template_utils.render_jinja_template",
        "rendering a chat of plain strings without apply_chat_template's copy of every message (a quarter of its "
        "cost per call)",
        "tokenizer.apply_chat_template(tokenize=False)",
        _render_jinja_template_present,
    ),
    "backend_tokenizer": Internal(
        "PreTrainedTokenizerFast.backend_tokenizer (tokenizers.Tokenizer.encode)",
        "encoding a prompt fragment straight with the Rust tokenizer (a third of encode's cost per call)",
        "tokenizer.encode(text, add_special_tokens=False)",
        _backend_tokenizer_present,
    ),
}


@functools.cache
def available(name: str) -> bool:
    """Whether the internal ``name`` (:data:`INTERNALS`) may be used: the installed transformers is in
    :data:`SUPPORTED_TRANSFORMERS` and the name is still where it was (else a warning, once)."""
    import transformers
    from packaging.specifiers import SpecifierSet

    internal = INTERNALS[name]
    if transformers.__version__ not in SpecifierSet(",".join(SUPPORTED_TRANSFORMERS)):
        return False  # another release: its public path, unread shortcuts are not taken
    if not internal.present():
        warnings.warn(
            f"transformers {transformers.__version__} no longer has {internal.where}, used for {internal.used_for}; "
            f"falling back to {internal.fallback} (update rllm_gym/policies/transformers_adapter.py)",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    return True


def render_plain_chat(
    tokenizer: Any, messages: Sequence[dict[str, str]], tools: list[dict[str, Any]] | None, template_kwargs: dict
) -> str | None:
    """``apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False, **template_kwargs)``
    for a chat whose keys and values are all strings, rendered by transformers' own Jinja function with the same
    arguments; ``None`` where :func:`available` says no (the caller then calls ``apply_chat_template``)."""
    if not available("render_jinja_template"):
        return None
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[[dict(message) for message in messages]],
        tools=tools,
        documents=None,
        chat_template=tokenizer.get_chat_template(None, tools),
        add_generation_prompt=True,
        **{**tokenizer.special_tokens_map, **template_kwargs},
    )
    return rendered[0]


def backend_encode(tokenizer: Any, text: str) -> list[int] | None:
    """``tokenizer.encode(text, add_special_tokens=False)`` straight from a fast tokenizer's Rust backend, when nothing
    transformers would change is set: no truncation or padding left on the backend (a call with ``truncation=...``
    sets them, the next plain call clears them) and its special-token splitting as the tokenizer's
    ``split_special_tokens``. ``None`` otherwise, for a slow tokenizer, and where :func:`available` says no."""
    if not available("backend_tokenizer"):
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    split = getattr(backend, "encode_special_tokens", None)
    if (
        split is None
        or split != bool(getattr(tokenizer, "split_special_tokens", False))
        or backend.truncation is not None
        or backend.padding is not None
    ):
        return None
    return backend.encode(text, add_special_tokens=False).ids
