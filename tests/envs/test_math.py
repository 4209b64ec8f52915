from __future__ import annotations

import json
import re
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import rllm_gym  # noqa: F401  (registers the ids)
from rllm_gym.data import Dataset, DatasetRegistry
from rllm_gym.envs.math import MathEnv
from rllm_gym.types import RewardOutput


def test_math_v0_works_offline_and_passes_check_env() -> None:
    env = gym.make("rllm/Math-v0")
    check_env(env.unwrapped)
    obs, info = env.reset(seed=0)
    assert obs == info["task"]["question"] and info["task"]["data_source"] == "synthetic_math"
    assert gym.make("rllm/Math-v0").reset(seed=0)[0] == obs
    gold = info["task"]["ground_truth"]
    obs, reward, terminated, truncated, info = env.step(f"Reasoning... so the answer is \\boxed{{{gold}}}.")
    assert (obs, reward, terminated, truncated) == ("", 1.0, True, False)
    assert info["is_correct"] and info["extracted_answer"] == gold and info["ground_truth"] == gold
    assert info["grading_path"] == "exact" and info["format_error"] is False


def test_task_from_options_and_format_errors() -> None:
    env = MathEnv(reward_config={"format_error_reward": -1.0, "incorrect_reward": -0.5})
    obs, info = env.reset(options={"task": {"id": "t1", "question": "What is 1/2 + 1/4?", "ground_truth": "3/4"}})
    assert obs == "What is 1/2 + 1/4?" and info["task_id"] == "t1"
    _, reward, terminated, _, info = env.step("<think>1/2 is 0.5 and</think> I cannot decide, sorry about that.")
    assert (reward, terminated, info["format_error"], info["extracted_answer"]) == (-1.0, True, True, None)
    env.reset(options={"task": {"question": "q", "ground_truth": "3/4"}})
    assert env.step("\\boxed{0.75}")[1] == 1.0
    env.reset(options={"task": {"question": "q", "ground_truth": "3/4"}})
    assert env.step("\\boxed{0.7}")[1] == -0.5
    # Rows in a public format are mapped on the way in.
    obs, info = env.reset(options={"task": {"problem": "Simplify $\\sqrt{8}$.", "answer": "2\\sqrt{2}"}})
    assert obs == "Simplify $\\sqrt{8}$." and info["task"]["ground_truth"] == "2\\sqrt{2}"


def test_multi_turn_variant_lets_the_model_retry() -> None:
    env = gym.make("rllm/Math-v0", max_turns=3)
    check_env(env.unwrapped)
    env.reset(options={"task": {"question": "2+2?", "ground_truth": "4"}})
    obs, reward, terminated, _, info = env.step("\\boxed{5}")
    assert obs == "Your answer 5 is incorrect. You have 2 attempts left. Please try again."
    assert (reward, terminated, info["turns_left"]) == (0.0, False, 2)
    obs, _, terminated, _, _ = env.step("no idea")
    assert (
        obs == "No final answer found: put your final answer in \\boxed{}. You have 1 attempt left. Please try again."
    )
    assert not terminated
    obs, reward, terminated, _, info = env.step("\\boxed{4}")
    assert (obs, reward, terminated, info["turn"]) == ("", 1.0, True, 3)


def test_dataset_sources_name_path_and_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"question": "Tom has 2 and gets 3. Total?", "answer": "2+3=5\n#### 5"}]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n")
    env = MathEnv(dataset=str(path))
    obs, info = env.reset(seed=1)
    assert obs == rows[0]["question"] and info["task"]["ground_truth"] == "5"
    env = MathEnv(dataset=Dataset.from_list(rows, format="gsm8k"))
    assert env.reset(seed=0)[1]["task"]["ground_truth"] == "5"
    registry = DatasetRegistry(root=tmp_path / "cache")
    registry.register("tiny", Dataset.from_list(rows, format="gsm8k"))
    monkeypatch.setenv("RLLM_GYM_DATA_DIR", str(tmp_path / "cache"))
    env = gym.make("rllm/Math-v0", dataset="tiny")
    assert env.reset(seed=0)[1]["task"]["ground_truth"] == "5"
    levels = {MathEnv(difficulty=3).reset(seed=s)[1]["task"]["difficulty"] for s in range(5)}
    assert levels == {3}


def test_custom_reward_fn_and_bad_arguments() -> None:
    def always_half(task_info: dict, action: str) -> RewardOutput:
        return RewardOutput(reward=0.5, is_correct=False)

    env = MathEnv(reward_fn=always_half)
    env.reset(seed=0)
    assert env.step("\\boxed{1}")[1] == 0.5
    with pytest.raises(ValueError, match=re.escape("pass reward_config (options of the math grader) or reward_fn")):
        MathEnv(reward_fn=always_half, reward_config={})
    with pytest.raises(ValueError, match=re.escape("invalid reward_config {'correct': 1}")):
        MathEnv(reward_config={"correct": 1})
    with pytest.raises(ValueError, match=re.escape("a math task needs 'ground_truth' (the reference answer)")):
        MathEnv().reset(options={"task": {"question": "q"}})
    with pytest.raises(FileNotFoundError, match=re.escape("no data file at 'missing.jsonl': check the path")):
        MathEnv(dataset="missing.jsonl")


def test_declared_reward_ranges_follow_reward_config_and_hold() -> None:
    config = {"correct_reward": 1.0, "incorrect_reward": -0.5, "format_error_reward": -1.0}
    env = MathEnv(reward_config=config, max_turns=3)
    assert env.metadata["step_reward_range"] == (-1.0, 1.0)
    assert env.metadata["episode_return_range"] == (-3.0, 1.0)
    assert MathEnv.metadata["step_reward_range"] == (0.0, 1.0)  # the class keeps the defaults' ranges
    env.reset(options={"task": {"question": "What is 2+2?", "ground_truth": "4"}})
    rewards = [env.step(reply)[1] for reply in ("no idea", "\\boxed{5}", "no idea")]
    assert rewards == [-1.0, -0.5, -1.0]
    low, high = env.metadata["episode_return_range"]
    assert low <= sum(rewards) <= high
    # Paid wrong answers raise the ceiling: two wrong replies, then the right one.
    env = MathEnv(reward_config={"incorrect_reward": 0.25}, max_turns=3)
    env.reset(options={"task": {"question": "What is 2+2?", "ground_truth": "4"}})
    total = sum(env.step(reply)[1] for reply in ("\\boxed{5}", "\\boxed{6}", "\\boxed{4}"))
    assert total == 1.5 == env.metadata["episode_return_range"][1]
    unknown = MathEnv(reward_fn=lambda task, action: RewardOutput(reward=7.0)).metadata
    assert unknown["step_reward_range"] == unknown["episode_return_range"] == (-float("inf"), float("inf"))
