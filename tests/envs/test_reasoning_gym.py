"""rllm/ReasoningGym-v0: reasoning-gym's datasets and mixes, scored by each dataset's own score_answer (binary by
default, the dataset's own score with reward="partial")."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings

import gymnasium as gym
import pytest
from gymnasium.error import DependencyNotInstalled
from gymnasium.utils.env_checker import check_env

import rllm_gym  # noqa: F401 - registers the envs

reasoning_gym = pytest.importorskip(
    "reasoning_gym", reason='reasoning-gym is an optional extra: pip install -e ".[reasoning-gym]"'
)

from rllm_gym.envs import reasoning_gym as rg_env  # noqa: E402 - after the skip: the module is fine without it

ENV_ID = "rllm/ReasoningGym-v0"
# countdown gives partial credit for wrong answers, the others 0 or 1: both kinds of score must come through.
DATASETS = ["chain_sum", "basic_arithmetic", "spell_backward", "word_sorting", "countdown"]


def own_score(name: str, config: dict, answer: str | None, task: dict) -> float:
    """What reasoning-gym itself says, from a dataset made independently of the env."""
    dataset = reasoning_gym.create_dataset(name, **config)
    entry = {"question": task["question"], "answer": task["ground_truth"], "metadata": task["metadata"]}
    return dataset.score_answer(answer, entry)


@pytest.mark.parametrize("name", DATASETS)
def test_correct_wrong_and_malformed_replies_earn_the_datasets_own_score(name):
    env = gym.make(ENV_ID, dataset=name, size=8, seed=3, reward="partial")
    for seed in range(3):
        observation, info = env.reset(seed=seed)
        task = info["task"]
        assert observation == task["question"] and task["dataset"] == name
        _, reward, terminated, _, step = env.step(f"<think>work</think>So: \\boxed{{{task['ground_truth']}}}")
        assert (reward, step["is_correct"], terminated) == (1.0, True, True)
        assert reward == own_score(name, {"seed": 3, "size": 8}, task["ground_truth"], task)
        assert step["grading_path"] == "score_answer" and step["source_dataset"] == name

        env.reset(seed=seed)
        wrong = "1 + 1" if name == "countdown" else "zzz"
        _, reward, _, _, step = env.step(f"The answer is \\boxed{{{wrong}}}")
        assert reward == own_score(name, {"seed": 3, "size": 8}, wrong, task) < 1.0
        assert (step["is_correct"], step["extracted_answer"], step["score"]) == (False, wrong, reward)

        env.reset(seed=seed)
        _, reward, terminated, _, step = env.step(f"I think it is {task['ground_truth']}")  # no \boxed{}
        assert (terminated, step["format_error"], step["extracted_answer"], step["is_correct"]) == (
            True,
            True,
            None,
            False,
        )
        assert step["grading_path"] == "format_error"
        assert reward == 0.0  # not what countdown's scorer gives no answer (0.01): no reward for no answer
    env.close()
    env = gym.make(ENV_ID, dataset=name, size=8, seed=3, reward_config={"format_error_reward": -0.5})
    env.reset(seed=0)
    assert env.step("no box")[1] == -0.5


@pytest.mark.parametrize("name", DATASETS)
def test_the_binary_reward_pays_only_a_fully_correct_answer(name):
    env = gym.make(ENV_ID, dataset=name, size=8, seed=3)  # reward="binary" is the default
    for seed in range(2):
        _, info = env.reset(seed=seed)
        task = info["task"]
        assert env.step(f"\\boxed{{{task['ground_truth']}}}")[1] == 1.0
        env.reset(seed=seed)
        wrong = "1 + 1" if name == "countdown" else "zzz"
        _, reward, _, _, step = env.step(f"\\boxed{{{wrong}}}")
        assert (reward, step["score"]) == (0.0, own_score(name, {"seed": 3, "size": 8}, wrong, task))
        env.reset(seed=seed)
        assert env.step("no box")[1] == 0.0


def test_a_weighted_mix_scores_each_task_with_its_own_dataset_and_config():
    config = {"chain_sum": {"min_digits": 2, "max_digits": 2}, "countdown": {"min_numbers": 3, "max_numbers": 3}}
    mix = {"chain_sum": 3, "countdown": 1, "spell_backward": 1}
    env = gym.make(ENV_ID, dataset=mix, config=config, size=40, seed=1, reward="partial")
    tasks = env.unwrapped.tasks
    counts = {name: sum(task["dataset"] == name for task in tasks) for name in mix}
    assert counts["chain_sum"] > counts["countdown"] > 0 and counts["spell_backward"] > 0
    for task in tasks[:12]:
        env.reset(options={"task": task})
        _, reward, _, _, step = env.step(f"\\boxed{{{task['ground_truth']}}}")
        assert (reward, step["source_dataset"]) == (1.0, task["dataset"])
        env.reset(options={"task": task})
        reward = env.step("\\boxed{1 + 1}")[1]
        assert reward == own_score(task["dataset"], config.get(task["dataset"], {}), "1 + 1", task)
    assert all(task["metadata"]["num_digits"] == 2 for task in tasks if task["dataset"] == "chain_sum")


def test_train_and_eval_splits_are_disjoint_seeded_and_size_independent():
    def questions(**kwargs):
        return [task["question"] for task in gym.make(ENV_ID, **kwargs).unwrapped.tasks]

    train = questions(dataset="chain_sum", size=60, seed=5)
    evaluation = questions(dataset="chain_sum", size=60, seed=5, split="eval")
    assert len(train) == len(evaluation) == 60
    assert not set(train) & set(evaluation)
    assert {rg_env.split_of(q) for q in train} == {"train"} and {rg_env.split_of(q) for q in evaluation} == {"eval"}
    assert questions(dataset="chain_sum", size=60, seed=5) == train  # seeded
    assert questions(dataset="chain_sum", size=20, seed=5) == train[:20]  # a smaller split is a prefix
    assert questions(dataset="chain_sum", size=60, seed=6) != train
    env = gym.make(ENV_ID, dataset="chain_sum", size=60, seed=5)
    assert env.reset(seed=11)[0] == env.reset(seed=11)[0]


def test_answer_tag_format_and_think_handling():
    env = gym.make(ENV_ID, dataset="chain_sum", size=4, answer_format="answer_tag")
    _, info = env.reset(seed=0)
    gold = info["task"]["ground_truth"]
    assert env.step(f"<think>maybe <answer>0</answer></think><answer> {gold} </answer>")[1] == 1.0
    env.reset(seed=0)
    _, reward, _, _, step = env.step(f"\\boxed{{{gold}}}")  # the wrong format for this env
    assert (reward, step["format_error"]) == (0.0, True)
    env.reset(seed=0)
    assert env.step(f"<think>\\boxed{{{gold}}}")[4]["format_error"] is True  # unclosed think: no final answer


@pytest.mark.timeout(60)  # unclosed tags made the tag pattern quadratic: 320,000 characters took 50 s
def test_answer_tag_extraction_takes_linear_time_on_unclosed_tags():
    why = "no final answer found: put it in <answer>...</answer>"
    assert rg_env.extract_reply_answer("<answer>" * 125_000, "answer_tag") == (None, why)
    replies = ("<answer>7</answer>" + "<answer>" * 125_000, "</answer><answer> 7 </answer>")
    assert [rg_env.extract_reply_answer(reply, "answer_tag") for reply in replies] == [("7", None), ("7", None)]


def test_multi_turn_feedback_then_a_correct_retry():
    env = gym.make(ENV_ID, dataset="chain_sum", size=4, max_turns=3)
    _, info = env.reset(seed=1)
    gold = info["task"]["ground_truth"]
    observation, reward, terminated, _, step = env.step("no idea")
    assert observation == "No final answer found: put your final answer in \\boxed{}. You have 2 attempts left. " + (
        "Please try again."
    )
    assert (reward, terminated, step["turns_left"]) == (0.0, False, 2)
    observation, _, terminated, _, _ = env.step("\\boxed{123456789}")
    assert observation.startswith("Your answer 123456789 is not correct. You have 1 attempt left.")
    _, reward, terminated, _, step = env.step(f"\\boxed{{{gold}}}")
    assert (reward, terminated, step["turn"], step["is_correct"]) == (1.0, True, 3, True)


def test_a_raw_reasoning_gym_entry_is_a_task_and_tasks_are_json():
    entry = reasoning_gym.create_dataset("spell_backward", seed=9, size=3)[1]
    env = gym.make(ENV_ID, dataset="chain_sum", size=4)  # scores another dataset's entry with that dataset
    observation, info = env.reset(options={"task": entry})
    assert observation == entry["question"]
    assert env.step(f"\\boxed{{{entry['answer']}}}")[1] == 1.0
    json.dumps(info)
    with pytest.raises(ValueError, match=re.escape("a reasoning-gym task needs 'metadata'")):
        env.reset(options={"task": {"question": "1+1?", "answer": "2"}})


def test_the_env_passes_gymnasiums_checker_for_a_mix():
    env = gym.make(ENV_ID, dataset={"chain_sum": 1, "word_sorting": 1}, size=10, split="eval")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped, skip_render_check=True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dataset": "chain_sun"}, "reasoning-gym has no dataset 'chain_sun'. Did you mean 'chain_sum'"),
        ({"dataset": {"chain_sum": 0}}, "dataset weights must be positive numbers, got 'chain_sum': 0"),
        ({"config": {"min_terms": 0}}, "reasoning-gym rejected the dataset settings"),
        ({"config": {"min_termz": 2}}, "reasoning-gym rejected the dataset settings"),
        ({"dataset": {"chain_sum": 1}, "config": {"countdown": {}}}, "['countdown'] is not in the mix ['chain_sum']"),
        ({"split": "test"}, "split must be 'train' or 'eval', got 'test'"),
        ({"size": 0}, "size must be a positive int (tasks in the split), got 0"),
        ({"answer_format": "json"}, "answer_format must be one of ('boxed', 'answer_tag'), got 'json'"),
        ({"reward_config": {"correct_reward": 2}}, "invalid reward_config {'correct_reward': 2}"),
        ({"reward": "dense"}, "reward must be one of ('binary', 'partial'), got 'dense'"),
        ({"reward_config": {"format_error_reward": 5}}, "format_error_reward must be a number in [-1, 1] or None"),
        ({"dataset": "game_of_life_halting"}, "Pass allow_unsound=True to use them anyway"),
        ({"dataset": {"chain_sum": 1, "game_of_life_halting": 1}}, "['game_of_life_halting'] have a scorer that pays"),
    ],
)
def test_bad_arguments_say_what_to_fix(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        gym.make(ENV_ID, **kwargs)


def test_without_the_extra_making_the_env_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym now raises ImportError
    with pytest.raises(DependencyNotInstalled, match=re.escape('pip install -e ".[reasoning-gym]"')):
        gym.make(ENV_ID, dataset="basic_arithmetic", size=3, seed=123)


def test_importing_rllm_gym_does_not_import_reasoning_gym():
    code = "import sys, rllm_gym, rllm_gym.envs.reasoning_gym; print('reasoning_gym' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "False"
