"""Scientific notation and magnitude-relative near misses in the math grader, in both directions.

Every form people write scientific notation in, on either side, is compared as an exact value; a decimal near a tiny
or huge ground truth counts only when it is that value correctly rounded with enough significant digits.
"""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm_gym.rewards.math import MathGrader, parse_number

FAST = MathGrader(use_math_verify=False)  # every case here is decided before math-verify

SCIENTIFIC: list[tuple[str, str, bool]] = [
    # e / E with signs, plain text
    ("42", "4.2e1", True),
    ("42", "4.2e2", False),
    ("0.001", "1E-3", True),
    ("0.001", "1e-4", False),
    ("-25000", "-2.5e+4", True),
    ("-25000", "2.5e+4", False),
    ("4.2e1", "42", True),  # the ground truth in scientific notation
    ("1e-3", "\\frac{1}{1000}", True),
    ("1E-3", "0.0011", False),
    # LaTeX \times and \cdot, braces or not, with spacing
    ("6.02 \\times 10^{23}", "602000000000000000000000", True),
    ("6.02 \\times 10^{23}", "6.02e23", True),
    ("6.02 \\times 10^{23}", "6.02e22", False),
    ("602000000000000000000000", "$6.02\\times10^{23}$", True),
    ("0.0015", "1.5\\cdot10^{-3}", True),
    ("0.0015", "1.5 \\cdot 10^{-4}", False),
    ("1.5\\cdot 10^{-3}", "0.0015", True),
    ("2.5\\times{10}^{-4}", "0.00025", True),
    # x10^k, *10^k, **, unicode
    ("300000", "3x10^5", True),
    ("300000", "3 x 10^5", True),
    ("300000", "3x10^6", False),
    ("3x10^5", "300000", True),
    ("300000", "3*10^5", True),
    ("300000", "3*10**5", True),
    ("300000", "3×10^5", True),
    ("0.0012", "1.2×10⁻³", True),
    ("0.0012", "1.2×10⁻²", False),
    # bare powers of ten
    ("0.001", "10^{-3}", True),
    ("0.001", "10^{-2}", False),
    ("1000", "10^3", True),
    ("10^{3}", "1000", True),
    ("-100", "-10^{2}", True),
    # percentages of scientific notation
    ("5\\%", "5e-2", True),
]

NEAR_MISSES: list[tuple[str, str, bool]] = [
    # tiny ground truths: close in absolute terms is not enough
    ("1e-5", "0.00002", False),
    ("0.00001", "0.00002", False),
    ("0.00002", "0.00001", False),
    ("1e-5", "2e-5", False),
    ("1.5e-7", "1e-7", False),
    ("1e-7", "0", False),
    ("0", "1e-7", False),
    ("0.000123", "0.000124", False),
    ("1.23456789e-5", "1.23457e-5", True),  # correctly rounded at 6 significant digits
    ("1.23456789e-5", "0.0000123457", True),
    ("1.23456789e-5", "1.23456e-5", False),  # truncated, not rounded
    ("1.23456789e-5", "1.23e-5", False),  # too few significant digits
    # huge ground truths: the tolerance grows with the magnitude, but only to the last written digit
    ("6.02214076e23", "6.02214e23", True),
    ("6.02214076e23", "6.02e23", False),
    ("6.02214076e23", "602214076000000000000001", True),  # the ground truth is this integer rounded
    ("6.02214076e23", "602214077000000000000000", False),
    ("123456789", "123456789.4", False),
    ("123456789", "1.23457e8", True),  # correctly rounded at 6 significant digits
    ("123456789", "1.23456e8", False),
    ("123456789", "1.2346e8", False),  # too few significant digits
    # correctly rounded decimals of repeating and irrational values
    ("\\frac{1}{3}", "0.333333", True),
    ("\\frac{1}{3}", "0.3333333333", True),
    ("\\frac{1}{3}", "0.333334", False),
    ("\\frac{1}{3}", "0.33333", False),
    ("\\frac{2}{3}", "0.666667", True),
    ("\\frac{2}{3}", "0.666666", False),
    ("0.666667", "\\frac{2}{3}", True),  # a rounded ground truth against the exact answer
    ("\\frac{1}{7000}", "0.000142857", True),
    ("\\frac{1}{7000}", "0.000143", False),
    ("\\sqrt{2}", "1.41421", True),
    ("\\sqrt{2}", "1.414214", True),
    ("\\sqrt{2}", "1.4142", False),
    ("\\sqrt{2}", "1.41422", False),
    ("1.41421", "\\sqrt{2}", True),
    ("2\\sqrt{3}", "3.46410", True),
    ("\\pi", "3.14159", True),
    ("\\pi", "3.14160", False),
    ("\\frac{\\pi}{3}", "1.04720", True),
    ("\\pi", "3.14", False),
]


