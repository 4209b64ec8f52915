from __future__ import annotations

import re

import pytest

from rllm_gym.policies import Policy, SamplingParams, build_model_output, parse_hermes_tool_calls, split_reasoning
from rllm_gym.policies.base import BasePolicy, PolicyRequest
from rllm_gym.tools.parsers import HermesToolParser
from rllm_gym.types import ModelOutput, ToolCall


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
        '<tool_call>{"name": " ", "arguments": {}}</tool_call>',  # blank: the shared parser's rule (tools.parsers)
        '<tool_call>{"name": "f"} trailing</tool_call>',
    ],
)
def test_malformed_tool_calls_stay_in_the_text(block):
    assert parse_hermes_tool_calls(block) == (block, [])


def test_the_policy_parser_is_the_tools_hermes_parser():
    # One Hermes parser: a "</tool_call>" inside a JSON string and a closing tag left off at the end of the reply are
    # the tool parser's rules, which the policy's old regex got wrong (it cut the JSON at the inner tag).
    text = 'A<tool_call>{"name": "echo", "arguments": {"s": "</tool_call>"}}</tool_call>B<tool_call>{"name": "f"}'
    rest, calls = parse_hermes_tool_calls(text)
    assert calls == [ToolCall(name="echo", arguments={"s": "</tool_call>"}), ToolCall(name="f")]
    assert rest == "AB"
    assert calls == HermesToolParser().parse(text)


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


class _Recorder(BasePolicy):
    """A backend that answers with the prompt ids it would send."""

    def __init__(self, tokenizer=None, **kwargs):
        super().__init__(tokenizer, **kwargs)
        self.requests: list[PolicyRequest] = []

    async def _generate(self, request: PolicyRequest) -> ModelOutput:
        self.requests.append(request)
        return build_model_output("ok", prompt_ids=self.prompt_token_ids(request), finish_reason="stop")


class _Template:
    """A tokenizer stand-in: the ids are the lengths of the messages' contents, plus one id per template option."""

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=False, tokenize=True, **kwargs):
        assert add_generation_prompt and tokenize and kwargs.pop("return_dict") is False
        return [len(m["content"]) for m in messages] + [len(tools or [])] + sorted(kwargs.values())


async def test_base_policy_checks_requests_fills_defaults_and_renders_prompts():
    policy = _Recorder(_Template(), enable_thinking=False, chat_template_kwargs={"flag": 7})
    assert policy.template_kwargs == {"flag": 7, "enable_thinking": False}
    out = await policy.generate([{"role": "user", "content": "four"}], tools=[{"name": "f"}])
    assert out.prompt_ids == [4, 1, False, 7]
    assert policy.requests[0].params == SamplingParams()  # the defaults, filled in once for every backend
    out = await policy.generate(prompt_ids=(5, 6), sampling_params=SamplingParams(temperature=0))
    assert out.prompt_ids == [5, 6] and policy.requests[1].params.greedy
    with pytest.raises(ValueError, match=re.escape("generate() needs exactly one of `messages`")):
        await policy.generate()
    with pytest.raises(TypeError, match=re.escape("messages must be a list of dicts")):
        await policy.generate("hello")
    assert len(policy.requests) == 2  # bad requests never reach the backend
    assert _Recorder(_Template()).template_kwargs == {}  # enable_thinking only when set: templates keep defaults


def test_model_backends_share_the_base_and_keep_only_their_own_parts():
    from rllm_gym.policies.hf import BatchingPolicy, HFPolicy
    from rllm_gym.policies.openai import OpenAIPolicy
    from rllm_gym.policies.vllm import VLLMPolicy

    for backend in (HFPolicy, OpenAIPolicy, VLLMPolicy, BatchingPolicy):
        assert issubclass(backend, BasePolicy)
        assert "generate" not in vars(backend) and "prompt_token_ids" not in vars(backend)  # one copy, in the base
        assert backend._generate is not BasePolicy._generate  # how a request reaches the model: the backend's own
    policy = OpenAIPolicy("m", enable_thinking=True)
    assert isinstance(policy, Policy) and policy.template_kwargs == {"enable_thinking": True}


def test_loop_handoff_runs_calls_from_other_threads_in_order_with_one_wake_up_per_burst():
    import asyncio
    import threading

    from rllm_gym.policies.base import LoopHandoff

    loop = asyncio.new_event_loop()
    wake_ups = []
    call_soon_threadsafe = loop.call_soon_threadsafe

    def counted(*args):
        wake_ups.append(1)
        return call_soon_threadsafe(*args)

    loop.call_soon_threadsafe = counted
    handoff = LoopHandoff(loop)
    ran: list[tuple[int, bool]] = []
    on_loop_thread = threading.get_ident

    async def burst() -> None:
        loop_thread = on_loop_thread()
        # 100 calls from another thread while the loop is busy: one wake-up, and all of them run, in order.
        sender = threading.Thread(
            target=lambda: [
                handoff.call(lambda i=i: ran.append((i, on_loop_thread() == loop_thread))) for i in range(100)
            ]
        )
        sender.start()
        sender.join()
        assert ran == [] and len(wake_ups) == 1
        await asyncio.sleep(0)
        assert ran == [(i, True) for i in range(100)]
        handoff.call(lambda: ran.append((100, True)))  # the next burst wakes the loop again
        await asyncio.sleep(0)
        assert ran[-1] == (100, True) and len(wake_ups) == 2

    loop.run_until_complete(burst())
    loop.close()
    with pytest.raises(RuntimeError):  # a closed loop: the caller hears of it, the call is dropped
        handoff.call(lambda: ran.append((-1, True)))
    assert ran[-1] == (100, True)
