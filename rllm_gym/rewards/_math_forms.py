"""Answers that ask the grader to do the task: :func:`unevaluated_reason` refuses them before math-verify sees them.

math-verify (through sympy) evaluates what it parses: ``\\int_0^2 1\\,dx`` is 2, ``\\frac{d}{dx} x^2`` is ``2x``,
``\\sum_{i=1}^{2} 1`` is 2, and so is ``1+1``, ``\\log_2 4`` or ``\\binom{2}{1}``. An answer in such a form restates
the question (an integral to integrate, a sum to add up) and has the grader compute the result, so it pays nothing:

* calculus and big operators (``\\int``, ``\\sum``, ``\\prod``, ``\\lim``, ``\\partial``, ``\\nabla``,
  ``\\frac{d}{dx}``, ``d/dx``, and the sympy-style calls ``integrate(...)``, ``diff(...)``,
  ``limit(...)``, ``solve(...)``) are refused in any answer, unless the reference answer uses the same operator;
* when the reference answer is a plain number (``42``, ``-3.5``, ``\\frac{2}{3}``, ``50\\%``), the answer must be a
  plain number too: one that is only numbers, arithmetic and named functions (``1+1``, ``2^{10}``,
  ``\\frac{1}{2}+\\frac{1}{3}``, ``3!``, ``\\gcd(4,6)``, ``\\sin(\\pi/6)``) is unevaluated, and so is a fraction for an
  integer (``16/2`` for 8; a mixed number such as ``1\\frac{1}{2}`` is a number). A decimal reference may be an
  irrational value rounded, so ``\\sqrt{2}`` or ``\\ln 2`` still answers ``1.41421356`` or ``0.693147``. Answers
  with words, units or variables the normalizer did not read (``9\\text{ cm}^2``, ``f(3)=5``) go to math-verify;
* an answer with an operation in it that is copied from the question (``(x+1)^2`` for "Expand $(x+1)^2$") is
  refused too (:func:`restated_reason`), whatever the reference answer.
"""

from __future__ import annotations

import re

from rllm_gym.rewards.numbers import parse_number

__all__ = ["restated_reason", "unevaluated_reason"]

# Each operator family, matched in a normalized answer (no spaces, \dfrac written \frac).
_TASK_OPERATORS = {
    "an integral": re.compile(r"\\(?:i{1,3}nt|oint|intop|smallint)(?![a-zA-Z])|\bintegra(?:te|l)\(", re.IGNORECASE),
    "a sum or product": re.compile(r"\\(?:sum|prod|coprod)(?![a-zA-Z])|\b(?:sum|product)\(", re.IGNORECASE),
    "a limit": re.compile(r"\\(?:lim|limsup|liminf|varlimsup|varliminf)(?![a-zA-Z])|\blimit\(", re.IGNORECASE),
    "a derivative": re.compile(
        r"\\(?:partial|nabla)(?![a-zA-Z])|\\frac\{(?:\\mathrm\{d\}|d)[^{}]*\}\{(?:\\mathrm\{d\}|d)[a-zA-Z\\]"
        r"|(?<![a-zA-Z])d/d[a-zA-Z]|\b(?:diff|derivative)\(",
        re.IGNORECASE,
    ),
    "an equation to solve": re.compile(r"\b(?:solve|solveset|nsolve)\(", re.IGNORECASE),
}
# What a closed-form expression without variables is made of: numbers, arithmetic, named functions and constants.
_CLOSED_FORM_MACROS = re.compile(
    r"\\(?:frac|times|cdot|div|sqrt|log|ln|lg|exp|sin|cos|tan|sec|csc|cot|arcsin|arccos|arctan|sinh|cosh|tanh|pi"
    r"|binom|dbinom|tbinom|choose|gcd|max|min|lceil|rceil|lfloor|rfloor|mod|bmod|operatorname\{[a-zA-Z]+\}"
    r"|mathrm\{(?:lcm|gcd|max|min)\})(?![a-zA-Z])|\\%"
)
_CLOSED_FORM_WORDS = re.compile(r"\b(?:gcd|lcm|max|min|sqrt|log|ln|exp|sin|cos|tan|floor|ceil|mod)(?=\()")
_CLOSED_FORM_REST = re.compile(r"[\d.,+\-*/^_!%(){}\[\]|]*")
_MIXED_NUMBER = re.compile(r"[+-]?\d+\\frac\{\d+\}\{\d+\}")  # 1\frac{1}{2}: how a mixed number is written
_FRACTION = re.compile(r"[+-]?(?:\\frac\{[+-]?\d+\}\{[+-]?\d+\}|\\frac\d\d|\d+/\d+)")
# A decimal reference (1.41421356) may be a rounded irrational value: a closed form of one is an answer, not work.
_IRRATIONAL = re.compile(r"\\(?:sqrt|log|ln|lg|exp|pi|sin|cos|tan|sec|csc|cot|arcsin|arccos|arctan|sinh|cosh|tanh)")
_WORK = re.compile(r"[+*/^!%]|(?<=[\d)}])-|\\|[a-z]\(")


