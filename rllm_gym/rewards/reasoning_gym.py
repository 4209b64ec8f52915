"""Scoring reasoning-gym answers as untrusted input: what may run in this process, and the sandbox for the rest.

Several reasoning-gym scorers evaluate the answer as code: ``eval`` (``spiral_matrix``, ``binary_matrix``,
``string_insertion``, ``n_queens``) or sympy's ``parse_expr``, itself ``eval``-based (``countdown``, ``puzzle24``,
``polynomial_multiplication``, the integration sets). So the model's answer is untrusted code, and:

* only the datasets of :data:`IN_PROCESS_DATASETS` are scored in this process: each uses reasoning-gym's base
  scorer, a pure string comparison (checked again at run time, so an upgrade that overrides it moves the dataset to
  the sandbox); every other dataset, known or not, is scored in :mod:`rllm_gym.sandbox`, one run per answer, with a
  time and memory limit (:data:`SCORE_TIMEOUT_S`, :data:`SCORE_MEMORY_MB`), and only a number comes back;
* the sandbox's zygote has reasoning-gym imported already (``Sandbox(preload=...)``), so a run is a fork (~25-60 ms
  on a 2-core machine) rather than a ~1 s import;
* answers to the datasets that ``eval``/``parse_expr`` them must be plain data (:func:`unsafe_answer_reason`): a
  Python literal, or arithmetic over numbers, symbols and named maths functions, in the forms the dataset's own
  answers take (numbers only for ``countdown`` and ``puzzle24``, no functions in a polynomial). Anything else (a call
  to ``__import__``, an attribute, a string, or ``Integral``/``Derivative``/``Sum``/``limit``/``solve``, which would
  have sympy do the task) is refused on the host before scoring, so no answer runs code even in the sandbox, none
  can print a score of its own, and none is paid for restating the question;
* what comes back is checked: a finite number in [0, 1] or it is a verdict of its own (``invalid_score``).

A verdict is a :class:`Verdict`: the dataset's score (None when there is none) and the path that produced it, one of
:data:`VERDICT_PATHS`.
"""

from __future__ import annotations

import ast
import atexit
import base64
import io
import json
import keyword
import math
import os
import pickle
import threading
import tokenize
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rllm_gym.sandbox import ExecutionStatus, Sandbox, SandboxResult

__all__ = [
    "EVAL_LITERAL_DATASETS",
    "EVAL_SYMPY_DATASETS",
    "IN_PROCESS_DATASETS",
    "SCORE_MEMORY_MB",
    "SCORE_TIMEOUT_S",
    "SCORING_HARNESS",
    "VERDICT_PATHS",
    "Verdict",
    "runs_in_process",
    "sandbox_score",
    "scoring_sandbox",
    "unsafe_answer_reason",
]

# Datasets whose scorer is reasoning-gym's ProceduralDataset.score_answer: ``answer == oracle`` (1.0), else
# ``len(oracle) / len(answer)`` when the oracle is a substring, else 0.0. Audited on reasoning-gym 0.1.25.
IN_PROCESS_DATASETS = frozenset(
    {
        "acre", "aiw", "arc_1d", "base_conversion", "basic_arithmetic", "bf", "binary_alternation",
        "caesar_cipher", "count_bits", "count_primes", "course_schedule", "gcd", "isomorphic_strings",
        "largest_island", "lcm", "leg_counting", "letter_counting", "list_functions", "mahjong_puzzle", "maze",
        "modulo_grid", "number_filtering", "number_sequence", "ransom_note", "rotate_matrix", "rotten_oranges",
        "simple_equations", "simple_geometry", "string_manipulation", "string_splitting", "string_synthesis",
        "syllogism", "word_sequence_reversal",
    }
)  # fmt: skip
# Scorers that ``eval`` the answer when it is not already the oracle's text: only a literal may reach them.
EVAL_LITERAL_DATASETS = frozenset({"binary_matrix", "n_queens", "spiral_matrix", "string_insertion"})
# Scorers that give the answer to sympy's ``parse_expr`` (an ``eval`` after token rewriting).
EVAL_SYMPY_DATASETS = frozenset(
    {"countdown", "intermediate_integration", "polynomial_multiplication", "puzzle24", "simple_integration"}
)
SCORE_TIMEOUT_S = 5.0
SCORE_MEMORY_MB = 1024  # the address-space limit of a scoring run: ~270 MB of it is the preloaded reasoning-gym
VERDICT_PATHS = (
    "score_answer",  # the dataset's scorer gave a number in [0, 1]
    "unsafe_answer",  # the answer is code where the scorer evaluates it: refused before scoring
    "timeout",  # the scorer ran past SCORE_TIMEOUT_S (e.g. an answer of 9**9**9**9)
    "memory_limit",  # the scorer ran past SCORE_MEMORY_MB
    "scorer_error",  # the scorer raised or crashed on the answer
    "invalid_score",  # the scorer returned something that is not a finite number in [0, 1]
    "sandbox_error",  # the sandbox itself failed (an infrastructure error, never the answer's doing)
    "rejected_by_check",  # the dataset said 1.0 but the wrapper's own check disagrees (reasoning_gym_checks)
)


