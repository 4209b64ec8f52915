"""Plain numbers in math answers, read exactly: the numeric fast path of :mod:`rllm_gym.rewards.math`.

Integers (``1,000``), decimals, ``a/b``, ``\\frac{a}{b}``, percentages and scientific notation (``4.2e1``,
``6.02 \\times 10^{23}``, ``3x10^5``, ``10⁻³``) are parsed into exact :class:`~fractions.Fraction` values, and simple
irrational terms (``2\\sqrt{7}``, ``\\frac{2\\pi}{3}``) into a rational times a basis, so most answers are decided
without sympy. A written decimal equals a more precise value only when it is that value correctly rounded at its last
digit and carries at least ``significant_digits`` significant digits, so the tolerance scales with the magnitude.
:func:`numeric_verdict` is the whole check; :func:`exact_scientific` rewrites scientific notation for math-verify.
"""

from __future__ import annotations

import re
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import NamedTuple

__all__ = ["exact_scientific", "numeric_verdict", "parse_number"]

_INTEGER = r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)"
_DECIMAL = re.compile(rf"^{_INTEGER}(?:\.\d*)?$|^[+-]?\.\d+$")
_SLASH = re.compile(r"^([+-]?\d+)/([+-]?\d+)$")
_FRAC = re.compile(r"^([+-]?)\\frac(?:\{([+-]?\d+)\}|(\d))(?:\{([+-]?\d+)\}|(\d))$")

_POWER = r"(?:\{(?P<braced>[+-]?\d+)\}|(?P<bare>[+-]?\d+))"
_SCIENTIFIC = re.compile(
    rf"^(?P<mantissa>[+-]?(?:\d+(?:\.\d*)?|\.\d+))"
    rf"(?:[eE](?P<e>[+-]?\d+)|(?:\\times|\\cdot|[xX×*·])\{{?10\}}?(?:\^|\*\*){_POWER})$"
)
_POWER_OF_TEN = re.compile(rf"^(?P<sign>[+-]?)\{{?10\}}?(?:\^|\*\*){_POWER}$")
_SUPERSCRIPT = re.compile(r"10([⁻⁺]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+)$")
_FROM_SUPERSCRIPT = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
_MAX_EXPONENT = 400  # 1e999999999 would be a billion-digit integer; such answers go to math-verify


class _Number(NamedTuple):
    """A plain number: its exact value and, for a decimal, the unit of its last written digit and how many
    significant digits it has (``unit`` None: an exact integer or fraction)."""

    value: Fraction
    unit: Fraction | None
    digits: int
    percent: bool


def _decimal(mantissa: str, exponent: int, percent: bool) -> _Number:
    """``mantissa * 10**exponent`` as written, e.g. ``("6.02", 23)``: exact value, last-digit unit, digit count."""
    digits = mantissa.lstrip("+-").replace(",", "")
    whole, _, fraction = digits.partition(".")
    value = Fraction(mantissa.replace(",", "")) * Fraction(10) ** exponent
    return _Number(value, Fraction(10) ** (exponent - len(fraction)), len((whole + fraction).lstrip("0")), percent)


def _scientific(answer: str, percent: bool) -> _Number | None:
    """``4.2e1``, ``-2.5E+4``, ``6.02\\times10^{23}``, ``1.5\\cdot10^{-3}``, ``3x10^5``, ``10^{-3}``, ``10⁻³``."""
    superscript = _SUPERSCRIPT.search(answer)
    if superscript:
        answer = f"{answer[: superscript.start()]}10^{{{superscript.group(1).translate(_FROM_SUPERSCRIPT)}}}"
    match = _SCIENTIFIC.match(answer) or _POWER_OF_TEN.match(answer)
    if match is None:
        return None
    groups = match.groupdict()
    exponent = int(groups.get("e") or groups["braced"] or groups["bare"])
    if abs(exponent) > _MAX_EXPONENT:
        return None
    if "mantissa" not in groups:  # a bare power of ten is exact
        return _Number((-1 if match.group("sign") == "-" else 1) * Fraction(10) ** exponent, None, 0, percent)
    return _decimal(match.group("mantissa"), exponent, percent)


def _parse(answer: str) -> _Number | None:
    percent = answer.endswith("%")
    if percent:
        answer = answer.removesuffix("%").removesuffix("\\")
    if _DECIMAL.match(answer):
        if "." in answer:
            return _decimal(answer, 0, percent)
        return _Number(Fraction(answer.replace(",", "")), None, 0, percent)
    match = _SLASH.match(answer)
    if match and int(match.group(2)) != 0:
        return _Number(Fraction(int(match.group(1)), int(match.group(2))), None, 0, percent)
    match = _FRAC.match(answer)
    if match:
        numerator, denominator = int(match.group(2) or match.group(3)), int(match.group(4) or match.group(5))
        if denominator != 0:
            value = Fraction(numerator, denominator)
            return _Number(-value if match.group(1) == "-" else value, None, 0, percent)
    return _scientific(answer, percent)


