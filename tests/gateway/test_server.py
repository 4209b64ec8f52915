"""The gateway against real clients on loopback: the official openai package and raw HTTP (aiohttp, sockets)."""

from __future__ import annotations

import asyncio
import json
import re
import threading

import aiohttp
import openai
import pytest

from rllm_gym.gateway import Gateway, SessionLimitError
from rllm_gym.policies import HFPolicy, OpenAIPolicy, ScriptedPolicy
from rllm_gym.policies.stub_server import StubOpenAIServer
from rllm_gym.policies.tokens import render_prompt_ids

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return HFPolicy(tiny_model_dir, max_batch_size=64)


def client_of(session) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=session.base_url, api_key=session.id, max_retries=0)


async def test_a_chat_call_becomes_a_step_with_its_exact_tokens(policy):
    async with Gateway(policy) as gateway:
        session = gateway.open_session({"question": "hi"})
        messages = [{"role": "user", "content": "move left"}]
        reply = await client_of(session).chat.completions.create(
            model="policy", messages=messages, max_tokens=12, temperature=1.0, seed=3, logprobs=True
        )
        async with aiohttp.ClientSession() as http, http.get(f"{gateway.url}/sessions/{session.id}") as response:
            recorded = await response.json()
    (step,) = recorded["steps"]
    assert recorded["input"] == {"task": {"question": "hi"}}
    assert step["prompt_ids"] == render_prompt_ids(policy.tokenizer, messages, None, {})
    assert 1 <= len(step["response_ids"]) <= 12 and len(step["logprobs"]) == len(step["response_ids"])
    assert [t.logprob for t in reply.choices[0].logprobs.content] == step["logprobs"]
    assert policy.tokenizer.decode(step["response_ids"], skip_special_tokens=True).startswith(
        step["model_output"]["text"][:5]
    )
    assert reply.usage.prompt_tokens == len(step["prompt_ids"])


async def test_a_chat_that_extends_the_last_call_continues_its_tokens(policy):
    async with Gateway(policy) as gateway:
        session = gateway.open_session()
        client = client_of(session)
        messages = [{"role": "user", "content": "move left"}]
        first = await client.chat.completions.create(model="p", messages=messages, max_tokens=8)
        messages += [first.choices[0].message.model_dump(), {"role": "user", "content": "again"}]
        await client.chat.completions.create(model="p", messages=messages, max_tokens=8)
        await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "new"}], max_tokens=8)
        trajectory = gateway.close_session(session.id)
    one, two, three = trajectory.steps
    assert two.prompt_ids[: len(one.prompt_ids) + len(one.response_ids)] == one.prompt_ids + one.response_ids
    assert len(two.prompt_ids) > len(one.prompt_ids) + len(one.response_ids)
    # A chat that does not extend a recorded one is rendered whole: a new training row.
    new_chat = [{"role": "user", "content": "new"}]
    assert three.prompt_ids == render_prompt_ids(policy.tokenizer, new_chat, None, {})


async def test_sessions_in_flight_are_never_mixed(policy):
    async with Gateway(policy) as gateway:
        sessions = [gateway.open_session({"i": i}) for i in range(8)]

        async def talk(i, session):
            content = f"task {i}"
            await client_of(session).chat.completions.create(
                model="p", messages=[{"role": "user", "content": content}], max_tokens=4
            )
            return content

        contents = await asyncio.gather(*(talk(i, s) for i, s in enumerate(sessions)))
        trajectories = [gateway.close_session(s.id) for s in sessions]
    assert len({s.id for s in sessions}) == 8 and all(len(s.id) >= 40 for s in sessions)
    for content, trajectory in zip(contents, trajectories, strict=True):
        (step,) = trajectory.steps
        assert step.chat_completions[0]["content"] == content


async def test_unknown_and_closed_sessions_get_404(policy):
    async with Gateway(policy) as gateway:
        session = gateway.open_session()
        gateway.close_session(session.id)
        with pytest.raises(openai.NotFoundError) as error:
            await client_of(session).chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}])
        assert error.value.body["code"] == "session_not_found"
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{gateway.url}/sessions/guess/reward", json={"reward": 1}) as response,
        ):
            assert response.status == 404
            assert (await response.json())["error"]["code"] == "session_not_found"


