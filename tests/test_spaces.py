import copy
import doctest
import re

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector.utils import (
    batch_space,
    concatenate,
    create_empty_array,
    create_shared_memory,
    iterate,
    read_from_shared_memory,
    write_to_shared_memory,
)

from rllm_gym import spaces
from rllm_gym.spaces import CodePointSpace, TextSpace, decode_text, encode_text


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


def test_create_empty_array_and_batch_space_seeding():
    space = TextSpace(max_length=10, min_length=2, seed=0)
    assert create_empty_array(space, 2) == ("  ", "  ")
    batched = batch_space(space, 2)
    first = batched.sample()
    assert batch_space(TextSpace(max_length=10, min_length=2, seed=0), 2).sample() == first
    assert first[0] != first[1], "each copy has its own generator"


def test_shared_memory_round_trips_any_unicode_and_reads_live():
    space = TextSpace(max_length=6)
    memory = create_shared_memory(space, n=3)
    view = read_from_shared_memory(space, memory, n=3)
    write_to_shared_memory(space, 0, "héllo✓", memory)
    write_to_shared_memory(space, 2, "\ud800x", memory)  # a lone surrogate survives too
    assert tuple(view) == ("héllo✓", "", "\ud800x")
    write_to_shared_memory(space, 0, "ab", memory)  # a shorter text replaces the longer one entirely
    assert view[0] == "ab" and len(view) == 3 and view[1:] == ("", "\ud800x")
    snapshot = copy.deepcopy(view)  # what AsyncVectorEnv hands out: a plain tuple, frozen in time
    write_to_shared_memory(space, 1, "later", memory)
    assert snapshot == ("ab", "", "\ud800x") and isinstance(snapshot, tuple)
    assert view == ("ab", "later", "\ud800x")


def test_shared_memory_refuses_overlong_text_naming_the_limit():
    space = TextSpace(max_length=4)
    memory = create_shared_memory(space, n=1)
    message = "text of 5 characters exceeds the TextSpace(min_length=0, max_length=4) limit of 4; text is never cut"
    with pytest.raises(ValueError, match=re.escape(message)):
        write_to_shared_memory(space, 0, "hello", memory)
    with pytest.raises(TypeError, match=re.escape("holds str, got bytes")):
        write_to_shared_memory(space, 0, b"hi", memory)


def test_async_vector_env_with_shared_memory_matches_sync():
    import rllm_gym  # noqa: F401 - registers the envs

    results = []
    for mode, kwargs in (("sync", {}), ("async", {"shared_memory": True, "context": "fork"})):
        envs = gym.make_vec("rllm/FrozenLake-v0", num_envs=2, vectorization_mode=mode, vector_kwargs=kwargs)
        observations, _ = envs.reset(seed=[1, 2])
        stepped, rewards, *_ = envs.step(("right", "down"))
        results.append((observations, stepped, rewards.tolist()))
        envs.close()
    assert results[0] == results[1]
    assert results[0][0] != results[0][1], "the shared buffer is read after every step, not once"


def test_code_point_arrays_round_trip_and_fit_their_space():
    text_space = TextSpace(max_length=3)
    space = CodePointSpace(text_space)
    assert encode_text("").tolist() == [0] and decode_text(encode_text("hé✓")) == "hé✓"
    assert space.contains(encode_text("abc")) and not space.contains(encode_text("abcd"))
    assert not space.contains(np.array([97, 98], dtype=np.int32)), "the final 0 is required"
    assert space.contains(space.sample()) and space.dtype == np.int32


def test_module_doctests_pass():
    assert doctest.testmod(spaces).failed == 0
