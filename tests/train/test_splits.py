"""train/splits.py: sources, eval splits by fraction, count or name, and no task shared between train and eval."""

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest

import rllm_gym
from rllm_gym.envs.frozenlake import generate_random_map
from rllm_gym.train.splits import load_source, make_split, split_record, task_key


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_sources_seed_ranges_jsonl_and_named_hf_splits(tmp_path):
    assert load_source("seeds:5", tmp_path) == range(5)
    assert load_source("seeds:100-103", tmp_path) == range(100, 103)
    write_jsonl(tmp_path / "t.jsonl", [{"id": "a", "map": ["SF", "FG"]}])
    assert load_source("t.jsonl", tmp_path) == [{"id": "a", "map": ["SF", "FG"]}]  # relative to the config's folder
    datasets = pytest.importorskip("datasets")
    rows = {"question": ["1+1?", "2+2?"], "ground_truth": ["2", "4"]}
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(rows),
            "test": datasets.Dataset.from_dict({k: v[:1] for k, v in rows.items()}),
        }
    ).save_to_disk(str(tmp_path / "hf"))
    assert [task["question"] for task in load_source("hf@test", tmp_path)] == ["1+1?"]
    assert len(load_source("hf", tmp_path)) == 2  # the train split by default
    for source, message in [
        ("seeds:5-5", "tasks: 'seeds:5-5' is an empty seed range"),
        ("seeds:x", "tasks: 'seeds:x' is not a seed range: write seeds:N"),
        ("missing.jsonl", "tasks: missing.jsonl: no such file"),
        ("hf@validation", "tasks: cannot load 'hf@validation'"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            load_source(source, tmp_path)


def test_a_task_is_known_by_what_the_env_poses_not_by_its_seed_or_id():
    env = rllm_gym.make("rllm/FrozenLake-v0")
    _, info = env.reset(seed=3)
    seeded = task_key(env, 3)
    assert task_key(env, {"id": "renamed", "map": info["task"]["map"]}) == seeded  # same lake, other id
    assert task_key(env, {"map": ["SFFF", "FFFF", "FFFF", "FFFG"]}) != seeded


@pytest.mark.parametrize("eval_source", ["0.25", "64", "seeds:5000-5200"])
def test_train_and_eval_never_share_a_task(eval_source, tmp_path):
    # Lakes with few holes repeat often across seeds: the draw must skip every training seed that poses an eval lake.
    split = make_split("rllm/FrozenLake-v0", "seeds:400", eval_source, tmp_path, split_seed=1, eval_limit=32)
    env = rllm_gym.make("rllm/FrozenLake-v0")
    held_out = {task_key(env, task) for task in split.eval}
    assert len(held_out) == len(split.eval) <= 32  # distinct lakes, at most eval_limit
    assert held_out <= split.eval_keys
    rng = random.Random(0)
    drawn = [split.draw(rng) for _ in range(600)]
    assert not {task_key(env, task) for task in drawn} & split.eval_keys
    assert not {task_key(env, task) for task in split.train_sample(64)} & split.eval_keys
    # Without the check some of these draws would have been eval lakes: the test can fail.
    rng = random.Random(0)
    raw = [split.train[rng.randrange(len(split.train))] for _ in range(600)]
    assert {task_key(env, task) for task in raw} & split.eval_keys


def test_files_with_a_task_in_both_keep_it_out_of_training(tmp_path):
    lakes = [{"id": f"lake{i}", "map": generate_random_map(4, 0.5, np.random.default_rng(i))} for i in range(6)]
    write_jsonl(tmp_path / "train.jsonl", lakes)
    write_jsonl(tmp_path / "eval.jsonl", [{"id": "other-name", "map": lakes[2]["map"]}])
    split = make_split("rllm/FrozenLake-v0", "train.jsonl", "eval.jsonl", tmp_path)
    assert lakes[2] not in split.train_sample(10) and len(split.train_sample(10)) == 5
    rng = random.Random(0)
    assert all(split.draw(rng)["id"] != "lake2" for _ in range(200))


def test_a_carved_split_is_seeded_and_recorded(tmp_path):
    first = make_split("rllm/FrozenLake-v0", "seeds:1000", "0.1", tmp_path, split_seed=7, eval_limit=16)
    again = make_split("rllm/FrozenLake-v0", "seeds:1000", "0.1", tmp_path, split_seed=7, eval_limit=16)
    other = make_split("rllm/FrozenLake-v0", "seeds:1000", "0.1", tmp_path, split_seed=8, eval_limit=16)
    assert first.eval == again.eval and first.eval != other.eval
    assert split_record([first], {"split_seed": 7}) == split_record([again], {"split_seed": 7})
    assert split_record([first], {"split_seed": 7}) != split_record([other], {"split_seed": 8})
    record = split_record([first], {"split_seed": 7})["envs"]["rllm/FrozenLake-v0"]
    assert record["eval_tasks"] == 16 and record["withheld"] <= 100  # 100 seeds withheld, fewer distinct lakes


@pytest.mark.parametrize(
    ("eval_source", "message"),
    [
        ("1.5", "eval_tasks: '1.5' for rllm/FrozenLake-v0 must be a fraction in (0, 1) or a whole count"),
        ("10", "eval_tasks: '10' for rllm/FrozenLake-v0 must be a fraction in (0, 1) or a whole count that leaves"),
    ],
)
def test_bad_eval_shares_name_the_fix(eval_source, message, tmp_path):
    with pytest.raises(ValueError, match=re.escape(message)):
        make_split("rllm/FrozenLake-v0", "seeds:10", eval_source, tmp_path)


def test_a_training_source_inside_the_eval_split_is_refused(tmp_path):
    split = make_split("rllm/FrozenLake-v0", "seeds:3", "seeds:0-3", tmp_path)
    with pytest.raises(ValueError, match=re.escape("training tasks drawn in a row were all in the eval split")):
        split.draw(random.Random(0))


def test_the_shipped_held_out_lakes_are_64_distinct_random_lakes_apart_from_the_demo_maps():
    configs = Path(__file__).resolve().parents[2] / "train" / "configs"
    split = make_split("rllm/FrozenLake-v0", "frozenlake_demo_maps.jsonl", "frozenlake_heldout_lakes.jsonl", configs)
    assert len(split.eval) == len(split.eval_keys) == 64
    assert len(split.train_sample(64)) == 8  # no demo map is held out: the main job trains on all 8
    # The file's recipe: the lakes of seeds 1,000,000 on, in order, each kept once, the demo maps skipped.
    env = rllm_gym.make("rllm/FrozenLake-v0")
    demo = {task_key(env, task) for task in load_source("frozenlake_demo_maps.jsonl", configs)}
    expected, seen, seed = [], set(demo), 1_000_000
    while len(expected) < 64:
        key = task_key(env, seed)
        if key not in seen:
            seen.add(key)
            expected.append(seed)
        seed += 1
    assert [task["seed"] for task in split.eval] == expected
    assert all(task_key(env, task["seed"]) == task_key(env, task) for task in split.eval)
