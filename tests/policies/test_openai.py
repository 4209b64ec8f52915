from __future__ import annotations

import asyncio
import logging
import re
import socket
import subprocess
import sys
import time

import pytest

from rllm_gym.policies import HFPolicy, OpenAIPolicy, PolicyError, SamplingParams
from rllm_gym.policies.openai import chat_request_body, reply_text
from rllm_gym.policies.stub_server import StubOpenAIServer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


CHAT = [{"role": "user", "content": "What is 2 + 3?"}]
GREEDY = SamplingParams(temperature=0, max_tokens=12)


# Against a real `transformers serve` process -------------------------------------------------------------------------


@pytest.mark.slow
async def test_openai_and_hf_agree_on_a_greedy_request(served_model, tiny_model_dir):
    hf = HFPolicy(tiny_model_dir)
    async with OpenAIPolicy(str(tiny_model_dir), served_model, tokenizer=str(tiny_model_dir)) as remote:
        for chat in (CHAT, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "move left"}]):
            local_out = await hf.generate(chat, GREEDY)
            remote_out = await remote.generate(chat, GREEDY)
            assert remote_out.content == local_out.content != ""
            assert remote_out.reasoning == local_out.reasoning
            assert remote_out.tool_calls == local_out.tool_calls
            assert remote_out.finish_reason == local_out.finish_reason == "length"
            assert remote_out.prompt_ids == local_out.prompt_ids
            assert remote_out.prompt_length == len(local_out.prompt_ids)
            # The server returns no ids: they come from tokenizing its text locally, which decodes back to it.
            assert hf.tokenizer.decode(remote_out.completion_ids) == remote_out.text
            assert remote_out.logprobs == []
    # transformers serve refuses vLLM's token-id fields (a 422 naming them): asked once, then asked without them.
    assert remote.server_token_ids is False


@pytest.mark.slow
async def test_64_concurrent_requests_complete(served_model, tiny_model_dir):
    async with OpenAIPolicy(str(tiny_model_dir), served_model, max_concurrency=64) as policy:
        chats = [[{"role": "user", "content": f"question {i}"}] for i in range(64)]
        outs = await asyncio.gather(*(policy.generate(c, SamplingParams(temperature=0, max_tokens=2)) for c in chats))
    assert len(outs) == 64
    assert all(out.finish_reason in ("stop", "length") for out in outs)
    assert len({out.content for out in outs}) > 1  # different prompts, different greedy replies
    assert policy.retries == 0


@pytest.mark.slow
async def test_rejected_request_fails_at_once_with_the_server_message(served_model, tiny_model_dir):
    # transformers serve does not accept the vLLM extension `top_k`: a 422 is not retried.
    policy = OpenAIPolicy(str(tiny_model_dir), served_model)
    with pytest.raises(PolicyError, match=re.escape("rejected the request with HTTP 422")) as info:
        await policy.generate(CHAT, SamplingParams(temperature=0, max_tokens=2, top_k=5))
    assert "top_k" in str(info.value)
    assert policy.retries == 0
    await policy.aclose()


# Against the stub server: retries, backoff, load balancing ----------------------------------------------------------


def fast_policy(urls, **kwargs) -> OpenAIPolicy:
    kwargs = {"backoff_s": 0.01, "max_backoff_s": 0.05, "timeout_s": 5.0, **kwargs}
    return OpenAIPolicy("stub", urls, **kwargs)


@pytest.mark.parametrize("failures", [("429", "429"), ("500",), ("garbage",), ("drop",), ("429", "500", "garbage")])
async def test_retryable_failures_are_retried_until_success(failures):
    with StubOpenAIServer() as server:
        server.fail_next(*failures)
        async with fast_policy(server.url) as policy:
            out = await policy.generate(CHAT, GREEDY)
    assert out.content == "echo: What is 2 + 3?"
    assert out.finish_reason == "stop"
    assert server.hits == len(failures) + 1
    assert policy.retries == len(failures)


async def test_client_errors_are_not_retried():
    with StubOpenAIServer() as server:
        server.fail_next("400")
        async with fast_policy(server.url) as policy:
            with pytest.raises(PolicyError, match=re.escape(f"{server.url}/chat/completions rejected the request")):
                await policy.generate(CHAT, GREEDY)
    assert server.hits == 1


async def test_retries_run_out_with_a_clear_error():
    with StubOpenAIServer() as server:
        server.fail_next("500", "500", "500")
        async with fast_policy(server.url, max_retries=2) as policy:
            with pytest.raises(PolicyError, match=re.escape("failed after 3 attempts (2 retries)")) as info:
                await policy.generate(CHAT, GREEDY)
    assert "HTTP 500" in str(info.value)
    assert server.hits == 3