def unevaluated_reason(answer: str, gold: str) -> str | None:
    """Why the normalized ``answer`` is work for the grader rather than an answer to ``gold`` (normalized too), or
    None. Called only when the two differ as strings: an answer written exactly as the reference is never refused."""
    for what, pattern in _TASK_OPERATORS.items():
        if pattern.search(answer) and not pattern.search(gold):
            return f"the answer is {what} for the grader to evaluate, not its value"
    gold_value, answer_value = parse_number(gold), parse_number(answer)
    if gold_value is None or _MIXED_NUMBER.fullmatch(answer):
        return None
    if answer_value is not None:
        written_as_integer = gold_value[0].denominator == 1 and "%" not in gold and not _FRACTION.fullmatch(gold)
        if written_as_integer and answer_value[0] == gold_value[0] and _FRACTION.fullmatch(answer):
            # 50% is 1/2, but 16/2 for 8 is the division the question asked for
            return "the answer is a fraction for the grader to divide; the reference answer is an integer"
        return None
    if not gold_value[1] and _IRRATIONAL.search(answer):
        return None
    stripped = _CLOSED_FORM_WORDS.sub("", _CLOSED_FORM_MACROS.sub("", answer))
    if _CLOSED_FORM_REST.fullmatch(stripped) and _WORK.search(answer):
        return "the answer is an expression for the grader to evaluate; the reference answer is a plain number"
    return None


_QUESTION_DROP = re.compile(r"\\left|\\right|\\[!,;: ]|~|\\displaystyle|[\s$]+")
_OPERATION = re.compile(r"[+*/^=!<>-]|\\[a-zA-Z]+")
_SINGLE_BRACED = re.compile(r"\{(\\?[A-Za-z0-9])\}")  # x^{2} is x^2
_PRODUCT = re.compile(r"\\cdot|\\times")
_TRIVIAL_WRAPPING = re.compile(r"^(?:\(|1\*|\+)*(.*?)(?:\)|\*1|\+0|-0)*$")


def _canonical(text: str) -> str:
    text = _QUESTION_DROP.sub("", text).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return _PRODUCT.sub("*", _SINGLE_BRACED.sub(r"\1", text))


def restated_reason(answer: str, question: object, golds: list[str]) -> str | None:
    """Why the normalized ``answer`` only copies an expression out of ``question`` (``(x+1)^2`` for "Expand
    (x+1)^2", also wrapped as ``1\\cdot((x+1)^{2})+0``), or None. Only answers with an operation count: a bare
    number or name may well be quoted by the question, and an answer written as one of the normalized ``golds`` is
    never refused."""
    if not isinstance(question, str) or len(answer) < 3 or answer in golds or not _OPERATION.search(answer):
        return None
    core = _canonical(answer)
    while (unwrapped := _TRIVIAL_WRAPPING.fullmatch(core)) and unwrapped.group(1) != core and unwrapped.group(1):
        core = unwrapped.group(1)
    if len(core) < 3 or not _OPERATION.search(core) or core in {_canonical(gold) for gold in golds}:
        return None
    return "the answer copies an expression from the question" if core in _canonical(question) else None