@dataclass(frozen=True)
class Verdict:
    """A scorer's outcome: ``score`` in [0, 1] when ``path == "score_answer"``, else None; ``error`` explains."""

    path: str
    score: float | None = None
    error: str | None = None


def runs_in_process(dataset: str, score_fn: Callable[..., Any] | None) -> bool:
    """True when ``dataset`` is allow-listed and ``score_fn`` really is reasoning-gym's base string scorer."""
    if dataset not in IN_PROCESS_DATASETS or score_fn is None:
        return False
    from reasoning_gym.dataset import ProceduralDataset

    return getattr(score_fn, "__func__", None) is ProceduralDataset.score_answer


def checked_score(value: Any) -> Verdict:
    """The verdict for a scorer's return value: a finite number in [0, 1], or ``invalid_score``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return Verdict("invalid_score", error=f"the scorer returned {type(value).__name__}, not a number")
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        return Verdict("invalid_score", error=f"the scorer returned {value!r}, outside [0, 1]")
    return Verdict("score_answer", float(value))


def score_in_process(score_fn: Callable[..., Any], answer: str, entry: dict[str, Any]) -> Verdict:
    """Run an allow-listed string scorer here (see :func:`runs_in_process`)."""
    try:
        return checked_score(score_fn(answer, entry))
    except Exception as failure:  # a scorer failing on odd model output is a wrong answer, not a crash
        return Verdict("scorer_error", error=f"{type(failure).__name__}: {failure}"[:300])


# Answers that reach eval


# What ``eval`` may see: data and operators on it. A bare name (``DCAABED``, ``True``) is looked up, never called;
# code runs only through calls, attributes, subscripts, lambdas, comprehensions and f-strings, all refused.
_LITERAL_NODES = (
    *(ast.Expression, ast.Constant, ast.Name, ast.Load, ast.List, ast.Tuple, ast.Set, ast.Dict),
    *(ast.UnaryOp, ast.BinOp, ast.BoolOp, ast.Compare, ast.operator, ast.unaryop, ast.boolop, ast.cmpop),
)
# Names sympy's parse_expr may see: one-letter symbols and sympy's elementary functions and constants. Calls to
# anything else (``eval``, ``chr``, ``getattr``, ``__import__``...) could build and run code from plain tokens. An
# answer is data, never work for the scorer: ``Integral``, ``Derivative``, ``Sum``, ``limit``, ``solve`` and the like
# would have sympy do the task (a scorer that differentiates the answer pays ``Integral(f, x)`` for integrating f).
_SYMPY_NAMES = frozenset(
    {
        "sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "acot", "asec", "acsc", "sinh", "cosh",
        "tanh", "coth", "sech", "csch", "asinh", "acosh", "atanh", "acoth", "exp", "log", "ln", "sqrt", "pi", "oo",
        "Abs", "abs", "sign", "floor", "ceiling", "factorial", "binomial", "gamma", "erf",
    }
)  # fmt: skip
# The forms each dataset's own answers take, and no more: the arithmetic puzzles' answers hold numbers only, a
# product of polynomials is a polynomial (symbols, no functions); the integrals' answers use the names above.
_SYMPY_FORMS: dict[str, tuple[bool, frozenset[str]]] = {  # dataset: (one-letter symbols allowed, named functions)
    "countdown": (False, frozenset()),
    "puzzle24": (False, frozenset()),
    "polynomial_multiplication": (True, frozenset()),
    "simple_integration": (True, _SYMPY_NAMES),
    "intermediate_integration": (True, _SYMPY_NAMES),
}
_SYMPY_OPS = frozenset({"+", "-", "*", "/", "**", "^", "(", ")", ",", "%", "!", "//"})


def unsafe_answer_reason(dataset: str, answer: str) -> str | None:
    """Why ``answer`` must not reach ``dataset``'s scorer (it would run as code there), or None when it is data."""
    if dataset in EVAL_LITERAL_DATASETS:
        try:
            tree = ast.parse(answer.lstrip(" \t"), mode="eval")
        except SyntaxError:
            return None  # eval raises the same SyntaxError before running anything
        except Exception as failure:  # too deep to parse: refuse rather than guess what eval would do
            return f"the answer cannot be checked ({type(failure).__name__})"
        for node in ast.walk(tree):
            if not isinstance(node, _LITERAL_NODES):
                return f"the answer is Python code ({type(node).__name__}), not data"
        return None
    if dataset in EVAL_SYMPY_DATASETS:
        symbols, names = _SYMPY_FORMS.get(dataset, (True, _SYMPY_NAMES))
        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(answer).readline))
        except (tokenize.TokenError, SyntaxError, IndentationError):
            return "the answer is not an arithmetic expression"
        for token in tokens:
            if token.type in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT):
                continue
            if token.type == tokenize.NUMBER:
                continue
            if token.type == tokenize.NAME and not keyword.iskeyword(token.string):
                name = token.string
                if (symbols and len(name) == 1 and name.isascii() and name.isalpha()) or name in names:
                    continue
            if token.type == tokenize.OP and token.string in _SYMPY_OPS:
                continue
            return f"the answer holds {token.string!r}, which is not arithmetic over numbers and symbols"
        return None
    return None


