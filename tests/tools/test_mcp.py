"""MCP tools against a real MCP server process (tests/tools/mcp_test_server.py, the official SDK's FastMCP) over
stdio and streamable HTTP: schemas, calls, results as tool messages in Tool-v0, and a server that misbehaves."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import gymnasium as gym
import psutil
import pytest

import rllm_gym  # noqa: F401 - registers the envs
from rllm_gym.agents.tool import ToolAgent
from rllm_gym.tools.mcp import MCPServer, MCPServerError
from rllm_gym.types import ModelOutput, ToolCall

SERVER = [sys.executable, str(Path(__file__).with_name("mcp_test_server.py"))]
TASK = {"question": "What is 2 + 40?", "ground_truth": "42"}


def children() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def call(env: gym.Env, name: str, **arguments) -> tuple[str, float, bool]:
    observation, reward, terminated, _, _ = env.step(
        ModelOutput(tool_calls=[ToolCall(name=name, arguments=arguments)])
    )
    return observation, reward, terminated


def test_stdio_server_tools_join_tool_env_and_answer_as_tool_messages() -> None:
    before = children()
    env = gym.make("rllm/Tool-v0", tools=["finish"], mcp_servers=[SERVER], mcp_timeout=5, parser="hermes")
    try:
        assert children() - before  # the server process the env started
        _, info = env.reset(options={"task": TASK})
        assert info["tool_names"] == ["finish", "add", "shout", "hang", "fail", "crash", "garbage"]
        assert '"name": "add"' in info["system_prompt"]  # the schema is rendered for the model
        observation, _, terminated = call(env, "add", a=2, b=40)
        assert "<tool_response>\n42\n</tool_response>" in observation and not terminated
        observation, reward, _ = call(env, "add", a="two", b=40)  # checked against the server's schema, not sent
        assert "is not of type 'integer'" in observation and reward < 0
        observation, _, _ = call(env, "shout", text="ab", times=3)
        assert "ABABAB" in observation
        observation, _, _ = call(env, "fail", message="boom")
        assert "Error" in observation and "boom" in observation
        _, reward, terminated = call(env, "finish", response="42")
        assert terminated and reward == 1.0
    finally:
        env.close()
    assert not children() - before  # close() stopped the server it started


def test_a_hanging_crashing_or_garbage_server_gives_observations() -> None:
    env = gym.make("rllm/Tool-v0", tools=["finish"], mcp_servers=[SERVER], mcp_timeout=1.5)
    try:
        env.reset(options={"task": TASK})
        observation, _, terminated = call(env, "hang", seconds=30)
        assert "timed out" in observation.lower() and not terminated
        observation, _, _ = call(env, "add", a=1, b=1)  # the server is still there after a slow call
        assert "<tool_response>\n2\n</tool_response>" in observation
        observation, _, _ = call(env, "garbage")
        assert "Error" in observation and not terminated
        observation, _, terminated = call(env, "crash")
        assert "Error" in observation and not terminated
        observation, _, _ = call(env, "add", a=1, b=1)
        assert re.search(r"Error: MCP server .* (is gone|failed the call)", observation)
    finally:
        env.close()


def test_streamable_mcp_http_url_and_tool_agent(mcp_http_url: str) -> None:
    server = MCPServer(mcp_http_url, timeout=5, max_output_chars=50)
    try:
        assert server.call("add", {"a": 5, "b": 6}).output == "11"
        long = next(tool for tool in server.tools if tool.name == "shout")(text="x", times=500)
        assert long.truncated and len(long.output) <= 50 + 40  # cut to max_output_chars, with a marker
    finally:
        server.close()
    assert server.call("add", {"a": 1, "b": 1}).error == f"MCP server {mcp_http_url!r} was closed"
    agent = ToolAgent(tools=["finish"], mcp_servers=[mcp_http_url], native_tools=True)
    assert [schema["function"]["name"] for schema in agent.tools_schema][:3] == ["finish", "add", "shout"]


def test_bad_servers_are_one_clear_line() -> None:
    with pytest.raises(MCPServerError, match=r"MCP server 'http://127\.0\.0\.1:9/mcp' could not be reached"):
        MCPServer("http://127.0.0.1:9/mcp", timeout=2)
    with pytest.raises(MCPServerError, match="could not be started or does not speak MCP"):
        MCPServer([sys.executable, "-c", "print('hello, not MCP')"], timeout=2)
    with pytest.raises(MCPServerError, match=r"could not be started or does not speak MCP \(TimeoutError"):
        MCPServer([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1, start_timeout=1)  # hangs
    with pytest.raises(ValueError, match="mcp_servers entries must be"):
        MCPServer(42)  # type: ignore[arg-type]
    with pytest.raises(MCPServerError, match="no-such-command-xyz"):
        gym.make("rllm/Tool-v0", mcp_servers=["no-such-command-xyz --flag"], mcp_timeout=2)


def test_a_web_page_or_an_openenv_server_given_as_an_mcp_server_is_one_line() -> None:
    import http.server
    import threading

    from rllm_gym.integrations.openenv import LocalServer

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    page = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=page.serve_forever, daemon=True).start()
    openenv = LocalServer("rllm/FrozenLake-v0")
    try:
        for url in (f"http://127.0.0.1:{page.server_address[1]}/mcp", openenv.base_url):
            with pytest.raises(MCPServerError, match=re.escape(f"MCP server {url!r} could not be reached")) as error:
                gym.make("rllm/Tool-v0", mcp_servers=[url], mcp_timeout=5)
            assert "\n" not in str(error.value) and "does not speak MCP" in str(error.value)
    finally:
        page.shutdown()
        page.server_close()
        openenv.stop()


def test_a_copied_env_shares_the_session_and_the_last_close_stops_the_server() -> None:
    import copy

    before = children()
    env = gym.make("rllm/Tool-v0", tools=["finish"], mcp_servers=[SERVER], mcp_timeout=5)
    env.reset(options={"task": TASK})
    clone = copy.deepcopy(env)
    assert "<tool_response>\n5\n</tool_response>" in call(clone, "add", a=2, b=3)[0]
    assert len(children() - before) == 1  # the copy holds the same session: no second process
    clone.close()
    assert "<tool_response>\n9\n</tool_response>" in call(env, "add", a=4, b=5)[0]  # the original is untouched
    env.close()
    assert not children() - before


def test_envs_of_a_process_share_one_server_process_and_their_calls_stay_apart() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from rllm_gym.tools.mcp import default_pool

    before = children()
    envs = [gym.make("rllm/Tool-v0", tools=["finish"], mcp_servers=[SERVER], mcp_timeout=10) for _ in range(8)]
    try:
        assert len(children() - before) == 1 and list(default_pool().sessions().values()) == [8]
        for env in envs:
            env.reset(options={"task": TASK})
        with ThreadPoolExecutor(8) as threads:  # every env's call at once over the one session
            answers = list(threads.map(lambda i: call(envs[i], "add", a=i, b=1000)[0], range(8)))
        assert [f"<tool_response>\n{1000 + i}\n</tool_response>" in answer for i, answer in enumerate(answers)] == [
            True
        ] * 8
        for env in envs[:-1]:
            env.close()
        assert len(children() - before) == 1  # still held by the last env
        assert "<tool_response>\n3\n</tool_response>" in call(envs[-1], "add", a=1, b=2)[0]
    finally:
        for env in envs:
            env.close()
    assert not children() - before and default_pool().sessions() == {}


def test_shared_false_keeps_one_server_per_env_for_stateful_servers() -> None:
    before = children()
    spec = {"command": SERVER[0], "args": SERVER[1:], "shared": False}
    envs = [gym.make("rllm/Tool-v0", tools=["finish"], mcp_servers=[spec], mcp_timeout=10) for _ in range(3)]
    try:
        assert len(children() - before) == 3
        envs[0].reset(options={"task": TASK})
        assert "<tool_response>\n7\n</tool_response>" in call(envs[0], "add", a=3, b=4)[0]
    finally:
        for env in envs:
            env.close()
    assert not children() - before


def test_a_shared_server_that_crashed_is_replaced_for_envs_made_later() -> None:
    before = children()
    first = gym.make("rllm/Tool-v0", tools=["finish"], mcp_servers=[SERVER], mcp_timeout=5)
    first.reset(options={"task": TASK})
    assert "Error" in call(first, "crash")[0]
    assert "Error" in call(first, "add", a=1, b=1)[0]  # gone: an observation, never an exception
    later = gym.make("rllm/Tool-v0", tools=["finish"], mcp_servers=[SERVER], mcp_timeout=5)
    later.reset(options={"task": TASK})
    assert "<tool_response>\n2\n</tool_response>" in call(later, "add", a=1, b=1)[0]
    first.close()
    later.close()
    assert not children() - before
