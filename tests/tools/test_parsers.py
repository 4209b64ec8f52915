"""Tests for rllm_gym/tools/parsers.py: each format's parsing, errors, rendering, fuzzing and render -> parse."""

from __future__ import annotations

import doctest
import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rllm_gym.tools import parsers
from rllm_gym.tools.multi_tool import MultiTool
from rllm_gym.tools.parsers import (
    PARSERS,
    HermesToolParser,
    JsonBlockToolParser,
    OpenAIToolParser,
    ParsedReply,
    ToolParser,
    get_parser,
)
from rllm_gym.types import ModelOutput, ToolCall

ALL = [HermesToolParser(), JsonBlockToolParser(), OpenAIToolParser()]


def test_module_doctests_pass():  # includes the runnable ToolParser extension example
    assert doctest.testmod(parsers).failed == 0


def test_get_parser():
    assert isinstance(get_parser("qwen"), HermesToolParser)
    parser = JsonBlockToolParser()
    assert get_parser(parser) is parser
    with pytest.raises(ValueError, match=re.escape("unknown tool parser 'hermse'. Did you mean 'hermes'?")):
        get_parser("hermse")
    assert set(PARSERS) == {"hermes", "qwen", "json", "openai"}


# Hermes / Qwen


def test_hermes_several_calls_and_content():
    text = (
        "Let me compute both.\n"
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>\n'
        '<tool_call>{"name": "search", "arguments": {"query": "a </tool_call> inside"}}</tool_call>'
    )
    reply = HermesToolParser().parse_with_errors(text)
    assert reply.calls == [
        ToolCall(name="calculator", arguments={"expression": "2+2"}),
        ToolCall(name="search", arguments={"query": "a </tool_call> inside"}),
    ]
    assert reply.errors == [] and reply.content == "Let me compute both."


def test_hermes_tolerates_a_missing_final_close_tag_and_string_arguments():
    text = '<tool_call>\n{"name": "finish", "arguments": "{\\"response\\": \\"7\\"}"}\n'
    assert HermesToolParser().parse(text) == [ToolCall(name="finish", arguments={"response": "7"})]


@pytest.mark.parametrize(
    ("text", "kind", "message"),
    [
        (
            "<tool_call>{name: 'calc'}</tool_call>",
            "invalid_json",
            "invalid JSON inside <tool_call>: Expecting property name enclosed in double quotes at character 1",
        ),
        (
            '<tool_call>{"name": "calc", "arguments": {"x": 1}</tool_call>',
            "invalid_json",
            "invalid JSON inside <tool_call>: Expecting ',' delimiter at character 38",
        ),
        (
            '<tool_call>{"arguments": {}}</tool_call>',
            "invalid_call",
            'missing "name" (a non-empty string): expected {"name": "<tool>", "arguments": {...}}',
        ),
        (
            '<tool_call>["calc"]</tool_call>',
            "invalid_call",
            'expected {"name": "<tool>", "arguments": {...}}, got a JSON array',
        ),
        (
            '<tool_call>{"name": "calc", "arguments": [1]}</tool_call>',
            "invalid_call",
            "\"arguments\" of 'calc' must be a JSON object, got a JSON array",
        ),
        (
            '<tool_call>{"name": "calc", "arguments": "{bad"}</tool_call>',
            "invalid_json",
            "the arguments of 'calc' are a string that is not valid JSON",
        ),
        (
            '<tool_call>{"name": "calc"} trailing</tool_call>',
            "invalid_json",
            "unexpected text after the JSON object in <tool_call>: 'trailing'",
        ),
    ],
)
def test_hermes_malformed_calls_say_what_is_wrong(text, kind, message):
    reply = HermesToolParser().parse_with_errors(text)
    assert reply.calls == []
    assert reply.errors[0].kind == kind
    assert reply.errors[0].message.startswith(message)


def test_hermes_good_call_after_a_bad_one_is_kept():
    text = '<tool_call>{oops</tool_call><tool_call>{"name": "a", "arguments": {}}</tool_call>'
    reply = HermesToolParser().parse_with_errors(text)
    assert [e.index for e in reply.errors] == [0]
    assert reply.calls == [ToolCall(name="a")]


def test_hermes_render_tools_has_the_structure_qwen_models_expect():
    prompt = HermesToolParser().render_tools(MultiTool(["calculator"]))
    assert prompt.startswith("# Tools\n\n")
    body = prompt.split("<tools>\n")[1].split("\n</tools>")[0]
    assert json.loads(body)["function"]["name"] == "calculator"
    assert prompt.endswith('<tool_call>\n{"name": "<function name>", "arguments": {<the arguments>}}\n</tool_call>')


def test_hermes_render_results_as_tool_responses():
    from rllm_gym.tools.base import ToolOutput

    text = HermesToolParser().render_results([ToolOutput(name="a", output="1"), ToolOutput(name="b", error="bad")])
    assert text == "<tool_response>\n1\n</tool_response>\n<tool_response>\nError: bad\n</tool_response>"


# JSON in fenced blocks


def test_json_blocks_object_list_and_other_fences():
    text = (
        "I will run two tools.\n```json\n"
        '[{"name": "calculator", "arguments": {"expression": "1+1"}}, '
        '{"name": "finish", "parameters": {"response": "2"}}]'
        "\n```\nAnd some code that is not a call:\n```python\nprint({'name': 1})\n```\n"
        '```\n{"name": "search", "arguments": {"query": "q"}}\n```'
    )
    reply = JsonBlockToolParser().parse_with_errors(text)
    assert [c.name for c in reply.calls] == ["calculator", "finish", "search"]
    assert reply.calls[1].arguments == {"response": "2"}
    assert "```python" in reply.content and "calculator" not in reply.content


