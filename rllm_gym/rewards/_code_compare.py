"""Comparison and quoting for code grading (:mod:`rllm_gym.rewards.code`): total functions over any plain value.

Every function here returns a value for any input the solution can produce (ints of any size, NaN and inf, deep
containers, strings with lone surrogates, megabytes of text) and never raises: a value the grader cannot compare is
a wrong answer, a value it cannot print is shown by its shape.
"""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from typing import Any

__all__ = ["DEFAULT_FLOAT_TOLERANCE", "clean_text", "outputs_match", "quote", "show", "values_match"]

DEFAULT_FLOAT_TOLERANCE = 1e-6
QUOTE = 300  # characters of an input/expected/got quoted in the per-test results
_INTEGER = re.compile(r"[+-]?\d+\Z")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_SHOWN_INT_BITS = 1000  # a longer int is shown by its size: its digits cost quadratic time and say little
_MAX_SHOWN_DEPTH = 100


def clean_text(text: str) -> str:
    """``text`` with every lone surrogate (which UTF-8 cannot encode) replaced by U+FFFD, so records can be logged."""
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


def _number(token: str) -> float | None:
    """The number a printed token spells in the plain notation a checker reads (``-1.5e3``, ``inf``), else None:
    not Python's extras, which no judge reads as a number (``1_000.5``, non-ASCII digits such as ``٤``)."""
    if not token.isascii() or "_" in token:
        return None
    try:
        return float(token)
    except ValueError:
        return None


def _is_float_literal(token: str) -> bool:
    return _INTEGER.match(token) is None and _number(token) is not None


def _close(got: int | float, expected: float, tol: float) -> bool:
    """``math.isclose`` with relative and absolute ``tol``; an int too large for a float is compared exactly."""
    if math.isnan(expected):
        return isinstance(got, float) and math.isnan(got)
    try:
        value = float(got)
    except OverflowError:  # |got| >= 2**1024: never NaN or inf, so compare exact values
        if math.isinf(expected):
            return False
        exact_got, exact_expected = Fraction(got), Fraction(expected)
        bound = max(tol * max(abs(exact_got), abs(exact_expected)), Fraction(tol))
        return abs(exact_got - exact_expected) <= bound
    return math.isclose(value, expected, rel_tol=tol, abs_tol=tol)


def outputs_match(got: str, expected: str, tol: float = DEFAULT_FLOAT_TOLERANCE) -> bool:
    """Whether printed output matches the expected output, token by token, ignoring whitespace.

    A token must equal the expected one exactly, except where the expected token is a float literal: then any
    number within ``tol`` (relative and absolute) matches.
    """
    got_tokens, expected_tokens = got.split(), expected.split()
    if got_tokens == expected_tokens:
        return True
    if len(got_tokens) != len(expected_tokens):
        return False
    for a, b in zip(got_tokens, expected_tokens, strict=True):
        if a == b:
            continue
        x = _number(a)
        if not _is_float_literal(b) or x is None or not _close(x, float(b), tol):
            return False
    return True


def _exact(item: Any) -> Any:
    """A hashable key or member with its exact type at every depth: ``1``, ``True`` and ``1.0`` differ, and so do
    ``(1, 2)`` and ``(True, 2)`` or ``frozenset({1})`` and ``frozenset({True})``."""
    kind = type(item)
    if kind is tuple:
        return kind, tuple(_exact(member) for member in item)
    if kind is frozenset:
        return kind, frozenset(_exact(member) for member in item)
    return kind, item


def _typed(items: Any) -> set[Any]:
    """Keys or members with their exact types at every depth (see :func:`_exact`)."""
    return {_exact(item) for item in items}


def values_match(got: Any, expected: Any, tol: float = DEFAULT_FLOAT_TOLERANCE) -> bool:
    """Whether a returned plain value equals the expected one under the strict rules of :mod:`rllm_gym.rewards.code`.

    Never raises: an int of any size against a float, NaN, and nesting as deep as the channel allows all get a bool.
    """
    try:
        return _values_match(got, expected, tol)
    except (RecursionError, OverflowError, ValueError, TypeError):
        return False


def _values_match(got: Any, expected: Any, tol: float) -> bool:
    kind = type(expected)
    if kind is bool or type(got) is bool:
        return type(got) is kind and got == expected
    if kind is float:
        return type(got) in (int, float) and _close(got, expected, tol)
    if kind is complex:
        return (
            type(got) in (int, float, complex)
            and _close(complex(got).real, expected.real, tol)
            and _close(complex(got).imag, expected.imag, tol)
        )
    if kind in (int, str, bytes, type(None)):
        return type(got) is kind and got == expected
    if kind in (list, tuple):
        return (
            type(got) in (list, tuple)
            and len(got) == len(expected)
            and all(_values_match(a, b, tol) for a, b in zip(got, expected, strict=True))
        )
    if kind is dict:
        return (
            type(got) is dict
            and _typed(got) == _typed(expected)
            and all(_values_match(got[k], expected[k], tol) for k in expected)
        )
    if kind in (set, frozenset):
        return type(got) in (set, frozenset) and _typed(got) == _typed(expected)
    return False


_BRACKETS = {list: ("[", "]"), tuple: ("(", ")"), set: ("{", "}"), frozenset: ("frozenset({", "})"), dict: ("{", "}")}


def show(value: Any, limit: int = QUOTE) -> str:
    """A Python-like rendering of a plain value, at most ``limit`` characters (then ``...``), in time bounded by the
    limit: big ints are shown by their size, containers stop once the text is long enough, lone surrogates escaped."""
    parts: list[str] = []
    room = [limit + 1]

    def put(text: str) -> bool:
        parts.append(text[: room[0]])
        room[0] -= len(parts[-1])
        return room[0] > 0

    def walk(item: Any, depth: int) -> bool:
        kind = type(item)
        if kind is int and item.bit_length() > _SHOWN_INT_BITS:
            return put(f"<an int of {item.bit_length()} bits>")
        if kind in (str, bytes):
            return put(repr(item[: room[0]]))
        if kind not in _BRACKETS:
            return put(repr(item) if kind in (int, float, complex, bool, type(None)) else f"<{kind.__name__}>")
        if depth > _MAX_SHOWN_DEPTH:
            return put("...")
        if kind is set and not item:
            return put("set()")
        opening, closing = _BRACKETS[kind]
        if not put(opening):
            return False
        for index, member in enumerate(item.items() if kind is dict else item):
            if index and not put(", "):
                return False
            if kind is dict:
                if not (walk(member[0], depth + 1) and put(": ") and walk(member[1], depth + 1)):
                    return False
            elif not walk(member, depth + 1):
                return False
        if kind is tuple and len(item) == 1 and not put(","):
            return False
        return put(closing)

    walk(value, 0)
    text = "".join(parts)
    return text if len(text) <= limit else text[:limit] + "..."


def quote(value: Any, limit: int = QUOTE) -> str:
    """A test's input or expected value for the per-test results: text as it is, data as JSON (or :func:`show` when
    JSON cannot hold it), at most ``limit`` characters, no lone surrogates."""
    if isinstance(value, str):
        text = value[: limit + 1]
    else:
        try:
            text = json.dumps(value)
            if len(text) > 4 * limit:  # cheap enough to make, too long to keep
                text = text[: limit + 1]
        except (ValueError, TypeError, RecursionError):  # an int past 4300 digits, a set, deep nesting
            text = show(value, limit)
    text = clean_text(text)
    return text if len(text) <= limit else text[:limit] + "..."
