"""Tools an agent can call, tool calls, and the parsers that read them out of model replies.

``Tool`` / ``@tool`` define tools, ``MultiTool`` dispatches parsed ``ToolCall`` s to them, and the parsers in
:mod:`rllm_gym.tools.parsers` turn model replies into calls and tool schemas into system prompts. Built-in tools:
``calculator``, ``search`` (BM25 over a shipped or user corpus), ``python`` (in the sandbox) and ``finish``.
"""

from __future__ import annotations

from rllm_gym.tools.base import FunctionTool, Tool, ToolOutput, function_schema, tool
from rllm_gym.tools.builtins import FinishTool, PythonTool
from rllm_gym.tools.calculator import CalculatorTool
from rllm_gym.tools.multi_tool import BUILTIN_TOOLS, MultiTool
from rllm_gym.tools.parsers import (
    PARSERS,
    HermesToolParser,
    JsonBlockToolParser,
    OpenAIToolParser,
    ParsedReply,
    ToolCallError,
    ToolParser,
    get_parser,
)
from rllm_gym.tools.search import SearchTool, load_corpus
from rllm_gym.types import ToolCall

__all__ = [
    "BUILTIN_TOOLS",
    "PARSERS",
    "CalculatorTool",
    "FinishTool",
    "FunctionTool",
    "HermesToolParser",
    "JsonBlockToolParser",
    "MultiTool",
    "OpenAIToolParser",
    "ParsedReply",
    "PythonTool",
    "SearchTool",
    "Tool",
    "ToolCall",
    "ToolCallError",
    "ToolOutput",
    "ToolParser",
    "function_schema",
    "get_parser",
    "load_corpus",
    "tool",
]
