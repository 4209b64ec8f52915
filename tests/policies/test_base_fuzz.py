"""Property tests for the completion splitters every policy shares: reasoning, Hermes tool calls, ModelOutput."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from rllm_gym.policies import build_model_output, parse_hermes_tool_calls, split_reasoning
from rllm_gym.types import ModelOutput, ToolCall

_fragments = st.sampled_from(
    [
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        '{"name": "f", "arguments": {}}',
        '{"name": "g", "arguments": "{\\"x\\": 1}"}',
        '{"name": 3}',
        '"arguments"',
        "{",
        "}",
        "\n",
        " ",
        "\x00",
        "\ud7ff",
        "\U0001f600",
    ]
)
_completions = st.text(max_size=200) | st.lists(_fragments | st.text(max_size=6), max_size=30).map("".join)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=6,
)
_calls = st.builds(
    ToolCall,
    # A blank name calls no tool: the one Hermes parser (tools.parsers) rejects it as malformed.
    name=st.text(min_size=1, max_size=15).filter(str.strip),
    arguments=st.dictionaries(st.text(max_size=8), _json_values, max_size=3),
)


@settings(max_examples=400, deadline=None)
@given(text=_completions)
def test_split_reasoning_keeps_every_character_outside_the_tags(text):
    reasoning, rest = split_reasoning(text)
    assert isinstance(reasoning, str) and isinstance(rest, str)
    assert len(reasoning) + len(rest) <= len(text)
    if "<think>" not in text and "</think>" not in text:
        assert (reasoning, rest) == ("", text)
    # rest is the text with one span (the tags and the reasoning between them) cut out: a prefix plus a suffix.
    assert any(rest == text[:i] + text[len(text) - len(rest) + i :] for i in range(len(rest) + 1))
    assert reasoning.strip() == reasoning


@settings(max_examples=300, deadline=None)
@given(reasoning=st.text(max_size=80), answer=st.text(max_size=80))
def test_split_reasoning_round_trips_a_think_block(reasoning, answer):
    if "<think>" in reasoning + answer or "</think>" in reasoning + answer:
        return
    assert split_reasoning(f"<think>{reasoning}</think>{answer}") == (reasoning.strip(), answer)
    assert split_reasoning(f"{reasoning}</think>{answer}") == (reasoning.strip(), answer)


@settings(max_examples=400, deadline=None)
@given(text=_completions)
def test_parse_hermes_tool_calls_never_raises_and_only_removes_what_it_parsed(text):
    rest, calls = parse_hermes_tool_calls(text)
    assert all(isinstance(call, ToolCall) and isinstance(call.arguments, dict) for call in calls)
    assert len(rest) <= len(text)
    assert rest.count("<tool_call>") == text.count("<tool_call>") - len(calls)


@settings(max_examples=300, deadline=None)
@given(calls=st.lists(_calls, min_size=1, max_size=3), prefix=st.text(max_size=40))
def test_hermes_calls_round_trip(calls, prefix):
    if "<tool_call>" in prefix or "</tool_call>" in prefix:
        return
    blocks = "".join(
        f"<tool_call>\n{json.dumps({'name': c.name, 'arguments': c.arguments})}\n</tool_call>" for c in calls
    )
    rest, parsed = parse_hermes_tool_calls(prefix + blocks)
    assert rest == prefix
    assert [(c.name, c.arguments) for c in parsed] == [(c.name, c.arguments) for c in calls]


@settings(max_examples=300, deadline=None)
@given(text=_completions, finish=st.sampled_from([None, "stop", "length"]))
def test_build_model_output_is_a_valid_model_output_for_any_completion(text, finish):
    out = build_model_output(text, finish_reason=finish)
    assert isinstance(out, ModelOutput)
    assert out.text == text and out.content == out.content.strip()
    if out.tool_calls:
        assert out.finish_reason == ("length" if finish == "length" else "tool_calls")
    else:
        assert out.finish_reason == finish
    assert ModelOutput.model_validate(out.model_dump()) == out  # survives the episode file round trip
