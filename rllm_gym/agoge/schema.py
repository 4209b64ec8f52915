"""The agoge schema as pydantic v2 models: messages and their content parts, Chat, TimeStep, Task, Trajectory.

Everything here mirrors agoge's record types (plus a ``metadata`` extension field on TimeStep and Trajectory) and
the helpers that turn one message into an OpenAI chat dict and back; it knows nothing of rllm_gym's own types, which
:mod:`rllm_gym.agoge.convert` maps onto these. Import the names from :mod:`rllm_gym.agoge`.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from abc import abstractmethod
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal, Self, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

__all__ = [
    "SCHEMA_VERSION", "AREEvaluatedTrajectory", "AssistantMessage", "Chat", "ChatMessage", "EvaluatedTrajectory",
    "FunctionCall", "ImageContent", "LLMEvaluatedTrajectory", "SystemMessage", "Task", "TextContent", "TimeStep",
    "ToolCall", "ToolMessage", "Trajectory", "UserMessage", "message_from_openai", "message_to_openai",
]  # fmt: skip

SCHEMA_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


# Messages


class TextContent(_Model):
    model_config = ConfigDict(frozen=True)
    type: Literal["text"] = "text"
    text: str


class ImageContent(_Model):
    """An image: ``data`` (base64 of the encoded file, e.g. PNG) with its ``mime_type``, and/or a ``url``.

    A data URL passed as ``data`` is split into ``mime_type`` and the base64 payload, so each image has one form.
    """

    model_config = ConfigDict(frozen=True)
    type: Literal["image"] = "image"
    data: str | None = None
    mime_type: str = "image/png"
    url: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _split_data_url(cls, value: Any) -> Any:
        if isinstance(value, dict) and isinstance(value.get("data"), str) and value["data"].startswith("data:"):
            header, _, payload = value["data"].partition(",")
            if not header.endswith(";base64"):
                raise ValueError("data: a data URL must be base64-encoded ('data:image/png;base64,...')")
            value = {**value, "mime_type": header[5:-7], "data": payload}
        return value

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.data is None and self.url is None:
            raise ValueError("an image needs `data` (base64 or a data URL) or `url`; both are None")
        if self.data is not None:
            try:
                base64.b64decode(self.data, validate=True)
            except binascii.Error as error:
                raise ValueError(f"data: not valid base64 ({error}); pass base64 text or a data URL") from None
        return self

    @classmethod
    def from_bytes(cls, raw: bytes, mime_type: str = "image/png") -> ImageContent:
        return cls(data=base64.b64encode(raw).decode("ascii"), mime_type=mime_type)

    @classmethod
    def from_url(cls, url: str) -> ImageContent:
        return cls(data=url) if url.startswith("data:") else cls(url=url)

    def as_url(self) -> str:
        """A data URL when the bytes are here, else the ``url``: what OpenAI's ``image_url`` part holds."""
        return f"data:{self.mime_type};base64,{self.data}" if self.data is not None else str(self.url)

    def to_bytes(self) -> bytes:
        if self.data is None and not str(self.url).startswith("data:"):
            raise ValueError(f"image {self.url!r} is only a remote URL; fetch it and pass its bytes as `data`")
        return base64.b64decode(self.data if self.data is not None else str(self.url).partition(",")[2])


ContentPart = Annotated[Union[TextContent, ImageContent], Field(discriminator="type")]  # noqa: UP007
Content = Union[str, list[ContentPart]]  # noqa: UP007


class FunctionCall(_Model):
    model_config = ConfigDict(frozen=True)
    name: str
    arguments: str = "{}"  # JSON text, as OpenAI sends it


class ToolCall(_Model):
    model_config = ConfigDict(frozen=True)
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class _Message(_Model):
    model_config = ConfigDict(frozen=True)

    def __add__(self, other: object) -> Chat:
        # message + message makes a Chat; message + chat is left to Chat.__radd__
        return Chat(messages=[self, other]) if isinstance(other, _Message) else NotImplemented


class SystemMessage(_Message):
    role: Literal["system"] = "system"
    content: Content


class UserMessage(_Message):
    role: Literal["user"] = "user"
    content: Content


class AssistantMessage(_Message):
    role: Literal["assistant"] = "assistant"
    content: Content | None = None  # None when the reply is only tool calls
    tool_calls: list[ToolCall] | None = None