async def test_requests_go_to_the_replica_with_fewest_in_flight():
    with StubOpenAIServer(latency_s=0.2) as a, StubOpenAIServer(latency_s=0.2) as b:
        async with fast_policy([a.url, b.url]) as policy:
            await asyncio.gather(*(policy.generate(CHAT, GREEDY) for _ in range(10)))
    assert (a.hits, b.hits) == (5, 5)


async def test_a_failing_replica_leaves_the_rotation_for_its_cooldown():
    with StubOpenAIServer() as a, StubOpenAIServer() as b:
        a.fail_next("500")
        async with fast_policy([a.url, b.url], cooldown_s=60) as policy:
            outs = [await policy.generate(CHAT, GREEDY) for _ in range(6)]
    assert all(out.content == "echo: What is 2 + 3?" for out in outs)
    assert a.hits == 1  # one failure, then cooling down: everything else went to b
    assert b.hits == 6


async def test_a_server_killed_mid_run_gives_retries_then_a_clear_error():
    port = free_port()
    command = [sys.executable, "-m", "rllm_gym.policies.stub_server", "--port", str(port), "--latency", "0.5"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}/v1"
        policy = fast_policy(url, max_retries=3)
        first = await policy.generate(CHAT, GREEDY)
        assert first.content == "echo: What is 2 + 3?"
        requests = [asyncio.ensure_future(policy.generate(CHAT, GREEDY)) for _ in range(8)]
        await asyncio.sleep(0.2)  # all 8 are in flight on the server
        server.kill()
        server.wait()
        results = await asyncio.gather(*requests, return_exceptions=True)
    finally:
        server.kill()
        server.wait()
        server.stdout.close()
    assert all(isinstance(result, PolicyError) for result in results)
    message = str(results[0])
    assert "failed after 4 attempts (3 retries)" in message
    assert "Is the server up and reachable?" in message
    assert policy.retries == 8 * 3
    await policy.aclose()


# Request and reply mapping ------------------------------------------------------------------------------------------


def test_request_body_sends_extensions_only_when_asked():
    plain = chat_request_body("m", CHAT, SamplingParams(temperature=0.5, max_tokens=7))
    assert plain == {"model": "m", "messages": CHAT, "max_tokens": 7, "temperature": 0.5, "top_p": 1.0}
    full = chat_request_body(
        "m",
        CHAT,
        SamplingParams(top_k=20, stop=["\n"], seed=3),
        tools=[{"type": "function", "function": {"name": "f"}}],
        template_kwargs={"enable_thinking": False},
        return_token_ids=True,
    )
    assert full["top_k"] == 20 and full["stop"] == ["\n"] and full["seed"] == 3
    assert full["chat_template_kwargs"] == {"enable_thinking": False}
    assert full["logprobs"] is full["return_token_ids"] is full["return_tokens_as_token_ids"] is True


def test_reply_text_rebuilds_reasoning_and_tool_calls():
    message = {
        "content": "Let me compute.",
        "reasoning_content": "2+3",
        "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": '{"x": 5}'}}],
    }
    assert reply_text(message) == (
        '<think>\n2+3\n</think>\n\nLet me compute.\n<tool_call>\n{"name": "calc", "arguments": {"x": 5}}\n</tool_call>'
    )


async def test_vllm_style_token_ids_and_logprobs_are_used(tiny_model_dir):
    """A server that returns vLLM's token ids and logprobs on a chat request (no tokenizer here, so the chat goes out
    as text): no local tokenization, logprobs kept, and the call is marked text-rendered."""
    ids = [11, 12, 13, 2]
    reply = {
        "choices": [
            {
                "message": {"role": "assistant", "content": "four"},
                "finish_reason": "stop",
                "token_ids": ids,
                "logprobs": {"content": [{"token": f"token_id:{i}", "logprob": -0.25} for i in ids]},
            }
        ],
        "prompt_token_ids": [1, 2, 3],
    }

    with StubOpenAIServer(response=reply) as server:
        async with OpenAIPolicy("m", server.url, return_token_ids=True) as policy:
            out = await policy.generate(CHAT, GREEDY)
        assert [path for path, _ in server.requests] == ["/v1/chat/completions"]
    assert out.completion_ids == ids and out.logprobs == [-0.25] * len(ids)
    assert (out.content, out.prompt_ids, out.finish_reason, out.text_rendered) == ("four", [1, 2, 3], "stop", True)


