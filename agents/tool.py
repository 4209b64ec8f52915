"""The tool agent: tool schemas in the system prompt, tool calls out, tool results back in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rllm_gym.agents.base import BaseAgent
from rllm_gym.tools import MultiTool, ToolParser, get_parser
from rllm_gym.tools.parsers import tool_schemas
from rllm_gym.types import ModelOutput

__all__ = ["ToolAgent"]

INSTRUCTIONS = (
    "Answer the user's question. Use the tools when they help; when you know the answer, call finish with it "
    "(or reply without any tool call)."
)


class ToolAgent(BaseAgent):
    """Plays ``rllm/Tool-v0``: renders the tool schemas with the chosen parser into the system prompt and turns a
    model output's tool calls into action text in that parser's format.

    Calls an OpenAI-compatible server returned as structured ``tool_calls`` are rendered into the text, so the env
    sees them whichever backend produced them; tool results come back as the next user message. ``mcp_servers``
    (as for ``rllm/Tool-v0``) adds the schemas of those MCP servers' tools, read once when the agent is made.
    """

    name = "agent"

    def __init__(
        self,
        tools: Sequence[Any] | MultiTool = ("calculator", "search", "python", "finish"),
        parser: str | ToolParser = "hermes",
        *,
        instructions: str = INSTRUCTIONS,
        native_tools: bool = False,
        mcp_servers: Sequence[Any] = (),
        **kwargs: Any,
    ):
        self.parser = get_parser(parser)
        multi_tool = tools if isinstance(tools, MultiTool) else MultiTool(tools)
        schemas = tool_schemas(multi_tool)
        if mcp_servers:  # the same servers as the env's mcp_servers: their tools' schemas join the prompt
            from rllm_gym.tools.mcp import mcp_tool_schemas

            schemas += mcp_tool_schemas(mcp_servers)
        # With native_tools the schemas go to the server (tools=...) and its chat template renders them.
        self.tools_schema = schemas if native_tools else None
        kwargs.setdefault(
            "system_prompt", instructions if native_tools else f"{instructions}\n\n{self.parser.render_tools(schemas)}"
        )
        super().__init__(**kwargs)

    def parse_action(self, output: ModelOutput) -> str:
        text = output.content if output.reasoning or output.tool_calls else output.text
        if output.tool_calls:
            calls = self.parser.render_calls(output.tool_calls)
            text = f"{text}\n{calls}" if text else calls
        return text
