"""Tool-call parsers: read the tool calls out of a model reply, and write tool schemas and calls in the form a model
family was trained on.

:class:`ToolParser` is the extension point; the built-in formats are Hermes/Qwen ``<tool_call>{json}</tool_call>``
(:class:`HermesToolParser`), OpenAI-style structured ``tool_calls`` (:class:`OpenAIToolParser`) and JSON in a fenced
code block (:class:`JsonBlockToolParser`). Parsing never raises: a malformed call becomes a :class:`ToolCallError`
that says exactly what was wrong, which envs show the model as an observation.
"""

from __future__ import annotations

import difflib
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import Field

from rllm_gym.tools.base import Tool, ToolOutput
from rllm_gym.tools.multi_tool import MultiTool
from rllm_gym.types import ModelOutput, Record, ToolCall

__all__ = [
    "MAX_ARGUMENT_DEPTH",
    "PARSERS",
    "HermesToolParser",
    "JsonBlockToolParser",
    "OpenAIToolParser",
    "ParsedReply",
    "ToolCallError",
    "ToolParser",
    "get_parser",
    "tool_schemas",
]

_QUOTE = 120  # characters of a malformed call quoted back to the model
# Levels of nesting a call's arguments may have (the arguments object is level 1). Far more than any tool's schema
# uses; past ~250 pydantic refuses to serialize the call, so deeper arguments ended the env's step with an error.
MAX_ARGUMENT_DEPTH = 64


class ToolCallError(Record):
    """One malformed tool call: which one (``index``, 0-based in the reply), what kind of problem, the message for
    the model, and the offending text. ``kind`` is one of ``invalid_json``, ``invalid_call`` (not a
    ``{"name", "arguments"}`` object, or arguments nested more than :data:`MAX_ARGUMENT_DEPTH` levels deep, in text
    or in a backend's parsed ``tool_calls``), ``invalid_input`` (the reply is not text) or ``parser_error``."""

    index: int
    kind: str
    message: str
    text: str = ""


class ParsedReply(Record):
    """A parsed reply: the well-formed ``calls``, ``errors`` for malformed ones, and the ``content`` around them."""

    calls: list[ToolCall] = Field(default_factory=list)
    errors: list[ToolCallError] = Field(default_factory=list)
    content: str = ""


def tool_schemas(tools: Any) -> list[dict[str, Any]]:
    """``{"type": "function", "function": {...}}`` schemas from Tools, a MultiTool, or schema dicts (either form)."""
    items = tools.tools.values() if isinstance(tools, MultiTool) else tools
    schemas = []
    for item in items:
        if isinstance(item, Tool):
            schemas.append(item.json_schema)
        elif isinstance(item, dict) and item.get("type") == "function" and "function" in item:
            schemas.append(item)
        elif isinstance(item, dict) and "name" in item:
            schemas.append({"type": "function", "function": item})
        else:
            raise TypeError(f"cannot render {item!r} as a tool: pass Tool objects or {{'name', 'parameters'}} dicts")
    return schemas


def _quote(text: str) -> str:
    return text if len(text) <= _QUOTE else text[: _QUOTE - 3] + "..."


