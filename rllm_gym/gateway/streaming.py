"""Token-by-token streaming of chat replies: content deltas sent while the policy generates, the rest at the end.

A backend that streams (:attr:`~rllm_gym.policies.base.BasePolicy.streams_tokens`: HFPolicy, VLLMPolicy) hands the
gateway each choice's new token ids as they are sampled. :class:`ContentStream` turns them into ``content`` deltas
that are certain to be the start of the reply's final ``content`` (what :func:`~rllm_gym.policies.base.
build_model_output` makes of the whole text): leading whitespace is dropped and trailing whitespace held back (the
content is stripped), a tail that may be the start of ``<think>``, ``</think>``, ``<tool_call>`` or a stop string is
held back, and once one of those appears nothing more is sent as it comes. When the reply is complete, the rest of
the content, the reasoning, the tool calls (each with its index, whole), the finish reason and the usage follow, so
the deltas of a choice add up to the content the gateway recorded. One case cannot be taken back: a reply that
closes a ``</think>`` it never opened after content was sent makes everything before it reasoning; the deltas then
stop short of the recorded content (the Step itself is exact either way).

:func:`stream_reply` runs one streamed call: the SSE response starts at the first delta (a policy that fails before
then gets the usual 502), a failure after it ends the stream with an ``error`` event (which OpenAI clients raise),
and a client that hangs up stops the writes but not the call, which is recorded like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from rllm_gym.gateway.protocol import chat_chunks, error_body
from rllm_gym.policies.base import PolicyError
from rllm_gym.types import ModelOutput

__all__ = ["ContentStream", "EventStream", "opens_reasoning", "send_chunks", "stream_reply"]

_MARKERS = ("<think>", "</think>", "<tool_call>")
# The reply is decoded whole again once its ids have grown by this share of their count since the last decode (every
# token up to 2 x this many): each decode reads every id, so decoding at every token cost a long reply's stream time
# quadratic in its length (~1.1 s of the event loop over a 4,000-token reply on 2 cores), now linear.
DECODE_GROWTH = 64


class ContentStream:
    """The content deltas of one streamed choice: :meth:`feed` takes the choice's next token ids and returns the
    content newly known for certain (maybe ``""``); :attr:`sent` is all it returned. A long reply is decoded again
    only once its ids have grown by a 1/``DECODE_GROWTH`` share, so its deltas come a few tokens at a time.

    ``live=False`` sends nothing until the end (a reply that continues a forced tool-call opening);
    ``in_reasoning=True``: the prompt opened a ``<think>`` block, so the content starts after ``</think>``;
    ``raw=True``: the deltas of the raw completion text (``/completions``: markup kept, nothing stripped), where only
    stop strings are held back.
    """

    def __init__(
        self,
        tokenizer: Any,
        stop: tuple[str, ...] = (),
        *,
        live: bool = True,
        in_reasoning: bool = False,
        raw: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.live = live
        self.in_reasoning = in_reasoning and not raw
        self.raw = raw
        self.sent = ""
        self.ids: list[int] = []
        self._decoded = 0  # len(self.ids) at the last decode
        self._holds = (*(() if raw else _MARKERS), *(s for s in stop if s))

    def feed(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        if not self.live or len(self.ids) - self._decoded < max(1, self._decoded // DECODE_GROWTH):
            return ""
        self._decoded = len(self.ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if self.in_reasoning:
            end = text.find("</think>")
            if end < 0:
                return ""
            text = text[end + len("</think>") :]
        cuts = [i for i in (text.find(hold) for hold in self._holds) if i >= 0]
        if cuts:  # what follows is reasoning, a tool call or past a stop: the end of the reply sorts it out
            text = text[: min(cuts)]
            self.live = False
        else:
            # A character whose bytes are not all sampled yet decodes as U+FFFD: wait for the rest.
            text = _without_partial_hold(text, self._holds).rstrip("\ufffd")
        certain = text if self.raw else text.strip()
        if not certain.startswith(self.sent):  # the decoded text changed under what was sent: send no more
            self.live = False
            return ""
        delta, self.sent = certain[len(self.sent) :], certain
        return delta


def _without_partial_hold(text: str, holds: tuple[str, ...]) -> str:
    """``text`` without its longest tail that is the start of one of ``holds`` (it may become one)."""
    for size in range(min(len(text), max(map(len, holds), default=0)), 0, -1):
        tail = text[-size:]
        if any(hold.startswith(tail) for hold in holds):
            return text[:-size]
    return text


def opens_reasoning(tokenizer: Any, prompt_ids: list[int]) -> bool:
    """Whether the prompt ends inside a ``<think>`` block the chat template opened (the reply starts as reasoning)."""
    tail = tokenizer.decode(prompt_ids[-8:], skip_special_tokens=False).rstrip()
    return tail.endswith("<think>")


class EventStream:
    """A Server-Sent Events response started on its first event; writes to a client that hung up are dropped."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None
        self.gone = False

    async def send(self, event: dict[str, Any] | str) -> None:
        if self.gone:
            return
        data = event if isinstance(event, str) else json.dumps(event)
        try:
            if self.response is None:
                headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
                self.response = web.StreamResponse(headers=headers)
                await self.response.prepare(self.request)
            await self.response.write(f"data: {data}\n\n".encode())
        except ConnectionResetError:  # the client went away: its loss; the call still ends and is recorded
            self.gone = True

    async def end(self) -> web.StreamResponse:
        await self.send("[DONE]")
        assert self.response is not None
        if not self.gone:
            with contextlib.suppress(ConnectionResetError):
                await self.response.write_eof()
        return self.response