# The sandbox


# The trusted program a scoring run executes (benchmarks/reasoning_gym_scoring.py times it): reads the request on
# stdin, writes only {"score": x} to stdout.
SCORING_HARNESS = """
import base64, json, os, pickle, sys
request = pickle.loads(base64.b64decode(sys.stdin.read()))
verdict = os.dup(1)
os.dup2(2, 1)  # whatever the scorer prints goes to stderr: stdout carries only the verdict
import reasoning_gym
dataset = reasoning_gym.create_dataset(request["dataset"], **request["config"])
score = float(dataset.score_answer(request["answer"], request["entry"]))
os.write(verdict, json.dumps({"score": score}).encode())
"""

_sandbox: Sandbox | None = None
_sandbox_lock = threading.Lock()


def scoring_sandbox() -> Sandbox:
    """The process-wide sandbox for reasoning-gym scorers (reasoning-gym preloaded), started on first use.

    Strict unless ``RLLM_GYM_SANDBOX_STRICT=0``, like :func:`rllm_gym.sandbox.default_sandbox`: where the machine
    cannot isolate, starting it raises :class:`~rllm_gym.sandbox.SandboxUnavailableError` naming what is missing.
    """
    global _sandbox
    with _sandbox_lock:
        if _sandbox is None:
            strict = os.environ.get("RLLM_GYM_SANDBOX_STRICT", "1") != "0"
            # read_view: a trusted scorer reads its own data files lazily; the answer it scores is data (see above)
            _sandbox = Sandbox(
                max_parallel=max(2, os.cpu_count() or 1), strict=strict, preload=["reasoning_gym"], read_view=True
            )
            atexit.register(_sandbox.close)
        box = _sandbox
    box.start()
    return box


def sandbox_score(dataset: str, config: Mapping[str, Any], answer: str | None, entry: dict[str, Any]) -> Verdict:
    """Score ``answer`` with ``dataset``'s scorer (configured by ``config``) in the sandbox: one run, one number."""
    request = {
        "dataset": dataset,
        "config": {**dict(config), "size": 1, "seed": 0},  # scoring does not depend on the stream
        "answer": answer,
        "entry": entry,
    }
    payload = base64.b64encode(pickle.dumps(request)).decode()
    try:
        box = scoring_sandbox()
    except RuntimeError as failure:  # SandboxUnavailableError included: report it, never raise out of env.step
        return Verdict("sandbox_error", error=str(failure)[:300])
    result = box.run(
        SCORING_HARNESS,
        stdin=payload,
        timeout=SCORE_TIMEOUT_S,
        memory_mb=SCORE_MEMORY_MB,
        max_output_bytes=1 << 16,
        run_class="verdict",  # only the score comes out
    )
    return verdict_of(result)


def verdict_of(result: SandboxResult) -> Verdict:
    """The verdict of a scoring run: only a JSON ``{"score": x}`` on stdout of a run that exited 0 is a score."""
    if result.status is ExecutionStatus.TIMEOUT:
        return Verdict("timeout", error=f"the scorer ran past {SCORE_TIMEOUT_S:g} s")
    if result.status is ExecutionStatus.MEMORY_LIMIT:
        return Verdict("memory_limit", error=f"the scorer ran past {SCORE_MEMORY_MB} MB")
    if result.status is ExecutionStatus.SANDBOX_ERROR:
        return Verdict("sandbox_error", error=(result.error or "")[:300])
    if not result.ok:
        last = next((line for line in reversed(result.stderr.splitlines()) if line.strip()), result.status.value)
        return Verdict("scorer_error", error=last[:300])
    try:
        reply = json.loads(result.stdout)
    except ValueError:
        return Verdict("invalid_score", error="the scoring run wrote no verdict")
    if not isinstance(reply, dict) or set(reply) != {"score"}:
        return Verdict("invalid_score", error="the scoring run wrote something other than a score")
    return checked_score(reply["score"])