def _call_from_json(obj: Any, index: int, raw: str) -> ToolCall | ToolCallError:
    """A ToolCall from a decoded ``{"name": ..., "arguments": {...}}`` object (``parameters`` is accepted for
    ``arguments``, as Llama models write it; ``arguments`` may also be a JSON-encoded string, as OpenAI sends it)."""
    shape = 'expected {"name": "<tool>", "arguments": {...}}'
    if not isinstance(obj, dict):
        return ToolCallError(
            index=index, kind="invalid_call", message=f"{shape}, got a JSON {_json_type(obj)}", text=_quote(raw)
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCallError(
            index=index, kind="invalid_call", message=f'missing "name" (a non-empty string): {shape}', text=_quote(raw)
        )
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (json.JSONDecodeError, RecursionError) as error:
            return ToolCallError(
                index=index,
                kind="invalid_json",
                text=_quote(raw),
                message=f"the arguments of {name!r} are a string that is not valid JSON: {error}",
            )
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return ToolCallError(
            index=index,
            kind="invalid_call",
            text=_quote(raw),
            message=f'"arguments" of {name!r} must be a JSON object, got a JSON {_json_type(arguments)}',
        )
    if _nested_deeper_than(arguments, MAX_ARGUMENT_DEPTH):
        return _too_deep(name, index, raw)
    call_id = obj.get("id")
    return ToolCall(name=name, arguments=arguments, id=call_id if isinstance(call_id, str) else None)


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether objects and arrays nest in ``value`` more than ``limit`` levels deep (found without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, (list, tuple)) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _too_deep(name: str, index: int, raw: str) -> ToolCallError:
    return ToolCallError(
        index=index,
        kind="invalid_call",
        text=_quote(raw),
        message=f"the arguments of {name!r} nest more than {MAX_ARGUMENT_DEPTH} levels deep",
    )


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


class ToolParser(ABC):
    """Reads tool calls out of model replies and writes tools and calls in one model family's format.

    Subclass it and implement :meth:`_parse`, :meth:`render_tools` and :meth:`render_calls`; :meth:`parse` and
    :meth:`parse_with_errors` never raise (an exception in ``_parse`` becomes a ``parser_error``). Example, a format
    with one ``CALL <name> <json arguments>`` per line::

        >>> class LineParser(ToolParser):
        ...     name = "line"
        ...     def _parse(self, text):
        ...         reply = ParsedReply(content=text)
        ...         for i, line in enumerate(l for l in text.splitlines() if l.startswith("CALL ")):
        ...             _, tool_name, arguments = line.split(" ", 2)
        ...             reply.calls.append(ToolCall(name=tool_name, arguments=json.loads(arguments)))
        ...         return reply
        ...     def render_tools(self, tools):
        ...         return "\\n".join(s["function"]["name"] for s in tool_schemas(tools))
        ...     def render_calls(self, calls):
        ...         return "\\n".join(f"CALL {c.name} {json.dumps(c.arguments)}" for c in calls)
        >>> LineParser().parse('Let me compute.\\nCALL calculator {"expression": "6*7"}')
        [ToolCall(name='calculator', arguments={'expression': '6*7'}, id=None)]
        >>> LineParser().parse_with_errors("CALL calculator {oops").errors[0].kind
        'parser_error'
    """

    name: ClassVar[str] = ""

    def parse(self, output: str | ModelOutput) -> list[ToolCall]:
        """The well-formed tool calls in ``output`` (malformed ones are dropped; see :meth:`parse_with_errors`)."""
        return self.parse_with_errors(output).calls

    def parse_with_errors(self, output: str | ModelOutput) -> ParsedReply:
        """Calls, errors for malformed calls, and the remaining content. Never raises."""
        if isinstance(output, ModelOutput):
            return self._guard(self._parse_model_output, output)
        if not isinstance(output, str):
            message = f"a reply must be text, got {type(output).__name__}"
            return ParsedReply(errors=[ToolCallError(index=0, kind="invalid_input", message=message)])
        return self._guard(self._parse, output)

    def _guard(self, parse: Any, output: Any) -> ParsedReply:
        try:
            return parse(output)
        except Exception as error:  # a parser bug or pathological input must not crash the env
            text = output if isinstance(output, str) else output.text
            message = f"could not parse the reply ({type(error).__name__}: {error})"
            return ParsedReply(
                errors=[ToolCallError(index=0, kind="parser_error", message=message, text=_quote(text))], content=text
            )

    def _parse_model_output(self, output: ModelOutput) -> ParsedReply:
        """Text formats parse the text; a backend that already parsed calls (``output.tool_calls``) wins."""
        if output.tool_calls:
            reply = ParsedReply(content=output.content)
            for index, call in enumerate(output.tool_calls):
                if _nested_deeper_than(call.arguments, MAX_ARGUMENT_DEPTH):  # as a text call's arguments are checked
                    reply.errors.append(_too_deep(call.name, index, call.name))
                else:
                    reply.calls.append(call)
            return reply
        return self._parse(output.text or output.content)

    @abstractmethod
    def _parse(self, text: str) -> ParsedReply:
        """Parse one reply's text."""

    @abstractmethod
    def render_tools(self, tools: Any) -> str:
        """The tools' schemas as the system-prompt text this format expects."""

    @abstractmethod
    def render_calls(self, calls: Sequence[ToolCall]) -> str:
        """``calls`` as the reply text a model of this family would write; :meth:`parse` reads it back."""

    def render_results(self, outputs: Sequence[ToolOutput]) -> str:
        """Tool outputs as the text the model sees next (one block per call, in call order)."""
        return "\n\n".join(f"[{out.name}] {out.to_string()}" for out in outputs)


class HermesToolParser(ToolParser):
    """Hermes / Qwen2.5 / Qwen3 format: each call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    Several calls per reply are allowed. The JSON is decoded in place (so ``</tool_call>`` inside a string argument
    is harmless) and a missing closing tag at the very end of the reply is tolerated, as generation often stops on it.
    """

    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    _decoder = json.JSONDecoder()

    def blocks(self, text: str) -> list[tuple[int, int, ToolCall | ToolCallError]]:
        """Every ``<tool_call>`` block of ``text`` in order: ``(start, end, call or error)``, where ``text[start:end]``
        is the block (its closing tag included when there is one). Never raises."""
        found: list[tuple[int, int, ToolCall | ToolCallError]] = []
        position = 0
        while (start := text.find(self.OPEN, position)) != -1:
            body_start = start + len(self.OPEN)
            close = text.find(self.CLOSE, body_start)
            call, position = self._decode_at(text, body_start, close, len(found))
            found.append((start, position, call))
        return found

    def _parse(self, text: str) -> ParsedReply:
        reply = ParsedReply()
        content: list[str] = []
        position = 0
        for start, end, call in self.blocks(text):
            content.append(text[position:start])
            (reply.calls if isinstance(call, ToolCall) else reply.errors).append(call)
            position = end
        content.append(text[position:])
        reply.content = "".join(content).strip()
        return reply

    def _decode_at(self, text: str, start: int, close: int, index: int) -> tuple[ToolCall | ToolCallError, int]:
        """Decode the JSON after ``<tool_call>``; return the call (or error) and where parsing resumes."""
        body_end = close if close != -1 else len(text)
        after_close = close + len(self.CLOSE) if close != -1 else len(text)
        begin = start + len(text[start:body_end]) - len(text[start:body_end].lstrip())
        raw = text[start:body_end].strip()
        try:
            obj, end = self._decoder.raw_decode(text, begin)
        except (json.JSONDecodeError, RecursionError) as error:
            detail = error.msg if isinstance(error, json.JSONDecodeError) else "nested too deeply"
            where = f" at character {error.pos - begin}" if isinstance(error, json.JSONDecodeError) else ""
            message = f"invalid JSON inside <tool_call>: {detail}{where}"
            return ToolCallError(index=index, kind="invalid_json", message=message, text=_quote(raw)), after_close
        rest = text[end:]
        stripped = rest.lstrip()
        if stripped.startswith(self.CLOSE):
            resume = end + (len(rest) - len(stripped)) + len(self.CLOSE)
        elif not stripped or stripped.startswith(self.OPEN):
            resume = end  # closing tag omitted at the end of the reply or before the next call
        else:
            message = (
                f"unexpected text after the JSON object in <tool_call>: {_quote(stripped.split(self.CLOSE)[0])!r}"
            )
            return ToolCallError(index=index, kind="invalid_json", message=message, text=_quote(raw)), after_close
        return _call_from_json(obj, index, raw), resume

    def render_tools(self, tools: Any) -> str:
        # The structure (a "# Tools" section, one JSON schema per line inside <tools>, calls as JSON inside
        # <tool_call>) is the one Hermes and Qwen models were trained on; the wording is ours.
        lines = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in tool_schemas(tools))
        return (
            "# Tools\n\nThese functions are available to help you answer; call as many as you need.\n\n"
            "Their signatures, as JSON schemas, are inside <tools></tools> tags:\n"
            f"<tools>\n{lines}\n</tools>\n\n"
            "To call a function, write its name and arguments as a JSON object between "
            f"{self.OPEN} and {self.CLOSE} tags, one block per call:\n{self.OPEN}\n"
            '{"name": "<function name>", "arguments": {<the arguments>}}\n'
            f"{self.CLOSE}"
        )

    def render_calls(self, calls: Sequence[ToolCall]) -> str:
        return "\n".join(
            f"{self.OPEN}\n{json.dumps({'name': c.name, 'arguments': c.arguments}, ensure_ascii=False)}\n{self.CLOSE}"
            for c in calls
        )

    def render_results(self, outputs: Sequence[ToolOutput]) -> str:
        return "\n".join(f"<tool_response>\n{out.to_string()}\n</tool_response>" for out in outputs)