def parse_number(answer: str) -> tuple[Fraction, bool, bool] | None:
    """``(value, exact, percent)`` for a normalized plain number, or None for anything else.

    Accepts integers (``1,000`` with thousands separators), decimals, ``a/b``, ``\\frac{a}{b}``, ``\\frac12`` and
    scientific notation (``4.2e1``, ``1E-3``, ``6.02\\times10^{23}``, ``1.5\\cdot10^{-3}``, ``3x10^5``,
    ``10^{-3}``), each optionally followed by ``%``/``\\%``. ``exact`` is False for decimals and scientific notation
    with a mantissa: written values that may be roundings of the true one.
    """
    number = _parse(answer)
    return None if number is None else (number.value, number.unit is None, number.percent)


def _readings(number: _Number) -> list[_Number]:
    """The values a number may stand for: ``50%`` is 50 or 0.5."""
    if not number.percent:
        return [number]
    unit = None if number.unit is None else number.unit / 100
    return [number, _Number(number.value / 100, unit, number.digits, False)]


def _rounds_to(approximation: _Number, value: Fraction, significant_digits: int) -> bool:
    """Whether a written decimal is ``value`` correctly rounded at its last digit, with enough significant digits.

    The tolerance is half a unit in the last written place, so it scales with the magnitude: ``6.02e23`` may stand
    for 6.0221e23, but ``0.00002`` (one significant digit) never stands for 1e-5 or for 1.5e-5.
    """
    return (
        approximation.unit is not None
        and approximation.digits >= significant_digits
        and 2 * abs(approximation.value - value) <= approximation.unit
    )


def _numeric_verdict(gold: _Number, answer: _Number, significant_digits: int) -> bool:
    """Equal as exact values, or one side is a correctly rounded decimal of the other (see :func:`_rounds_to`)."""
    pairs = [(g, a) for g in _readings(gold) for a in _readings(answer)]
    if any(g.value == a.value for g, a in pairs):
        return True
    return any(
        _rounds_to(a, g.value, significant_digits) or _rounds_to(g, a.value, significant_digits) for g, a in pairs
    )


_SURD = re.compile(r"^(\d*)\\sqrt(?:\{(\d+)\}|(\d))$")
_PI = re.compile(r"^(\d*)\\pi$")
_OVER = re.compile(r"^\\frac\{(.+)\}\{(\d+)\}$|^(.+)/(\d+)$")
_INTERVAL = re.compile(r"^([(\[])([^,()\[\]]+),([^,()\[\]]+)([)\]])$")


def _squarefree(coefficient: int, radicand: int) -> tuple[int, int]:
    """``c * sqrt(r)`` rewritten with ``r`` square-free, e.g. ``sqrt(28) -> 2 * sqrt(7)``."""
    factor = 2
    while factor * factor <= radicand:
        while radicand % (factor * factor) == 0:
            coefficient, radicand = coefficient * factor, radicand // (factor * factor)
        factor += 1
    return coefficient, radicand


def _simple_term(text: str) -> tuple[Fraction, int | str] | None:
    """``(q, basis)`` for ``q * basis`` with q rational and basis 1, ``"pi"`` or a square-free radicand, else None.

    Covers the exact forms math answers take most often: ``-3``, ``\\frac{3}{4}``, ``2\\sqrt{7}``, ``\\sqrt{28}``,
    ``\\frac{\\sqrt{2}}{2}``, ``\\pi/3``, ``\\frac{2\\pi}{3}``. 1, pi and square roots of distinct square-free
    integers are linearly independent over the rationals, so two such terms are equal exactly when these match.
    """
    sign = -1 if text.startswith("-") else 1
    text = text.removeprefix("-").removeprefix("+")
    number = parse_number(text)
    if number is not None:
        return (sign * number[0], 1) if number[1] and not number[2] else None
    over = _OVER.match(text)
    if over:
        numerator = _simple_term(over.group(1) or over.group(3))
        denominator = int(over.group(2) or over.group(4))
        if numerator is None or denominator == 0:
            return None
        return sign * numerator[0] / denominator, numerator[1]
    surd = _SURD.match(text)
    if surd:
        coefficient, radicand = _squarefree(int(surd.group(1) or 1), int(surd.group(2) or surd.group(3)))
        return Fraction(sign * coefficient), radicand if radicand > 1 else 1
    pi = _PI.match(text)
    if pi:
        return Fraction(sign * int(pi.group(1) or 1)), "pi"
    return None


