"""Math answer normalization: the canonical string :mod:`rllm_gym.rewards.math` compares answers by, with the words
after a number read (a unit dropped, a scale applied, words that change the meaning kept)."""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["normalize_answer"]


_DROP = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\:|\\ |~|\\displaystyle|\^\s*\{?\\circ\}?|\\\$|\s+")
_ASSIGNMENT = re.compile(r"^[A-Za-z]\s*=(?!=)")
_NUMERIC_START = re.compile(r"^[+-]?(?:\d|\.\d|\\d?frac)")
# Words after a number: ``\text{...}``-style groups and bare words of two or more letters (or one with a period, as
# in ``5 m.``); a word right after a backslash or a digit (``2\pi``, ``3x``) is part of the expression.
_TRAILING_WORDS = re.compile(
    r"(?:\s*\\(?:text|textbf|textit|mbox|mathrm|operatorname)\s*\{[^{}]*\}|\s+[A-Za-z]{2,}\.?|\s+[A-Za-z]\.)+\s*$"
)
_WORD = re.compile(r"[A-Za-z]+|[^A-Za-z\s.,]")
_PLAIN_DECIMAL = re.compile(r"^[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?$")
_SCALES = {"hundred": 2, "thousand": 3, "million": 6, "billion": 9, "trillion": 12}  # powers of ten
_DOZEN = "dozen"  # a scale too: "2 dozen" is 24, never 2
# Words that make a number say something else ("3 is not it", "5 or more", "about 7"): an answer ending in one is
# not that number. Any other short run of words after a number is read as its unit ("10 cm", "5 apples each").
_MEANING_WORDS = frozenset(
    """is are was were be been being am isn aren wasn not no none nor never neither either or and but than more less
    fewer greater smaller larger bigger higher lower plus minus times divided over under above below least most only
    approximately approx about around roughly nearly almost exactly if then so because since which who what when
    where why how can cannot could would should may might will must do does did has have had it its this that these
    those there here i you he she we they me him her us them my your his our their wrong incorrect correct false true
    maybe possibly probably perhaps undefined infinite infinity impossible other else between to from out up down off
    away except without answer solution solutions""".split()  # noqa: SIM905 (a word list reads better as prose)
)
_MAX_UNIT_WORDS = 4


def _read_trailing_words(text: str) -> tuple[str, str]:
    """``(text, how)``: the answer with words after its number read, and how they were read: ``""`` (none),
    ``"unit"`` (dropped: ``10\\text{ cm}`` -> ``10``), ``"scale"`` (applied: ``7 thousand`` -> ``7e3``),
    ``"percent"`` (``50 percent`` -> ``50%``) or ``"words"`` (they change the meaning: the text is left as it is)."""
    if not text or not (text[-1].isalpha() or text[-1] in "}.") or not _NUMERIC_START.match(text):
        return text, ""  # words end in a letter, a period or a brace: most numbers are decided here
    found = _TRAILING_WORDS.search(text)
    if found is None or found.start() == 0:
        return text, ""
    core = text[: found.start()].rstrip()
    words = [word.lower() for word in _WORD.findall(re.sub(r"\\[A-Za-z]+\s*\{", " ", found.group(0)))]
    words = [word for word in words if word not in "{}"]
    if not words:
        return core, "unit"  # an empty \text{}
    exponent, dozens = 0, 0
    while words and (words[0] in _SCALES or words[0] == _DOZEN):
        word = words.pop(0)
        exponent, dozens = exponent + _SCALES.get(word, 0), dozens + (word == _DOZEN)
    scaled = exponent or dozens
    if words[:2] in (["percent"], ["per", "cent"]) and len(words) == (1 if words[0] == "percent" else 2):
        return (core + "%", "percent") if not scaled else (text, "words")
    if len(words) > _MAX_UNIT_WORDS or any(not word.isalpha() or word in _MEANING_WORDS for word in words):
        return text, "words"
    if not scaled:
        return core, "unit"
    if not _PLAIN_DECIMAL.match(core):
        return text, "words"  # a scale word after an expression: not read here
    if dozens:  # exact: 12**k times the number (never longer than the words it replaces)
        value = Fraction(core.replace(",", "")) * 12**dozens * 10**exponent
        return (str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"), "scale"
    return f"{core.replace(',', '')}e{exponent}", "scale"


def _normalize(answer: str) -> tuple[str, str]:
    text = answer.strip().rstrip(".").strip("$").strip().rstrip(".")
    text = re.sub(r"\\text\{\s*\}", "", text)
    if text.startswith(("\\$", "$")):  # "\$1.2 million": the number, and its words, start after the dollar sign
        text = text.removeprefix("\\").removeprefix("$").lstrip()
    text, how = _read_trailing_words(text)
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _DROP.sub("", text)
    return _ASSIGNMENT.sub("", text), how


def normalize_answer(answer: str) -> str:
    """A canonical string for cheap exact matching: no ``$``, spacing macros, ``\\left``/``\\right``, degree signs,
    dollar signs, or a leading single-letter assignment (``x = 3`` -> ``3``); ``\\dfrac``/``\\tfrac`` become
    ``\\frac``. Words after a number are read: a unit is dropped (``10\\text{ cm}``, ``18 dollars``), a scale word
    applied (``7 thousand`` -> ``7e3``, ``10\\text{ million}`` -> ``10e6``), ``percent`` becomes ``%``; words that
    change the meaning (``3\\text{ is not it}``) are kept, so the answer is not that number."""
    return _normalize(answer)[0]
