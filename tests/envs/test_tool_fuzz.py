"""Property test: rllm/Tool-v0 ``step`` turns any reply (text or ModelOutput) into an observation, never an error."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rllm_gym.envs.tool import ToolEnv
from rllm_gym.types import ModelOutput, RewardOutput, ToolCall

_fragments = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        '{"name": "calculator", "arguments": {"expression": "2**10"}}',
        '{"name": "calculator", "arguments": {"expression": 7}}',
        '{"name": "search", "arguments": {"query": "capital"}}',
        '{"name": "nope", "arguments": {}}',
        '{"name": "finish", "arguments": {"response": "1024"}}',
        '{"name": "finish"}',
        "```json\n",
        "```",
        "{",
        "}",
        '"',
        "\n",
        "\x00",
    ]
)
_replies = st.text(max_size=200) | st.lists(_fragments | st.text(max_size=6), max_size=12).map("".join)
_outputs = st.builds(
    ModelOutput,
    text=st.text(max_size=40),
    content=st.text(max_size=40),
    tool_calls=st.lists(
        st.builds(
            ToolCall,
            name=st.sampled_from(["calculator", "finish", "nope", ""]),
            arguments=st.dictionaries(st.sampled_from(["expression", "response", "x"]), st.text(max_size=8)),
        ),
        max_size=2,
    ),
)
_TASK = {"id": "t", "question": "What is 2**10?", "ground_truth": "1024"}


def _exact(task_info: dict, action: str) -> RewardOutput:
    return RewardOutput(reward=float(action.strip() == task_info["ground_truth"]), is_correct=None)


@settings(max_examples=200, deadline=None)
@given(actions=st.lists(_replies | _outputs, min_size=1, max_size=4))
def test_step_never_raises_and_rewards_are_the_documented_ones(actions):
    env = ToolEnv(
        tools=["calculator", "search", "finish"], reward_fn=_exact, max_tool_calls=2, malformed_call_penalty=0.25
    )
    env.reset(options={"task": _TASK})
    paid = 0.0
    for action in actions:
        observation, reward, terminated, truncated, info = env.step(action)
        assert env.observation_space.contains(observation)
        assert not (terminated and truncated)
        n_malformed = len(info["malformed_calls"])
        # 0.25 a malformed call, at most 0.2 a reply (max_reply_penalty) and 0.5 an episode (max_episode_penalty)
        penalty = -min(0.25 * n_malformed, 0.2, 0.5 - paid)
        paid -= penalty
        assert all(call["kind"] and call["message"] for call in info["malformed_calls"])
        assert 0 <= info["n_tool_calls"] <= 2 and info["tool_calls_left"] == 2 - info["n_tool_calls"]
        if terminated:
            assert info["final_answer"] is not None
            assert reward == float(info["is_correct"]) + penalty
            break
        assert info["final_answer"] is None and reward == penalty
        if truncated:
            break
