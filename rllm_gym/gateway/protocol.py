"""The OpenAI wire format of the gateway: requests checked into typed records, replies and errors built from ours.

Everything a client sends is untrusted: :func:`parse_chat_request` and :func:`parse_completion_request` turn a decoded
JSON body into a :class:`ChatRequest` / :class:`CompletionRequest` or raise :class:`RequestError`, which carries an
OpenAI-shaped error (``{"error": {"message", "type", "param", "code"}}``) naming the field. Messages are normalized
(text parts joined, ``None`` fields dropped, tool calls in one shape) so that a chat the client sends back equals the
chat the gateway recorded, which is what lets a call continue the tokens of the call before it.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from dataclasses import dataclass
from typing import Any

from rllm_gym.policies.base import GREEDY_BELOW, build_model_output, split_reasoning
from rllm_gym.types import ModelOutput

__all__ = [
    "ChatRequest",
    "CompletionRequest",
    "RequestError",
    "ToolChoice",
    "apply_tool_choice",
    "assistant_message",
    "chat_chunks",
    "chat_response",
    "check_body",
    "completion_response",
    "error_body",
    "finite_number",
    "normalize_messages",
    "parse_chat_request",
    "parse_completion_request",
    "readable_calls",
    "unrecordable",
]

_ROLES = ("system", "developer", "user", "assistant", "tool")
TOOL_CALL_OPEN = "<tool_call>\n"
MAX_N = 16
MAX_STOP = 4
# transformers matches stop strings against every vocabulary entry up front, and streaming holds back any tail that
# may start one, both in time growing with the string: a megabyte stop stalled a 20-token call for 40 s.
MAX_STOP_CHARS = 256
MAX_DEPTH = 64


class RequestError(Exception):
    """A request the gateway refuses: the HTTP status and the OpenAI error fields."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        code: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.type = status, param, code, type

    def body(self) -> dict[str, Any]:
        return error_body(str(self), param=self.param, code=self.code, type=self.type)


