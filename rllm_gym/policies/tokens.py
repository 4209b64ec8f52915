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

A policy's :class:`RenderCache` also renders that text from a short chat: the system message, the message before the
reply, the marker and the messages after it, instead of the whole chat, whose rendering grows with every turn. It
does so only for a template that writes the same text after a reply either way on a set of probe chats (with and
without a system message, earlier turns, tool results before and after the reply), checked once per template and tool
list, and only when no assistant message follows the reply; any other template, a chat with such a message, and a
short chat the template refuses, take the whole chat as above. Probes show only the chats they hold: a template that
looks back past the short chat in a way none of them shows would continue with the short chat's text, still exactly
the ids the model was given (training stays token-exact), but not the whole chat's rendering.
"""

from __future__ import annotations

import json
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
    cache: RenderCache | None = None,
) -> list[int] | None:
    """The prompt ids of the call after ``previous``: its prompt ids + its completion ids + the template's tokens
    after that reply, or ``None`` when ``messages`` does not continue ``previous``'s chat (the agent dropped or
    changed earlier messages, e.g. ``max_history_turns``) or ``previous`` has no ids to continue. With a ``cache``
    whose template passed its probes, that text comes from a short chat (module docstring), with the same ids.

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
    after = None
    # The short chat is shorter only from the third message before the reply on (system, message, reply). An
    # assistant message after the reply (one the client wrote) is rendered by rules that may look back past the short
    # chat (Qwen3 shows reasoning only after the last user query): such a chat is rendered whole.
    if (
        cache is not None
        and len(chat) > 3
        and all(message.get("role") != "assistant" for message in messages[len(chat) :])
        and cache.renders_after_reply_locally(tokenizer, tools, template_kwargs)
    ):
        after = _text_after_short_chat(tokenizer, marked, len(chat) - 1, tools, template_kwargs)
    if after is None:
        after = _text_after_reply(tokenizer, marked, tools, template_kwargs)
    if after is None:
        return None  # a template that drops or repeats the reply: nothing to continue from
    completion = list(previous.response_ids)
    if completion and completion[-1] in tokenizer.all_special_ids:  # a short list: no set built per call
        sampled_end = tokenizer.decode(completion[-1:], skip_special_tokens=False)
        if sampled_end and after.startswith(sampled_end):
            after = after[len(sampled_end) :]
    suffix = encode_text(tokenizer, after) if after else []
    return [*previous.prompt_ids, *completion, *suffix]


def _text_after_reply(
    tokenizer: Any, marked: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None, template_kwargs: dict
) -> str | None:
    """What the template writes after the marker in ``marked``; ``None`` when it writes the marker other than once."""
    text = render_chat_text(tokenizer, marked, tools, template_kwargs)
    if text.count(_MARK) != 1:
        return None
    return text[text.index(_MARK) + len(_MARK) :]


def _short_chat(marked: Sequence[dict[str, Any]], reply_at: int) -> list[dict[str, Any]]:
    """The messages of ``marked`` a template needs to write what follows the reply at ``reply_at``: the system
    message, the message before the reply (a template that wants turns to alternate sees them alternate), the reply
    and every message after it."""
    head = [marked[0]] if reply_at >= 2 and marked[0].get("role") == "system" else []
    return [*head, *marked[max(reply_at - 1, 0) :]]


def _text_after_short_chat(
    tokenizer: Any,
    marked: Sequence[dict[str, Any]],
    reply_at: int,
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict,
) -> str | None:
    """:func:`_text_after_reply` of the short chat; ``None`` when the template refuses it (the whole chat decides)."""
    try:
        return _text_after_reply(tokenizer, _short_chat(marked, reply_at), tools, template_kwargs)
    except Exception:  # a template's own raise_exception, or a check the short chat fails: the whole chat decides
        return None


