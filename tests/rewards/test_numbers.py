"""Tests for rllm_gym/rewards/numbers.py: a correctly rounded decimal of any length stands for its exact value."""

from __future__ import annotations

from decimal import Decimal, localcontext

import mpmath
import pytest

from rllm_gym.rewards.numbers import numeric_verdict


def _exact(gold: str, digits: int) -> Decimal:
    with localcontext() as context:
        context.prec = digits + 30
        if gold == "\\frac{\\pi}{3}":
            with mpmath.workdps(digits + 30):
                return Decimal(mpmath.nstr(mpmath.pi, digits + 30)) / 3
        coefficient, radicand = {"\\sqrt{2}": (1, 2), "3\\sqrt{7}": (3, 7), "-\\sqrt{5}/2": (Decimal("-0.5"), 5)}[gold]
        return coefficient * Decimal(radicand).sqrt()


def _written(gold: str, places: int) -> str:
    """The exact value correctly rounded to ``places`` decimal places."""
    with localcontext() as context:
        context.prec = places + 40
        return str(_exact(gold, places + 10).quantize(Decimal(1).scaleb(-places)))


@pytest.mark.parametrize("gold", ["\\sqrt{2}", "3\\sqrt{7}", "\\frac{\\pi}{3}", "-\\sqrt{5}/2"])
@pytest.mark.parametrize("places", [6, 40, 99, 400])
def test_a_correctly_rounded_decimal_of_any_length_matches_the_exact_answer(gold, places):
    written = _written(gold, places)
    last = int(written[-1])
    off_by_one = written[:-1] + str((last + 1) % 10 if last != 9 else 8)
    assert numeric_verdict(gold, written, 6) is True, written
    assert numeric_verdict(written, gold, 6) is True  # either side may be the decimal
    assert numeric_verdict(gold, off_by_one, 6) is False, off_by_one
    assert numeric_verdict(gold, _written(gold, 2), 6) is False  # too few digits
