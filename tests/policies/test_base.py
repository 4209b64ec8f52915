from __future__ import annotations

import re

import pytest

from rllm_gym.policies import SamplingParams, build_model_output, parse_hermes_tool_calls, split_reasoning
from rllm_gym.types import ToolCall


@pytest.mark.parametrize(
    ("text", "reasoning", "rest"),
    [
        ("plain answer", "", "plain answer"),
        ("<think>\nsteps\n</think>\n\nanswer", "steps", "\n\nanswer"),
        ("steps opened by the template</think>answer", "steps opened by the template", "answer"),
        ("<think>cut off by the length lim", "cut off by the length lim", ""),
        ("pre <think>x</think> post", "x", "pre  post"),
    ],
)
def test_split_reasoning(text, reasoning, rest):
    assert split_reasoning(text) == (reasoning, rest)


def test_hermes_tool_calls_are_parsed_and_removed():
    text = (
        'Checking.\n<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>{"name": "search", "arguments": "{\\"q\\": \\"gym\\"}"}</tool_call>'
    )
    rest, calls = parse_hermes_tool_calls(text)
    assert calls == [ToolCall(name="calc", arguments={"x": 1}), ToolCall(name="search", arguments={"q": "gym"})]
    assert rest.strip() == "Checking."


@pytest.mark.parametrize(
    "block",
    [
        "<tool_call>not json</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>',
        '<tool_call>{"name": "f", "arguments": "{broken"}</tool_call>',
    ],
)
def test_malformed_tool_calls_stay_in_the_text(block):
    assert parse_hermes_tool_calls(block) == (block, [])


def test_build_model_output_splits_everything():
    text = '<think>plan</think>Calling.<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    out = build_model_output(
        text, prompt_ids=[1, 2], completion_ids=[3, 4, 5], logprobs=[-1, -2, -3], finish_reason="stop"
    )
    assert (out.text, out.reasoning, out.content) == (text, "plan", "Calling.")
    assert out.tool_calls == [ToolCall(name="f")]
    assert out.finish_reason == "tool_calls"
    assert (out.prompt_length, out.completion_length) == (2, 3)
    # A reply cut by the length limit keeps "length" even if a call was complete.
    assert build_model_output(text, finish_reason="length").finish_reason == "length"


def test_sampling_params_validation_names_the_field():
    with pytest.raises(ValueError, match=re.escape("SamplingParams.temperature must be >= 0 (0 = greedy), got -1")):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match=re.escape("SamplingParams.top_p must be in (0, 1], got 0")):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match=re.escape("SamplingParams.top_k must be >= 1 or None (disabled), got 0")):
        SamplingParams(top_k=0)
    with pytest.raises(ValueError, match=re.escape("SamplingParams.max_tokens must be >= 1, got 0")):
        SamplingParams(max_tokens=0)


def test_sampling_params_normalise_stop_and_are_hashable():
    params = SamplingParams(stop="\n")
    assert params.stop == ("\n",)
    assert SamplingParams(stop=["a", "b"]) == SamplingParams(stop=("a", "b"))
    assert len({SamplingParams(), SamplingParams(), SamplingParams(seed=1)}) == 2
    assert params.to_dict()["stop"] == ["\n"]
