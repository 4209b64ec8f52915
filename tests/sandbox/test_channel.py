"""The channel's plain-data encoding: what crosses from the solution's process and what is refused."""

from __future__ import annotations

import math
import re

import pytest

from rllm_gym.sandbox import channel


@pytest.mark.parametrize("value", [1j, -2.5 + 0j, complex(math.inf, -0.0), [1 + 2j, {"k": (3j,)}], {1j}])
def test_complex_numbers_round_trip_with_their_type(value):
    back = channel.decode(channel.encode(value))
    assert back == value and type(back) is type(value)
    assert channel.loads(channel.json.dumps(channel.encode(value))) == value


@pytest.mark.parametrize("parts", [[1.0], [1.0, 2.0, 3.0], [1, 2.0], ["1", 2.0], [True, 0.0], [None, 1.0], 3.0])
def test_a_malformed_complex_from_the_solution_is_not_plain_data(parts):
    with pytest.raises(channel.RemoteError, match=re.escape("malformed")) as caught:
        channel.decode({"c": parts})
    assert caught.value.status == "not_plain_data"


def test_a_complex_subclass_is_not_plain_data():
    class Fake(complex):
        def __eq__(self, other):
            return True

    with pytest.raises(channel.NotPlainData, match=re.escape("Fake is not plain data")):
        channel.encode(Fake(1, 2))