async def send_chunks(request: web.Request, chunks: list[dict[str, Any]]) -> web.StreamResponse:
    """A finished reply's chunks as Server-Sent Events, at once (a policy without token streaming)."""
    events = EventStream(request)
    for chunk in chunks:
        await events.send(chunk)
    return await events.end()


async def stream_reply(
    request: web.Request,
    generate: Callable[[list[Callable[[list[int]], None]]], Awaitable[list[ModelOutput]]],
    finish: Callable[[list[ModelOutput]], dict[str, Any]],
    streams: list[ContentStream],
    *,
    model: str,
    include_usage: bool,
    text: bool = False,
) -> web.StreamResponse:
    """Answer a call with ``stream: true`` token by token.

    ``generate(on_tokens)`` runs the call (one callback per choice); ``finish(outputs)`` records it and returns its
    ``chat.completion`` response, whose rest follows the deltas (:func:`~rllm_gym.gateway.protocol.chat_chunks`), or
    with ``text=True`` its ``text_completion`` response (``/completions``: ``text`` deltas, no roles).
    """
    queue: asyncio.Queue[tuple[int, list[int]] | None] = asyncio.Queue()

    def on_token(index: int) -> Callable[[list[int]], None]:
        return lambda ids: queue.put_nowait((index, ids))

    async def produce() -> list[ModelOutput]:
        try:
            return await generate([on_token(i) for i in range(len(streams))])
        finally:
            queue.put_nowait(None)

    task = asyncio.ensure_future(produce())
    kind = ("cmpl", "text_completion") if text else ("chatcmpl", "chat.completion.chunk")
    base = {"id": f"{kind[0]}-{secrets.token_hex(12)}", "object": kind[1], "created": int(time.time()), "model": model}
    events = EventStream(request)
    try:
        while (item := await queue.get()) is not None:
            index, ids = item
            delta = streams[index].feed(ids)
            if not delta:
                continue
            if text:
                choice = {"index": index, "text": delta, "finish_reason": None, "logprobs": None}
                await events.send({**base, "choices": [choice]})
                continue
            if events.response is None:  # each choice's role first, as OpenAI's streams open
                for i in range(len(streams)):
                    role = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
                    await events.send({**base, "choices": [role]})
            await events.send({**base, "choices": [{"index": index, "delta": {"content": delta}, "logprobs": None}]})
        try:
            outputs = await task
        except PolicyError as error:
            if events.response is None:
                raise  # nothing sent yet: the usual 502
            await events.send(error_body(str(error), type="server_error", code="policy_error"))
            return await events.end()
        response = finish(outputs)
        sent = [stream.sent for stream in streams]
        if text:
            for choice in response["choices"]:
                done, whole = sent[choice["index"]], choice["text"]
                rest = whole[len(done) :] if whole.startswith(done) else ""
                await events.send({**base, "choices": [{**choice, "text": rest}]})
            return await events.end()
        for chunk in chat_chunks(response, include_usage, sent=None if events.response is None else sent):
            await events.send({**chunk, "id": base["id"], "created": base["created"]})
        return await events.end()
    finally:
        if not task.done():  # the handler itself was cancelled
            task.cancel()
