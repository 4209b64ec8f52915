import re

import pytest

from rllm_gym.agents.base import BaseAgent
from rllm_gym.agents.frozenlake import FrozenLakeAgent
from rllm_gym.agents.math import MathAgent
from rllm_gym.policies.base import build_model_output
from rllm_gym.types import ModelOutput


class EchoAgent(BaseAgent):
    system_prompt = "Echo."


def test_records_one_step_per_llm_call_with_token_fields():
    agent = EchoAgent()
    agent.update_from_env("first", 0.0, False, {"k": 1})
    output = build_model_output(
        "<think>hmm</think>reply one",
        prompt_ids=[1, 2, 3],
        completion_ids=[4, 5],
        logprobs=[-0.1, -0.2],
        finish_reason="stop",
    )
    action = agent.update_from_model(output)
    assert action == "reply one"  # the reasoning is not sent to the env
    agent.update_from_env("second", 0.5, False, {"k": 2})
    agent.update_from_model("reply two")
    agent.update_from_env("", 1.0, True, {"is_correct": True})
    first, second = agent.trajectory.steps
    assert (first.prompt_ids, first.response_ids, first.logprobs) == ([1, 2, 3], [4, 5], [-0.1, -0.2])
    assert first.thought == "hmm" and first.model_output == output and first.observation == "first"
    assert (first.reward, first.done, first.info) == (0.5, False, {"k": 2})
    assert (second.reward, second.done, second.info) == (1.0, True, {"is_correct": True})
    assert first.chat_completions == [
        {"role": "system", "content": "Echo."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "<think>hmm</think>reply one"},
    ]
    assert agent.trajectory.is_cumulative()
    assert agent.get_current_state() is second


def test_reset_starts_over():
    agent = MathAgent()
    agent.update_from_env("1+1?", 0.0, False, {})
    agent.update_from_model("\\boxed{2}")
    agent.reset()
    assert agent.trajectory.steps == [] and agent.get_current_state() is None
    assert [m["role"] for m in agent.chat_completions] == ["system"]


def test_history_limit_keeps_system_prompt_and_last_turns():
    agent = FrozenLakeAgent(max_history_turns=2)
    for turn in range(4):
        agent.update_from_env(f"grid {turn}", 0.0, False, {})
        agent.update_from_model(ModelOutput(text="Action: up", content="Action: up"))
    chat = agent.chat_completions
    assert chat[0]["role"] == "system"
    assert [m["content"] for m in chat[1:] if m["role"] == "user"] == [
        "Current grid:\ngrid 2\nYour move?",
        "Current grid:\ngrid 3\nYour move?",
    ]
    with pytest.raises(ValueError, match=re.escape("max_history_turns must be >= 1 or None")):
        FrozenLakeAgent(max_history_turns=0)


def test_name_and_system_prompt_overrides():
    agent = MathAgent(system_prompt="Be brief.", name="solver")
    assert agent.trajectory.name == "solver"
    assert agent.chat_completions == [{"role": "system", "content": "Be brief."}]
