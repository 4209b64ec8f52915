"""The wrapper's own checks of reasoning-gym verdicts, and the datasets whose scorer cannot be made sound.

Some reasoning-gym scorers say 1.0 for answers that do not solve the task: ``puzzle24`` truncates the value
(``int(24.5) == 24``) and never checks that the expression uses the puzzle's numbers (a regex counts any four numbers,
so ``0x18`` or ``24+0*0*0`` pass), ``countdown``'s number check misses hex and float literals, ``coin_flip``'s
"matching prefix" credit reaches 1.0 (``1e9`` for a probability of 1, ``0`` on every task: the check here pays only the
probability, to 1e-4 and to a tenth of ``min(p, 1 - p)``, so ``1`` is no answer to 0.99997), ``complex_arithmetic``
pays ``nan`` in full (``min(1.0, exp(-nan))``), and ``polynomial_equations``' oracle misses real roots of some
quartics, so ``0`` is paid on tasks it does not solve (checked against every real root here; a task whose own oracle
fails the check is not posed, :func:`oracle_problem`). Where the task is checkable exactly, :func:`wrapper_check`
checks it here, on the host, without evaluating the answer as code (a Fraction evaluator over the parsed tree, only
``+ - * /`` and the puzzle's own decimal numbers). Where it is not, the dataset is in :data:`UNSOUND_DATASETS` and
``rllm/ReasoningGym-v0`` refuses it unless ``allow_unsound=True``.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from fractions import Fraction
from typing import Any

from rllm_gym.rewards.reasoning_gym import Verdict

__all__ = ["UNSOUND_DATASETS", "arithmetic_puzzle_problem", "oracle_problem", "roots_problem", "wrapper_check"]

# Datasets whose scorer pays 1.0 (the binary reward) for a constant or garbage answer, and why. Found by
# tests/envs/test_reasoning_gym_survey.py on reasoning-gym 0.1.25.
UNSOUND_DATASETS: dict[str, str] = {
    "game_of_life_halting": "its scorer pays 1.0 for any answer at all (it never reads the answer it is given)",
    "propositional_logic": (
        "its scorer pays 1.0 for any consequence of the premises that is not a tautology, so the premises "
        "themselves, one of them or all joined with ∧, are paid on every task"
    ),
}
_PROBABILITY = re.compile(r"-?\d{1,30}(?:\.\d{1,30})?(?:[eE][+-]?\d{1,2}|/\d{1,30})?")
_NOT_A_NUMBER = re.compile(r"nan|inf", re.IGNORECASE)
_PLAIN_DECIMAL = re.compile(r"[+-]?\d{1,30}(?:\.\d{0,30})?")

_OPERATORS = {ast.Add: Fraction.__add__, ast.Sub: Fraction.__sub__, ast.Mult: Fraction.__mul__}


def _evaluate(node: ast.AST, answer: str, used: list[int]) -> Fraction:
    """The exact value of an arithmetic tree of decimal integers; the integers met are appended to ``used``."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        text = ast.get_source_segment(answer, node) or ""
        if not text.isascii() or not text.isdigit():  # 0x18, 1_0, 0b11: not how the puzzle writes its numbers
            raise ValueError(f"{text!r} is not a plain decimal number")
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand, answer, used)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (*_OPERATORS, ast.Div)):
        left, right = _evaluate(node.left, answer, used), _evaluate(node.right, answer, used)
        if isinstance(node.op, ast.Div):
            if right == 0:
                raise ValueError("division by zero")
            return left / right
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError(f"{type(node).__name__} is not one of + - * / over the puzzle's numbers")


