"""The JSON of the OpenAI API as :class:`~rllm_gym.policies.OpenAIPolicy` speaks it: request bodies (with vLLM's
token-id extensions when asked), the raw reply text behind a chat message, token ids and logprobs out of a choice, and
a reply's ``usage``. Pure functions, no I/O."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from rllm_gym.policies.base import Messages, SamplingParams

__all__ = ["EXTENSION_FIELDS", "chat_request_body", "logprob_entries", "reply_text", "usage_counts"]

# vLLM's fields for token ids (and the "token_id:N" spelling of logprob tokens): other servers may refuse them.
EXTENSION_FIELDS = ("return_token_ids", "return_tokens_as_token_ids")


def chat_request_body(
    model: str,
    messages: Messages,
    params: SamplingParams,
    *,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
    request_logprobs: bool = False,
    return_token_ids: bool = False,
) -> dict[str, Any]:
    """The JSON body of a ``/chat/completions`` request; optional fields only when set.

    Servers differ in what they accept (``transformers serve`` rejects unknown fields such as ``top_k`` with a 422),
    so nothing beyond the standard fields is sent unless asked for.
    """
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
    }
    if params.stop:
        body["stop"] = list(params.stop)
    if params.seed is not None:
        body["seed"] = params.seed
    if params.top_k is not None:
        body["top_k"] = params.top_k  # a vLLM/SGLang extension
    if tools:
        body["tools"] = tools
    if template_kwargs:
        body["chat_template_kwargs"] = template_kwargs
    if request_logprobs or return_token_ids:
        body["logprobs"] = True
    if return_token_ids:
        # vLLM extensions: token ids of prompt and reply, and logprob entries keyed "token_id:N".
        body["return_token_ids"] = True
        body["return_tokens_as_token_ids"] = True
    return body


def reply_text(message: dict[str, Any]) -> str:
    """The raw completion text behind a chat ``message``: reasoning in ``<think>``, tool calls as Hermes blocks.

    Servers parse a reply into content, ``reasoning_content`` and ``tool_calls``; writing them back in the model's own
    markup lets every backend go through the same :func:`~rllm_gym.policies.base.build_model_output`.
    """
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    text = f"<think>\n{reasoning}\n</think>\n\n" if reasoning else ""
    text += message.get("content") or ""
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            # Unparseable arguments stay a string: the block then stays in the content, like any malformed call.
            with contextlib.suppress(json.JSONDecodeError):
                arguments = json.loads(arguments)
        payload = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
        text += f"\n<tool_call>\n{payload}\n</tool_call>"
    return text


def logprob_entries(choice: dict[str, Any]) -> tuple[list[float], list[int] | None]:
    """Log-probabilities of a choice, and its token ids when they are written as ``token_id:N`` tokens; from a chat
    choice (``logprobs.content``) or a ``/completions`` one (``logprobs.token_logprobs`` and ``logprobs.tokens``)."""
    block = choice.get("logprobs") or {}
    entries = block.get("content")
    if entries:
        logprobs = [float(e["logprob"]) for e in entries]
        tokens = [e.get("token", "") for e in entries]
    elif block.get("token_logprobs"):
        logprobs = [float(lp) if lp is not None else 0.0 for lp in block["token_logprobs"]]
        tokens = list(block.get("tokens") or [])
    else:
        return [], None
    if entries and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        return logprobs, [int(t.removeprefix("token_id:")) for t in tokens]
    return logprobs, None


def usage_counts(data: dict[str, Any]) -> tuple[int | None, int | None]:
    """``(prompt_tokens, completion_tokens)`` of a reply's ``usage``; ``None`` for a count the server did not give (or
    gave as something other than a non-negative integer)."""
    usage = data.get("usage")
    if not isinstance(usage, dict):
        return None, None
    return _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None  # not bool, which is an int too
