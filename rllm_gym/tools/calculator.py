"""The ``calculator`` tool: exact arithmetic on model-written expressions, evaluated by walking Python's ``ast``.

Nothing is ever passed to ``eval``: only number literals, ``+ - * / // % **``, unary signs, parentheses, the
constants ``pi``, ``e``, ``tau`` and a fixed set of math functions are accepted. Integers are exact and of any size
up to :data:`MAX_RESULT_DIGITS` digits; powers, factorials and products are checked *before* they are computed, so
an expression such as ``9**9**9`` is refused in microseconds instead of exhausting memory. Every step works on
operands within that cap (``lcm`` folds its arguments one at a time), so no expression of
:data:`MAX_EXPRESSION_CHARS` characters holds the interpreter for more than a fraction of a second.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from rllm_gym.tools.base import Tool, ToolOutput

__all__ = ["MAX_EXPRESSION_CHARS", "MAX_RESULT_DIGITS", "CalculatorError", "CalculatorTool", "evaluate"]

MAX_EXPRESSION_CHARS = 2_000
# Python refuses str() of ints over 4300 digits by default (sys.int_max_str_digits); stay under it.
MAX_RESULT_DIGITS = 4_000
_MAX_BITS = int(MAX_RESULT_DIGITS * math.log2(10)) + 1
_MAX_FACTORIAL = 1_500  # 1500! has 4115 digits

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate; the message is meant for the model."""


def _factorial(n: Any) -> int:
    if not isinstance(n, int) or n < 0:
        raise CalculatorError(f"factorial() takes a non-negative integer, got {n!r}")
    if n > _MAX_FACTORIAL:
        raise CalculatorError(f"factorial({n}) is too large: the calculator allows n <= {_MAX_FACTORIAL}")
    return math.factorial(n)


def _lcm(*numbers: Any) -> int:
    # math.lcm of many large coprime arguments builds a product of millions of bits before any size check (one call
    # held the interpreter for 17 s): fold it one argument at a time, so each step's operands are within the cap.
    result = 1
    for position, number in enumerate(numbers, start=1):
        if not isinstance(number, int):
            raise CalculatorError(f"lcm() takes integers, got {number!r}")
        result = math.lcm(result, number)
        if result.bit_length() > _MAX_BITS:
            raise CalculatorError(f"lcm() has more than {MAX_RESULT_DIGITS} digits by its argument {position}")
    return result


def _round(x: Any, ndigits: Any = None) -> Any:
    if ndigits is not None and (not isinstance(ndigits, int) or abs(ndigits) > 100):
        raise CalculatorError(f"round() digits must be an integer between -100 and 100, got {ndigits!r}")
    return round(x, ndigits)


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "round": _round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
    "isqrt": math.isqrt,
    "exp": math.exp,
    "log": math.log,
    "log2": math.log2,
    "log10": math.log10,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "floor": math.floor,
    "ceil": math.ceil,
    "factorial": _factorial,
    "gcd": math.gcd,
    "lcm": _lcm,
}


def _check_size(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > _MAX_BITS:
        raise CalculatorError(f"result has more than {MAX_RESULT_DIGITS} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError(f"result is not a finite number ({value})")
    return value


def _power(base: Any, exponent: Any) -> Any:
    # |base|**exponent has about exponent * log2|base| bits: refuse before computing it.
    exact = isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1
    if exact and exponent * (abs(base).bit_length() - 1) > _MAX_BITS:
        raise CalculatorError(f"{base}**{exponent} has more than {MAX_RESULT_DIGITS} digits")
    result = base**exponent
    if isinstance(result, complex):
        raise CalculatorError(f"{base}**{exponent} is not a real number")
    return result


def _multiply(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int) and a.bit_length() + b.bit_length() > _MAX_BITS + 1:
        raise CalculatorError(f"product has more than {MAX_RESULT_DIGITS} digits")
    return a * b


class _Evaluator:
    def evaluate(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return self.evaluate(node.body)
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise CalculatorError(f"only numbers are allowed, got {node.value!r}")
            return _check_size(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self.evaluate(node.left), self.evaluate(node.right)
            if isinstance(node.op, ast.Pow):
                return _check_size(_power(left, right))
            if isinstance(node.op, ast.Mult):
                return _check_size(_multiply(left, right))
            return _check_size(_BINARY[type(node.op)](left, right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](self.evaluate(node.operand))
        if isinstance(node, ast.Name):
            if node.id in _CONSTANTS:
                return _CONSTANTS[node.id]
            raise CalculatorError(f"unknown name {node.id!r}; known constants: {', '.join(_CONSTANTS)}")
        if isinstance(node, ast.Call):
            return self._call(node)
        raise CalculatorError(f"unsupported syntax: {type(node).__name__}")

    def _call(self, node: ast.Call) -> Any:
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
            name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise CalculatorError(f"unknown function {name!r}; known functions: {', '.join(sorted(_FUNCTIONS))}")
        if node.keywords:
            raise CalculatorError(f"{node.func.id}() takes positional arguments only")
        arguments = [self.evaluate(argument) for argument in node.args]
        return _check_size(_FUNCTIONS[node.func.id](*arguments))


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression, or :class:`CalculatorError` saying what is wrong with it.

    >>> evaluate("123456789 * 987654321")
    121932631112635269
    >>> evaluate("sqrt(2) ** 2 // 1"), evaluate("2 ** -1"), evaluate("7 ** 222 % 1000003")
    (2.0, 0.5, 849282)
    """
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    if not text:
        raise CalculatorError("expression is empty")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as error:
        quoted = text if len(text) <= 80 else text[:77] + "..."
        raise CalculatorError(f"invalid syntax in {quoted!r}: {error.msg}") from None
    except (RecursionError, MemoryError):
        raise CalculatorError("expression is nested too deeply") from None
    except ValueError as error:
        raise CalculatorError(f"invalid expression: {error}") from None
    try:
        return _Evaluator().evaluate(tree)
    except CalculatorError:
        raise
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except RecursionError:
        raise CalculatorError("expression is nested too deeply") from None
    except (ArithmeticError, ValueError, TypeError) as error:
        raise CalculatorError(f"{type(error).__name__}: {error}") from None


def format_number(value: int | float) -> str:
    """Integers in full; floats in Python's shortest round-trip form (``0.1``, ``1e+20``)."""
    return str(value) if isinstance(value, int) else repr(float(value))


class CalculatorTool(Tool):
    """``calculator(expression)``: evaluate an arithmetic expression exactly (see :func:`evaluate`)."""

    def __init__(self, **kwargs: Any):
        super().__init__(
            "calculator",
            "Evaluate an arithmetic expression exactly. Integers have arbitrary size. Supports + - * / // % ** "
            "(or ^), parentheses, the constants pi, e, tau and the functions " + ", ".join(sorted(_FUNCTIONS)) + ".",
            {
                "type": "object",
                "properties": {
                    "expression": {"type": "string", "description": "The expression, e.g. '(2**64 - 1) * 37 % 1000'."}
                },
                "required": ["expression"],
            },
            **kwargs,
        )

    def forward(self, expression: str) -> ToolOutput:
        try:
            return ToolOutput(name=self.name, output=format_number(evaluate(expression)))
        except CalculatorError as error:
            return ToolOutput(name=self.name, error=str(error))
