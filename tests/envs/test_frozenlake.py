import itertools
import re

import gymnasium as gym
import numpy as np
import pytest

import rllm_gym  # noqa: F401 - registers the envs
from rllm_gym.envs.frozenlake import (
    ACTION_NAMES,
    FrozenLakeEnv,
    _reachable,
    best_fixed_moves,
    generate_random_map,
    parse_action,
)

FIXED = ["SFFF", "FHFH", "FFFH", "HFFG"]  # Gymnasium's 4x4 map


def pinned(env: FrozenLakeEnv, rows=FIXED, **task):
    return env.reset(options={"task": {"map": rows, **task}})


def test_reset_prints_a_map():
    observation, info = gym.make("rllm/FrozenLake-v0").reset(seed=0)
    lines = observation.splitlines()
    assert len(lines) == 4 and all(len(line.split()) == 4 for line in lines)
    assert lines[0].split()[0] == "P" and lines[-1].split()[-1] == "G"
    assert info["position"] == (0, 0) and info["task"]["id"].startswith("frozenlake-4x4-")


def test_pinned_map_observation_and_solution():
    env = FrozenLakeEnv()
    observation, info = pinned(env, id="classic")
    assert observation == "P _ _ _\n_ O _ O\n_ _ _ O\nO _ _ G"
    assert info["task"] == {"id": "classic", "map": FIXED}
    rewards = []
    for move in ["down", "down", "right", "right", "down", "right"]:
        observation, reward, terminated, truncated, info = env.step(move)
        rewards.append(reward)
    assert rewards == [0, 0, 0, 0, 0, 1.0]
    assert terminated and not truncated and info["is_correct"]
    assert observation.splitlines()[-1] == "O _ _ P"


def test_hole_terminates_with_zero_reward():
    env = FrozenLakeEnv()
    pinned(env)
    env.step("right")
    _, reward, terminated, _, info = env.step("down")
    assert (reward, terminated, info["is_correct"], info["position"]) == (0.0, True, False, (1, 1))
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("up")


def test_walls_keep_the_player_on_the_map():
    env = FrozenLakeEnv()
    pinned(env)
    _, _, _, _, info = env.step("up")
    assert info["position"] == (0, 0) and info["action"] == "up"


@pytest.mark.parametrize(
    ("reply", "move"),
    [
        ("left", 0),
        ("  Down.  ", 1),
        ("RIGHT", 2),
        ("**up**", 3),
        ("```\nLeft\n```", 0),
        ("I think ```right``` is best", 2),
        ("Action: Left", 0),
        ("thinking... action = 'up'", 3),
        ("Down is a hole, so Action: Right", 2),
        ("I will go left because it is safe.", 0),
        ("Going left or right?", None),
        ("jump", None),
        ("", None),
        ("upward", None),
        ("```python\nprint(1)\n``` then down", 1),
    ],
)
def test_parse_action(reply, move):
    assert parse_action(reply) == move


def test_invalid_action_gets_observation_and_documented_reward():
    env = FrozenLakeEnv(invalid_action_reward=-0.1)
    observation_before, _ = pinned(env)
    observation, reward, terminated, truncated, info = env.step("fly north-east please")
    assert observation.startswith("Invalid action 'fly north-east please': reply with exactly one of up, down")
    assert observation.endswith(observation_before)
    assert (reward, terminated, truncated, info["invalid_action"], info["action"]) == (-0.1, False, False, True, None)
    observation, *_ = env.step("x" * 1000)
    assert len(observation.splitlines()[0]) < 200


def test_random_maps_are_reachable_and_seeded():
    for seed in range(30):
        rows = generate_random_map(6, 0.5, np.random.default_rng(seed))
        assert _reachable(rows) and rows[0][0] == "S" and rows[-1][-1] == "G"
    env_a, env_b = FrozenLakeEnv(size=8), FrozenLakeEnv(size=8)
    assert env_a.reset(seed=3)[1]["task"] == env_b.reset(seed=3)[1]["task"]
    assert env_a.reset()[1]["task"] == env_b.reset()[1]["task"]  # the seeded generator continues identically


def test_task_seed_pins_a_map():
    env = FrozenLakeEnv()
    a = env.reset(options={"task": {"seed": 11, "size": 5}})[1]["task"]
    b = env.reset(seed=99, options={"task": {"seed": 11, "size": 5}})[1]["task"]
    assert a == b and len(a["map"]) == 5


def test_slippery_moves_are_seeded():
    def moves(seed):
        env = FrozenLakeEnv(is_slippery=True)
        env.reset(seed=seed, options={"task": {"map": ["SFFFFF"] + ["FFFFFF"] * 4 + ["FFFFFG"]}})
        return [env.step("right")[4]["position"] for _ in range(3)]

    assert moves(1) == moves(1)
    assert any(moves(s) != [(0, 1), (0, 2), (0, 3)] for s in range(10))