BAD_REQUESTS = [
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": 7}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"n": 0}, "n"),
    ({"n": 1.5}, "n"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"stop": [1, 2]}, "stop"),
    ({"stream": "yes"}, "stream"),
    ({"tools": {"add": 1}}, "tools"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"tools": [ADD_TOOL], "tool_choice": {"type": "function", "function": {"name": "mul"}}}, "tool_choice"),
    ({"tools": [ADD_TOOL], "tool_choice": "always"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    (
        {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": 3}]}]},
        "messages[0].tool_calls[0]",
    ),
    ({"model": 3}, "model"),
    # Numbers JSON allows that a float cannot hold, names that cannot be looked up, text UTF-8 cannot hold.
    ({"temperature": 10**400}, "temperature"),
    ({"top_p": -(10**400)}, "top_p"),
    ({"tools": [ADD_TOOL], "tool_choice": {"type": "function", "function": {"name": ["add"]}}}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "hi \ud800"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]}, "messages[0].content[0].text"),
    ({"stop": ["x" * 257]}, "stop"),  # a megabyte stop string stalled a 20-token call for 40 s
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
]


@pytest.mark.parametrize(("change", "param"), BAD_REQUESTS)
async def test_a_malformed_request_gets_a_400_naming_the_field(policy, change, param):
    body = {"model": "p", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2} | change
    async with Gateway(policy) as gateway:
        session = gateway.open_session()
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{session.base_url}/chat/completions", json=body) as response,
        ):
            error = (await response.json())["error"]
            assert response.status == 400
        assert error["param"] == param and error["type"] == "invalid_request_error"
        assert param.split("[")[0] in error["message"]
        assert gateway.close_session(session.id).steps == []


async def test_nothing_a_client_sends_crashes_the_gateway(policy):
    async with Gateway(policy, max_body_bytes=4096) as gateway:
        session = gateway.open_session()
        url = f"{session.base_url}/chat/completions"
        async with aiohttp.ClientSession() as http:
            for body in (b"{not json", b"\xff\xfe", b"[1, 2]", b"null", b"[" * 2000 + b"]" * 2000):
                async with http.post(url, data=body) as response:
                    assert response.status == 400, body[:10]
                    assert "error" in await response.json()
            async with http.post(url, data=b"x" * 10_000) as response:
                assert response.status == 413
                assert (await response.json())["error"]["code"] == "request_too_large"
            async with http.get(f"{gateway.url}/nowhere") as response:
                assert response.status == 404 and "error" in await response.json()
        # Clients that hang up: mid-headers, mid-body, and right after a complete request.
        host, port = gateway.url.removeprefix("http://").split(":")
        request = json.dumps({"model": "p", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3})
        head = f"POST /sessions/{session.id}/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        for data in (
            head[:30],
            head + 'Content-Length: 500\r\n\r\n{"mod',
            head + f"Content-Length: {len(request)}\r\n\r\n" + request,
        ):
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(data.encode())
            await writer.drain()
            writer.close()
            await writer.wait_closed()
        await asyncio.sleep(0.5)  # let a generation started for the last one finish
        reply = await client_of(session).chat.completions.create(
            model="p", messages=[{"role": "user", "content": "still there?"}], max_tokens=3
        )
    assert reply.choices[0].finish_reason in ("stop", "length")


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


async def test_a_body_nested_past_what_a_record_can_hold_is_refused_and_one_within_reads_back():
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "default": nested(80)}}}
    chat = {"messages": [{"role": "user", "content": "x"}], "tools": [tool]}
    async with Gateway(ScriptedPolicy(["ok"])) as gateway, aiohttp.ClientSession() as http:
        session = gateway.open_session()
        for url, body, param in (
            (f"{gateway.url}/sessions", {"task": nested(80)}, "task" + "[0]" * 63),
            (f"{session.base_url}/chat/completions", chat, "tools[0].function.parameters.default" + "[0]" * 59),
        ):
            async with http.post(url, json=body) as response:
                error = (await response.json())["error"]
                assert response.status == 400 and error["param"] == param
                assert error["message"].endswith("is nested more than 64 levels deep")
        async with http.post(f"{gateway.url}/sessions", json={"task": nested(60)}) as response:
            opened = await response.json()
        async with http.get(f"{gateway.url}/sessions/{opened['id']}") as response:
            assert response.status == 200 and (await response.json())["task"] == nested(60)