@pytest.mark.parametrize(("gold", "answer", "label"), SCIENTIFIC + NEAR_MISSES)
def test_scientific_notation_and_near_misses(gold: str, answer: str, label: bool) -> None:
    result = FAST({"ground_truth": gold}, f"So the answer is \\boxed{{{answer}}}.")
    assert result.is_correct is label, result.metadata
    assert result.metadata["path"] in ("exact", "numeric")


@pytest.mark.parametrize(
    ("text", "value", "exact"),
    [
        ("4.2e1", Fraction(42), False),
        ("-2.5E+4", Fraction(-25000), False),
        ("6.02\\times10^{23}", Fraction(602) * 10**21, False),
        ("1.5\\cdot10^{-3}", Fraction(3, 2000), False),
        ("3x10^5", Fraction(300000), False),
        ("10^{-3}", Fraction(1, 1000), True),
        ("1.2×10⁻³", Fraction(12, 10000), False),
    ],
)
def test_parse_number_reads_scientific_notation_as_exact_values(text: str, value: Fraction, exact: bool) -> None:
    assert parse_number(text) == (value, exact, False)


def test_absurd_exponents_are_not_expanded() -> None:
    assert parse_number("1e999999999") is None  # not a billion-digit integer
    assert FAST({"ground_truth": "1"}, "\\boxed{1e999999999}").is_correct is False


def test_significant_digits_is_a_grader_option() -> None:
    assert MathGrader().significant_digits == 6
    loose = MathGrader(use_math_verify=False, significant_digits=3)
    assert loose({"ground_truth": "\\frac{1}{3}"}, "\\boxed{0.333}").is_correct is True
    assert loose({"ground_truth": "\\pi"}, "\\boxed{3.14}").is_correct is True
    assert loose({"ground_truth": "\\pi"}, "\\boxed{3.15}").is_correct is False
    assert loose({"ground_truth": "1e-5"}, "\\boxed{2e-5}").is_correct is False  # still relative to the magnitude
    assert loose({"ground_truth": "1.5e-5"}, "\\boxed{1.50e-5}").is_correct is True
    assert FAST({"ground_truth": "\\frac{1}{3}"}, "\\boxed{0.333}").is_correct is False
    with pytest.raises(ValueError, match=re.escape("MathGrader significant_digits must be an int in [1, 30], got 0")):
        MathGrader(significant_digits=0)


def test_scientific_notation_inside_symbolic_answers_is_exact_for_math_verify() -> None:
    grader = MathGrader(time_limit=10)
    right = grader({"ground_truth": "(0.001, 2500)"}, "\\boxed{(1e-3, 2.5\\times 10^{3})}")
    assert (right.is_correct, right.metadata["path"]) == (True, "math_verify")
    wrong = grader({"ground_truth": "(0.001, 2500)"}, "\\boxed{(1e-3, 2.5\\times 10^{4})}")
    assert wrong.is_correct is False


@settings(max_examples=300, deadline=None)
@given(
    mantissa=st.integers(-(10**6), 10**6),
    decimals=st.integers(0, 5),
    exponent=st.integers(-30, 30),
    form=st.sampled_from(["{m}e{k}", "{m}E{k:+d}", "{m}\\times10^{{{k}}}", "{m} \\cdot 10^{{{k}}}", "{m}x10^{k}"]),
)
def test_every_form_equals_its_exact_value_and_not_a_neighbour(mantissa, decimals, exponent, form):
    digits = str(abs(mantissa)).rjust(decimals + 1, "0")
    written = ("-" if mantissa < 0 else "") + (f"{digits[:-decimals]}.{digits[-decimals:]}" if decimals else digits)
    value = Fraction(mantissa, 10**decimals) * Fraction(10) ** exponent
    exact = str(value.numerator) if value.denominator == 1 else f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
    answer = form.format(m=written, k=exponent)
    assert FAST({"ground_truth": exact}, f"\\boxed{{{answer}}}").is_correct
    assert FAST({"ground_truth": answer}, f"\\boxed{{{exact}}}").is_correct
    neighbour = value + Fraction(10) ** (exponent - decimals)  # one unit in the last written place away
    assert not FAST({"ground_truth": answer}, f"\\boxed{{{neighbour.numerator}/{neighbour.denominator}}}").is_correct
