"""What every policy backend shares: the Policy protocol, SamplingParams, and turning a completion into a ModelOutput.

A policy takes chat messages (or prompt token ids) and sampling parameters and returns a
:class:`~rllm_gym.types.ModelOutput`. The helpers here are pure functions used by all backends so that the same
completion gives the same ModelOutput whichever backend produced it: reasoning is split out of ``<think>`` blocks,
Hermes ``<tool_call>{json}</tool_call>`` blocks become :class:`~rllm_gym.types.ToolCall`, and the finish reason is
``"tool_calls"`` when a reply calls a tool. Hermes blocks are read by :mod:`rllm_gym.tools.parsers`'s parser, the one
Hermes parser of the package (``rllm_gym.tools`` imports nothing from the policies, so the import runs one way).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import numbers
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rllm_gym.policies.tokens import (
    RenderCache,
    TokenHistory,
    check_token_history,
    prompt_ids_for,
    render_prompt_ids,
)
from rllm_gym.tools.parsers import HermesToolParser
from rllm_gym.types import ModelOutput, Step, ToolCall

__all__ = [
    "BasePolicy",
    "LoopHandoff",
    "Messages",
    "Policy",
    "PolicyError",
    "PolicyRequest",
    "SamplingParams",
    "build_model_output",
    "check_model_source",
    "parse_hermes_tool_calls",
    "render_prompt_ids",
    "split_reasoning",
]

Messages = list[dict[str, Any]]

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_HERMES = HermesToolParser()


MODEL_FILES = ("config.json", "adapter_config.json", "tokenizer_config.json")


def check_model_source(model: str | os.PathLike[str], what: str = "--model") -> None:
    """Raise ValueError at once when ``model`` is neither a model folder nor a hub id (``org/name``) that may exist.

    A path that does not exist would otherwise be tried as a hub id and fail a minute later blaming the network. A
    hub id that is not in the local cache is left to the download (which needs the network).
    """
    text = os.fspath(model)
    path = Path(text).expanduser()
    if path.is_dir():
        if not any((path / name).is_file() for name in MODEL_FILES):
            raise ValueError(
                f"{what} {text}: the folder has none of {', '.join(MODEL_FILES)}, so it is not a model folder "
                f"(a training run's model is in <output_dir>/final or <output_dir>/checkpoint-N)"
            )
        return
    if path.exists():
        raise ValueError(f"{what} {text} is a file; pass the model's folder or a hub id such as Qwen/Qwen3-0.6B")
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
        # "runs/fnial" is a valid hub id, but a folder named like a local one ("runs" exists here) is a typo.
        local = text.startswith((".", "/", "~")) or Path(text.split("/")[0]).is_dir()
    except HFValidationError:
        local = True
    if local:
        parent = path.parent
        while not parent.is_dir() and parent != parent.parent:
            parent = parent.parent
        entries = sorted(e.name for e in parent.iterdir() if not e.name.startswith("."))[:8] if parent.is_dir() else []
        raise ValueError(
            f"{what} {text}: no such folder (the nearest existing one, {parent}, holds: {', '.join(entries) or '-'}), "
            f"and it is not a hub id such as Qwen/Qwen3-0.6B"
        )


class PolicyError(RuntimeError):
    """A policy could not produce a completion (server unreachable, request rejected, engine failure)."""


# vLLM's rule: a temperature below this is greedy (dividing logits by 1e-300 makes them infinite: sampling fails).
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters that every backend can map (vLLM, OpenAI-compatible servers, transformers).

    ``temperature=0`` means greedy decoding, as does any temperature below ``GREEDY_BELOW`` (1e-5, vLLM's rule).
    ``top_k=None`` and ``top_p=1.0`` disable those filters. ``stop`` strings end the completion and are not part of
    its text. ``seed`` makes sampling reproducible where the backend can
    (vLLM and HFPolicy per request batch; servers per request when they honour it).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int | None = None

    def __post_init__(self) -> None:
        # Types first, so a string or None gets this message rather than a comparison error below.
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"SamplingParams.{name} must be a finite number, got {value!r}")
        for name, optional in (("top_k", True), ("max_tokens", False), ("seed", True)):
            value = getattr(self, name)
            if not (value is None and optional) and (
                isinstance(value, bool) or not isinstance(value, numbers.Integral)
            ):
                allowed = "an int or None" if optional else "an int"
                raise ValueError(f"SamplingParams.{name} must be {allowed}, got {value!r}")
        if not isinstance(self.stop, (str, Sequence)) or not all(isinstance(s, str) for s in self.stop):
            raise ValueError(f"SamplingParams.stop must be a string or a list of strings, got {self.stop!r}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}; use 1.0 to disable it")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"SamplingParams.top_k must be >= 1 or None (disabled), got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        if isinstance(self.stop, str):
            # A bare string would otherwise be read as a tuple of one-character stop strings.
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["stop"] = list(self.stop)
        return data


@runtime_checkable
class Policy(Protocol):
    """Chat messages or prompt token ids in, one :class:`ModelOutput` out; async, and batched by the backend.

    Call ``generate`` from many coroutines at once: concurrent calls are the normal case and every backend batches
    them (vLLM continuous batching, a server's own batching, HFPolicy's request queue). ``previous`` is the episode's
    last Step of the same agent (its chat, prompt ids and completion ids): a backend that works on token ids continues
    that call's tokens rather than re-rendering the chat (:mod:`rllm_gym.policies.tokens`); others may ignore it.

    Example::

        import asyncio
        from rllm_gym.policies import ScriptedPolicy, SamplingParams

        policy = ScriptedPolicy(["<think>easy</think>The answer is 4."])
        out = asyncio.run(policy.generate([{"role": "user", "content": "2+2?"}], SamplingParams(temperature=0)))
        assert (out.reasoning, out.content) == ("easy", "The answer is 4.")
    """

    async def generate(
        self,
        messages: Messages | None = None,
        sampling_params: SamplingParams | None = None,
        *,
        prompt_ids: Sequence[int] | None = None,
        tools: list[dict[str, Any]] | None = None,
        previous: Step | None = None,
    ) -> ModelOutput: ...


def check_request(messages: Messages | None, prompt_ids: Sequence[int] | None, previous: Step | None = None) -> None:
    """Raise a clear error unless exactly one of ``messages`` and ``prompt_ids`` is given (and ``previous``, when
    given, is a Step)."""
    if previous is not None and not isinstance(previous, Step):
        raise TypeError(
            "previous must be the agent's last Step (agent.get_current_state()) or None, "
            f"got {type(previous).__name__}"
        )
    if (messages is None) == (prompt_ids is None):
        raise ValueError("generate() needs exactly one of `messages` (a chat) or `prompt_ids` (token ids)")
    if messages is not None and (not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages)):
        raise TypeError(
            "messages must be a list of dicts like {'role': 'user', 'content': '...'}, "
            f"got {type(messages).__name__}"
        )


def split_reasoning(text: str) -> tuple[str, str]:
    """Split ``text`` into ``(reasoning, rest)`` at its ``<think>...</think>`` block.

    A completion may start inside the block when the chat template already opened it, so a ``</think>`` without an
    opening tag ends the reasoning too; an unclosed ``<think>`` (a truncated reply) makes all of it reasoning.
    Text before an opening ``<think>`` is kept in ``rest``.
    """
    close = text.find(_THINK_CLOSE)
    open_ = text.find(_THINK_OPEN)
    if close == -1 and open_ == -1:
        return "", text
    if close == -1:
        return text[open_ + len(_THINK_OPEN) :].strip(), text[:open_]
    if open_ == -1 or open_ > close:
        return text[:close].strip(), text[close + len(_THINK_CLOSE) :]
    reasoning = text[open_ + len(_THINK_OPEN) : close].strip()
    return reasoning, text[:open_] + text[close + len(_THINK_CLOSE) :]


def parse_hermes_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Parse Hermes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks out of ``text``.

    Returns the text with the well-formed blocks removed and the calls. A block that is not a well-formed call stays
    in the text: malformed model output is normal input, the agent or env decides about it. The parsing is
    :class:`~rllm_gym.tools.parsers.HermesToolParser`'s (the one Hermes parser): JSON decoded in place, a closing tag
    left off at the end of the reply tolerated, ``arguments`` as an object, a JSON string or absent.
    """
    if "<tool_call>" not in text:
        return text, []
    kept: list[str] = []
    calls: list[ToolCall] = []
    position = 0
    for start, end, call in _HERMES.blocks(text):
        if isinstance(call, ToolCall):
            kept.append(text[position:start])
            calls.append(call)
            position = end
    kept.append(text[position:])
    return "".join(kept), calls