class JsonBlockToolParser(ToolParser):
    """Calls as JSON in fenced code blocks: a ```` ```json ```` (or ```` ```tool_call ````, or unlabelled) block
    holding one ``{"name", "arguments"}`` object or a list of them. Other blocks (```` ```python ```` ...) are
    content. Rendering escapes backticks inside the JSON (``\\u0060``) so a fence can never close early."""

    name = "json"
    _FENCE = re.compile(r"```([A-Za-z0-9_-]*)[ \t]*\n(.*?)```", re.DOTALL)
    _LABELS = frozenset({"json", "tool_call", "tool_calls"})

    def _parse(self, text: str) -> ParsedReply:
        reply = ParsedReply()
        content: list[str] = []
        position = 0
        for match in self._FENCE.finditer(text):
            label, body = match.group(1).lower(), match.group(2)
            if label not in self._LABELS and not (label == "" and body.lstrip()[:1] in ("{", "[")):
                continue
            content.append(text[position : match.start()])
            position = match.end()
            index = len(reply.calls) + len(reply.errors)
            try:
                obj = json.loads(body)
            except (json.JSONDecodeError, RecursionError) as error:
                detail = (
                    f"{error.msg} at line {error.lineno} column {error.colno}"
                    if isinstance(error, json.JSONDecodeError)
                    else "nested too deeply"
                )
                reply.errors.append(
                    ToolCallError(
                        index=index,
                        kind="invalid_json",
                        text=_quote(body.strip()),
                        message=f"invalid JSON in the ```{label} block: {detail}",
                    )
                )
                continue
            for item in obj if isinstance(obj, list) else [obj]:
                call = _call_from_json(item, len(reply.calls) + len(reply.errors), body.strip())
                (reply.calls if isinstance(call, ToolCall) else reply.errors).append(call)
        content.append(text[position:])
        reply.content = "".join(content).strip()
        return reply

    def render_tools(self, tools: Any) -> str:
        return (
            "You can call these tools (JSON schemas):\n"
            f"{json.dumps(tool_schemas(tools), indent=2, ensure_ascii=False)}\n\n"
            "To call a tool, reply with a fenced ```json block holding "
            '{"name": "<tool name>", "arguments": {...}}, or a list of such objects to call several at once.'
        )

    def render_calls(self, calls: Sequence[ToolCall]) -> str:
        objects = [{"name": c.name, "arguments": c.arguments} for c in calls]
        body = json.dumps(objects[0] if len(objects) == 1 else objects, ensure_ascii=False).replace("`", "\\u0060")
        return f"```json\n{body}\n```"


