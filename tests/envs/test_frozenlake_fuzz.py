"""Property tests for FrozenLake's move parser and ``step`` on arbitrary model replies."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rllm_gym.envs.frozenlake import ACTION_NAMES, FrozenLakeEnv, parse_action

_fragments = st.sampled_from(
    ["up", "Down", "LEFT", "right", "Action:", "action =", "```", "```\n", "**", '"', "'", ".", "!", "\n", " ", "é"]
)
_replies = st.text(max_size=200) | st.lists(_fragments | st.text(max_size=5), max_size=30).map("".join)
_MAP = ["SFFF", "FHFH", "FFFH", "HFFG"]


@settings(max_examples=400, deadline=None)
@given(text=_replies)
def test_parse_action_gives_a_move_index_or_none(text):
    move = parse_action(text)
    assert move is None or (isinstance(move, int) and 0 <= move < 4)
    if move is not None:
        assert ACTION_NAMES[move] in text.lower()  # it never invents a direction the reply did not name


@settings(max_examples=300, deadline=None)
@given(
    move=st.sampled_from(ACTION_NAMES),
    style=st.sampled_from(["{}", "{}.", "  {}\n", "Action: {}", "```\n{}\n```", "I will go {} now."]),
    case=st.sampled_from([str.lower, str.upper, str.title]),
)
def test_parse_action_round_trips_every_documented_format(move, style, case):
    assert parse_action(style.format(case(move))) == ACTION_NAMES.index(move)


@settings(max_examples=300, deadline=None)
@given(replies=st.lists(_replies, min_size=1, max_size=6), seed=st.integers(0, 2**16), slippery=st.booleans())
def test_step_never_raises_and_keeps_the_documented_contract(replies, seed, slippery):
    env = FrozenLakeEnv(is_slippery=slippery, invalid_action_reward=-0.5)
    env.reset(seed=seed, options={"task": {"map": _MAP}})
    for reply in replies:
        observation, reward, terminated, truncated, info = env.step(reply)
        assert env.observation_space.contains(observation)
        assert observation.count("P") >= 1 and truncated is False
        assert info["invalid_action"] == (parse_action(reply) is None)
        if info["invalid_action"]:
            assert (reward, terminated, info["action"]) == (-0.5, False, None)
        else:
            assert reward in (0.0, 1.0) and info["action"] in ACTION_NAMES
            assert reward == float(info["is_correct"])
        row, col = info["position"]
        assert 0 <= row < 4 and 0 <= col < 4
        if terminated:
            assert _MAP[row][col] in "GH"
            break
