"""Every registered single-agent env, end to end: its default agent, the engine, a scripted policy, valid Episodes."""

import pytest

from rllm_gym.engine import AgentExecutionEngine
from rllm_gym.policies.scripted import ScriptedPolicy
from rllm_gym.registry import default_agent, env_ids
from rllm_gym.types import Episode, TerminationReason

# Replies that each env accepts as well-formed, so every code path past parsing runs.
REPLIES = {
    "rllm/FrozenLake-v0": ["Let me go down.\nAction: down", "Action: right"],
    "rllm/OpenEnv-v0": ["Action: down", "Action: right"],  # a served FrozenLake (tests/conftest.py)
    "rllm/Math-v0": ["<think>add them</think>The answer is \\boxed{4}."],
    "rllm/Code-v0": ["```python\nprint(input())\n```"],
    "rllm/ReasoningGym-v0": ["<think>add them</think>\\boxed{4}"],
    "rllm/Tool-v0": [
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2**10"}}\n</tool_call>',
        '<tool_call>\n{"name": "finish", "arguments": {"response": "1024"}}\n</tool_call>',
    ],
}


def test_every_env_has_replies_here():
    assert set(env_ids(multi_agent=False)) <= set(REPLIES)


@pytest.mark.parametrize("env_id", env_ids(multi_agent=False))
async def test_scripted_episodes_are_valid_and_carry_the_policy_tokens(env_id):
    policy = ScriptedPolicy(REPLIES[env_id], cycle=True)
    engine = AgentExecutionEngine(env_id=env_id, agent_cls=default_agent(env_id), policy=policy, max_turns=3)
    episodes = await engine.run(list(range(3)), n_rollouts=2)
    assert len(episodes) == 6
    for episode in episodes:
        assert episode.termination_reason in {TerminationReason.ENV_DONE, TerminationReason.MAX_TURNS_EXCEEDED}, (
            episode.metadata.get("error")
        )
        assert Episode.from_json(episode.to_json()).to_dict() == episode.to_dict()
        (trajectory,) = episode.trajectories
        assert 1 <= len(trajectory.steps) <= 3
        for step in trajectory.steps:
            output = step.model_output
            assert step.response_ids == output.completion_ids and step.response_ids
            assert step.logprobs == output.logprobs and len(step.logprobs) == len(step.response_ids)
            assert step.prompt_ids == output.prompt_ids
            assert step.chat_completions[-1] == {"role": "assistant", "content": output.text}
        assert trajectory.reward == sum(step.reward for step in trajectory.steps)
