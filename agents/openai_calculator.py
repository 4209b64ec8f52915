"""An agent program written with the ``openai`` client, as the README's gateway section shows it: a small calculator
agent with one tool (``add``), run by :mod:`rllm_gym.sdk` against a gateway session (``solve``) and scored by
``reward``.

A task is a dict ``{"question", "answer"}`` (a ``--data`` JSONL line) or an int seed, which :func:`make_task` turns
into an addition question. The program asks the model, runs the tool calls it makes and sends their results back,
until the model answers without a tool call or ``max_turns`` calls were made.

    rllm-gym eval --agent-program rllm_gym.agents.openai_calculator:solve \\
        --reward-fn rllm_gym.agents.openai_calculator:reward --tasks 8 --n 2
"""

from __future__ import annotations

import json
import random
from typing import Any

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def make_task(task: Any) -> dict:
    if isinstance(task, dict):
        return task
    rng = random.Random(task)
    a, b = rng.randint(1, 99), rng.randint(1, 99)
    return {"question": f"What is {a} + {b}?", "answer": a + b}


def run_tool(call: Any) -> str:
    """The tool's answer, or an error the model can read (malformed calls are normal input)."""
    if call.function.name != "add":
        return f"error: no tool named {call.function.name!r}; the only tool is add"
    try:
        arguments = json.loads(call.function.arguments)
        return str(int(arguments["a"]) + int(arguments["b"]))
    except (ValueError, KeyError, TypeError) as error:
        return f"error: add takes {{'a': int, 'b': int}} ({type(error).__name__}: {error})"


def solve(task: Any, base_url: str, max_turns: int = 4) -> str | None:
    task = make_task(task)
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages: list[dict] = [
        {"role": "system", "content": "Use the add tool, then answer with the number."},
        {"role": "user", "content": task["question"]},
    ]
    for _ in range(max_turns):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=64)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(call)})
    return None


def reward(task: Any, output: str | None) -> float:
    return float(output is not None and str(make_task(task)["answer"]) in output)