def build_model_output(
    text: str,
    *,
    prompt_ids: Sequence[int] = (),
    completion_ids: Sequence[int] = (),
    logprobs: Sequence[float] = (),
    finish_reason: str | None = None,
    prompt_length: int | None = None,
    completion_length: int | None = None,
    text_rendered: bool = False,
) -> ModelOutput:
    """The ModelOutput for a completion ``text``: reasoning and tool calls split out, content stripped.

    ``finish_reason`` becomes ``"tool_calls"`` when the reply holds at least one well-formed tool call and it was not
    cut off by the length limit. The token counts are the lengths of the ids unless given (a server's ``usage`` where
    there are no ids).
    """
    reasoning, rest = split_reasoning(text)
    content, tool_calls = parse_hermes_tool_calls(rest)
    if tool_calls and finish_reason != "length":
        finish_reason = "tool_calls"
    return ModelOutput(
        text=text,
        content=content.strip(),
        reasoning=reasoning,
        tool_calls=tool_calls,
        prompt_ids=list(prompt_ids),
        completion_ids=list(completion_ids),
        logprobs=list(logprobs),
        prompt_length=len(prompt_ids) if prompt_length is None else prompt_length,
        completion_length=len(completion_ids) if completion_length is None else completion_length,
        finish_reason=finish_reason,
        text_rendered=text_rendered,
    )


