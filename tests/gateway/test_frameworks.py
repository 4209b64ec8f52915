"""An agent written the LangGraph way (a ReAct graph over ``langchain_openai.ChatOpenAI`` with a tool), unchanged,
run as episodes through the gateway: its tool calls execute and every model call is a Step with token ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

from rllm_gym.policies import HFPolicy, ScriptedPolicy
from rllm_gym.sdk import run_agent_program
from rllm_gym.types import TerminationReason

TOOL_RESULTS: list[int] = []
# create_react_agent is LangGraph 1.x's prebuilt ReAct graph (its successor is in the separate langchain package).
pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    TOOL_RESULTS.append(a + b)
    return a + b


async def langgraph_agent(task, base_url):
    model = ChatOpenAI(model="policy", base_url=base_url, api_key="unused", max_tokens=96, max_retries=0)
    agent = create_react_agent(model, [add])
    state = await agent.ainvoke({"messages": [{"role": "user", "content": task["question"]}]}, {"recursion_limit": 6})
    return state["messages"][-1].content


def calls_add_then_answers(messages):
    if messages[-1]["role"] == "tool":
        return f"The sum is {messages[-1]['content']}."
    return '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


async def test_a_langgraph_agent_calls_its_tool_through_the_gateway():
    TOOL_RESULTS.clear()
    policy = ScriptedPolicy(calls_add_then_answers)
    (episode,) = await run_agent_program(
        langgraph_agent, [{"question": "What is 2+3?"}], policy, reward_fn=lambda task, output: float("5" in output)
    )
    trajectory = episode.trajectories[0]
    assert episode.termination_reason is TerminationReason.ENV_DONE, episode.metadata
    assert TOOL_RESULTS == [5] and trajectory.output == "The sum is 5." and trajectory.reward == 1.0
    first, second = trajectory.steps
    assert first.info["tools"][0]["function"]["name"] == "add"
    call = first.chat_completions[-1]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"a": 2, "b": 3}
    # LangGraph sent back the recorded reply and the tool's answer: the second call extends the first.
    assert second.chat_completions[: len(first.chat_completions)] == first.chat_completions
    assert second.chat_completions[len(first.chat_completions)] == {
        "role": "tool",
        "content": "5",
        "tool_call_id": call["id"],
    }


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return HFPolicy(tiny_model_dir)


async def test_a_langgraph_agent_on_a_model_records_token_ids(policy):
    episodes = await run_agent_program(langgraph_agent, [{"question": "add 2 and 3"}], policy, n_rollouts=2)
    for episode in episodes:
        assert episode.termination_reason is TerminationReason.ENV_DONE, episode.metadata
        step = episode.trajectories[0].steps[0]
        assert step.chat_completions[0] == {"role": "user", "content": "add 2 and 3"}
        assert "add" in policy.tokenizer.decode(step.prompt_ids)  # the tool list reached the chat template
        assert len(step.response_ids) == len(step.logprobs) > 0


def count_reward(task, output):
    return len(output or "") / 100  # varies within a group, so GRPO has advantages to learn from


@pytest.mark.slow
def test_grpo_trains_the_langgraph_agent_unchanged(tmp_path):
    from rllm_gym.train.grpo import main

    config = Path(__file__).resolve().parents[2] / "train" / "configs" / "test_tiny.yaml"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"q{i}", "question": f"add {i} and 3"}) + "\n" for i in range(4)))
    flags = ["--config", str(config), "--output_dir", str(tmp_path / "run"), "--max_steps", "1", "--tasks", str(tasks)]
    flags += ["--agent_program", f"{__name__}:langgraph_agent", "--reward_fn", f"{__name__}:count_reward"]
    summary = main(flags)
    assert summary["termination_reasons"] == {"env_done": 4} and not summary["errors"]
    [step] = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert step["grad_norm"] > 0 and step["rollout/turns"] >= 1.0