class GatedPolicy(ScriptedPolicy):
    """A scripted policy whose replies wait for ``gate``; ``all_in`` is set once ``calls`` calls are generating."""

    def __init__(self, calls: int) -> None:
        super().__init__(["late reply"], cycle=True)
        self.waiting, self.expected = 0, calls
        self.all_in, self.gate = asyncio.Event(), asyncio.Event()

    async def generate(self, *args, **kwargs):
        self.waiting += 1
        if self.waiting == self.expected:
            self.all_in.set()
        await self.gate.wait()
        return await super().generate(*args, **kwargs)


async def test_a_call_still_running_when_its_session_closes_is_answered_but_not_recorded():
    policy = GatedPolicy(calls=2)
    async with Gateway(policy) as gateway:
        session = gateway.open_session()
        client = client_of(session)
        calls = [
            asyncio.ensure_future(
                client.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}])
            ),
            asyncio.ensure_future(client.completions.create(model="p", prompt=[1, 2])),
        ]
        await policy.all_in.wait()
        trajectory = gateway.close_session(session.id)  # the episode ends (the SDK scores it from here on)
        policy.gate.set()
        chat, completion = await asyncio.gather(*calls)
    assert chat.choices[0].message.content == "late reply" and completion.choices[0].text == "late reply"
    assert trajectory.steps == []


async def test_a_reward_whose_body_arrives_after_its_session_closed_is_a_404_not_a_late_reward():
    async with Gateway(ScriptedPolicy(["ok"])) as gateway:
        session = gateway.open_session()
        host, port = gateway.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        body = b'{"reward": 1.0}'
        head = f"POST /sessions/{session.id}/reward HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body[:5])
        await writer.drain()
        await asyncio.sleep(0.3)  # the handler has the session and waits for the rest of the body
        trajectory = gateway.close_session(session.id)
        writer.write(body[5:])
        await writer.drain()
        status = (await reader.readline()).decode()
        writer.close()
        await writer.wait_closed()
    assert status.startswith("HTTP/1.1 404") and trajectory.reward is None


async def test_a_number_longer_than_python_reads_is_a_400_not_a_500():
    body = b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1' + b"0" * 4300 + b"}"
    async with Gateway(ScriptedPolicy(["ok"])) as gateway, aiohttp.ClientSession() as http:
        session = gateway.open_session()
        for url in (f"{session.base_url}/chat/completions", f"{gateway.url}/sessions/{session.id}/reward"):
            async with http.post(url, data=body) as response:
                error = (await response.json())["error"]
                assert response.status == 400 and error["type"] == "invalid_request_error"
                assert error["message"].startswith("the request body is not valid JSON: Exceeds the limit")


async def test_a_temperature_below_1e_5_is_greedy_not_a_policy_failure(policy):
    messages = [{"role": "user", "content": "move left"}]
    async with Gateway(policy) as gateway:
        client = client_of(gateway.open_session())
        greedy = await client.chat.completions.create(model="p", messages=messages, max_tokens=6, temperature=0)
        for temperature in (1e-300, 5e-324, 9e-6):
            tiny = await client.chat.completions.create(
                model="p", messages=messages, max_tokens=6, temperature=temperature
            )
            assert tiny.choices[0].message.content == greedy.choices[0].message.content
        completion = await client.completions.create(model="p", prompt="the agent", max_tokens=4, temperature=1e-300)
    assert completion.choices[0].finish_reason in ("stop", "length")


