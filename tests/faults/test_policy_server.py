"""A policy server that drops connections, stalls or answers garbage, on a real socket on 127.0.0.1.

OpenAIPolicy must retry and then fail with an error that says what went wrong; the engine must end only the affected
episodes with ERROR (the error recorded), retry them, and leave every other episode as it would have been.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rllm_gym.agents.math import MathAgent
from rllm_gym.engine import AgentExecutionEngine
from rllm_gym.envs.base import SingleTurnEnv
from rllm_gym.policies.base import PolicyError, SamplingParams
from rllm_gym.policies.openai import OpenAIPolicy
from rllm_gym.store import read_episodes
from rllm_gym.types import RewardOutput, TerminationReason

# What each failure mode leaves in the policy's error message.
SYMPTOM = {"drop": "ServerDisconnectedError", "stall": "no answer within timeout_s=", "garbage": "unreadable reply"}
CHAT = [{"role": "user", "content": "ping"}]


class FaultyServer:
    """An OpenAI-compatible server whose answer depends on the last user message: ``plan[text]`` is a list of
    failure modes used one per request (then normal answers) or one mode for every request. A normal answer echoes
    the message, so the env below can grade it."""

    def __init__(self, plan: dict[str, str | list[str]]):
        self.plan = {text: list(modes) if isinstance(modes, list) else modes for text, modes in plan.items()}
        self.hits: Counter[str] = Counter()
        self.released = threading.Event()  # ends stalled requests when the test is over
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def mode_for(self, text: str) -> str | None:
        with self.lock:
            self.hits[text] += 1
            modes = self.plan.get(text)
            if isinstance(modes, list):
                return modes.pop(0) if modes else None
            return modes

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                return

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
                mode = server.mode_for(text)
                if mode == "drop":
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if mode == "stall":
                    server.released.wait(30)
                    self.close_connection = True
                    return
                if mode == "garbage":
                    payload = b"<html>502 bad gateway</html>"
                else:
                    message = {"role": "assistant", "content": f"echo: {text}"}
                    payload = json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})
                    payload = payload.encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler

    def __enter__(self) -> FaultyServer:
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def fast_policy(url: str, max_retries: int) -> OpenAIPolicy:
    # A short per-attempt timeout makes a stalled server a timeout within a fraction of a second.
    return OpenAIPolicy(
        "stub", url, max_retries=max_retries, timeout_s=0.3, backoff_s=0.01, max_backoff_s=0.02, cooldown_s=0.1
    )


@pytest.mark.parametrize("mode", sorted(SYMPTOM))
async def test_policy_retries_then_fails_with_the_cause(mode):
    with FaultyServer({"ping": mode}) as server:
        async with fast_policy(server.url, max_retries=2) as policy:
            start = time.monotonic()
            with pytest.raises(PolicyError, match=re.escape("failed after 3 attempts (2 retries)")) as info:
                await policy.generate(CHAT, SamplingParams(max_tokens=4))
            elapsed = time.monotonic() - start
    message = str(info.value)
    assert SYMPTOM[mode] in message, message
    assert f"{server.url}/chat/completions" in message and "Is the server up and reachable?" in message
    assert server.hits["ping"] == 3 and policy.retries == 2
    assert elapsed < 5, "a stalled server must cost the per-attempt timeouts, not hang"


@pytest.mark.parametrize("mode", sorted(SYMPTOM))
async def test_policy_recovers_when_the_server_does(mode):
    with FaultyServer({"ping": [mode, mode]}) as server:
        async with fast_policy(server.url, max_retries=2) as policy:
            output = await policy.generate(CHAT, SamplingParams(max_tokens=4))
    assert output.content == "echo: ping"
    assert server.hits["ping"] == 3 and policy.retries == 2


def echo_reward(task: dict, action: str) -> RewardOutput:
    correct = action == f"echo: {task['question']}"
    return RewardOutput(reward=float(correct), is_correct=correct)


@pytest.mark.parametrize("mode", sorted(SYMPTOM))
async def test_engine_errors_and_retries_only_the_failing_episodes(mode, tmp_path):
    questions = ["q0", "q1", "q2", "q3", "dead", "flaky"]
    # "dead" fails every request; "flaky" fails the first episode attempt's two requests (one policy retry), then
    # answers: the engine's retry must turn it into a normal episode.
    plan = {"dead": mode, "flaky": [mode, mode]}
    out = tmp_path / "episodes.jsonl"
    with FaultyServer(plan) as server:
        async with fast_policy(server.url, max_retries=1) as policy:
            engine = AgentExecutionEngine(
                env_id=SingleTurnEnv,
                env_args={"reward_fn": echo_reward},
                agent_cls=MathAgent,
                agent_args={"system_prompt": "Echo the question."},
                policy=policy,
                n_parallel=4,
                retry_limit=2,
                out=out,
            )
            episodes = await engine.run([{"id": q, "question": q} for q in questions])
    by_id = {episode.id: episode for episode in episodes}
    assert list(by_id) == [f"{q}:0" for q in questions]

    dead = by_id["dead:0"]
    assert dead.termination_reason is TerminationReason.ERROR and not dead.is_correct
    assert dead.metadata["attempts"] == 2
    error = dead.metadata["error"]
    assert error["type"] == "PolicyError"
    assert "failed after 2 attempts (1 retries)" in error["message"] and SYMPTOM[mode] in error["message"]

    flaky = by_id["flaky:0"]
    assert flaky.termination_reason is TerminationReason.ENV_DONE and flaky.is_correct
    assert flaky.metadata["attempts"] == 2 and "error" not in flaky.metadata

    for q in ("q0", "q1", "q2", "q3"):
        episode = by_id[f"{q}:0"]
        assert episode.termination_reason is TerminationReason.ENV_DONE and episode.is_correct
        assert episode.metadata["attempts"] == 1
        assert episode.trajectories[0].steps[0].action == f"echo: {q}"
    assert server.hits == Counter({"dead": 4, "flaky": 3, "q0": 1, "q1": 1, "q2": 1, "q3": 1})

    # The episode file holds every episode once, the failed one with its error.
    stored = {episode.id: episode for episode in read_episodes(out)}
    assert sorted(stored) == sorted(by_id)
    assert stored["dead:0"].metadata["error"] == error
