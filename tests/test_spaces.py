import re

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from rllm_gym.spaces import TextSpace


def test_contains_any_unicode_up_to_max_length():
    space = TextSpace(max_length=21)
    assert space.contains("Action: Left ✓ — ok")
    assert space.contains("")
    assert "with spaces\nand lines" in space
    assert not space.contains("x" * 22)
    assert not space.contains(b"bytes")
    assert not space.contains(42)
    assert not TextSpace(max_length=5, min_length=2).contains("a")


def test_sample_is_seeded_printable_and_bounded():
    a, b = TextSpace(max_length=1000, seed=3), TextSpace(max_length=1000, seed=3)
    samples = [a.sample() for _ in range(50)]
    assert samples == [b.sample() for _ in range(50)]
    assert all((a.contains(s) and len(s) <= a.sample_max_length and s.isprintable()) or "\n" in s for s in samples)
    assert len(a.sample(mask=7)) == 7
    with pytest.raises(ValueError, match=re.escape("mask (a length) must lie in [0, 1000]")):
        a.sample(mask=1001)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_length": -1}, "TextSpace max_length must be a non-negative int, got -1"),
        ({"max_length": 3, "min_length": 5}, "TextSpace min_length (5) must not exceed max_length (3)"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TextSpace(**kwargs)


def test_equality_and_jsonable():
    assert TextSpace(10) == TextSpace(10)
    assert TextSpace(10) != TextSpace(11)
    assert TextSpace(10).to_jsonable(("a", "b")) == ["a", "b"]


def test_vector_utils_batch_text_as_tuples():
    space = TextSpace(max_length=10)
    batched = batch_space(space, 3)
    assert isinstance(batched, gym.spaces.Tuple) and len(batched) == 3
    out = create_empty_array(space, 3)
    items = concatenate(space, ["a", "b", "c"], out)
    assert items == ("a", "b", "c")
    assert batched.contains(items)
    assert list(iterate(batched, items)) == ["a", "b", "c"]


def test_sync_vector_env_with_text_spaces():
    import rllm_gym  # noqa: F401 - registers the envs

    envs = gym.make_vec("rllm/FrozenLake-v0", num_envs=2, vectorization_mode="sync")
    observations, _ = envs.reset(seed=[1, 2])
    assert isinstance(observations, tuple) and all("P" in obs for obs in observations)
    observations, rewards, *_ = envs.step(("right", "down"))
    assert len(observations) == 2 and rewards.shape == (2,) and np.all(rewards >= 0)
    envs.close()