async def test_a_chat_of_megabytes_is_rendered_off_the_loop_while_other_sessions_are_served(policy, monkeypatch):
    # The huge chat's rendering is held until the other session was served: rendered on the loop, it would hold the
    # loop (and the read below would time out) whatever the machine's speed.
    rendering_started, release = threading.Event(), threading.Event()
    render = policy.prompt_token_ids

    def held_render(request):
        rendering_started.set()
        release.wait(60)
        return render(request)

    monkeypatch.setattr(policy, "prompt_token_ids", held_render)
    huge = {"messages": [{"role": "user", "content": "ab"}] * 20_000, "max_tokens": 2}  # over 64k characters
    async with Gateway(policy) as gateway, aiohttp.ClientSession() as http:
        slow, other = gateway.open_session(), gateway.open_session()

        async def post_huge():
            async with http.post(f"{slow.base_url}/chat/completions", json=huge) as response:
                return response.status

        async def read_other():
            async with http.get(f"{gateway.url}/sessions/{other.id}") as response:
                return response.status

        rendering = asyncio.ensure_future(post_huge())
        try:
            assert await asyncio.to_thread(rendering_started.wait, 60)
            assert await asyncio.wait_for(read_other(), 30) == 200  # the loop answered while the chat rendered
            assert not rendering.done()
        finally:
            release.set()
        assert await rendering == 400  # then: far over the context


async def test_a_prompt_over_the_context_gets_context_length_exceeded(policy):
    async with Gateway(policy, max_context_tokens=40) as gateway:
        session = gateway.open_session()
        client = client_of(session)
        with pytest.raises(openai.BadRequestError) as error:
            await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "left " * 60}])
        assert error.value.code == "context_length_exceeded"
        with pytest.raises(openai.BadRequestError, match="maximum context length is 40"):
            await client.chat.completions.create(
                model="p", messages=[{"role": "user", "content": "hi"}], max_tokens=39
            )
        # Without max_tokens, the default shrinks to the room left.
        reply = await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}])
        trajectory = gateway.close_session(session.id)
    assert len(trajectory.steps[0].prompt_ids) + len(trajectory.steps[0].response_ids) <= 40
    assert reply.choices[0].finish_reason in ("stop", "length")


async def test_stream_n_stop_and_completions(policy):
    async with Gateway(policy) as gateway:
        session = gateway.open_session()
        client = client_of(session)
        messages = [{"role": "user", "content": "go"}]
        stream = await client.chat.completions.create(
            model="p", messages=messages, max_tokens=6, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
        several = await client.chat.completions.create(model="p", messages=messages, max_tokens=6, n=3, seed=1)
        stopped = await client.chat.completions.create(model="p", messages=messages, max_tokens=30, stop=["e"])
        completion = await client.completions.create(model="p", prompt="the agent", max_tokens=5, logprobs=1)
        trajectory = gateway.close_session(session.id)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == trajectory.steps[0].model_output.content
    assert chunks[-1].usage.completion_tokens == len(trajectory.steps[0].response_ids)
    assert [c.index for c in several.choices] == [0, 1, 2]
    assert len({tuple(s.response_ids) for s in trajectory.steps[1:4]}) > 1  # each choice sampled on its own
    assert "e" not in stopped.choices[0].message.content
    last = trajectory.steps[-1]
    assert last.prompt_ids == policy.tokenizer.encode("the agent", add_special_tokens=False)
    assert completion.choices[0].text == last.model_output.text
    assert completion.choices[0].logprobs.token_logprobs == last.logprobs
    assert len(trajectory.steps) == 1 + 3 + 1 + 1


def scripted_tool_caller(messages):
    """Calls ``add`` first, then answers with the tool's result."""
    if messages[-1]["role"] == "tool":
        return f"The sum is {messages[-1]['content']}."
    return '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


async def test_tool_calls_round_trip_and_continue_the_recorded_chat():
    async with Gateway(ScriptedPolicy(scripted_tool_caller)) as gateway:
        session = gateway.open_session()
        client = client_of(session)
        messages = [{"role": "user", "content": "2+3?"}]
        first = await client.chat.completions.create(
            model="p", messages=messages, tools=[ADD_TOOL], tool_choice="auto"
        )
        call = first.choices[0].message.tool_calls[0]
        assert first.choices[0].finish_reason == "tool_calls"
        assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 2, "b": 3})
        messages += [first.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": "5"}]
        second = await client.chat.completions.create(model="p", messages=messages, tools=[ADD_TOOL])
        none = await client.chat.completions.create(
            model="p", messages=[{"role": "user", "content": "hi"}], tools=[ADD_TOOL], tool_choice="none"
        )
        trajectory = gateway.close_session(session.id)
    assert second.choices[0].message.content == "The sum is 5."
    # tool_choice "none": the script calls anyway, but the reply has no tool calls (the markup stays its content).
    assert none.choices[0].finish_reason == "stop" and none.choices[0].message.tool_calls is None
    assert none.choices[0].message.content.startswith("<tool_call>")
    assert trajectory.steps[0].info["tools"] == [ADD_TOOL] and "tools" not in trajectory.steps[2].info
    assert trajectory.is_cumulative() is False  # the third call starts a new chat
    one, two = trajectory.steps[:2]
    assert two.chat_completions[: len(one.chat_completions)] == one.chat_completions


DEEP_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": ' + "[" * 300 + "]" * 300 + "}}\n</tool_call>"
NAN_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": NaN, "b": 1e999}}\n</tool_call>'