def error_body(
    message: str, *, param: str | None = None, code: str | None = None, type: str = "invalid_request_error"
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass(frozen=True)
class Sampling:
    """The sampling fields of a request; ``None`` where the client left them to the gateway's defaults."""

    temperature: float | None
    top_p: float | None
    max_tokens: int | None
    stop: tuple[str, ...]
    seed: int | None
    n: int


@dataclass(frozen=True)
class ToolChoice:
    """A request's ``tool_choice``: ``mode`` is ``"auto"``, ``"none"`` or ``"required"``; ``name`` is the function a
    named choice (``{"type": "function", "function": {"name": ...}}``) requires, else ``None``."""

    mode: str = "auto"
    name: str | None = None

    @property
    def opening(self) -> str | None:
        """The text that starts the reply when a call is required: the Hermes tool-call opening (the format the
        gateway reads tool calls in), with the function's name for a named choice; ``None`` otherwise."""
        if self.mode != "required":
            return None
        if self.name is None:
            return TOOL_CALL_OPEN
        return f'{TOOL_CALL_OPEN}{{"name": {json.dumps(self.name)}, "arguments": '


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tool_choice: ToolChoice
    sampling: Sampling
    stream: bool
    include_usage: bool
    logprobs: bool


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompt: str | list[int]
    sampling: Sampling
    stream: bool
    logprobs: bool


def finite_number(value: Any) -> float | None:
    """``value`` as a float when it is a JSON number a float holds finitely, else ``None`` (a bool, a string, NaN,
    an infinity, or an integer too large for a float: JSON gives all of these)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def check_body(body: Any) -> Any:
    """``body`` (a decoded JSON body) when the gateway can record it, else :class:`RequestError` naming where not
    (:func:`unrecordable`)."""
    fault = unrecordable(body)
    if fault is None:
        return body
    path, why = fault
    if why == "text":
        raise _text_error(path)
    raise RequestError(f"'{path}' is nested more than {MAX_DEPTH} levels deep"[:300], param=path)


def unrecordable(value: Any) -> tuple[str, str] | None:
    """Where ``value`` (decoded JSON, or a program's output: dicts, lists, tuples) cannot go into a record, and why:
    ``(path, "text")`` for a string that is not valid Unicode (a lone UTF-16 surrogate such as ``"\ud800"``, which
    JSON allows and UTF-8 cannot hold; for a key, the path of the object that holds it), ``(path, "depth")`` for
    nesting deeper than ``MAX_DEPTH`` (a record nests what it keeps in a few levels of its own, and its JSON must stay
    within what pydantic writes); ``None`` where it can."""
    if isinstance(value, str) and not _valid_text(value):
        return "", "text"
    pending: list[tuple[str, Any, int]] = [("", value, 0)]
    while pending:
        path, item, depth = pending.pop()
        if isinstance(item, dict):
            items: Any = item.items()
        elif isinstance(item, (list, tuple)):
            items = enumerate(item)
        else:
            continue
        if depth >= MAX_DEPTH:
            return path, "depth"
        for key, child in items:
            if isinstance(key, str) and not _valid_text(key):
                return path, "text"
            if isinstance(child, str):
                if not _valid_text(child):
                    return _child(path, key), "text"
            elif isinstance(child, (dict, list, tuple)):
                pending.append((_child(path, key), child, depth + 1))
    return None


def _child(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _valid_text(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text_error(path: str) -> RequestError:
    message = f"'{path or '(body)'}' is not valid Unicode (it holds a lone UTF-16 surrogate such as \\ud800)"
    return RequestError(message[:300] + ": send UTF-8 text", param=path or None)


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    number = finite_number(value)
    if number is None:
        raise RequestError(f"'{name}' must be a number, got {json.dumps(value)[:80]}", param=name)
    if not low <= number <= high:
        raise RequestError(f"'{name}' must be between {low} and {high}, got {json.dumps(value)[:80]}", param=name)
    return number


def _integer(body: dict[str, Any], name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"'{name}' must be an integer, got {json.dumps(value)[:80]}", param=name)
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        raise RequestError(f"'{name}' must be {bound}, got {value}", param=name)
    return value


def _flag(body: dict[str, Any], name: str, parent: str = "") -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        param = f"{parent}.{name}" if parent else name
        raise RequestError(f"'{param}' must be true or false, got {json.dumps(value)[:80]}", param=param)
    return value


def _sampling(body: dict[str, Any]) -> Sampling:
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,) if stop else ()
    elif isinstance(stop, list) and len(stop) <= MAX_STOP and all(isinstance(s, str) and s for s in stop):
        stops = tuple(stop)
    else:
        raise RequestError(f"'stop' must be a string or a list of up to {MAX_STOP} non-empty strings", param="stop")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise RequestError(f"'stop' strings must be at most {MAX_STOP_CHARS} characters each", param="stop")
    max_tokens = _integer(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1)
    temperature = _number(body, "temperature", 0.0, 2.0)
    if temperature is not None and temperature < GREEDY_BELOW:
        temperature = 0.0
    return Sampling(
        temperature=temperature,
        top_p=_top_p(body),
        max_tokens=max_tokens,
        stop=stops,
        seed=_integer(body, "seed", -(2**63), 2**63 - 1),
        n=_integer(body, "n", 1, MAX_N) or 1,
    )


def _top_p(body: dict[str, Any]) -> float | None:
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p == 0:
        raise RequestError("'top_p' must be above 0 and at most 1 (1 disables it), got 0", param="top_p")
    return top_p


def _model(body: dict[str, Any]) -> str:
    model = body.get("model", "")
    if not isinstance(model, str):
        raise RequestError("'model' must be a string (any name: the gateway serves its one policy)", param="model")
    return model


def _text(content: Any, param: str) -> str:
    """A message's content as text: a string, ``None`` (empty), or a list of ``{"type": "text", "text": ...}``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(
                    f"'{param}[{i}]' must be a text part {{'type': 'text', 'text': '...'}} (the gateway's models "
                    "take text only)",
                    param=f"{param}[{i}]",
                )
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"'{param}' must be a string, a list of text parts or null", param=param)


