"""Token in, token out: the prompt ids of an episode's next LLM call, continued from the tokens of its last one.

Re-rendering the whole chat at every call and tokenizing it again conditions the model on tokens it never sampled:
a BPE tokenizer re-spells sampled ``le`` ``ft`` as ``left``, a reply cut by the length limit gets an end-of-turn
token it never produced, and Qwen3-style templates drop the ``<think>`` blocks of earlier turns. The trainer then
either trains on a sequence the model never saw or splits the trajectory into rows. :func:`continuation_ids` builds
the next prompt the other way round: the previous call's prompt ids, its sampled completion ids, then only the
tokens the chat template writes after that reply (the end of the assistant turn, unless the reply already sampled
it, the messages added since, and the generation prompt). Every backend (HFPolicy, VLLMPolicy, OpenAIPolicy on a
server that takes token prompts) gets its prompt ids through :func:`prompt_ids_for`, so this is the one place that
does it.

The template's text after the reply is found by rendering the chat with a marker in place of the reply's content and
taking what follows the marker: what the template writes before the reply (a default system prompt, a tool list,
earlier turns it rewrites) never enters the continuation, and neither do its changes to the reply itself. That text
is tokenized on its own, which assumes a tokenizer that adds nothing in front of a fragment (byte-level BPE as in
Qwen, Llama 3, GPT-style models; a SentencePiece tokenizer with a dummy prefix space would add one there).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Literal

from rllm_gym.policies.transformers_adapter import backend_encode, render_plain_chat
from rllm_gym.types import Step

__all__ = [
    "TOKEN_HISTORY_MODES",
    "RenderCache",
    "TokenHistory",
    "continuation_ids",
    "encode_text",
    "prompt_ids_for",
    "render_chat_text",
    "render_prompt_ids",
]

TokenHistory = Literal["sampled", "template"]
TOKEN_HISTORY_MODES: tuple[str, ...] = ("sampled", "template")

# Stands in for the previous reply's content: letters and digits only, so a template that escapes or trims content
# (tojson, | trim) still writes it as is; a chat that happens to hold it too is rendered whole (see the count check).
_MARK = "rllmgymPreviousReply7f3a9c"
# apply_chat_template's own arguments for tokenizing its text (not template variables): tokenize=True honours them.
_TOKENIZATION_ARGUMENTS = frozenset({"sanitize_control_tokens", "tokenizer_kwargs"})


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """``tokenizer.encode(text, add_special_tokens=False)``, straight from the Rust tokenizer of a fast tokenizer where
    the installed transformers allows it (:func:`~rllm_gym.policies.transformers_adapter.backend_encode`: a third of
    ``encode``'s cost per call on the prompt path, which runs twice per LLM call), else transformers' ``encode``."""
    ids = backend_encode(tokenizer, text)
    return ids if ids is not None else list(tokenizer.encode(text, add_special_tokens=False))


def render_chat_text(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None, template_kwargs: dict
) -> str:
    """``apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False, **template_kwargs)``.

    A chat whose messages hold nothing but strings (the common case: an env's observations and the model's replies)
    skips what transformers does before rendering (a recursive copy of every message, a quarter of its cost per
    call) and is rendered by the same Jinja function with the same arguments
    (:func:`~rllm_gym.policies.transformers_adapter.render_plain_chat`); anything else, and transformers releases
    the adapter does not support, goes through ``apply_chat_template``.
    """
    plain = bool(messages) and all(
        type(key) is str and type(value) is str for message in messages for key, value in message.items()
    )
    if plain and _TOKENIZATION_ARGUMENTS.isdisjoint(template_kwargs):
        text = render_plain_chat(tokenizer, messages, tools, template_kwargs)
        if text is not None:
            return text
    return tokenizer.apply_chat_template(
        list(messages), tools=tools, add_generation_prompt=True, tokenize=False, **template_kwargs
    )


def render_prompt_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
) -> list[int]:
    """Token ids of ``messages`` rendered by the tokenizer's chat template, with the assistant generation prompt.

    The template renders text and ``encode`` (no special tokens added: the template writes them) tokenizes it, which
    is what ``apply_chat_template(tokenize=True)`` does, at a third of its cost per call (transformers 5 builds a
    BatchEncoding around it): a training step renders one prompt per episode on the event loop. Template arguments
    that change how the text is tokenized (``sanitize_control_tokens``, ``tokenizer_kwargs``), and a processing class
    without ``encode``, go the long way.
    """
    if _TOKENIZATION_ARGUMENTS.isdisjoint(template_kwargs) and hasattr(tokenizer, "encode"):
        return encode_text(tokenizer, render_chat_text(tokenizer, messages, tools, template_kwargs))
    ids = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False, **template_kwargs
    )
    return list(ids)


def check_token_history(value: Any, owner: str) -> TokenHistory:
    if value not in TOKEN_HISTORY_MODES:
        raise ValueError(
            f"{owner}(token_history=...) must be 'sampled' (each call continues the tokens the model saw and sampled) "
            f"or 'template' (the chat template re-renders the whole chat each call), got {value!r}"
        )
    return value


def continuation_ids(
    tokenizer: Any,
    previous: Step,
    messages: Sequence[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
) -> list[int] | None:
    """The prompt ids of the call after ``previous``: its prompt ids + its completion ids + the template's tokens
    after that reply, or ``None`` when ``messages`` does not continue ``previous``'s chat (the agent dropped or
    changed earlier messages, e.g. ``max_history_turns``) or ``previous`` has no ids to continue.

    ``previous.chat_completions`` is the chat that call was sent plus its reply (as agents record it); ``messages``
    must start with exactly those messages. The end-of-turn text the template puts after a reply is left out when
    the completion's last token is a special token that spells its start (the model sampled it, e.g.
    ``<|im_end|>``), and kept otherwise (a reply cut by the length limit or a stop string, or an EOS token the
    template does not use).
    """
    chat = previous.chat_completions
    if not chat or not previous.prompt_ids or chat[-1].get("role") != "assistant":
        return None
    if len(messages) < len(chat) or list(messages[: len(chat)]) != chat:
        return None
    # The reply's content is the marker; the template's own spelling of it (tool-call markup, reasoning fields) is
    # dropped with it, as the sampled ids already hold what the model wrote.
    marked = [*messages[: len(chat) - 1], {"role": "assistant", "content": _MARK}, *messages[len(chat) :]]
    text = render_chat_text(tokenizer, marked, tools, template_kwargs)
    if text.count(_MARK) != 1:
        return None  # a template that drops or repeats the reply: nothing to continue from
    after = text[text.index(_MARK) + len(_MARK) :]
    completion = list(previous.response_ids)
    if completion and completion[-1] in tokenizer.all_special_ids:  # a short list: no set built per call
        sampled_end = tokenizer.decode(completion[-1:], skip_special_tokens=False)
        if sampled_end and after.startswith(sampled_end):
            after = after[len(sampled_end) :]
    suffix = encode_text(tokenizer, after) if after else []
    return [*previous.prompt_ids, *completion, *suffix]


class RenderCache:
    """The ids of the whole chats one policy rendered lately, so that the same chat is rendered once: a GRPO step
    asks for every prompt of a group G times (the first call of G episodes of one task).

    Only chats whose messages hold nothing but strings (and ``None``) and no tools are kept, keyed by their items:
    equal keys are equal chats, so the template would render the same text. The policy's tokenizer and template
    arguments are fixed, so they are not part of the key. At most ``size`` chats; the oldest go first.
    """

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._ids: dict[tuple[tuple[tuple[str, str | None], ...], ...], list[int]] = {}
        self._lock = threading.Lock()  # a policy may render from several threads

    def ids(
        self,
        tokenizer: Any,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any],
    ) -> list[int]:
        """:func:`render_prompt_ids` of the chat, from the cache when it holds it (a fresh list either way)."""
        key = None if tools is not None else _chat_key(messages)
        if key is None:
            return render_prompt_ids(tokenizer, messages, tools, template_kwargs)
        with self._lock:
            ids = self._ids.get(key)
        if ids is None:
            ids = render_prompt_ids(tokenizer, messages, tools, template_kwargs)
            with self._lock:
                while len(self._ids) >= self.size:
                    del self._ids[next(iter(self._ids))]
                self._ids[key] = ids
        return list(ids)


def _chat_key(messages: list[dict[str, Any]]) -> tuple[tuple[tuple[str, str | None], ...], ...] | None:
    """The chat as a hashable key, or ``None`` when a message holds anything but strings (lists, numbers, objects
    that a template may print in ways their equality does not tell)."""
    key = []
    for message in messages:
        items = tuple(message.items())
        for name, value in items:
            if type(name) is not str or (value is not None and type(value) is not str):
                return None
        key.append(items)
    return tuple(key)


def prompt_ids_for(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
    previous: Step | None,
    token_history: TokenHistory = "sampled",
    cache: RenderCache | None = None,
) -> list[int]:
    """The prompt ids of a call: continued from ``previous`` (see :func:`continuation_ids`) when ``token_history`` is
    ``"sampled"`` and the chat continues it, else the whole chat rendered by the template (through ``cache`` when
    given)."""
    if previous is not None and token_history == "sampled":
        ids = continuation_ids(tokenizer, previous, messages, tools, template_kwargs)
        if ids is not None:
            return ids
    if cache is not None:
        return cache.ids(tokenizer, messages, tools, template_kwargs)
    return render_prompt_ids(tokenizer, messages, tools, template_kwargs)