def merge_template_kwargs(enable_thinking: bool | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Keyword arguments for ``apply_chat_template``: ``enable_thinking`` only when set, so templates keep defaults."""
    kwargs = dict(extra or {})
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    return kwargs


def on_loop(loop: asyncio.AbstractEventLoop, callback: Callable[[list[int]], None]) -> Callable[[list[int]], None]:
    """``callback`` run on ``loop`` whichever thread calls it (dropped once the loop is closed): how a backend that
    generates on another thread hands ``on_token`` calls back to the requester's loop."""

    def relay(ids: list[int]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is listening any more
            loop.call_soon_threadsafe(callback, ids)

    return relay


class LoopHandoff:
    """Calls handed to one event loop from other threads, with one wake-up of that loop per burst.

    ``loop.call_soon_threadsafe`` wakes the loop's thread (a write to its self-pipe) per call; 128 episodes whose
    requests, or whose results after one engine step, come together paid one wake-up each. :meth:`call` queues the
    call and wakes the loop only when no wake-up is pending; the loop then runs every call queued so far, in order.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._calls: collections.deque[Callable[[], None]] = collections.deque()
        self._lock = threading.Lock()
        self._woken = False

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on the loop soon, after the calls handed over before it; RuntimeError when the loop is closed
        (``fn`` is then dropped)."""
        with self._lock:
            self._calls.append(fn)
            if self._woken:
                return
            try:
                self.loop.call_soon_threadsafe(self._run)
            except RuntimeError:
                self._calls.pop()
                raise
            self._woken = True

    def _run(self) -> None:
        with self._lock:
            calls, self._calls = self._calls, collections.deque()
            self._woken = False
        for fn in calls:
            fn()


@dataclass(frozen=True)
class PolicyRequest:
    """One checked ``generate`` call: exactly one of ``messages`` and ``prompt_ids`` is set; ``params`` is filled;
    ``previous`` is the agent's last Step in this episode, if any; ``on_token`` receives the completion's ids as they
    come, where the backend streams (:attr:`BasePolicy.streams_tokens`)."""

    messages: Messages | None
    prompt_ids: list[int] | None
    params: SamplingParams
    tools: list[dict[str, Any]] | None
    previous: Step | None = None
    on_token: Callable[[list[int]], None] | None = None


class BasePolicy(ABC):
    """What the model backends (transformers, vLLM, OpenAI-compatible HTTP) have in common.

    :meth:`generate` checks the request (exactly one of messages and prompt ids, default sampling parameters) and
    hands a :class:`PolicyRequest` to the backend's :meth:`_generate`; :meth:`prompt_token_ids` gives its prompt ids
    (token in, token out: continued from the previous call's ids, see :mod:`rllm_gym.policies.tokens`; the chat
    template with the policy's ``template_kwargs``, ``enable_thinking`` only when set, renders the rest), and every
    backend builds its reply with :func:`build_model_output`. A backend keeps only what is its own: how a request
    reaches the model and how the model's answer is read.
    """

    # Whether ``generate(on_token=...)`` hands over the completion's token ids while it is generated (HFPolicy,
    # VLLMPolicy); a backend that only ever has whole replies leaves it False.
    streams_tokens: bool = False

    def __init__(
        self,
        tokenizer: Any,
        *,
        enable_thinking: bool | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        token_history: TokenHistory = "sampled",
    ) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = merge_template_kwargs(enable_thinking, chat_template_kwargs)
        self.token_history = check_token_history(token_history, type(self).__name__)
        self.rendered = RenderCache()  # whole chats rendered lately (the G first calls of a GRPO group share one)

    async def generate(
        self,
        messages: Messages | None = None,
        sampling_params: SamplingParams | None = None,
        *,
        prompt_ids: Sequence[int] | None = None,
        tools: list[dict[str, Any]] | None = None,
        previous: Step | None = None,
        on_token: Callable[[list[int]], None] | None = None,
    ) -> ModelOutput:
        """:class:`Policy`'s ``generate``; ``on_token``, with a backend whose :attr:`streams_tokens` is true, is called
        on the caller's event loop with each new piece of the completion's token ids as they are generated (the
        returned ModelOutput stays the authority: ids after the end it cuts, such as padding after a stop string,
        may reach ``on_token`` too). Other backends never call it."""
        check_request(messages, prompt_ids, previous)
        if on_token is not None and not callable(on_token):
            raise TypeError(f"on_token must be a callable taking a list of token ids, or None, got {on_token!r}")
        ids = None if prompt_ids is None else list(prompt_ids)
        params = sampling_params or SamplingParams()
        return await self._generate(PolicyRequest(messages, ids, params, tools, previous, on_token))

    @abstractmethod
    async def _generate(self, request: PolicyRequest) -> ModelOutput:
        """The backend's reply to a checked request."""

    def prompt_token_ids(self, request: PolicyRequest) -> list[int]:
        """The request's prompt ids: as given; or, with ``token_history="sampled"`` (the default), the previous call's
        prompt and completion ids continued by the new messages; or the chat rendered whole by the chat template
        (the first call, ``token_history="template"``, or a chat that dropped earlier messages), once per distinct
        chat of plain strings (:class:`~rllm_gym.policies.tokens.RenderCache`)."""
        if request.prompt_ids is not None:
            return request.prompt_ids
        return prompt_ids_for(
            self.tokenizer,
            request.messages,
            request.tools,
            self.template_kwargs,
            request.previous,
            self.token_history,
            self.rendered,
        )