def _tool_calls(calls: Any, param: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise RequestError(f"'{param}' must be a list of tool calls", param=param)
    out = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        arguments = function.get("arguments", "{}") if isinstance(function, dict) else None
        if not isinstance(name, str) or not isinstance(arguments, (str, dict)):
            raise RequestError(
                f"'{param}[{i}]' must be {{'id': ..., 'type': 'function', 'function': {{'name': str, "
                "'arguments': str}}",
                param=f"{param}[{i}]",
            )
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments)
        out.append(
            {"id": str(call.get("id") or ""), "type": "function", "function": {"name": name, "arguments": arguments}}
        )
    return out


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """The chat in one canonical shape: ``role``, ``content`` (text), and ``tool_calls`` / ``tool_call_id`` /
    ``name`` / ``reasoning_content`` where given. Anything else a client adds (``refusal: null``, ``annotations``)
    is dropped, so the chat a client echoes back compares equal to the one recorded."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of messages", param="messages")
    out = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RequestError(f"'{param}' must be an object with a 'role' and a 'content'", param=param)
        role = message.get("role")
        if role not in _ROLES:
            raise RequestError(f"'{param}.role' must be one of {', '.join(_ROLES)}, got {role!r}"[:200], param=param)
        item: dict[str, Any] = {"role": "system" if role == "developer" else role}
        item["content"] = _text(message.get("content"), f"{param}.content")
        if message.get("tool_calls") and role == "assistant":
            item["tool_calls"] = _tool_calls(message["tool_calls"], f"{param}.tool_calls")
        for key in ("tool_call_id", "name", "reasoning_content"):
            value = message.get(key)
            if value is not None:
                if not isinstance(value, str):
                    raise RequestError(f"'{param}.{key}' must be a string", param=f"{param}.{key}")
                item[key] = value
        out.append(item)
    return out


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, ToolChoice]:
    """The tools the template is told about (``None`` for ``tool_choice: "none"``) and the checked ``tool_choice``."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None or tools == []:
        if choice is None or choice in ("none", "auto"):
            return None, ToolChoice("none" if choice == "none" else "auto")
        raise RequestError("'tool_choice' requires a tool call, but the request has no 'tools'", param="tool_choice")
    if not isinstance(tools, list):
        raise RequestError("'tools' must be a list of {'type': 'function', 'function': {...}}", param="tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RequestError(
                f"'tools[{i}]' must be {{'type': 'function', 'function': {{'name': str, 'parameters': {{...}}}}}}",
                param=f"tools[{i}]",
            )
    if choice is None or choice == "auto":
        return tools, ToolChoice("auto")
    if choice == "required":
        return tools, ToolChoice("required")
    if choice == "none":
        return None, ToolChoice("none")  # the model is not told about tools it must not call
    names = {tool["function"]["name"] for tool in tools}
    function = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or function["name"] not in names:
        raise RequestError(
            "'tool_choice' must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': <one of "
            f"the tools: {', '.join(sorted(names))}>}}}}"[:400],
            param="tool_choice",
        )
    return tools, ToolChoice("required", function["name"])