@pytest.mark.parametrize("reply", [DEEP_CALL, NAN_CALL], ids=["nested-300-deep", "nan-and-infinity"])
async def test_a_tool_call_whose_arguments_no_client_or_record_can_hold_stays_content(reply, tmp_path):
    from rllm_gym.sdk import run_agent_program

    async with Gateway(ScriptedPolicy([reply], cycle=True)) as gateway:
        session = gateway.open_session()
        answer = await client_of(session).chat.completions.create(
            model="p", messages=[{"role": "user", "content": "2+3?"}], tools=[ADD_TOOL], max_tokens=2000
        )
        async with aiohttp.ClientSession() as http, http.get(f"{gateway.url}/sessions/{session.id}") as response:
            assert response.status == 200
            (step,) = (await response.json())["steps"]
        completion = await client_of(session).completions.create(model="p", prompt=[1, 2], max_tokens=2000)
        async with aiohttp.ClientSession() as http, http.get(f"{gateway.url}/sessions/{session.id}") as response:
            assert response.status == 200
            completion_step = (await response.json())["steps"][1]
    (choice,) = answer.choices
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert choice.message.content == reply and step["model_output"]["tool_calls"] == []
    assert completion.choices[0].text == reply and completion_step["model_output"]["tool_calls"] == []

    async def program(task, base_url):
        client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "2+3?"}]
        await client.chat.completions.create(model="p", messages=messages, tools=[ADD_TOOL], max_tokens=2000)
        return "done"

    out = tmp_path / "episodes.jsonl"
    await run_agent_program(program, [{"q": 1}], ScriptedPolicy([reply], cycle=True), out=out)
    assert json.loads(out.read_text())["trajectories"][0]["output"] == "done"


async def test_reward_and_signals_are_set_by_the_program(policy):
    async with Gateway(policy) as gateway:
        session = gateway.open_session()
        root = f"{gateway.url}/sessions/{session.id}"
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{root}/reward", json={"reward": "high"}) as response:
                assert response.status == 400 and (await response.json())["error"]["param"] == "reward"
            async with http.post(f"{root}/reward", json={"signals": {"format": "ok"}}) as response:
                assert response.status == 400 and (await response.json())["error"]["param"] == "signals"
            async with http.post(f"{root}/reward", json={"reward": 0.5, "signals": {"format": 1}}) as response:
                assert response.status == 200
            async with http.get(root) as response:
                recorded = await response.json()
            async with http.post(f"{gateway.url}/sessions", json={"task": {"q": 1}}) as response:
                opened = await response.json()
                assert response.status == 201 and opened["base_url"].endswith(f"/sessions/{opened['id']}/v1")
            async with http.delete(f"{gateway.url}/sessions/{opened['id']}") as response:
                assert (await response.json())["task"] == {"q": 1}
    assert (recorded["reward"], recorded["signals"]) == (0.5, {"format": 1.0})


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"reward": NaN}', "reward"),
        (b'{"reward": Infinity}', "reward"),
        (b'{"reward": -1e400}', "reward"),
        (b'{"reward": 1' + b"0" * 400 + b"}", "reward"),
        (b'{"signals": {"format": NaN}}', "signals"),
        (b'{"signals": {"format": 1' + b"0" * 400 + b"}}", "signals"),
        (b'{"signals": {"\\udc00": 1}}', "signals"),
    ],
)
async def test_a_reward_that_is_not_a_finite_number_is_refused_not_recorded(body, param):
    async with Gateway(ScriptedPolicy(["ok"])) as gateway, aiohttp.ClientSession() as http:
        session = gateway.open_session()
        root = f"{gateway.url}/sessions/{session.id}"
        async with http.post(f"{root}/reward", data=body) as response:
            assert response.status == 400
            assert (await response.json())["error"]["param"] == param
        async with http.get(root) as response:
            recorded = await response.json()
    assert (recorded["reward"], recorded["signals"]) == (None, {})


