from __future__ import annotations

import re

import pytest

from rllm_gym.policies import Policy, PolicyError, SamplingParams, ScriptedPolicy
from rllm_gym.types import ModelOutput, ToolCall

CHAT = [{"role": "user", "content": "hi"}]


async def test_replies_come_in_order_with_fake_ids_and_logprobs():
    policy = ScriptedPolicy(["first", "<think>hmm</think>second"])
    one = await policy.generate(CHAT)
    two = await policy.generate(CHAT)
    assert (one.content, two.content, two.reasoning) == ("first", "second", "hmm")
    assert one.completion_ids == list(b"first") and one.prompt_ids == list(b"hi")
    assert one.logprobs == [-0.5] * 5
    assert one.finish_reason == "stop"
    assert policy.calls == [CHAT, CHAT]
    assert isinstance(policy, Policy)


async def test_running_out_of_replies_is_a_clear_error_unless_cycling():
    policy = ScriptedPolicy(["only"])
    await policy.generate(CHAT)
    with pytest.raises(PolicyError, match=re.escape("ScriptedPolicy ran out of replies after 1 calls")):
        await policy.generate(CHAT)
    cycling = ScriptedPolicy(["a", "b"], cycle=True)
    assert [(await cycling.generate(CHAT)).text for _ in range(3)] == ["a", "b", "a"]


async def test_function_replies_sync_and_async():
    echo = ScriptedPolicy(lambda messages: f"you said {messages[-1]['content']}")
    assert (await echo.generate(CHAT)).content == "you said hi"

    async def reply(messages):
        return '<tool_call>{"name": "move", "arguments": {"dir": "left"}}</tool_call>'

    out = await ScriptedPolicy(reply).generate(CHAT)
    assert out.tool_calls == [ToolCall(name="move", arguments={"dir": "left"})]
    assert out.finish_reason == "tool_calls"


async def test_max_tokens_cuts_the_reply_like_a_model():
    out = await ScriptedPolicy(["abcdefgh"]).generate(CHAT, SamplingParams(max_tokens=3))
    assert (out.text, out.completion_ids, out.finish_reason) == ("abc", list(b"abc"), "length")


async def test_model_output_replies_pass_through_and_tokenizer_is_used(tiny_model_dir):
    from transformers import AutoTokenizer

    canned = ModelOutput(text="x", content="x", completion_ids=[5], logprobs=[-0.1])
    assert await ScriptedPolicy([canned]).generate(CHAT) is canned
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    out = await ScriptedPolicy(["The answer is 42."], tokenizer=tokenizer).generate(CHAT)
    assert out.completion_ids == tokenizer.encode("The answer is 42.", add_special_tokens=False)


def test_bad_scripts_are_rejected():
    with pytest.raises(TypeError, match=re.escape("takes a list of replies or a function, not a single string")):
        ScriptedPolicy("hello")
    with pytest.raises(ValueError, match=re.escape("ScriptedPolicy(replies=[]) has nothing to say")):
        ScriptedPolicy([])