def test_json_block_errors():
    reply = JsonBlockToolParser().parse_with_errors('```json\n{"name": "a", "arguments": {,}}\n```')
    assert (
        reply.errors[0].message
        == "invalid JSON in the ```json block: Expecting property name enclosed in double quotes at line 1 column 29"
    )
    reply = JsonBlockToolParser().parse_with_errors('```json\n{"answer": 3}\n```')
    assert reply.errors[0].kind == "invalid_call"


# OpenAI


def test_openai_structured_tool_calls_from_model_output():
    calls = [ToolCall(name="calculator", arguments={"expression": "3"}, id="call_a")]
    output = ModelOutput(text="", content="thinking aloud", tool_calls=calls, finish_reason="tool_calls")
    reply = OpenAIToolParser().parse_with_errors(output)
    assert reply.calls == calls and reply.content == "thinking aloud"
    # Text parsers also prefer calls a backend already structured.
    assert HermesToolParser().parse(output) == calls


def test_openai_wire_text_and_plain_content():
    wire = json.dumps(
        {
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"query": "bridge"}'}},
                {"id": "c2", "type": "function", "function": {"name": "search", "arguments": "{not json"}},
            ],
        }
    )
    reply = OpenAIToolParser().parse_with_errors(wire)
    assert reply.calls == [ToolCall(name="search", arguments={"query": "bridge"}, id="c1")]
    assert reply.errors[0].message.startswith("the arguments of 'search' are a string that is not valid JSON")
    assert OpenAIToolParser().parse_with_errors("The answer is 42.") == ParsedReply(content="The answer is 42.")
    assert OpenAIToolParser().parse_with_errors('{"answer": 42}').calls == []
    schemas = json.loads(OpenAIToolParser().render_tools(MultiTool(["finish"])))
    assert schemas[0]["type"] == "function" and schemas[0]["function"]["name"] == "finish"


def test_non_text_reply_is_an_error_not_an_exception():
    for parser in ALL:
        reply = parser.parse_with_errors(12345)  # type: ignore[arg-type]
        assert reply.errors[0].kind == "invalid_input"
        assert reply.errors[0].message == "a reply must be text, got int"


def test_a_crashing_custom_parser_becomes_a_parser_error():
    class Crashing(ToolParser):
        def _parse(self, text):
            raise KeyError("boom")

        def render_tools(self, tools):
            return ""

        def render_calls(self, calls):
            return ""

    reply = Crashing().parse_with_errors("hello")
    assert reply.errors[0].kind == "parser_error"
    assert reply.errors[0].message == "could not parse the reply (KeyError: 'boom')"


# Property tests

_json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
)
_json_values = st.recursive(
    _json_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)
_calls = st.builds(
    ToolCall,
    name=st.text(min_size=1, max_size=20).filter(str.strip),
    arguments=st.dictionaries(st.text(max_size=10), _json_values, max_size=4),
)
_fragments = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "```json\n",
        "```",
        "\n",
        "{",
        "}",
        "[",
        "]",
        '"name"',
        '"arguments"',
        ":",
        ",",
        '"',
        "\\",
        "null",
        '{"name": "a", "arguments": {}}',
        "\x00",
        "\ud7ff",
        '"tool_calls"',
        '"function"',
    ]
)
_adversarial = st.lists(_fragments | st.text(max_size=8), max_size=30).map("".join)


@pytest.mark.parametrize("parser", ALL, ids=lambda p: p.name)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200) | _adversarial)
def test_no_exception_escapes_any_parser(parser, text):
    reply = parser.parse_with_errors(text)
    assert isinstance(reply, ParsedReply)
    assert all(isinstance(call, ToolCall) and isinstance(call.arguments, dict) for call in reply.calls)
    assert all(error.message for error in reply.errors)
    assert parser.parse(text) == reply.calls


def _key(call: ToolCall) -> tuple[str, str]:
    return call.name, json.dumps(call.arguments, sort_keys=True)


@pytest.mark.parametrize("parser", ALL, ids=lambda p: p.name)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    calls=st.lists(_calls, min_size=1, max_size=3), prefix=st.sampled_from(["", "Let me check.\n", "Thinking...\n\n"])
)
def test_valid_calls_round_trip_render_then_parse(parser, calls, prefix):
    reply = parser.parse_with_errors(
        parser.render_calls(calls) if parser.name == "openai" else prefix + parser.render_calls(calls)
    )
    assert reply.errors == []
    assert [_key(c) for c in reply.calls] == [_key(c) for c in calls]
    if parser.name == "hermes":
        assert reply.content == prefix.strip()


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_arguments_nested_past_the_limit_are_a_malformed_call_in_text_and_in_parsed_tool_calls(name):
    deep = "[" * 300 + "]" * 300  # json.loads reads it; serializing the call would fail past ~250 levels
    parser = get_parser(name)
    call = ToolCall(name="calculator", arguments={"expression": "2+2", "x": json.loads(deep)})
    text = parser.render_calls([ToolCall(name="calculator", arguments={"expression": "2+2", "x": []})])
    for reply in (text.replace("[]", deep), ModelOutput(tool_calls=[ToolCall(name="calculator"), call])):
        parsed = parser.parse_with_errors(reply)
        assert [error.kind for error in parsed.errors] == ["invalid_call"]
        assert parsed.errors[0].message == "the arguments of 'calculator' nest more than 64 levels deep"
    assert parsed.errors[0].index == 1 and parsed.calls == [ToolCall(name="calculator")]
    at_limit = {"x": json.loads("[" * 63 + "]" * 63)}  # the arguments object is the first level
    assert parser.parse_with_errors(ModelOutput(tool_calls=[ToolCall(name="c", arguments=at_limit)])).errors == []