async def test_completion_token_ids_outside_the_vocabulary_are_the_clients_400_not_a_policy_failure(policy):
    size = len(policy.tokenizer)
    async with Gateway(policy) as gateway:
        session = gateway.open_session()
        client = client_of(session)
        for prompt, param, message in (
            ([5, size], "prompt[1]", f"'prompt[1]' is token id {size}, outside the model's vocabulary of {size} ids"),
            ([5, 10**30], "prompt[1]", "outside the model's vocabulary"),
            ([-1, 5], "prompt", "'prompt' token ids must be >= 0, got -1"),
        ):
            with pytest.raises(openai.BadRequestError, match=re.escape(message)) as error:
                await client.completions.create(model="p", prompt=prompt, max_tokens=2)
            assert error.value.body["param"] == param
        completion = await client.completions.create(model="p", prompt=[5, size - 1], max_tokens=2)
        (step,) = gateway.close_session(session.id).steps
    assert step.prompt_ids == [5, size - 1] and completion.choices[0].text == step.model_output.text


def test_gateway_arguments_are_checked(policy):
    with pytest.raises(TypeError, match=r"Gateway\(policy=...\) must be a Policy"):
        Gateway(object())
    with pytest.raises(ValueError, match=r"Gateway\(max_context_tokens=...\) must be an int >= 1, got 0"):
        Gateway(policy, max_context_tokens=0)
    with pytest.raises(RuntimeError, match="needs a started gateway"):
        Gateway(policy).open_session()


async def test_sessions_opened_in_a_loop_hit_the_limit_not_the_memory(policy):
    async with Gateway(policy, max_sessions=3) as gateway, aiohttp.ClientSession() as http:
        statuses = []
        for _ in range(5):
            async with http.post(f"{gateway.url}/sessions") as response:
                statuses.append(response.status)
                body = await response.json()
        assert statuses == [201, 201, 201, 429, 429] and body["error"]["code"] == "too_many_sessions"
        with pytest.raises(SessionLimitError, match="3 sessions open"):
            gateway.open_session()


async def test_a_policy_failure_is_a_502_and_the_program_ends_in_error_not_a_wrong_answer():
    from rllm_gym.sdk import run_agent_program
    from rllm_gym.types import TerminationReason

    async with Gateway(ScriptedPolicy(["only one reply"])) as gateway:
        session = gateway.open_session()
        client = client_of(session)
        await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "1"}])
        with pytest.raises(openai.InternalServerError) as error:
            await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "2"}])
    assert error.value.status_code == 502 and error.value.body["code"] == "policy_error"
    assert "ran out of replies" in error.value.body["message"]

    async def program(task, base_url):
        await openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0).chat.completions.create(
            model="p", messages=[{"role": "user", "content": "hi"}]
        )

    (episode,) = await run_agent_program(program, [{"q": 1}], ScriptedPolicy(lambda messages: 5))
    assert episode.termination_reason is TerminationReason.ERROR and not episode.is_correct
    assert episode.metadata["error"]["type"] == "InternalServerError"


async def test_completions_stream_their_text(policy):
    async with Gateway(policy) as gateway:
        session = gateway.open_session()
        stream = await client_of(session).completions.create(model="p", prompt=[5, 6, 7], max_tokens=4, stream=True)
        chunks = [chunk async for chunk in stream]
        (step,) = gateway.close_session(session.id).steps
    assert step.prompt_ids == [5, 6, 7] and "".join(c.choices[0].text for c in chunks) == step.model_output.text