async def test_with_a_tokenizer_token_ids_go_to_the_completions_endpoint(tiny_model_dir):
    """Token in, token out on a vLLM-style server: the chat is rendered locally and sent as token ids to
    /completions; the reply's ids and logprobs are the server's, the text is decoded from them."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = [*tokenizer.encode("<think>hm</think>four", add_special_tokens=False), tokenizer.eos_token_id]
    rendered = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=False)
    with StubOpenAIServer(reply="ignored: ids win", reply_ids=ids) as server:
        async with OpenAIPolicy("m", server.url, tokenizer=tokenizer, return_token_ids=True) as policy:
            out = await policy.generate(CHAT, GREEDY)
        (path, body), *_ = server.requests
    assert path == "/v1/completions" and body["prompt"] == rendered and body["logprobs"] == 0
    assert out.completion_ids == ids and out.logprobs == [-0.5] * len(ids)
    assert (out.reasoning, out.content, out.prompt_ids) == ("hm", "four", rendered)
    assert out.finish_reason == "stop" and not out.text_rendered


def _vllm_chat_reply(ids: list[int]) -> dict:
    """A chat reply with vLLM's token ids, as vLLM sends one to a request with return_token_ids."""
    choice = {"message": {"role": "assistant", "content": "four"}, "text": "four", "finish_reason": "stop"}
    choice |= {"token_ids": ids, "logprobs": {"content": [{"token": f"token_id:{i}", "logprob": -0.5} for i in ids]}}
    return {"choices": [choice], "prompt_token_ids": [1, 2, 3]}


async def test_token_ids_are_asked_for_by_default_and_kept_when_the_server_sends_them():
    ids = [11, 12, 2]
    with StubOpenAIServer(response=_vllm_chat_reply(ids)) as server:
        async with OpenAIPolicy("m", server.url) as policy:  # no flag: return_token_ids=None
            assert policy.server_token_ids is None
            out = await policy.generate(CHAT, GREEDY)
        [(path, body)] = server.requests
    assert path == "/v1/chat/completions"
    assert body["return_token_ids"] is body["return_tokens_as_token_ids"] is body["logprobs"] is True
    assert (out.prompt_ids, out.completion_ids, out.logprobs) == ([1, 2, 3], ids, [-0.5] * 3)
    assert policy.server_token_ids is True


async def test_with_a_tokenizer_later_calls_continue_the_servers_tokens_on_completions(tiny_model_dir):
    """Token in, token out with no flag: once the server has sent ids, a call that continues an episode sends the
    previous call's prompt and sampled ids, then the new messages' tokens, to /completions."""
    from transformers import AutoTokenizer

    from rllm_gym.types import Step

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = [*tokenizer.encode("left", add_special_tokens=False), tokenizer.convert_tokens_to_ids("<|im_end|>")]
    with StubOpenAIServer(response=_vllm_chat_reply(ids)) as server:
        async with OpenAIPolicy("m", server.url, tokenizer=tokenizer) as policy:
            first = await policy.generate(CHAT, GREEDY)
            chat = [*CHAT, {"role": "assistant", "content": "four"}]
            previous = Step(chat_completions=chat, prompt_ids=first.prompt_ids, response_ids=first.completion_ids)
            await policy.generate([*chat, {"role": "user", "content": "and 3 + 3?"}], GREEDY, previous=previous)
        (_, _), (path, body) = server.requests
    assert path == "/v1/completions"
    assert body["prompt"][: len(first.prompt_ids) + len(ids)] == [1, 2, 3, *ids]
    assert tokenizer.decode(body["prompt"][len(first.prompt_ids) + len(ids) :]).startswith("\n<|im_start|>user")


async def test_a_server_that_refuses_the_token_id_fields_is_asked_without_them_after_one_warning(caplog):
    with StubOpenAIServer(reply="five", refuse=("return_token_ids", "return_tokens_as_token_ids")) as server:
        async with OpenAIPolicy("m", server.url) as policy:
            with caplog.at_level(logging.WARNING, logger="rllm_gym"):
                outs = await asyncio.gather(*(policy.generate(CHAT, GREEDY) for _ in range(4)))
                outs.append(await policy.generate(CHAT, GREEDY))
        bodies = [body for _, body in server.requests]
    assert [out.content for out in outs] == ["five"] * 5
    assert all(out.completion_ids == out.prompt_ids == out.logprobs == [] for out in outs)  # no ids invented
    assert policy.server_token_ids is False and policy.retries == 0
    asked = [body for body in bodies if "return_token_ids" in body]
    assert 1 <= len(asked) <= 4 and len(bodies) == len(asked) + 5  # each refused request once more, then never
    assert "logprobs" not in bodies[-1]
    warned = [r.getMessage() for r in caplog.records if "refuses vLLM's token-id fields" in r.getMessage()]
    assert len(warned) == 1 and "HTTP 400: " in warned[0] and "Unrecognized request argument" in warned[0]