class ToolMessage(_Message):
    role: Literal["tool"] = "tool"
    content: Content
    tool_call_id: str


ChatMessage = Annotated[
    Union[SystemMessage, UserMessage, AssistantMessage, ToolMessage],  # noqa: UP007
    Field(discriminator="role"),
]
_MESSAGE = TypeAdapter(ChatMessage)


def message_to_openai(message: ChatMessage) -> dict[str, Any]:
    """The OpenAI chat dict of ``message``: text parts as ``text``, images as ``image_url`` data URLs."""
    content: Any = message.content
    if isinstance(content, list):
        content = [
            {"type": "text", "text": p.text} if isinstance(p, TextContent)
            else {"type": "image_url", "image_url": {"url": p.as_url()}}
            for p in content
        ]  # fmt: skip
    out: dict[str, Any] = {"role": message.role, "content": content}
    if isinstance(message, AssistantMessage) and message.tool_calls is not None:
        out["tool_calls"] = [call.model_dump() for call in message.tool_calls]
    if isinstance(message, ToolMessage):
        out["tool_call_id"] = message.tool_call_id
    return out


def _part_from_openai(part: Any) -> dict[str, Any]:
    if isinstance(part, dict) and part.get("type") == "text":
        return {"type": "text", "text": str(part.get("text", ""))}
    if isinstance(part, dict) and part.get("type") == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        return ImageContent.from_url(str(url)).model_dump()
    return {"type": "text", "text": json.dumps(part, default=str)}


def message_from_openai(message: Mapping[str, Any]) -> ChatMessage:
    """Best-effort reading of an OpenAI chat dict; anything unreadable becomes a user message with its JSON.

    ``message_to_openai(message_from_openai(d)) == d`` holds for the dicts :func:`message_to_openai` writes; the
    converters keep any other dict verbatim beside the Chat.
    """
    try:
        role = message.get("role")
        role = {"developer": "system", "function": "tool"}.get(role, role) if isinstance(role, str) else role
        content = message.get("content")
        if isinstance(content, list):
            content = [_part_from_openai(part) for part in content]
        elif content is not None and not isinstance(content, str):
            content = json.dumps(content, default=str)
        data: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant" and message.get("tool_calls") is not None:
            data["tool_calls"] = [
                {"id": str(call.get("id", "")), "function": {"name": str(call.get("function", {}).get("name", "")),
                 "arguments": _as_json_text(call.get("function", {}).get("arguments", "{}"))}}
                for call in message["tool_calls"]
            ]  # fmt: skip
        if role == "tool":
            data["tool_call_id"] = str(message.get("tool_call_id", ""))
        return _MESSAGE.validate_python(data)
    except (ValidationError, ValueError, AttributeError, TypeError):
        return UserMessage(content=json.dumps(dict(message), default=str))


def _as_json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


# Chat