async def test_a_session_with_max_turns_refuses_the_call_past_it():
    async with Gateway(ScriptedPolicy(["ok"], cycle=True)) as gateway, aiohttp.ClientSession() as http:
        session = gateway.open_session(max_turns=2)
        client = client_of(session)
        for _ in range(2):
            await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.BadRequestError) as error:
            await client.completions.create(model="p", prompt=[1, 2])
        assert error.value.code == "max_turns_exceeded" and "limit of 2 LLM calls" in error.value.message
        assert session.turns_exceeded and len(gateway.close_session(session.id).steps) == 2
        async with http.post(f"{gateway.url}/sessions", json={"max_turns": 0}) as response:
            assert response.status == 400 and (await response.json())["error"]["param"] == "max_turns"
        async with http.post(f"{gateway.url}/sessions", json={"max_turns": 1}) as response:
            opened = await response.json()
        body = {"model": "p", "prompt": [1, 2]}
        statuses = []
        for _ in range(2):
            async with http.post(f"{opened['base_url']}/completions", json=body) as response:
                statuses.append(response.status)
        assert statuses == [200, 400]
    with pytest.raises(ValueError, match=r"open_session\(max_turns=...\) must be an int >= 1"):
        gateway.open_session(max_turns="3")


async def test_tool_choice_required_and_named_start_the_reply_with_the_tool_call_opening(policy):
    tokenizer = policy.tokenizer
    # The script writes what follows the opening the gateway put in the prompt.
    replies = ['{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>', '{"a": 4, "b": 5}}\n</tool_call>', "no"]
    scripted = ScriptedPolicy(replies, tokenizer=tokenizer)
    messages = [{"role": "user", "content": "2+3?"}]
    named = {"type": "function", "function": {"name": "add"}}
    async with Gateway(scripted) as gateway:
        session = gateway.open_session()
        client = client_of(session)
        required = await client.chat.completions.create(
            model="p", messages=messages, tools=[ADD_TOOL], tool_choice="required"
        )
        chosen = await client.chat.completions.create(
            model="p", messages=messages, tools=[ADD_TOOL], tool_choice=named
        )
        malformed = await client.chat.completions.create(
            model="p", messages=messages, tools=[ADD_TOOL], tool_choice="required"
        )
        for choice in ("required", named):  # a call is required, but there are no tools to call
            with pytest.raises(openai.BadRequestError) as error:
                await client.chat.completions.create(model="p", messages=messages, tool_choice=choice)
            assert error.value.body["param"] == "tool_choice"
        trajectory = gateway.close_session(session.id)
    rendered = render_prompt_ids(tokenizer, messages, [ADD_TOOL], {})
    opening = tokenizer.encode("<tool_call>\n", add_special_tokens=False)
    named_opening = tokenizer.encode('<tool_call>\n{"name": "add", "arguments": ', add_special_tokens=False)
    for reply, arguments in ((required, {"a": 2, "b": 3}), (chosen, {"a": 4, "b": 5})):
        (call,) = reply.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("add", arguments)
        assert reply.choices[0].finish_reason == "tool_calls"
    # The opening is prompt: recorded in the prompt ids, never in the sampled ids (which are the script's own).
    one, two, three = trajectory.steps
    assert one.prompt_ids == rendered + opening and two.prompt_ids == rendered + named_opening
    assert one.response_ids == tokenizer.encode(replies[0], add_special_tokens=False)
    assert len(one.logprobs) == len(one.response_ids)
    # A completion that does not finish a call is content, not an error.
    assert malformed.choices[0].finish_reason == "stop" and malformed.choices[0].message.tool_calls is None
    assert three.prompt_ids == rendered + opening


