"""Tests for rllm_gym/tools/calculator.py: exact values, refusals that say why, and DoS caps."""

from __future__ import annotations

import math
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm_gym.tools.calculator import MAX_RESULT_DIGITS, CalculatorError, CalculatorTool, evaluate


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("123456789 * 987654321", 121932631112635269),
        ("2**100 - 1", 2**100 - 1),
        ("2^10", 1024),
        ("-(3 - 5) * +4", 8),
        ("7 // 2 + 7 % 2", 4),
        ("10 / 4", 2.5),
        ("2 ** -2", 0.25),
        ("sqrt(16) + abs(-3) + round(2.567, 2)", 9.57),
        ("factorial(25) // factorial(20)", 6375600),
        ("gcd(12, 18) * lcm(4, 6)", 72),
        ("isqrt(10**41)", math.isqrt(10**41)),
        ("max(1, 5, 3) - min(4, 2)", 3),
        ("floor(pi) + ceil(e)", 6),
        ("7 × 6 ÷ 2", 21.0),
    ],
)
def test_evaluates_exactly(expression, value):
    assert evaluate(expression) == value
    assert type(evaluate(expression)) is type(value)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1/0", "division by zero"),
        ("", "expression is empty"),
        ("2 +", "invalid syntax in '2 +'"),
        ("x + 1", "unknown name 'x'; known constants: pi, e, tau"),
        ("__import__('os')", "unknown function '__import__'"),
        ("(1).real.conjugate()", "unknown function '1 .real.conjugate'"),
        ("(1).__class__", "unsupported syntax: Attribute"),
        ("'a' * 3", "only numbers are allowed, got 'a'"),
        ("True + 1", "only numbers are allowed, got True"),
        ("[1, 2]", "unsupported syntax: List"),
        ("lambda: 1", "unsupported syntax: Lambda"),
        ("sqrt(-1)", "ValueError: math domain error"),
        ("round(1.5, ndigits=1)", "round() takes positional arguments only"),
        ("(-8) ** 0.5", "is not a real number"),
        ("10.0 ** 400", "OverflowError"),
        ("9**9**9", "9**387420489 has more than 4000 digits"),
        ("factorial(100000)", "factorial(100000) is too large"),
        ("factorial(2.5)", "factorial() takes a non-negative integer"),
        ("(2**13000) * (2**13000)", "product has more than 4000 digits"),
        ("exp(1000)", "OverflowError"),
        ("1" + "+1" * 1500, "expression is longer than 2000 characters"),
    ],
)
def test_refuses_with_a_message(expression, message):
    with pytest.raises(CalculatorError, match=re.escape(message)):
        evaluate(expression)


def test_size_caps_answer_fast():
    start = time.monotonic()
    for expression in ("9**9**9", "(10**3999)**(10**10)", "2**(2**40)", "factorial(10**9)", "10**4001"):
        with pytest.raises(CalculatorError):
            evaluate(expression)
    assert time.monotonic() - start < 0.5
    assert len(str(evaluate(f"10**{MAX_RESULT_DIGITS - 1}"))) == MAX_RESULT_DIGITS


def test_lcm_refuses_by_its_cost_before_folding_every_argument():
    # math.lcm of 150 coprime 4000-digit numbers built a 2-million-bit product first: 17 s under the interpreter lock.
    expression = "lcm(" + ",".join(f"10**3999+{i}" for i in range(150)) + ")"
    with pytest.raises(CalculatorError, match=re.escape("lcm() has more than 4000 digits by its argument 2")):
        evaluate(expression)
    assert evaluate("lcm(4, 6, 10**3000, 10**3000)") == 10**3000 * 3
    with pytest.raises(CalculatorError, match=re.escape("lcm() takes integers, got 2.5")):
        evaluate("lcm(4, 2.5)")


def test_deep_nesting_is_refused_not_crashing():
    with pytest.raises(CalculatorError):
        evaluate("(" * 1000 + "1" + ")" * 1000)
    with pytest.raises(CalculatorError):
        evaluate("-" * 1999 + "1")


def test_calculator_tool_outputs():
    calc = CalculatorTool()
    assert calc(expression="3**45").output == "2954312706550833698643"
    assert calc(expression="0.1 + 0.2").output == "0.30000000000000004"
    assert calc(expression="1/0").error == "division by zero"
    assert (
        calc(expression=5).error
        == "invalid arguments for tool 'calculator': 5 is not of type 'string' (at 'expression')"
    )


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_any_string_either_evaluates_or_raises_calculator_error(text):
    try:
        value = evaluate(text)
    except CalculatorError:
        return
    assert isinstance(value, (int, float))


_ints = st.integers(min_value=-(10**30), max_value=10**30)


@settings(max_examples=200, deadline=None)
@given(_ints, _ints, _ints, st.sampled_from(["+", "-", "*", "//", "%"]))
def test_integer_arithmetic_matches_python(a, b, c, op):
    expression = f"({a}) {op} ({b}) + ({c})"
    if op in ("//", "%") and b == 0:
        with pytest.raises(CalculatorError, match="division by zero"):
            evaluate(expression)
        return
    expected = {"+": a + b, "-": a - b, "*": a * b, "//": a // b if b else 0, "%": a % b if b else 0}[op] + c
    assert evaluate(expression) == expected
