"""The gateway's own CPU per call, apart from the clients' and the model's (bench_gateway.py prints it).

The clients (plain aiohttp, ``sessions`` programs of ``turns`` chat calls, ``rounds`` times) run in a process of their
own, so this process's CPU is the server's alone; the policy is a ScriptedPolicy with the model's tokenizer (prompt
rendering and token continuation as on the real path, no model). Three figures in ms of CPU per call:

- ``gateway``: the whole gateway (HTTP, JSON, request checks, prompt ids, recording, the reply);
- ``bare_aiohttp``: an aiohttp handler that reads the same requests and answers a canned reply (HTTP and JSON only);
- ``policy_direct``: the same policy called directly with the same chats (what the direct path spends too).

So ``gateway - bare_aiohttp - policy_direct`` is the gateway's own Python. Garbage collection is off while they run
(the sessions here stay open, so its passes would grow with them; the engine's ``tune_interpreter`` tames it too).
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import time
from typing import Any

import aiohttp
from aiohttp import web

from rllm_gym.gateway import Gateway
from rllm_gym.policies.base import SamplingParams
from rllm_gym.policies.scripted import ScriptedPolicy
from rllm_gym.types import Step

REPLY_TEXT = "LEFT then UP, done."
CANNED = {
    "id": "chatcmpl-0",
    "object": "chat.completion",
    "created": 0,
    "model": "p",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": REPLY_TEXT}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 20, "completion_tokens": 8, "total_tokens": 28},
}


def _next_chat(messages: list[dict[str, Any]], content: str) -> list[dict[str, Any]]:
    return [*messages, {"role": "assistant", "content": content}, {"role": "user", "content": "and again"}]


def _clients(rounds: list[list[str]], turns: int, max_tokens: int) -> None:
    """In the clients' process: each round's sessions at once, ``turns`` calls each, one round after the other."""

    async def episode(http: aiohttp.ClientSession, base_url: str) -> None:
        messages = [{"role": "user", "content": "move left then up"}]
        for _ in range(turns):
            body = {"model": "p", "messages": messages, "max_tokens": max_tokens}
            async with http.post(f"{base_url}/chat/completions", json=body) as response:
                messages = _next_chat(messages, (await response.json())["choices"][0]["message"]["content"])

    async def run() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            for urls in rounds:
                await asyncio.gather(*(episode(http, url) for url in urls))

    asyncio.run(run())


async def _server_cpu(rounds: list[list[str]], turns: int, max_tokens: int) -> float:
    """This process's CPU seconds while a process of clients runs ``rounds`` against it."""
    # fork: the child runs only aiohttp clients (none of this process's threads' work), and starts at once.
    clients = multiprocessing.get_context("fork").Process(target=_clients, args=(rounds, turns, max_tokens))
    start = time.process_time()
    try:
        clients.start()
        while clients.is_alive():  # the loop stays free to serve; a 5 ms poll costs ~nothing
            await asyncio.sleep(0.005)
        used = time.process_time() - start
    finally:
        clients.join()
    if clients.exitcode != 0:
        raise RuntimeError(f"the clients' process failed (exit code {clients.exitcode})")
    return used


async def _bare_aiohttp(sessions: int, rounds: int, turns: int, max_tokens: int) -> float:
    async def chat(request: web.Request) -> web.Response:
        await request.json()
        return web.json_response(CANNED)

    app = web.Application()
    app.router.add_post("/sessions/{sid}/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        urls = [[f"http://127.0.0.1:{port}/sessions/s{i}/v1" for i in range(sessions)] for _ in range(rounds)]
        return await _server_cpu(urls, turns, max_tokens)
    finally:
        await runner.cleanup()


async def _policy_direct(policy: ScriptedPolicy, sessions: int, rounds: int, turns: int, max_tokens: int) -> float:
    params = SamplingParams(max_tokens=max_tokens)

    async def episode() -> None:
        messages, previous = [{"role": "user", "content": "move left then up"}], None
        for _ in range(turns):
            output = await policy.generate(messages, params, previous=previous)
            reply = {"role": "assistant", "content": output.content}
            previous = Step(
                chat_completions=[*messages, reply], prompt_ids=output.prompt_ids, response_ids=output.completion_ids
            )
            messages = _next_chat(messages, output.content)

    start = time.process_time()
    for _ in range(rounds):
        await asyncio.gather(*(episode() for _ in range(sessions)))
    return time.process_time() - start


async def gateway_cost(tokenizer: Any, sessions: int, turns: int, rounds: int, max_tokens: int) -> dict[str, float]:
    """ms of CPU per call of the gateway, of a bare aiohttp server and of the policy called directly (module doc)."""
    policy = ScriptedPolicy([REPLY_TEXT], cycle=True, tokenizer=tokenizer)
    await _policy_direct(policy, sessions, 1, turns, max_tokens)  # warm-up: the chat template compiled
    collecting = gc.isenabled()
    gc.disable()
    try:
        async with Gateway(policy) as gateway:
            urls = [[gateway.open_session(i).base_url for i in range(sessions)] for _ in range(rounds)]
            gateway_s = await _server_cpu(urls, turns, max_tokens)
        seconds = {
            "gateway": gateway_s,
            "bare_aiohttp": await _bare_aiohttp(sessions, rounds, turns, max_tokens),
            "policy_direct": await _policy_direct(policy, sessions, rounds, turns, max_tokens),
        }
    finally:
        if collecting:
            gc.enable()
    calls = sessions * turns * rounds
    return {name: round(1e3 * used / calls, 3) for name, used in seconds.items()}