def _body(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object", param=None)
    return body


def parse_chat_request(body: Any) -> ChatRequest:
    """A checked ``/v1/chat/completions`` request, or :class:`RequestError` naming the field."""
    body = _body(body)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError(
            "'stream_options' must be an object such as {'include_usage': true}", param="stream_options"
        )
    tools, tool_choice = _tools(body)
    return ChatRequest(
        model=_model(body),
        messages=normalize_messages(body.get("messages")),
        tools=tools,
        tool_choice=tool_choice,
        sampling=_sampling(body),
        stream=_flag(body, "stream"),
        include_usage=_flag(options or {}, "include_usage", "stream_options"),
        logprobs=_flag(body, "logprobs"),
    )


def parse_completion_request(body: Any) -> CompletionRequest:
    """A checked ``/v1/completions`` request: ``prompt`` is a string, a list of one string, or token ids."""
    body = _body(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    ids = isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    if not (isinstance(prompt, str) and prompt) and not ids:
        raise RequestError("'prompt' must be a non-empty string or a list of token ids", param="prompt")
    if ids and min(prompt) < 0:
        raise RequestError(f"'prompt' token ids must be >= 0, got {min(prompt)}"[:200], param="prompt")
    logprobs = body.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 0):
        raise RequestError("'logprobs' must be an integer >= 0 or null", param="logprobs")
    return CompletionRequest(
        model=_model(body),
        prompt=prompt,
        sampling=_sampling(body),
        stream=_flag(body, "stream"),
        logprobs=logprobs is not None,
    )


def readable_calls(output: ModelOutput) -> ModelOutput:
    """The reply, with its tool calls only when a client and a record can read their arguments: nested at most
    ``MAX_DEPTH`` levels (a record is written by pydantic, which stops near 250) and without NaN or infinities (which
    strict JSON parsers refuse). Otherwise the model wrote a call no one can use: it stays content, as any malformed
    call does, and the finish reason is ``"stop"`` or ``"length"``."""
    if all(_plain_json(call.arguments) for call in output.tool_calls):
        return output
    finish = "length" if output.finish_reason == "length" else "stop"
    content = split_reasoning(output.text)[1].strip()
    return output.model_copy(update={"content": content, "tool_calls": [], "finish_reason": finish})


def _plain_json(value: Any) -> bool:
    pending = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return False
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            if depth >= MAX_DEPTH:
                return False
            pending.extend((child, depth + 1) for child in children)
    return True


def apply_tool_choice(output: ModelOutput, choice: ToolChoice) -> ModelOutput:
    """The reply as ``choice`` reads it. ``"none"``: no tool calls (markup the model wrote anyway stays in the content,
    the finish reason is ``"stop"`` or ``"length"``). ``"required"`` / named: the completion continues the choice's
    :attr:`~ToolChoice.opening`, which the gateway put at the end of the prompt, so the calls are parsed from the
    opening plus the completion (a completion that does not finish a well-formed call stays content: malformed output
    is normal input). ``text``, token ids and log-probabilities stay the completion's own."""
    finish = "length" if output.finish_reason == "length" else "stop"
    if choice.mode == "none":
        if not output.tool_calls:
            return output
        content = split_reasoning(output.text)[1].strip()
        return output.model_copy(update={"content": content, "tool_calls": [], "finish_reason": finish})
    opening = choice.opening
    if opening is None:
        return output
    parsed = build_model_output(opening + output.text, finish_reason=finish)
    fields = ("content", "reasoning", "tool_calls", "finish_reason")
    return output.model_copy(update={name: getattr(parsed, name) for name in fields})


def _tool_call_json(output: ModelOutput) -> list[dict[str, Any]]:
    return [
        {
            "id": call.id or f"call_{secrets.token_hex(12)}",
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
        }
        for call in output.tool_calls
    ]


def assistant_message(output: ModelOutput) -> dict[str, Any]:
    """The reply as the client receives it and sends it back (normalized: see :func:`normalize_messages`)."""
    message: dict[str, Any] = {"role": "assistant", "content": output.content}
    if output.tool_calls:
        message["tool_calls"] = _tool_call_json(output)
    if output.reasoning:
        message["reasoning_content"] = output.reasoning
    return message


def _finish_reason(output: ModelOutput) -> str:
    if output.tool_calls and output.finish_reason != "length":
        return "tool_calls"
    return "length" if output.finish_reason == "length" else "stop"


def _logprobs(output: ModelOutput, tokenizer: Any) -> dict[str, Any] | None:
    if tokenizer is None or len(output.logprobs) != len(output.completion_ids):
        return None
    content = []
    for token_id, logprob in zip(output.completion_ids, output.logprobs, strict=True):
        token = tokenizer.decode([token_id], skip_special_tokens=False)
        content.append({"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []})
    return {"content": content}


def _usage(outputs: list[ModelOutput]) -> dict[str, int]:
    prompt = outputs[0].prompt_length if outputs else 0
    completion = sum(output.completion_length for output in outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_response(
    outputs: list[ModelOutput], messages: list[dict[str, Any]], model: str, tokenizer: Any, logprobs: bool
) -> dict[str, Any]:
    """A ``chat.completion`` object; ``messages[i]`` is choice ``i``'s :func:`assistant_message`."""
    choices = []
    for i, (output, message) in enumerate(zip(outputs, messages, strict=True)):
        shown = dict(message)
        if not shown["content"] and "tool_calls" in shown:
            shown["content"] = None
        choice = {"index": i, "message": shown, "finish_reason": _finish_reason(output), "logprobs": None}
        if logprobs:
            choice["logprobs"] = _logprobs(output, tokenizer)
        choices.append(choice)
    return {
        "id": f"chatcmpl-{secrets.token_hex(12)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _usage(outputs),
    }


def chat_chunks(response: dict[str, Any], include_usage: bool, sent: list[str] | None = None) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a finished response, as a stream sends them: per choice its role
    and content, its tool calls, then its finish reason; the usage last when asked for. ``sent``: the content each
    choice's stream already sent (role included, :mod:`rllm_gym.gateway.streaming`); only the rest follows."""
    base = {key: response[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    chunks = []
    for choice in response["choices"]:
        message, index = choice["message"], choice["index"]
        content = message["content"] or ""
        delta: dict[str, Any] = {"role": "assistant", "content": content}
        if sent is not None:
            done = sent[index]
            delta = {"content": content[len(done) :] if content.startswith(done) else ""}
        if "reasoning_content" in message:
            delta["reasoning_content"] = message["reasoning_content"]
        chunks.append({**base, "choices": [{"index": index, "delta": delta, "logprobs": choice["logprobs"]}]})
        if "tool_calls" in message:
            calls = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
            chunks.append({**base, "choices": [{"index": index, "delta": {"tool_calls": calls}}]})
        end = {"index": index, "delta": {}, "finish_reason": choice["finish_reason"]}
        chunks.append({**base, "choices": [end]})
    if include_usage:
        chunks.append({**base, "choices": [], "usage": response["usage"]})
    return chunks


def completion_response(outputs: list[ModelOutput], model: str, tokenizer: Any, logprobs: bool) -> dict[str, Any]:
    """A ``text_completion`` object; the text is the raw completion (reasoning and tool markup included)."""
    choices = []
    for i, output in enumerate(outputs):
        finish = "length" if output.finish_reason == "length" else "stop"
        choice: dict[str, Any] = {"index": i, "text": output.text, "finish_reason": finish}
        choice["logprobs"] = None
        if logprobs and tokenizer is not None and len(output.logprobs) == len(output.completion_ids):
            tokens = [tokenizer.decode([t], skip_special_tokens=False) for t in output.completion_ids]
            choice["logprobs"] = {"tokens": tokens, "token_logprobs": list(output.logprobs)}
        choices.append(choice)
    return {
        "id": f"cmpl-{secrets.token_hex(12)}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _usage(outputs),
    }