class OpenAIToolParser(ToolParser):
    """OpenAI Chat Completions ``tool_calls``: read from ``ModelOutput.tool_calls`` (what an OpenAI-compatible server
    returns, already structured), or from text holding the wire form ``[{"id", "type": "function", "function":
    {"name", "arguments": "<json string>"}}]`` (or ``{"tool_calls": [...]}``). Text that is not such JSON is plain
    content (a final answer), not an error. ``render_tools`` gives the JSON list passed as ``tools=`` to the API."""

    name = "openai"

    def _parse(self, text: str) -> ParsedReply:
        stripped = text.strip()
        if not stripped.startswith(("[", "{")):
            return ParsedReply(content=text.strip())
        try:
            obj = json.loads(stripped)
        except (json.JSONDecodeError, RecursionError):
            return ParsedReply(content=text.strip())
        items = obj.get("tool_calls") if isinstance(obj, dict) else obj
        if not isinstance(items, list) or not all(
            isinstance(i, dict) and ("function" in i or "name" in i) for i in items
        ):
            return ParsedReply(content=text.strip())
        reply = ParsedReply(content=(obj.get("content") or "") if isinstance(obj, dict) else "")
        for item in items:
            index = len(reply.calls) + len(reply.errors)
            function = item.get("function", item)
            if isinstance(function, dict) and "id" in item:
                function = {**function, "id": item["id"]}
            call = _call_from_json(function, index, json.dumps(item, ensure_ascii=False))
            (reply.calls if isinstance(call, ToolCall) else reply.errors).append(call)
        return reply

    def render_tools(self, tools: Any) -> str:
        return json.dumps(tool_schemas(tools), ensure_ascii=False)

    def render_calls(self, calls: Sequence[ToolCall]) -> str:
        wire = [
            {
                "id": call.id or f"call_{i}",
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
            }
            for i, call in enumerate(calls)
        ]
        return json.dumps(wire, ensure_ascii=False)


PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "qwen": HermesToolParser,
    "json": JsonBlockToolParser,
    "openai": OpenAIToolParser,
}


def get_parser(parser: str | ToolParser) -> ToolParser:
    """A parser instance from a name in :data:`PARSERS` (or a ToolParser, returned as is)."""
    if isinstance(parser, ToolParser):
        return parser
    if isinstance(parser, str) and parser in PARSERS:
        return PARSERS[parser]()
    close = difflib.get_close_matches(str(parser), PARSERS, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown tool parser {parser!r}.{hint} Known parsers: {', '.join(PARSERS)}, or a ToolParser")