def arithmetic_puzzle_problem(answer: str, numbers: list[int], target: int | float) -> str | None:
    """Why ``answer`` does not reach ``target`` using each of ``numbers`` exactly once, or None when it does."""
    try:
        tree = ast.parse(answer.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "the answer is not an arithmetic expression"
    # Count the constants before evaluating: the tree is then as small as the puzzle, whatever the answer's length.
    constants = [node for node in ast.walk(tree) if isinstance(node, ast.Constant)]
    if len(constants) != len(numbers):
        return f"the answer uses {len(constants)} numbers, the puzzle has {len(numbers)}"
    used: list[int] = []
    try:
        value = _evaluate(tree.body, answer, used)
    except (ValueError, RecursionError) as failure:
        return str(failure)
    if Counter(used) != Counter(int(n) for n in numbers):
        return f"the answer uses {sorted(used)}, the puzzle's numbers are {sorted(numbers)}"
    if value != Fraction(target):
        return f"the expression is worth {value}, not {target}"
    return None


def wrapper_check(dataset: str, answer: str, entry: dict[str, Any], verdict: Verdict) -> Verdict:
    """``verdict``, or ``rejected_by_check`` when the dataset's 1.0 does not hold up to the wrapper's own check."""
    if verdict.path != "score_answer" or verdict.score != 1.0:
        return verdict
    metadata = entry.get("metadata") or {}
    problem = None
    if dataset == "puzzle24":
        problem = arithmetic_puzzle_problem(answer, list(metadata.get("numbers", [])), 24)
    elif dataset == "countdown":
        problem = arithmetic_puzzle_problem(answer, list(metadata.get("numbers", [])), metadata.get("target", 0))
    elif dataset == "coin_flip":
        problem = _probability_problem(answer, str(entry.get("answer", "")))
    elif dataset == "complex_arithmetic" and _NOT_A_NUMBER.search(answer):
        problem = "nan or inf is not a complex number's part"
    elif dataset == "polynomial_equations":
        problem = roots_problem(answer, str(metadata.get("polynomial_expr", "")), str(metadata.get("variable", "x")))
    return verdict if problem is None else Verdict("rejected_by_check", error=problem)


def oracle_problem(dataset: str, entry: dict[str, Any]) -> str | None:
    """Why a task's own oracle answer fails the wrapper's check (the task is then not posed), or None."""
    if dataset != "polynomial_equations":
        return None
    metadata = entry.get("metadata") or {}
    expression, variable = str(metadata.get("polynomial_expr", "")), str(metadata.get("variable", "x"))
    return roots_problem(str(entry.get("answer") or ""), expression, variable)


def _real_roots(expression: str, variable: str) -> list[float]:
    """The distinct real roots of the dataset's own polynomial (trusted text: it comes from the generator)."""
    import sympy  # math-verify's dependency; imported on the first polynomial_equations verdict only

    polynomial = sympy.Poly(sympy.sympify(expression), sympy.Symbol(variable))
    return sorted(float(root.evalf(30)) for root, _ in polynomial.real_roots(multiple=False))


def roots_problem(answer: str, expression: str, variable: str) -> str | None:
    """Why ``answer`` is not the comma-separated real roots of ``expression = 0`` (each within 1e-3), or None.

    ``polynomial_equations``' oracle comes from ``sympy.solve``, which misses real roots of some quartics
    (``-7*n**4 + 97*n**2 - 31*n`` has four, its oracle says ``0.0``): its scorer then pays ``0`` for a task it
    does not solve. The check here counts every real root."""
    values = []
    for part in answer.split(","):
        if not part.strip():
            continue
        if not _PLAIN_DECIMAL.fullmatch(part.strip()):
            return "the answer is not a comma-separated list of decimal numbers"
        values.append(float(part))
    try:
        roots = _real_roots(expression, variable)
    except Exception as failure:  # a dataset change we cannot read: a 1.0 that cannot be checked is not paid
        return f"the equation {expression[:100]!r} cannot be checked ({type(failure).__name__})"
    if len(values) != len(roots):
        return f"the equation has {len(roots)} real solution(s), the answer gives {len(values)}"
    for value, root in zip(sorted(values), roots, strict=True):
        if abs(value - root) > 1e-3 * max(1.0, abs(root)):
            return f"{value} is not a real solution (the nearest is {root:.6g})"
    return None


def _probability_problem(answer: str, oracle: str) -> str | None:
    """Why ``answer`` is not the oracle's probability, or None. It must be within 1e-4 of it and, for an oracle
    strictly between 0 and 1, within a tenth of the smaller of ``p`` and ``1 - p``: ``0`` is no answer to a chance
    of 3e-5 (15 heads in 15 flips), nor ``1`` to 0.99997 (at least one head in 15), though both are within 1e-4. The
    answer is a plain decimal, fraction or ``1.5e-05``-style decimal (a bounded exponent: ``Fraction("1e999999999")``
    would take forever)."""
    answer, oracle = answer.replace(",", "").replace(" ", ""), oracle.replace(",", "").replace(" ", "")
    if not _PROBABILITY.fullmatch(answer) or not _PROBABILITY.fullmatch(oracle):
        return "the answer is not a plain decimal or fraction"
    try:
        value, expected = Fraction(answer), Fraction(oracle)
    except (ValueError, ZeroDivisionError):
        return "the answer is not a number"
    distance = abs(value - expected)
    if distance > Fraction(1, 10_000):
        return f"the answer is {float(distance):.3g} away from the oracle"
    if 0 < expected < 1 and distance > min(expected, 1 - expected) / 10:
        return f"the answer is {float(distance):.3g} away from a probability of {float(expected):.3g}"
    return None
