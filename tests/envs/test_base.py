from __future__ import annotations

import re

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

from rllm_gym.envs.base import MultiTurnEnv, SingleTurnEnv
from rllm_gym.types import RewardOutput

TASKS = [
    {"id": "cap-0", "question": "Capital of France?", "answer": "Paris"},
    {"id": "cap-1", "question": "Capital of Italy?", "answer": "Rome"},
]


def exact_match(task_info: dict, action: str) -> RewardOutput:
    ok = action.strip().lower() == task_info["answer"].lower()
    return RewardOutput(reward=float(ok), is_correct=ok, metadata={"expected": task_info["answer"]})


def test_single_turn_env_wraps_any_reward_function() -> None:
    env = SingleTurnEnv(exact_match, TASKS)
    check_env(env)
    obs, info = env.reset(seed=0)
    assert obs in ("Capital of France?", "Capital of Italy?") and info["task"]["question"] == obs
    assert env.reset(seed=0)[0] == obs  # same seed, same task
    obs, info = env.reset(options={"task": TASKS[1]})
    assert (obs, info["task_id"]) == ("Capital of Italy?", "cap-1")
    obs, reward, terminated, truncated, info = env.step(" rome ")
    assert (obs, reward, terminated, truncated) == ("", 1.0, True, False)
    assert info == {
        "is_correct": True,
        "infra_failed": False,
        "turn": 1,
        "invalid_action": False,
        "reward_metadata": {"expected": "Rome"},
    }
    with pytest.raises(RuntimeError, match=re.escape("SingleTurnEnv.step called after the episode ended")):
        env.step("again")


def test_a_user_env_registers_in_a_few_lines() -> None:
    class CapitalsEnv(SingleTurnEnv):
        def __init__(self) -> None:
            super().__init__(exact_match, TASKS)

        def format_observation(self, task: dict) -> str:
            return f"Answer with one word. {task['question']}"

    gym.register(id="test/Capitals-v0", entry_point=CapitalsEnv)
    try:
        env = gym.make("test/Capitals-v0")
        obs, _ = env.reset(options={"task": TASKS[0]})
        assert obs == "Answer with one word. Capital of France?"
        assert env.step("Lyon")[1:4] == (0.0, True, False)
    finally:
        gym.registry.pop("test/Capitals-v0")


def test_multi_turn_env_gives_feedback_until_correct_or_out_of_turns() -> None:
    env = MultiTurnEnv(exact_match, TASKS, max_turns=3)
    check_env(env)
    env.reset(options={"task": TASKS[0]})
    obs, reward, terminated, _, info = env.step("Lyon")
    assert obs == "Your answer is incorrect. You have 2 attempts left. Please try again."
    assert (reward, terminated, info["turns_left"]) == (0.0, False, 2)
    obs, reward, terminated, _, info = env.step("Paris")
    assert (obs, reward, terminated, info["turn"], info["is_correct"]) == ("", 1.0, True, 2, True)
    env.reset(options={"task": TASKS[0]})
    results = [env.step("Nice") for _ in range(3)]
    assert [r[2] for r in results] == [False, False, True]
    assert results[1][0] == "Your answer is incorrect. You have 1 attempt left. Please try again."


def test_bad_arguments_and_tasks_raise_clear_errors() -> None:
    with pytest.raises(TypeError, match=re.escape("reward_fn must be callable as reward_fn(task_info, action)")):
        SingleTurnEnv("not a function")
    with pytest.raises(ValueError, match=re.escape("tasks is empty: pass at least one task dict")):
        SingleTurnEnv(exact_match, [])
    with pytest.raises(
        ValueError, match=re.escape("max_turns must be a positive int (the number of replies allowed)")
    ):
        MultiTurnEnv(exact_match, TASKS, max_turns=0)
    env = SingleTurnEnv(exact_match)
    with pytest.raises(ValueError, match=re.escape("SingleTurnEnv has no tasks: pass tasks= or reset(options=")):
        env.reset(seed=0)
    with pytest.raises(ValueError, match=re.escape("task['question'] must be a string (the text the model sees)")):
        env.reset(options={"task": {"prompt": "hi"}})


def test_non_string_actions_are_graded_not_raised() -> None:
    env = SingleTurnEnv(exact_match, TASKS)
    env.reset(options={"task": TASKS[0]})
    assert env.step(42)[1] == 0.0


@pytest.mark.parametrize("env_class", [SingleTurnEnv, MultiTurnEnv])
def test_a_broken_reward_function_is_an_error_not_a_nan_reward(env_class) -> None:
    def nan_reward(task_info: dict, action: str) -> RewardOutput:
        return RewardOutput(reward=float("nan"), is_correct=True)

    def bare_float(task_info: dict, action: str) -> float:
        return 1.0

    env = env_class(nan_reward, TASKS)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=re.escape("returned a non-finite reward nan: return a finite one")):
        env.step("Paris")
    env = env_class(bare_float, TASKS)
    env.reset(seed=0)
    with pytest.raises(TypeError, match=re.escape("returned float, not a RewardOutput: return RewardOutput(")):
        env.step("Paris")


def test_a_question_longer_than_the_observation_space_is_refused_at_reset() -> None:
    env = SingleTurnEnv(exact_match, TASKS)
    env.reset(seed=0)
    too_long = {"id": "long", "question": "x" * (env.observation_space.max_length + 1), "answer": "x"}
    with pytest.raises(ValueError, match=re.escape("task['question'] makes an observation of 1000001 characters")):
        env.reset(options={"task": too_long})
    with pytest.raises(RuntimeError, match=re.escape("call reset() first")):  # no half-started episode
        env.step("Paris")


@pytest.mark.parametrize("env_class", [SingleTurnEnv, MultiTurnEnv])
def test_step_before_the_first_reset_says_so(env_class) -> None:
    with pytest.raises(RuntimeError, match=re.escape(f"{env_class.__name__}.step called before reset(): call")):
        env_class(exact_match, TASKS).step("Paris")
