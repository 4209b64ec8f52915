"""Token-by-token streaming through the gateway, read with the official openai client's streaming API."""

from __future__ import annotations

import asyncio
import json
import threading

import aiohttp
import openai
import pytest

from rllm_gym.gateway import Gateway
from rllm_gym.gateway.streaming import ContentStream, opens_reasoning
from rllm_gym.policies import HFPolicy, ScriptedPolicy
from rllm_gym.policies.base import build_model_output
from tests.gateway.test_server import ADD_TOOL


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def client_of(session) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=session.base_url, api_key=session.id, max_retries=0)


def fed_one_by_one(tokenizer, text: str, stop: tuple[str, ...] = (), **kwargs) -> tuple[list[str], str]:
    """The deltas of ``text``'s tokens fed one at a time, and the content build_model_output makes of the text."""
    stream = ContentStream(tokenizer, stop, **kwargs)
    deltas = [stream.feed([token]) for token in tokenizer.encode(text, add_special_tokens=False)]
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
    return deltas, build_model_output(text[:cut]).content


@pytest.mark.parametrize(
    ("text", "stop", "kwargs"),
    [
        ("  The answer is 4, surely.  ", (), {}),
        ('Let me call <tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>', (), {}),
        ("<think>hmm</think>The answer is 4.", (), {}),
        ("Before <think>a thought</think> after it.", (), {}),
        ("one two END three", ("END",), {}),
        ("one two EN", ("END",), {}),
        ("still thinking</think> Done now.", (), {"in_reasoning": True}),
        ("still thinking with no end", (), {"in_reasoning": True}),
        ("naïve café, 東京 ✓", (), {}),
    ],
)
def test_deltas_add_up_to_the_content_and_never_run_ahead_of_it(tokenizer, text, stop, kwargs):
    deltas, content = fed_one_by_one(tokenizer, text, stop, **kwargs)
    sent = "".join(deltas)
    assert content.startswith(sent)  # a delta is never taken back: each is the start of the final content
    for hold in ("<", "<think", "<tool_call", "</think", "EN"):
        assert not sent.endswith(hold)  # a tail that may become markup or a stop string waits


def test_plain_text_streams_as_it_comes(tokenizer):
    deltas, content = fed_one_by_one(tokenizer, "move left then up then right")
    assert "".join(deltas) == content and sum(1 for d in deltas if d) >= 4
    # Nothing is sent live where the reply continues a forced opening, or inside reasoning the prompt opened.
    assert set(fed_one_by_one(tokenizer, "a b c", live=False)[0]) == {""}
    assert "".join(fed_one_by_one(tokenizer, "a b c", in_reasoning=True)[0]) == ""


def test_a_long_reply_is_decoded_a_linear_number_of_ids_in_all_and_its_deltas_still_add_up(tokenizer):
    decoded = []  # the ids each decode read

    class Counting:
        def decode(self, ids, **kwargs):
            decoded.append(len(ids))
            return tokenizer.decode(ids, **kwargs)

    text = " ".join(f"word{i}" for i in range(1500))
    ids = tokenizer.encode(text, add_special_tokens=False)
    stream = ContentStream(Counting())
    sent = "".join(stream.feed([token]) for token in ids)
    assert len(ids) > 3000 and text.startswith(sent) and len(sent) > len(text) * 0.95
    assert sum(decoded) < 100 * len(ids)  # a decode at every token reads len(ids) ** 2 / 2
    assert decoded[:64] == list(range(1, 65))  # a short reply streams token by token


def test_the_prompt_tells_whether_the_reply_starts_in_reasoning(tokenizer):
    assert opens_reasoning(tokenizer, tokenizer.encode("<|im_start|>assistant\n<think>\n"))
    assert not opens_reasoning(tokenizer, tokenizer.encode("<|im_start|>assistant\n"))


