"""The tool abstraction: :class:`Tool` (a name, a description, a JSON-schema for its arguments and a ``forward``),
:class:`ToolOutput` (what a call returns, capped in size), and the :func:`tool` decorator that turns a typed,
docstringed Python function into a tool whose JSON schema is derived from its signature and docstring.

Calling a tool through ``tool(**kwargs)`` / ``await tool.acall(**kwargs)`` is the safe path every env uses: the
arguments are validated against the schema, exceptions become error outputs, and the output is truncated, so a
model's bad call never raises.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import os
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, get_type_hints, overload

import docstring_parser
import jsonschema
from pydantic import Field, create_model

from rllm_gym.types import Record, ToolCall

__all__ = [
    "DEFAULT_MAX_OUTPUT_CHARS",
    "FunctionTool",
    "Tool",
    "ToolCall",
    "ToolOutput",
    "function_schema",
    "tool",
    "tool_executor",
]

DEFAULT_MAX_OUTPUT_CHARS = 10_000
# OpenAI's rule for function names; Hermes/Qwen templates accept the same set.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_EXECUTOR_WORKERS = 16
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def tool_executor() -> ThreadPoolExecutor:
    """The threads that run sync forwards for async callers: created on first use, one pool per process.

    Not asyncio's default executor, so that a timed-out tool thread never blocks the shutdown of a short-lived event
    loop such as the one ``asyncio.run`` creates. Nothing is started at import, and a forked child starts its own
    pool (it inherits the parent's pool object but none of its threads, which would hang every submit).
    """
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=_EXECUTOR_WORKERS, thread_name_prefix="rllm-tool")
        return _executor


def _forget_executor_in_child() -> None:
    global _executor, _executor_lock
    _executor, _executor_lock = None, threading.Lock()  # the parent's lock may have been held by a thread at fork


os.register_at_fork(after_in_child=_forget_executor_in_child)


class ToolOutput(Record):
    """The result of one tool call: ``output`` on success, ``error`` (a message for the model) on failure.

    ``truncated`` says that the text was cut to the tool's ``max_output_chars``; ``metadata`` holds structured
    extras (sandbox status, search hit ids) that envs may put in ``info``.
    """

    name: str
    output: str = ""
    error: str | None = None
    call_id: str | None = None
    truncated: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_string(self) -> str:
        """The text a model sees: the output, or ``Error: <message>``."""
        return self.output if self.error is None else f"Error: {self.error}"

    def truncate(self, max_chars: int) -> ToolOutput:
        """A copy whose ``output`` and ``error`` hold at most ``max_chars`` characters (plus a marker)."""
        output, cut_output = _cut(self.output, max_chars)
        error, cut_error = _cut(self.error, max_chars) if self.error is not None else (None, False)
        if not (cut_output or cut_error):
            return self
        return self.model_copy(update={"output": output, "error": error, "truncated": True})


def _cut(text: str, max_chars: int) -> tuple[str, bool]:
    if len(text) <= max_chars:
        return text, False
    return f"{text[:max_chars]}\n... [truncated {len(text) - max_chars} characters]", True


def _to_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


_SCHEMA_PROBLEMS: dict[str, str | None] = {}  # repr of a schema -> why it is invalid (None: valid)
_SCHEMA_CACHE_SIZE = 1024


def _schema_problem(parameters: dict[str, Any]) -> str | None:
    """Why ``parameters`` is not a valid JSON schema, or None. The metaschema check took three quarters of building a
    Tool-v0 env (~0.7 ms a tool, four tools an env), so verdicts are kept by the schema's repr (which tells a tuple
    from a list and 1 from 1.0 or True)."""
    key = repr(parameters)
    if key in _SCHEMA_PROBLEMS:
        return _SCHEMA_PROBLEMS[key]
    try:
        jsonschema.Draft202012Validator.check_schema(parameters)
        problem = None
    except jsonschema.SchemaError as error:
        problem = error.message
    if len(_SCHEMA_PROBLEMS) < _SCHEMA_CACHE_SIZE:
        _SCHEMA_PROBLEMS[key] = problem
    return problem


class Tool(ABC):
    """A function a model can call: ``name``, ``description``, JSON-schema ``parameters``, and ``forward``.

    Subclasses implement :meth:`forward` (and may override :meth:`async_forward` when they have a native async
    path). Example::

        >>> class Echo(Tool):
        ...     def __init__(self):
        ...         super().__init__("echo", "Repeat the text.",
        ...                          {"type": "object", "properties": {"text": {"type": "string"}},
        ...                           "required": ["text"]})
        ...     def forward(self, text: str) -> ToolOutput:
        ...         return ToolOutput(name=self.name, output=text)
        >>> Echo()(text="hi").output
        'hi'
        >>> Echo()(text=3).error
        "invalid arguments for tool 'echo': 3 is not of type 'string' (at 'text')"
    """

    def __init__(
        self,
        name: str,
        description: str,
        parameters: dict[str, Any] | None = None,
        *,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        timeout: float | None = None,
    ):
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"tool name must match {_NAME.pattern} (letters, digits, _ and -), got {name!r}")
        parameters = {"type": "object", "properties": {}} if parameters is None else parameters
        if not isinstance(parameters, dict) or parameters.get("type") != "object":
            raise ValueError(
                f"tool {name!r} parameters must be a JSON schema of type 'object', e.g. "
                f"{{'type': 'object', 'properties': {{'x': {{'type': 'number'}}}}}}, got {parameters!r}"
            )
        problem = _schema_problem(parameters)
        if problem is not None:
            raise ValueError(f"tool {name!r} parameters are not a valid JSON schema: {problem}")
        if not isinstance(description, str):
            raise ValueError(f"tool {name!r} description must be a str, got {description!r}")
        if not isinstance(max_output_chars, int) or isinstance(max_output_chars, bool) or max_output_chars < 1:
            raise ValueError(f"tool {name!r} max_output_chars must be a positive int, got {max_output_chars!r}")
        if timeout is not None and not (
            isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0
        ):
            raise ValueError(f"tool {name!r} timeout must be a positive number of seconds or None, got {timeout!r}")
        self.name = name
        self.description = description or ""
        self.parameters = parameters
        self.max_output_chars = max_output_chars
        self.timeout = None if timeout is None else float(timeout)
        self._validator = jsonschema.Draft202012Validator(parameters)

    def __getstate__(self) -> dict[str, Any]:
        # The schema validator holds closures that the standard pickle cannot store; it is rebuilt on load.
        state = self.__dict__.copy()
        state.pop("_validator", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._validator = jsonschema.Draft202012Validator(self.parameters)

    @abstractmethod
    def forward(self, **kwargs: Any) -> ToolOutput:
        """Run the tool on validated arguments."""

    async def async_forward(self, **kwargs: Any) -> ToolOutput:
        """Run the tool without blocking the event loop (default: :meth:`forward` on a worker thread)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(tool_executor(), functools.partial(self.forward, **kwargs))

    @property
    def json_schema(self) -> dict[str, Any]:
        """The OpenAI / Hermes schema: ``{"type": "function", "function": {name, description, parameters}}``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def validate_arguments(self, arguments: Any) -> str | None:
        """None when ``arguments`` fit the schema, else a message that says exactly what is wrong."""
        if not isinstance(arguments, dict):
            return f"arguments for tool {self.name!r} must be a JSON object, got {type(arguments).__name__}"
        problems = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
        if not problems:
            return None
        messages = []
        for problem in problems[:5]:
            where = ".".join(str(part) for part in problem.absolute_path)
            messages.append(f"{problem.message} (at {where!r})" if where else problem.message)
        return f"invalid arguments for tool {self.name!r}: " + "; ".join(messages)

    def _finish(self, output: Any, call_id: str | None) -> ToolOutput:
        if not isinstance(output, ToolOutput):
            output = ToolOutput(name=self.name, output=_to_text(output))
        if call_id is not None and output.call_id != call_id:
            output = output.model_copy(update={"call_id": call_id})
        return output.truncate(self.max_output_chars)

    def _error(self, message: str, call_id: str | None) -> ToolOutput:
        return ToolOutput(name=self.name, error=message, call_id=call_id).truncate(self.max_output_chars)

    def __call__(self, *, _call_id: str | None = None, **kwargs: Any) -> ToolOutput:
        """Validate, run :meth:`forward`, turn exceptions into error outputs, truncate. Never raises."""
        problem = self.validate_arguments(kwargs)
        if problem is not None:
            return self._error(problem, _call_id)
        try:
            return self._finish(self.forward(**kwargs), _call_id)
        except Exception as error:  # a tool bug or bad input must reach the model as text, not crash the env
            return self._error(f"{type(error).__name__}: {error}", _call_id)

    async def acall(self, *, _call_id: str | None = None, timeout: float | None = None, **kwargs: Any) -> ToolOutput:
        """Async :meth:`__call__` with a timeout (``timeout`` or the tool's own); never raises."""
        problem = self.validate_arguments(kwargs)
        if problem is not None:
            return self._error(problem, _call_id)
        limit = timeout if timeout is not None else self.timeout
        try:
            output = await asyncio.wait_for(self.async_forward(**kwargs), limit)
        except TimeoutError:
            return self._error(f"tool {self.name!r} timed out after {limit:g} s", _call_id)
        except Exception as error:
            return self._error(f"{type(error).__name__}: {error}", _call_id)
        return self._finish(output, _call_id)

    def call(self, call: ToolCall) -> ToolOutput:
        """Run a parsed :class:`ToolCall` (its name is not checked here; :class:`MultiTool` dispatches by name)."""
        return self(_call_id=call.id, **call.arguments)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _strip_titles(schema: Any) -> Any:
    # Pydantic adds a "title" to every property; they repeat the names and cost prompt tokens.
    if isinstance(schema, dict):
        return {
            key: _strip_titles(value) for key, value in schema.items() if key != "title" or isinstance(value, dict)
        }
    if isinstance(schema, list):
        return [_strip_titles(item) for item in schema]
    return schema


def function_schema(function: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """``(description, parameters)`` for a typed function: the JSON schema comes from the annotations (through
    pydantic), the descriptions from the docstring (Google, NumPy or reST style).

    Every parameter needs a type annotation; ``*args``/``**kwargs`` are not allowed (a model calls with a JSON
    object of named arguments).
    """
    signature = inspect.signature(function)
    hints = get_type_hints(function)
    doc = docstring_parser.parse(inspect.getdoc(function) or "")
    param_docs = {param.arg_name: param.description or "" for param in doc.params}
    fields: dict[str, Any] = {}
    for name, param in signature.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"@tool function {function.__name__!r} cannot take *{name}: name every argument")
        if name not in hints:
            raise TypeError(
                f"@tool function {function.__name__!r} argument {name!r} needs a type annotation, e.g. {name}: str"
            )
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[name] = (hints[name], Field(default, description=param_docs.get(name) or None))
    model = create_model(f"{function.__name__}_arguments", **fields)
    parameters = _strip_titles(model.model_json_schema())
    parameters.setdefault("properties", {})
    description = "\n\n".join(part for part in (doc.short_description, doc.long_description) if part)
    return description, parameters


class FunctionTool(Tool):
    """A tool around a plain (sync or async) Python function; :func:`tool` builds these."""

    def __init__(
        self, function: Callable[..., Any], name: str | None = None, description: str | None = None, **kwargs
    ):
        doc_description, parameters = function_schema(function)
        super().__init__(name or function.__name__, description or doc_description, parameters, **kwargs)
        self.function = function
        self._is_async = inspect.iscoroutinefunction(function)
        functools.update_wrapper(self, function)

    def forward(self, **kwargs: Any) -> ToolOutput:
        if not self._is_async:
            return self._finish(self.function(**kwargs), None)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._finish(asyncio.run(self.function(**kwargs)), None)
        # Called synchronously from inside a running loop: run the coroutine on its own loop in a worker thread.
        return tool_executor().submit(lambda: asyncio.run(self.function(**kwargs))).result()

    async def async_forward(self, **kwargs: Any) -> ToolOutput:
        if self._is_async:
            return self._finish(await self.function(**kwargs), None)
        return await super().async_forward(**kwargs)


@overload
def tool(function: Callable[..., Any], /) -> FunctionTool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    max_output_chars: int = ...,
    timeout: float | None = ...,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...
def tool(function: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Turn a typed, docstringed function into a :class:`FunctionTool`; use as ``@tool`` or ``@tool(name=...)``.

    Example::

        >>> @tool
        ... def add(a: int, b: int = 0) -> int:
        ...     '''Add two integers.
        ...
        ...     Args:
        ...         a: The first addend.
        ...         b: The second addend.
        ...     '''
        ...     return a + b
        >>> add.parameters["properties"]["a"], add.parameters["required"]
        ({'description': 'The first addend.', 'type': 'integer'}, ['a'])
        >>> add(a=2, b=3).output, add(a="2").error
        ('5', "invalid arguments for tool 'add': '2' is not of type 'integer' (at 'a')")
    """
    if function is not None:
        return FunctionTool(function, **options)
    return lambda fn: FunctionTool(fn, **options)