# Probe chats for a template's text after a reply: (messages before the reply, messages after it).
_SYSTEM = {"role": "system", "content": "Rules: be brief."}
_PROBES: tuple[tuple[tuple[dict[str, str], ...], tuple[dict[str, str], ...]], ...] = (
    (({"role": "user", "content": "start"},), ({"role": "user", "content": "next?"},)),
    (
        (
            _SYSTEM,
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "A"},
            {"role": "user", "content": "two"},
        ),
        ({"role": "user", "content": "three\n"},),
    ),
    (
        (_SYSTEM, {"role": "user", "content": "call"}),
        ({"role": "tool", "content": "4"}, {"role": "tool", "content": "5"}),
    ),
    (
        ({"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}),
        ({"role": "tool", "content": "7"}, {"role": "user", "content": "u3"}, {"role": "user", "content": "u4"}),
    ),
    (  # a tool result before the short chat: a template whose state carries over (DeepSeek-R1 opens its outputs
        # block at the chat's first tool result only) writes the later ones differently without it
        (
            _SYSTEM,
            {"role": "user", "content": "call"},
            {"role": "assistant", "content": "A"},
            {"role": "tool", "content": "1"},
            {"role": "user", "content": "again"},
        ),
        ({"role": "tool", "content": "2"}, {"role": "user", "content": "u3"}),
    ),
)


def _renders_after_reply_locally(tokenizer: Any, tools: list[dict[str, Any]] | None, template_kwargs: dict) -> bool:
    """Whether the template writes the same text after the reply from the short chat as from the whole chat on every
    probe chat it accepts (at least one)."""
    agreed = 0
    for before, after in _PROBES:
        marked = [*before, {"role": "assistant", "content": _MARK}, *after]
        try:
            expected = _text_after_reply(tokenizer, marked, tools, template_kwargs)
        except Exception:  # a chat this template refuses tells nothing about it
            continue
        if expected is None:
            continue
        if _text_after_short_chat(tokenizer, marked, len(before), tools, template_kwargs) != expected:
            return False
        agreed += 1
    return agreed > 0


class RenderCache:
    """The ids of the whole chats one policy rendered lately, so that the same chat is rendered once: a GRPO step
    asks for every prompt of a group G times (the first call of G episodes of one task).

    Only chats whose messages hold nothing but strings (and ``None``) and no tools are kept, keyed by their items:
    equal keys are equal chats, so the template would render the same text. The policy's tokenizer and template
    arguments are fixed, so they are not part of the key. At most ``size`` chats; the oldest go first. It also keeps
    whether the template may continue a chat from its short form (:meth:`renders_after_reply_locally`).
    """

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._ids: dict[tuple[tuple[tuple[str, str | None], ...], ...], list[int]] = {}
        self._local: dict[tuple[str | None, str | None], bool] = {}  # (template, tools) -> its probes' verdict
        self._lock = threading.Lock()  # a policy may render from several threads

    def renders_after_reply_locally(
        self, tokenizer: Any, tools: list[dict[str, Any]] | None, template_kwargs: dict[str, Any]
    ) -> bool:
        """Whether the chat template (with ``tools``) writes the same text after a reply when given only the short
        chat (module docstring) as when given the whole chat, on every probe chat it accepts; decided once per
        template and tool list."""
        template = tokenizer.chat_template  # a string, or a dict of named templates
        template_key = template if isinstance(template, str) or template is None else _json_key(template)
        key = (template_key, None if tools is None else _json_key(tools))
        local = self._local.get(key)  # a single dict read: no lock needed to read, only to change
        if local is None:
            local = _renders_after_reply_locally(tokenizer, tools, template_kwargs)
            with self._lock:
                while len(self._local) >= self.size:
                    del self._local[next(iter(self._local))]
                self._local[key] = local
        return local

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


def _json_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=repr)


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
        ids = continuation_ids(tokenizer, previous, messages, tools, template_kwargs, cache)
        if ids is not None:
            return ids
    if cache is not None:
        return cache.ids(tokenizer, messages, tools, template_kwargs)
    return render_prompt_ids(tokenizer, messages, tools, template_kwargs)