class Chat(_Model):
    """One contiguous LLM call: its messages and, optionally, one log-probability per templated token.

    Immutable: ``chat + message``, ``chat + chat`` and ``message + chat`` return new Chats. ``logprobs`` survives
    only when the other operand adds no message (they would no longer match the tokens), otherwise it is None.
    """

    model_config = ConfigDict(frozen=True)
    messages: list[ChatMessage] = Field(default_factory=list)
    logprobs: list[float] | None = None

    @model_validator(mode="before")
    @classmethod
    def _accept_one_message(cls, value: Any) -> Any:
        if isinstance(value, _Message):
            return {"messages": [value]}
        if isinstance(value, dict) and "role" in value and "messages" not in value:
            return {"messages": [value]}
        return value

    def __add__(self, other: object) -> Chat:
        if isinstance(other, _Message):
            return Chat(messages=[*self.messages, other])
        if isinstance(other, Chat):
            if not other.messages:
                return self
            return other if not self.messages else Chat(messages=[*self.messages, *other.messages])
        return NotImplemented

    def __radd__(self, other: object) -> Chat:
        if isinstance(other, _Message):
            return Chat(messages=[other, *self.messages])
        return NotImplemented

    def to_openai(self, exclude: Iterable[str | int] | None = None) -> list[dict[str, Any]]:
        """The messages as OpenAI dicts, leaving out ``exclude``: role names and/or indices (negative allowed)."""
        exclude = set(exclude or ())
        n = len(self.messages)
        return [
            message_to_openai(m)
            for i, m in enumerate(self.messages)
            if m.role not in exclude and i not in exclude and i - n not in exclude
        ]

    def apply_chat_template(self, tokenizer: Any, exclude: Iterable[str | int] | None = None, **kwargs: Any) -> Any:
        """``tokenizer.apply_chat_template`` on :meth:`to_openai` (``exclude`` as there); kwargs pass through."""
        return tokenizer.apply_chat_template(self.to_openai(exclude), **kwargs)

    def history_view(self, limits: Mapping[str, int] | None = None) -> Chat:
        """The most recent messages within ``limits``, in their original order; system messages are always kept.

        ``limits`` maps ``"total"`` to the most non-system messages kept, and a role (``"user"``, ``"assistant"``,
        ``"tool"``) to the most messages of that role kept, e.g. ``{"total": 8, "tool": 2}``. Messages are taken
        newest first; one whose role quota is used up is dropped and the walk goes on, and once ``total`` is
        reached every older non-system message is dropped. None keeps everything (and the logprobs).
        """
        if not limits:
            return self
        for key, value in limits.items():
            if key not in ("total", "user", "assistant", "tool"):
                raise ValueError(f"limits: unknown key {key!r}; use 'total', 'user', 'assistant' or 'tool'")
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"limits[{key!r}] must be a non-negative int, got {value!r}")
        total = limits.get("total")
        used: dict[str, int] = {}
        keep: list[bool] = [False] * len(self.messages)
        for i in reversed(range(len(self.messages))):
            role = self.messages[i].role
            if role == "system":
                keep[i] = True
            elif (total is None or sum(used.values()) < total) and used.get(role, 0) < limits.get(role, len(keep)):
                keep[i] = True
                used[role] = used.get(role, 0) + 1
        if all(keep):
            return self
        return Chat(messages=[m for m, k in zip(self.messages, keep, strict=True) if k])

    def extract_images(self, as_bytes: bool = False) -> list[Any]:
        """Every image in message order, as PIL images (needs Pillow) or, with ``as_bytes=True``, raw bytes."""
        raw = [
            part.to_bytes()
            for message in self.messages
            if isinstance(message.content, list)
            for part in message.content
            if isinstance(part, ImageContent)
        ]
        if as_bytes:
            return raw
        try:
            from PIL import Image
        except ImportError as error:
            raise ImportError(
                "Chat.extract_images(as_bytes=False) returns PIL images and needs the `pillow` package: "
                "pip install pillow, or call extract_images(as_bytes=True) for raw bytes"
            ) from error
        return [Image.open(io.BytesIO(data)) for data in raw]


# Steps, tasks and trajectories


class TimeStep(_Model):
    """One environment step: every Chat of that step (at least one), then the step's reward and done flag.

    ``metadata`` is this project's extension (agoge has none); the converters keep rllm-only data there.
    """

    chats: list[Chat] = Field(min_length=1, description="All LLM exchanges that occurred during this step")
    reward: float | None = None
    done: bool = False
    available_tool_schemas: list[dict[str, Any]] | None = None
    advantage: float | None = None
    mc_return: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class Task(_Model):
    task_id: str
    inputs: dict[str, Any] = Field(default_factory=dict)
    eval_criteria: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)


class Trajectory(_Model):
    """One agent's episode as ordered TimeSteps; ``metadata`` is this project's extension, as on TimeStep."""

    timesteps: list[TimeStep] = Field(default_factory=list, description="Ordered timesteps from t=0 to T")
    reset_kwargs: dict[str, Any] = Field(default_factory=dict)
    error_info: dict[str, str] | None = None
    schema_version: int = SCHEMA_VERSION
    episode_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class EvaluatedTrajectory(Trajectory):
    """A Trajectory with evaluation results; :attr:`evaluation` reads them the same way for every subclass."""

    @property
    @abstractmethod
    def evaluation(self) -> dict[str, Any]:
        """The evaluation, with at least a success flag and a rationale where the evaluator gives them."""


class AREEvaluatedTrajectory(EvaluatedTrajectory):
    are_evaluation: dict[str, Any]

    @property
    def evaluation(self) -> dict[str, Any]:
        return self.are_evaluation


class LLMEvaluatedTrajectory(EvaluatedTrajectory):
    judge_response: dict[str, Any] | None = None

    @property
    def evaluation(self) -> dict[str, Any]:
        return self.judge_response if self.judge_response is not None else {}