async def test_a_refusal_is_an_error_when_token_ids_were_required_and_other_rejections_stay_errors():
    with StubOpenAIServer(refuse=("return_token_ids",)) as server:
        async with OpenAIPolicy("m", server.url, return_token_ids=True) as policy:
            with pytest.raises(PolicyError, match=re.escape('HTTP 400: {"error": {"message": "Unrecognized')):
                await policy.generate(CHAT, GREEDY)
        async with OpenAIPolicy("m", server.url, return_token_ids=False) as policy:
            assert (await policy.generate(CHAT, GREEDY)).content.startswith("echo")
        assert "return_token_ids" not in server.requests[-1][1]
        server.refuse = ("seed",)  # a refusal of another field is the caller's to fix: not retried, not hidden
        async with OpenAIPolicy("m", server.url) as policy:
            with pytest.raises(PolicyError, match="supplied: seed"):
                await policy.generate(CHAT, SamplingParams(max_tokens=4, seed=1))
            assert policy.server_token_ids is None


async def test_a_server_that_ignores_the_fields_is_not_asked_again():
    with StubOpenAIServer(reply="five") as server:  # accepts unknown fields and sends no ids, as many servers do
        async with OpenAIPolicy("m", server.url) as policy:
            await policy.generate(CHAT, GREEDY)
            out = await policy.generate(CHAT, GREEDY)
        (_, first), (_, second) = server.requests
    assert first["return_token_ids"] is True and "return_token_ids" not in second and "logprobs" not in second
    assert policy.server_token_ids is False and out.completion_ids == []


def test_bad_constructor_arguments_name_the_fix():
    with pytest.raises(ValueError, match=re.escape("must be an http(s) URL like 'http://host:8000/v1'")):
        OpenAIPolicy("m", "localhost:8000")
    with pytest.raises(ValueError, match=re.escape("needs at least one URL")):
        OpenAIPolicy("m", [])


def test_policy_can_be_used_from_two_event_loops():
    with StubOpenAIServer() as server:
        policy = fast_policy(server.url)
        first = asyncio.run(policy.generate(CHAT, GREEDY))
        started = time.monotonic()
        second = asyncio.run(policy.generate(CHAT, GREEDY))
    assert first.content == second.content == "echo: What is 2 + 3?"
    assert time.monotonic() - started < 5


def test_a_policy_that_is_never_closed_closes_its_connections_when_its_loop_ends():
    import gc
    import warnings

    gc.collect()  # earlier tests' garbage (a client they left open) is finalized before the warnings are recorded
    with StubOpenAIServer() as server:
        policy = fast_policy(server.url)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            asyncio.run(policy.generate(CHAT, GREEDY))
            session = policy._session
            assert session is not None and session.closed
            del session, policy
            gc.collect()
    assert not [w for w in caught if "nclosed" in str(w.message)], [str(w.message) for w in caught]


def test_proxy_variables_apply_to_remote_servers_and_never_to_loopback(monkeypatch):
    from rllm_gym.policies.openai import _env_proxy

    with StubOpenAIServer() as proxy, StubOpenAIServer() as server:
        monkeypatch.setenv("HTTP_PROXY", proxy.url.removesuffix("/v1"))
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        # A host that does not exist: only the proxy can take the request (no name lookup), and the stub answers 404
        # to the absolute URL it is sent.
        with pytest.raises(PolicyError, match="HTTP 404"):
            asyncio.run(fast_policy("http://upstream.invalid:8000/v1", max_retries=0).generate(CHAT, GREEDY))
        assert proxy.hits == 1
        out = asyncio.run(fast_policy(server.url).generate(CHAT, GREEDY))
        assert out.content == "echo: What is 2 + 3?" and (server.hits, proxy.hits) == (1, 1)
        assert _env_proxy("http://[::1]:8000/v1") is None and _env_proxy("http://localhost:8000/v1") is None
        monkeypatch.setenv("NO_PROXY", "upstream.invalid")
        assert _env_proxy("http://upstream.invalid:8000/v1") is None


def test_a_redirect_is_not_followed_but_named():
    import http.server
    import threading

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.send_response(307)
            self.send_header("Location", "http://upstream.invalid/v1/chat/completions")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        with pytest.raises(PolicyError, match=re.escape("rejected the request with HTTP 307")):
            asyncio.run(fast_policy(url).generate(CHAT, GREEDY))
    finally:
        server.shutdown()
        server.server_close()