def _simple_verdict(gold: str, answer: str) -> bool | None:
    """Exact verdict for simple terms and for intervals of plain numbers, None when neither fits."""
    gold_interval, answer_interval = _INTERVAL.match(gold), _INTERVAL.match(answer)
    if gold_interval and answer_interval:
        gold_ends = [_simple_term(gold_interval.group(i)) for i in (2, 3)]
        answer_ends = [_simple_term(answer_interval.group(i)) for i in (2, 3)]
        if None in gold_ends or None in answer_ends:
            return None
        same_brackets = (gold_interval.group(1), gold_interval.group(4)) == (
            answer_interval.group(1),
            answer_interval.group(4),
        )
        # "(a, b)" is an open interval or a pair: both readings agree on equality of exact endpoints.
        return same_brackets and gold_ends == answer_ends
    gold_term, answer_term = _simple_term(gold), _simple_term(answer)
    if gold_term is None or answer_term is None:
        return None
    return gold_term == answer_term or (gold_term[0] == answer_term[0] == 0)


def _term_value(term: tuple[Fraction, int | str], digits: int) -> Fraction:
    """``q * basis`` to ``digits + 20`` significant digits (at least 80; exact for basis 1): far below the rounding
    of a decimal written with ``digits`` significant digits, however many that is (a 99-digit ``\\sqrt{2}``)."""
    coefficient, basis = term
    if basis == 1:
        return coefficient
    precision = max(80, digits + 20)
    if basis == "pi":
        import mpmath  # sympy's own dependency; imported on the first decimal graded against a multiple of pi

        with mpmath.workdps(precision):
            return coefficient * Fraction(Decimal(mpmath.nstr(mpmath.pi, precision, strip_zeros=False)))
    with localcontext() as context:
        context.prec = precision
        return coefficient * Fraction(Decimal(basis).sqrt())


def _approximate_verdict(gold: str, answer: str, significant_digits: int) -> bool | None:
    """A decimal against an exact surd or multiple of pi (``1.41421`` vs ``\\sqrt{2}``), else None."""
    for exact_side, decimal_side in ((gold, answer), (answer, gold)):
        number = _parse(decimal_side)
        if number is None or number.unit is None:
            continue
        term = _simple_term(exact_side)
        if term is not None and term[1] != 1:
            value = _term_value(term, number.digits)
            return any(_rounds_to(reading, value, significant_digits) for reading in _readings(number))
    return None


_SCIENTIFIC_IN_TEXT = re.compile(
    r"(?<![\w.\\])(\d+(?:\.\d*)?|\.\d+)\s*(?:[eE]([+-]?\d+)|(?:\\times|\\cdot)\s*\{?10\}?\s*\^\s*(?:\{\s*([+-]?\d+)\s*\}|(\d)))"
    r"(?![\w.])"
)


def exact_scientific(text: str) -> str:
    """Scientific notation inside a larger expression as an exact ``\\frac{p}{q}`` for math-verify, which would
    read ``1e-3`` as ``1 \\cdot e - 3`` and ``6.02\\times10^{23}`` as a float."""

    def exact(match: re.Match[str]) -> str:
        exponent = int(match.group(2) or match.group(3) or match.group(4))
        if abs(exponent) > _MAX_EXPONENT:
            return match.group(0)
        value = Fraction(match.group(1)) * Fraction(10) ** exponent
        return (
            str(value.numerator) if value.denominator == 1 else f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
        )

    return _SCIENTIFIC_IN_TEXT.sub(exact, text) if any(c in text for c in "eE\\") else text


def numeric_verdict(gold: str, answer: str, significant_digits: int) -> bool | None:
    """Whether two normalized answers are equal, decided exactly, or None when they are not both numbers or simple
    terms (math-verify's job then).

    Two plain numbers are equal as exact values or when one is a correctly rounded decimal of the other with at least
    ``significant_digits`` significant digits; simple terms (``2\\sqrt{7}``, ``\\pi/3``) and intervals of them are
    compared exactly; a decimal matches a surd or multiple of pi under the same rounding rule.
    """
    number_gold, number_answer = _parse(gold), _parse(answer)
    if number_gold is not None and number_answer is not None:
        return _numeric_verdict(number_gold, number_answer, significant_digits)
    verdict = _simple_verdict(gold, answer)
    return verdict if verdict is not None else _approximate_verdict(gold, answer, significant_digits)
