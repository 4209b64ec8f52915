"""The wrapper's own check of coin_flip: a constant ``0`` or ``1`` is no answer to a tiny or near-certain chance.

reasoning-gym's coin_flip scorer pays 1.0 for ``0`` on every task (its matching-prefix credit); the wrapper's check
is what stands between that and the reward. Within 1e-4 alone, ``0`` was paid on the tasks whose chance is under
1e-4 (15 heads in 15 flips) and ``1`` on those over 1 - 1e-4 (at least one head in 15), about 8% of the default
stream; and an oracle written as ``3.051757812e-05`` failed the check whatever the answer.
"""

from __future__ import annotations

from fractions import Fraction
from functools import cache

import pytest

reasoning_gym = pytest.importorskip("reasoning_gym", reason='the optional extra: pip install -e ".[reasoning-gym]"')

from rllm_gym.rewards.reasoning_gym import Verdict  # noqa: E402
from rllm_gym.rewards.reasoning_gym_checks import wrapper_check  # noqa: E402

PAID = Verdict("score_answer", 1.0)  # what coin_flip's own scorer says for "0" and "1" on every task


@cache
def _stream() -> list[dict]:
    return list(reasoning_gym.create_dataset("coin_flip", size=2000, seed=0))


def _entries(keep) -> list[dict]:
    return [entry for entry in _stream() if keep(Fraction(entry["answer"]))]


def test_a_constant_is_not_paid_for_a_tiny_or_near_certain_probability() -> None:
    tiny, certain = _entries(lambda p: p < Fraction(1, 10_000)), _entries(lambda p: 1 - Fraction(1, 10_000) < p < 1)
    assert tiny and certain
    for entry in tiny:
        for answer in ("0", "0.0", "0.0000", "0.00001"):
            assert wrapper_check("coin_flip", answer, entry, PAID).path == "rejected_by_check", (answer, entry)
    for entry in certain:
        for answer in ("1", "1.0", "0.9999999"):
            assert wrapper_check("coin_flip", answer, entry, PAID).path == "rejected_by_check", (answer, entry)


def test_the_probability_itself_is_paid_in_every_usual_form() -> None:
    tiny = _entries(lambda p: p < Fraction(1, 10_000))[0]
    value = Fraction(tiny["answer"])
    assert "e-" in tiny["answer"]  # the oracle itself is in scientific notation
    for answer in (tiny["answer"], f"{float(value):.10f}", "1/32768", f"{float(value):.3e}", "0.0000305"):
        assert wrapper_check("coin_flip", answer, tiny, PAID) == PAID, answer
    middle = _entries(lambda p: Fraction(1, 10) < p < Fraction(9, 10))[0]
    for answer in (middle["answer"], f"{float(middle['answer']):.4f}"):
        assert wrapper_check("coin_flip", answer, middle, PAID) == PAID, answer
    assert wrapper_check("coin_flip", "0.5", middle, PAID).path == "rejected_by_check" or middle["answer"] == "0.5"


def test_answers_with_unbounded_exponents_are_refused_at_once() -> None:
    entry = _entries(lambda p: p < Fraction(1, 10_000))[0]
    for answer in ("1e999999999", "3.05e-999", "1e9"):
        assert wrapper_check("coin_flip", answer, entry, PAID).path == "rejected_by_check"
