"""The blind baseline a run reports next to its held-out success (train/baselines.py), and where it lands: the model
card and its record."""

from __future__ import annotations

import json
from pathlib import Path

from rllm_gym.envs.frozenlake import best_fixed_moves
from rllm_gym.train.baselines import blind_baselines, describe_blind_baselines, task_maps
from rllm_gym.train.model_record import model_card, training_record

CONFIGS = Path(__file__).resolve().parents[2] / "train" / "configs"
LAKE = "rllm/FrozenLake-v0"


def heldout_tasks() -> list[dict]:
    return [json.loads(line) for line in (CONFIGS / "frozenlake_heldout_lakes.jsonl").read_text().splitlines()]


def test_the_blind_baseline_of_the_heldout_lakes_is_the_best_fixed_move_sequence():
    tasks = heldout_tasks()
    found = blind_baselines([LAKE], "{}", {LAKE: tasks}, 10)
    moves, solved = best_fixed_moves([task["map"] for task in tasks], 10)
    assert found == {"heldout_blind_baseline": {LAKE: solved / 64}, "heldout_blind_moves": {LAKE: moves}}
    assert solved == 29  # the figure the README quotes for these 64 lakes
    assert describe_blind_baselines(found) == [
        f"blind baseline on the held-out tasks ({LAKE}): the best fixed moves ({', '.join(moves)}) solve 0.453"
    ]
    assert describe_blind_baselines({}) == []
    # The turn limit bounds the sequence: with 5 moves no lake (6 moves from corner to corner) is solved.
    assert blind_baselines([LAKE], "{}", {LAKE: tasks}, 5)["heldout_blind_baseline"] == {LAKE: 0.0}


def test_seed_tasks_are_read_as_the_env_draws_them():
    maps = task_maps(LAKE, {}, [7, {"seed": 7}])
    assert maps is not None and maps[0] == maps[1] and len(maps[0]) == 4


def test_no_baseline_where_none_is_defined():
    tasks = heldout_tasks()[:4]
    assert blind_baselines([LAKE], {"is_slippery": True}, {LAKE: tasks}, 10) == {}  # moves do not decide a slip
    assert blind_baselines([LAKE], "{}", {}, 10) == {}  # nothing held out
    assert blind_baselines(["rllm/Math-v0"], "{}", {"rllm/Math-v0": [{"question": "1+1", "answer": "2"}]}, 1) == {}


def test_the_model_card_states_the_blind_baseline_next_to_the_heldout_result():
    config = {
        "env": [LAKE],
        "tasks": ["seeds:1000000"],
        "eval_tasks": ["frozenlake_heldout_lakes.jsonl"],
        "agent_args": "{}",
        "env_args": "{}",
        "max_turns": 10,
        "max_completion_length": 4,
        "temperature": 1.0,
        "estimator": "grpo",
        "num_generations": 8,
        "max_steps": 100,
    }
    scores = {
        "greedy_before": {LAKE: 0.0},
        "greedy_after": {LAKE: 0.75},
        "heldout_before": {LAKE: 0.0},
        "heldout_after": {LAKE: 0.6875},
        **blind_baselines([LAKE], "{}", {LAKE: heldout_tasks()}, 10),
    }
    record = training_record(config, steps=100, scores=scores)
    assert record["heldout_blind_baseline"] == {LAKE: 29 / 64}
    card = model_card("run/final", record)
    assert "- Greedy success on held-out tasks (never trained on), after training: rllm/FrozenLake-v0 0.688" in card
    assert (
        "- Blind baseline on the held-out tasks: rllm/FrozenLake-v0 0.453 (the fixed moves right, right, down, down, "
        "right, down)" in card
    )
    without = model_card("run/final", training_record(config, steps=100, scores={}))
    assert "- Blind baseline on the held-out tasks: none defined for these envs and tasks" in without
