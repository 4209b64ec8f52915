"""The OpenEnv server side: our env behind OpenEnv's Environment interface, and the served app under hostile input
(malformed JSON, wrong types, unknown routes and message types, huge bodies, clients that vanish mid-session)."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from rllm_gym.cli import build_parser
from rllm_gym.integrations.openenv import GymTextEnvironment, LocalServer, TextAction, create_server_app


@pytest.fixture(scope="module")
def server():
    local = LocalServer("rllm/FrozenLake-v0", max_sessions=1, env_kwargs={"size": 3})
    yield local
    local.stop()


def test_environment_wraps_the_gym_env() -> None:
    env = GymTextEnvironment("rllm/Math-v0")
    first = env.reset(seed=0, options={"task": {"question": "1+1?", "ground_truth": "2"}})
    assert first.text == "1+1?" and not first.done and env.state.step_count == 0
    last = env.step(TextAction(text="\\boxed{2}"))
    assert last.done and last.reward == 1.0 and not last.truncated and last.info["is_correct"] is True
    again = env.step(TextAction(text="\\boxed{2}"))
    assert again.done and again.reward == 0.0 and "reset first" in again.info["error"]
    env.close()


def test_bad_arguments_fail_at_once() -> None:
    with pytest.raises(ValueError, match="multi-agent"):
        create_server_app("rllm/SolverJudge-v0")
    with pytest.raises(ValueError, match="max_sessions"):
        create_server_app("rllm/FrozenLake-v0", max_sessions=0)
    with pytest.raises(ValueError, match="size"):
        create_server_app("rllm/FrozenLake-v0", env_kwargs={"size": 0})
    assert build_parser().parse_args(["serve", "rllm/Math-v0"]).host == "127.0.0.1"


def test_server_survives_hostile_http(server: LocalServer) -> None:
    url = server.base_url
    with httpx.Client(base_url=url, timeout=30) as client:
        headers = {"content-type": "application/json"}
        assert client.post("/step", content=b"{not json", headers=headers).status_code == 422
        assert client.post("/step", json={"action": {"text": 5}}).status_code == 422  # a wrong type
        assert client.post("/step", json={"action": {"txt": "up"}}).status_code == 422  # an unknown field
        assert client.post("/reset", json={"seed": "zero"}).status_code == 422
        assert client.get("/no-such-route").status_code == 404
        huge = client.post("/step", content=b"x" * (17 * 1024 * 1024), headers=headers)
        assert huge.status_code == 413 and "request body over" in huge.json()["detail"]
        assert client.post("/reset", json={"seed": 1}).json()["observation"]["text"]  # still serving
        assert client.get("/health").json()["status"] == "healthy"


def test_a_vanished_client_frees_its_session(server: LocalServer) -> None:
    from openenv.core import GenericEnvClient

    host, port = server.base_url.removeprefix("http://").split(":")
    raw = socket.create_connection((host, int(port)))
    raw.sendall(
        f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    assert b"101" in raw.recv(1024).split(b"\r\n")[0]
    raw.close()  # gone without a close frame, mid-session
    for _ in range(3):  # max_sessions=1: each session is usable only if the previous one was released
        client = GenericEnvClient(base_url=server.base_url, message_timeout_s=30).sync()
        with client:
            result = client.reset(seed=2)
            assert result.observation["text"]
            bad = client.step({"text": json.dumps({"nested": ["not", "a", "move"]})})
            assert "Invalid action" in bad.observation["text"] and not bad.done
