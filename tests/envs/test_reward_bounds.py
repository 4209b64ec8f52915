"""Every registered env stays within the reward bounds it declares, under fuzzed replies.

Each env declares ``metadata["step_reward_range"]`` and ``metadata["episode_return_range"]`` (documented in its
``## Rewards``); the test reads them from the env itself, never from a table here, and drives seeded random
replies at every id of :func:`rllm_gym.registry.env_ids`: garbage, format tricks, tool-call spam, hedges and,
mixed in, the task's own answer, so that high rewards are reached too.
"""

from __future__ import annotations

import importlib.util
import math
import random

import pytest

import rllm_gym
from rllm_gym.registry import ENV_SPECS, env_ids

EPISODES = 6
MAX_STEPS = 12


def _fragments(task: dict) -> list[str]:
    truth = str(task.get("ground_truth", task.get("answer", "")))
    return [
        "",
        " ",
        "0",
        "1",
        "True",
        "TrueFalse",
        "yes no",
        "up",
        "left right",
        f"\\boxed{{{truth}}}",
        f"\\boxed{{{truth}}} \\boxed{{0}}",
        f"<answer>{truth}</answer>",
        "\\boxed{}",
        "\\boxed{\\boxed{1}}",
        "<think>",
        "</think>",
        "<verdict>1</verdict>",
        "<verdict>1</verdict><verdict>2</verdict>",
        "<tool_call></tool_call>" * 500,
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2**10"}}</tool_call>',
        '<tool_call>{"name": "finish", "arguments": {"response": "' + truth.replace('"', "") + '"}}</tool_call>',
        '<tool_call>{"name": "nope"}</tool_call>' * 50,
        "```python\nprint(input())\n```",
        "```python\ndef f(*a):\n    return 1\n```",
        "\\boxed{9**9**9}",
        "\\boxed{__import__('os').getcwd()}",
        "x" * 5000,
        "\u2028Solution 2:\n\u0000\ud7ff",
        truth,
    ]


def _reply(rng: random.Random, task: dict) -> str:
    """One to three fragments; a single one half the time, so that plain right answers come up as well."""
    return "".join(rng.choice(_fragments(task)) for _ in range(rng.choice([1, 1, 1, 2, 3])))


def _bounds(env: object) -> tuple[tuple[float, float], tuple[float, float]]:
    metadata = env.unwrapped.metadata if hasattr(env, "unwrapped") else env.metadata
    step, episode = metadata["step_reward_range"], metadata["episode_return_range"]
    assert step[0] <= step[1] and episode[0] <= episode[1]
    return step, episode


def _within(value: float, bounds: tuple[float, float]) -> bool:
    return math.isfinite(value) and bounds[0] - 1e-9 <= value <= bounds[1] + 1e-9


def _available(env_id: str) -> bool:
    spec = next(spec for spec in ENV_SPECS if spec.id == env_id)
    return all(importlib.util.find_spec(extra.replace("-", "_")) is not None for extra in spec.extras)


@pytest.mark.parametrize("env_id", env_ids(multi_agent=False))
def test_single_agent_envs_stay_within_their_declared_bounds(env_id):
    if not _available(env_id):
        pytest.skip(f"{env_id} needs an optional extra")
    rng = random.Random(f"bounds/{env_id}")
    env = rllm_gym.make(env_id)
    step_range, episode_range = _bounds(env)
    for episode in range(EPISODES):
        _, info = env.reset(seed=episode)
        task = info.get("task") or {}
        total = 0.0
        for _ in range(MAX_STEPS):
            _, reward, terminated, truncated, _ = env.step(_reply(rng, task))
            assert _within(reward, step_range), (env_id, reward, step_range)
            total += reward
            if terminated or truncated:
                break
        assert _within(total, episode_range), (env_id, total, episode_range)
    env.close()


@pytest.mark.parametrize("env_id", env_ids(multi_agent=True))
def test_multi_agent_envs_stay_within_their_declared_bounds_per_agent(env_id):
    rng = random.Random(f"bounds/{env_id}")
    env = rllm_gym.make(env_id, parallel=True)
    step_range, episode_range = _bounds(env)
    for episode in range(EPISODES):
        _, infos = env.reset(seed=episode)
        task = next(iter(infos.values())).get("task") or {}
        totals = dict.fromkeys(env.possible_agents, 0.0)
        for _ in range(MAX_STEPS):
            if not env.agents:
                break
            actions = {agent: _reply(rng, task) for agent in env.agents if infos.get(agent, {}).get("active", True)}
            _, rewards, _, _, infos = env.step(actions)
            for agent, reward in rewards.items():
                assert _within(reward, step_range), (env_id, agent, reward, step_range)
                totals[agent] += reward
        for agent, total in totals.items():
            assert _within(total, episode_range), (env_id, agent, total, episode_range)
    env.close()