@pytest.mark.parametrize(
    ("task", "message"),
    [
        ({"map": ["SFF", "FG"]}, "task['map'] must be rectangular"),
        ({"map": ["SFX", "FFG"]}, "task['map'] may only use the letters S (start, exactly one)"),
        ({"map": ["FFF", "FFG"]}, "task['map'] may only use the letters S"),
        ({"seed": -1}, "task['seed'] must be a non-negative int, got -1"),
        ({"size": 4}, "options['task'] must have a 'map' (rows of S/F/H/G) or a 'seed'"),
    ],
)
def test_bad_task_names_the_field(task, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        FrozenLakeEnv().reset(options={"task": task})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": 1}, "FrozenLake size must be an int in [2, 64], got 1"),
        ({"p": 0}, "FrozenLake p (the probability of a frozen tile) must lie in (0, 1], got 0"),
        ({"render_mode": "rgb_array"}, "FrozenLakeEnv render_mode must be one of ['human', 'ansi'] or None, got 'rgb"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        FrozenLakeEnv(**kwargs)


def test_ansi_render_and_time_limit():
    env = gym.make("rllm/FrozenLake-v0", render_mode="ansi", max_episode_steps=3)
    env.reset(options={"task": {"map": FIXED}})
    assert env.render() == "P _ _ _\n_ O _ O\n_ _ _ O\nO _ _ G"
    results = [env.step("up") for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True]


def test_step_and_render_before_the_first_reset():
    env = FrozenLakeEnv(render_mode="ansi")
    assert env.render() == ""  # nothing to show yet, as the other text envs render
    with pytest.raises(RuntimeError, match=re.escape("FrozenLakeEnv.step called before reset(): call reset() first")):
        env.step("down")
    pinned(env)
    assert env.step("down")[4]["position"] == (1, 0)


def test_declared_reward_ranges_follow_invalid_action_reward():
    env = FrozenLakeEnv(invalid_action_reward=-0.1)
    assert env.metadata["step_reward_range"] == (-0.1, 1.0)
    assert env.metadata["episode_return_range"] == (float("-inf"), 1.0)  # invalid actions repeat until the limit
    pinned(env)
    assert env.step("sideways")[1] == -0.1
    assert FrozenLakeEnv(invalid_action_reward=2.0).metadata["step_reward_range"] == (0.0, 2.0)
    assert FrozenLakeEnv.metadata["step_reward_range"] == FrozenLakeEnv().metadata["step_reward_range"] == (0.0, 1.0)


def test_the_largest_grid_with_the_longest_quoted_invalid_action_stays_in_the_observation_space():
    env = FrozenLakeEnv(size=64)
    env.reset(seed=0)
    observation, *_ = env.step("\U000e0001" * 100)  # each quoted character is 10 characters of its repr()
    assert observation.startswith("Invalid action '\\U000e0001") and env.observation_space.contains(observation)


@pytest.mark.timeout(60)  # the label and fence patterns backtracked: 2,000 spaces after "action:" took 30 s
def test_parse_action_takes_linear_time_on_long_replies():
    assert parse_action("Action:" + " " * 400_000 + "x, so left") == ACTION_NAMES.index("left")
    assert parse_action("```" + "a" * 400_000 + " up") == ACTION_NAMES.index("up")  # an unclosed fence
    assert parse_action('Action: ** "Right"') == ACTION_NAMES.index("right")


def blind_successes(maps, moves):
    """How many of ``maps`` the fixed ``moves`` solve, played in the env itself."""
    solved = 0
    env = FrozenLakeEnv()
    for rows in maps:
        env.reset(options={"task": {"map": rows}})
        for move in moves:
            _, reward, terminated, _, _ = env.step(move)
            if terminated:
                solved += reward == 1.0
                break
    return solved


def test_best_fixed_moves_matches_every_sequence_tried_in_the_env():
    maps = [generate_random_map(3, 0.7, np.random.default_rng(seed)) for seed in range(12)]
    moves, solved = best_fixed_moves(maps, 5)
    assert blind_successes(maps, moves) == solved and len(moves) <= 5 and 0 < solved < 12
    best = max(blind_successes(maps, sequence) for sequence in itertools.product(ACTION_NAMES, repeat=5))
    assert solved == best  # a shorter sequence solves no more than its 5-move extensions: this covers them all
    # Two lakes that need opposite first moves: no blind sequence solves both, however long.
    assert best_fixed_moves([["SH", "FG"], ["SF", "HG"]], 8)[1] == 1