class GatedHFPolicy(HFPolicy):
    """HFPolicy whose generation waits, before its last token, until the test says it saw a streamed delta: the
    delta can only have come from tokens streamed while the reply was still being generated."""

    def __init__(self, *args, gate_at: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate_at = gate_at
        self.seen = threading.Event()
        self.waited: list[bool] = []

    def _generate_batch(self, prompts, params, on_tokens=None):
        if on_tokens is not None:
            on_tokens = [None if callback is None else self._gated(callback) for callback in on_tokens]
        return super()._generate_batch(prompts, params, on_tokens)

    def _gated(self, callback):
        count = [0]

        def gated(ids):
            callback(ids)
            count[0] += 1
            if count[0] == self.gate_at:
                self.waited.append(self.seen.wait(timeout=60))

        return gated


async def test_hf_deltas_arrive_while_the_reply_is_generated_and_add_up_to_the_recorded_content(tiny_model_dir):
    policy = GatedHFPolicy(tiny_model_dir, gate_at=23)
    assert policy.streams_tokens
    async with Gateway(policy) as gateway:
        session = gateway.open_session()
        messages = [{"role": "user", "content": "Say something long about moving left."}]
        stream = await client_of(session).chat.completions.create(
            model="p", messages=messages, max_tokens=24, temperature=1.0, seed=5, stream=True, logprobs=True
        )
        chunks = []
        async for chunk in stream:
            chunks.append(chunk)
            if chunk.choices and chunk.choices[0].delta.content:
                policy.seen.set()
        (step,) = gateway.close_session(session.id).steps
    assert policy.waited == [True]  # a delta reached the client before the 24th token was sampled
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(deltas) >= 3 and "".join(deltas) == step.model_output.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    logprobs = [
        t.logprob for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content
    ]
    assert logprobs == step.logprobs and len(step.response_ids) == 24


async def test_hf_streams_each_choice_and_matches_the_same_call_unstreamed(tiny_model_dir):
    policy = HFPolicy(tiny_model_dir)
    messages = [{"role": "user", "content": "go"}]
    async with Gateway(policy) as gateway:
        session = gateway.open_session()
        client = client_of(session)
        stream = await client.chat.completions.create(
            model="p",
            messages=messages,
            max_tokens=12,
            seed=3,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        whole = await client.chat.completions.create(model="p", messages=messages, max_tokens=12, seed=3, n=2)
        steps = gateway.close_session(session.id).steps
    for index in (0, 1):
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == index)
        assert text == steps[index].model_output.content == whole.choices[index].message.content
    assert [s.response_ids for s in steps[:2]] == [s.response_ids for s in steps[2:]]  # seeded: the same tokens
    assert chunks[-1].usage.completion_tokens == len(steps[0].response_ids) + len(steps[1].response_ids)


async def test_a_streamed_tool_call_comes_whole_after_the_content_streamed_before_it(tokenizer):
    reply = 'Adding. <tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    policy = ScriptedPolicy([reply], tokenizer=tokenizer)
    async with Gateway(policy) as gateway:
        session = gateway.open_session()
        messages = [{"role": "user", "content": "2+3?"}]
        async with client_of(session).chat.completions.stream(model="p", messages=messages, tools=[ADD_TOOL]) as s:
            events = [event async for event in s]
            final = await s.get_final_completion()
        (step,) = gateway.close_session(session.id).steps
    contents = [e.delta for e in events if e.type == "content.delta"]
    assert "".join(contents) == "Adding." == step.model_output.content
    (call,) = final.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 2, "b": 3})
    assert final.choices[0].finish_reason == "tool_calls"
    kinds = [e.type for e in events]
    assert kinds.index("content.delta") < kinds.index("tool_calls.function.arguments.done")
    # The reply the client assembled is the one recorded: sent back, the next call continues its tokens.
    assert final.choices[0].message.content == step.chat_completions[-1]["content"]


async def test_a_policy_failure_mid_stream_ends_the_stream_with_an_error_the_client_raises(tokenizer):
    class FailingAfterTokens(ScriptedPolicy):
        async def _generate(self, request):
            for token in tokenizer.encode("partial answer here", add_special_tokens=False):
                request.on_token([token])
            raise RuntimeError("the engine died")

    async with Gateway(FailingAfterTokens(["x"], tokenizer=tokenizer)) as gateway:
        session = gateway.open_session()
        stream = await client_of(session).chat.completions.create(
            model="p", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        with pytest.raises(openai.APIError, match="the engine died"):
            async for _ in stream:
                pass
        # Nothing was recorded, and the gateway still serves the session.
        assert gateway.close_session(session.id).steps == []


async def test_a_client_that_hangs_up_mid_stream_leaves_the_call_recorded_and_the_gateway_serving(tokenizer):
    reply = "word " * 100
    async with Gateway(ScriptedPolicy([reply], cycle=True, tokenizer=tokenizer)) as gateway:
        session = gateway.open_session()
        body = {"model": "p", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 400}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{session.base_url}/chat/completions", json=body) as response:
                first = await response.content.readline()
                response.close()  # gone after the first event
            assert first.startswith(b"data: ")
            for _ in range(200):  # the call runs to its end on the gateway's side
                if gateway._sessions[session.id].trajectory.steps:
                    break
                await asyncio.sleep(0.01)
            again = await client_of(session).chat.completions.create(
                model="p", messages=[{"role": "user", "content": "hi"}], max_tokens=3
            )
        steps = gateway.close_session(session.id).steps
    assert len(steps) == 2 and steps[0].model_output.content == reply.strip()
    assert again.choices[0].message.content == steps[1].model_output.content


async def test_completions_stream_their_raw_text_token_by_token(tiny_model_dir, tokenizer):
    async with Gateway(HFPolicy(tiny_model_dir)) as gateway:
        session = gateway.open_session()
        client = client_of(session)
        stream = await client.completions.create(
            model="p", prompt="The agent moves", max_tokens=20, temperature=1.0, seed=1, stream=True
        )
        chunks = [chunk async for chunk in stream]
        stop = await client.completions.create(model="p", prompt=[5, 6], max_tokens=30, stop=["e"], stream=True)
        stopped = [chunk async for chunk in stop]
        first, second = gateway.close_session(session.id).steps
    texts = [c.choices[0].text for c in chunks]
    assert "".join(texts) == first.model_output.text and sum(1 for t in texts if t) > 2
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert (
        "".join(c.choices[0].text for c in stopped) == second.model_output.text and "e" not in second.model_output.text
    )
    # Raw text: reasoning and tool-call markup stay in it, as they come.
    deltas, _ = fed_one_by_one(tokenizer, "a <think>b</think> c")
    raw = ContentStream(tokenizer, raw=True)
    assert "".join(raw.feed([t]) for t in tokenizer.encode("a <think>b</think> c ")) == "a <think>b</think> c "
    assert "".join(deltas) == "a"