async def test_tool_choice_on_the_model_continues_the_opening_and_refuses_what_it_cannot_honour(policy):
    messages = [{"role": "user", "content": "2+3?"}]
    named = {"type": "function", "function": {"name": "add"}}
    async with Gateway(policy) as gateway:
        session = gateway.open_session()
        await client_of(session).chat.completions.create(
            model="p", messages=messages, tools=[ADD_TOOL], tool_choice=named, max_tokens=8
        )
        (step,) = gateway.close_session(session.id).steps
    opening = policy.tokenizer.encode('<tool_call>\n{"name": "add", "arguments": ', add_special_tokens=False)
    assert step.prompt_ids[-len(opening) :] == opening and 1 <= len(step.response_ids) <= 8
    # A policy without token ids cannot be given the opening: refused, naming the field, rather than ignored.
    async with Gateway(ScriptedPolicy(["x"], cycle=True)) as gateway:
        client = client_of(gateway.open_session())
        with pytest.raises(openai.BadRequestError) as error:
            await client.chat.completions.create(
                model="p", messages=messages, tools=[ADD_TOOL], tool_choice="required"
            )
        assert error.value.body["param"] == "tool_choice" and "tokenizer" in error.value.message


async def test_a_streamed_tool_call_reads_back_whole_with_the_openai_stream_helper():
    async with Gateway(ScriptedPolicy(scripted_tool_caller)) as gateway:
        session = gateway.open_session()
        client = client_of(session)
        messages = [{"role": "user", "content": "2+3?"}]
        async with client.chat.completions.stream(
            model="p", messages=messages, tools=[ADD_TOOL], n=2, stream_options={"include_usage": True}
        ) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_completion()
        trajectory = gateway.close_session(session.id)
    assert "tool_calls.function.arguments.done" in kinds and "chunk" in kinds
    assert [choice.index for choice in final.choices] == [0, 1]
    for choice in final.choices:
        (call,) = choice.message.tool_calls
        assert choice.finish_reason == "tool_calls"
        assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 2, "b": 3})
    assert final.usage.completion_tokens == sum(len(step.response_ids) for step in trajectory.steps)


async def test_a_program_that_asks_late_still_joins_the_batch_while_the_gateway_is_up(tiny_model_dir):
    policy = HFPolicy(tiny_model_dir, max_batch_size=8, batch_wait_s=0.005)
    messages = [{"role": "user", "content": "go"}]

    async def ask(session, delay: float) -> None:
        await asyncio.sleep(delay)
        await client_of(session).chat.completions.create(model="p", messages=messages, max_tokens=2)

    async with Gateway(policy, batch_wait_s=30.0) as gateway:
        assert policy.batch_wait_s == 30.0
        sessions = [gateway.open_session(i) for i in range(3)]
        # Far past the policy's own 5 ms: alone, it would send the first two calls as a batch and the late one after.
        await asyncio.gather(ask(sessions[0], 0), ask(sessions[1], 0), ask(sessions[2], 0.2))
    # One batch, sent as soon as the last open session asked (not 30 s later); the policy's own wait is back.
    assert policy.batch_sizes == [3]
    assert policy.batch_wait_s == 0.005 and policy.expected_requests is None
    with pytest.raises(ValueError, match=re.escape("Gateway(batch_wait_s=...) must be seconds in [0, 60), got -1")):
        Gateway(policy, batch_wait_s=-1)


async def test_an_upstream_servers_refusal_is_the_clients_400_and_its_failure_the_gateways_502():
    chat = [{"role": "user", "content": "hi"}]
    with StubOpenAIServer(max_context=20) as server:
        upstream = OpenAIPolicy("stub", server.url, max_retries=0, backoff_s=0.01, timeout_s=5.0)
        async with upstream, Gateway(upstream) as gateway:
            session = gateway.open_session()
            client = client_of(session)
            with pytest.raises(openai.BadRequestError) as refused:  # no tokenizer here: only the upstream can tell
                await client.chat.completions.create(model="stub", messages=[{"role": "user", "content": "w " * 50}])
            assert refused.value.code == "context_length_exceeded" and refused.value.param == "messages"
            assert "maximum context length is 20 tokens" in refused.value.message
            server.fail_next("400")
            with pytest.raises(openai.BadRequestError, match="the model's server refused the request: scripted 400"):
                await client.chat.completions.create(model="stub", messages=chat)
            assert session.policy_error is None  # the program's requests: its episode is still the model's doing
            server.fail_next("500")
            with pytest.raises(openai.InternalServerError) as failed:
                await client.chat.completions.create(model="stub", messages=chat)
            assert failed.value.status_code == 502 and session.policy_error is not None
            reply = await client.chat.completions.create(model="stub", messages=chat)
    assert reply.choices[0].message.content == "echo: hi"
