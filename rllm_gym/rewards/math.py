"""Math answer grading: pull the final answer out of a model reply, then decide whether it equals the ground truth.

Grading runs three paths, cheapest first: an exact match of the normalized strings, an exact rational comparison
when both answers are plain numbers (integers, decimals, fractions, percentages, scientific notation such as
``4.2e1``, ``6.02 \\times 10^{23}`` or ``3x10^5``), and only then math-verify for everything symbolic (LaTeX
expressions, sets, intervals, tuples, equations). Near misses are judged relative to the magnitude of the values: a
decimal counts as equal to a more precise value only when it is that value correctly rounded and carries at least
``significant_digits`` significant digits (6 by default), so ``0.333333`` is 1/3 but twice 1e-5 is never 1e-5.
The numeric path lives in :mod:`rllm_gym.rewards.numbers`, normalization (:func:`normalize_answer`) in
:mod:`rllm_gym.rewards._math_normalize`.

math-verify times itself out with ``signal.alarm``, which only works in a main thread, so it runs in a small pool
of worker processes that the caller can kill (:class:`MathVerifyPool`, :mod:`rllm_gym.rewards.math_pool`): grading
is safe from any thread and from an asyncio loop, each answer has a hard wall-clock limit, and one pathological
answer never stalls the others.

Use :func:`math_reward_fn` as a :class:`~rllm_gym.rewards.RewardFunction`, or :class:`MathGrader` to choose the
rewards and limits.
"""

from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from rllm_gym.rewards._math_forms import restated_reason, unevaluated_reason
from rllm_gym.rewards._math_normalize import _normalize, normalize_answer
from rllm_gym.rewards.math_pool import MathVerifyPool, infrastructure_failed, shared_pool
from rllm_gym.rewards.numbers import exact_scientific, numeric_verdict, parse_number
from rllm_gym.types import RewardOutput

__all__ = [
    "MathGrader",
    "MathVerifyPool",
    "extract_answer",
    "last_boxed",
    "math_reward_fn",
    "normalize_answer",
    "parse_number",
]

# Extraction


_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")
# Linear time: the answer is read run by run, a run of spaces whole (possessive *+, ++) and only when what follows it
# does not end the answer, instead of a lazy (.+?) between \s* that backtracked cubically on "answer: x", thousands
# of spaces and "y" (4,000 spaces: a minute). The answer ends where the rest of its line is spaces (####), or (the
# answer is) at a period followed by a space, at the line's end or at the text's end.
_HASHES = re.compile(r"####\s*+(\S(?:\S|[^\S\n]++(?!\n|\Z))*+)[^\S\n]*+$", re.MULTILINE)
_ANSWER_IS = re.compile(
    r"(?:final answer|the answer|answer)\s*+(?:is|:|=)\s*+(?::\s*+)?"
    r"([^\n](?:[^\s.]|\.(?!\s|\Z)|[^\S\n]++(?!\n|\Z|\.(?:\s|\Z)))*+)[^\S\n]*+(?:\.\s|\.?\s*+$|\n)",
    re.IGNORECASE,
)
_MARKUP = " \t\n$*`"
_TOKEN = re.compile(r"[^\s$]+")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` or ``\\fbox{...}`` in ``text`` (braces balanced), or None.

    ``\\boxed 5`` (no braces) gives ``"5"``; an unclosed ``\\boxed{`` gives None (and an earlier box is used).
    """
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None
    # One pass from the right instead of a scan per box: thousands of nested unclosed boxes would be quadratic.
    # close[i] is the index of the brace that closes an opening brace at i, found via brace depths: the first index
    # after i where the depth falls back to its level before i.
    close: dict[int, int] = {}
    starts = {match.end() for match in matches if match.end() < len(text) and text[match.end()] == "{"}
    depth = text.count("{") - text.count("}")  # the depth after the last character
    first_at: dict[int, int] = {}  # depth -> the smallest index seen so far whose closing brace leaves that depth
    for index in range(len(text) - 1, -1, -1):
        char = text[index]
        if char not in "{}":
            continue
        first_at[depth] = index
        depth += 1 if char == "}" else -1  # now the depth before this character
        if char == "{" and index in starts and depth in first_at and first_at[depth] != index:
            close[index] = first_at[depth]
    for match in reversed(matches):
        start = match.end()
        if start in starts:
            if start in close:
                return text[start + 1 : close[start]].strip()
            continue  # unbalanced: try an earlier box
        token = _TOKEN.match(text, start)
        if token:
            return token.group(0)
    return None


def extract_answer(text: str) -> tuple[str | None, str | None]:
    """``(answer, None)`` for the final answer of a model reply, or ``(None, why)`` when it gives none.

    Only the text after the last ``</think>`` counts; a ``<think>`` without its ``</think>`` gives no answer. Looked
    for in this order: the last ``\\boxed{}``/``\\fbox{}``, the last ``#### N`` line, the last "The answer is N" /
    "Answer: N", and finally a reply that is nothing but one short answer (``42``, ``$\\frac{1}{2}$``).
    """
    if not isinstance(text, str):
        return None, f"the reply must be a string, got {type(text).__name__}"
    if "</think>" in text:
        text = text.rpartition("</think>")[2]
    elif "<think>" in text:
        return None, "the reply opens <think> but never closes it, so it has no final answer"
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed, None
    for pattern in (_HASHES, _ANSWER_IS):
        found = pattern.findall(text)
        if found and found[-1].strip(_MARKUP):
            return found[-1].strip(_MARKUP), None
    bare = text.strip(_MARKUP).rstrip(".")
    if (
        re.fullmatch(r"\S+(?:\s\S+){0,3}", bare)
        and len(bare) <= 64
        and (re.search(r"[\d\\]", bare) or re.fullmatch(r"\(?[A-Ea-e]\)?", bare))
    ):
        return bare, None  # a reply that is just the answer, not a sentence
    return None, "no final answer found: put it in \\boxed{...}, after '####', or after 'The answer is'"


# The grader


def _ground_truths(task_info: dict[str, Any]) -> list[str]:
    if not isinstance(task_info, dict):
        raise TypeError(f"task_info must be a dict with a 'ground_truth', got {type(task_info).__name__}")
    key = "ground_truth" if task_info.get("ground_truth") is not None else "answer"
    value = task_info.get(key)
    if value is None:
        raise ValueError(
            f"task_info has no 'ground_truth' (or 'answer'): got keys {sorted(task_info)}; "
            "add the reference answer, e.g. {'question': ..., 'ground_truth': '42'}"
        )
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    golds = []
    for item in values:
        if isinstance(item, bool) or not isinstance(item, (str, int, float, Fraction)):
            raise ValueError(f"task_info[{key!r}] must be a string or number (or a list of them), got {item!r}")
        text = str(item)
        golds.append(last_boxed(text) or (_HASHES.findall(text) or [text])[-1].strip())
    return golds


@dataclass(frozen=True)
class MathGrader:
    """A configurable math :class:`~rllm_gym.rewards.RewardFunction`: ``grader(task_info, action) -> RewardOutput``.

    Example::

        >>> grader = MathGrader(correct_reward=1.0, incorrect_reward=0.0, format_error_reward=-0.1)
        >>> grader({"ground_truth": "\\\\frac{1}{2}"}, "So the answer is \\\\boxed{0.5}.").reward
        1.0
        >>> grader({"ground_truth": "3"}, "I am not sure.").metadata["format_error"]
        True

    ``metadata`` holds ``extracted_answer``, ``ground_truth`` (the first reference answer), ``path`` (which path
    decided: ``exact``, ``numeric``, ``words`` (words after the number change its meaning: not equal),
    ``unevaluated`` (the answer is work for the grader, not a value: an integral, sum, limit or derivative, ``1+1``
    or ``2^{10}`` for a plain number, an expression copied from ``task_info["question"]``; see
    :mod:`rllm_gym.rewards._math_forms`: not equal), ``math_verify``, ``timeout``, ``error``, ``format_error``),
    ``format_error``
    and, for format errors and failures, ``error`` and ``infra_failed`` (True when the math-verify worker died or
    the host starved it, see :meth:`MathVerifyPool.verify`: the infrastructure's failure; a ``timeout`` on the
    answer, with the worker computing, is the answer's).

    Args:
        correct_reward / incorrect_reward / format_error_reward: the reward for a correct answer, a wrong one, and a
            reply with no extractable answer (or one longer than ``max_answer_chars``).
        time_limit: wall-clock seconds for math-verify on one answer (0.1 to 600); past it the answer is wrong if
            the worker used a quarter of it in CPU time, else the host starved it (``infra_failed``) after at most
            three times the limit. An answer that times out against one reference answer is wrong without being
            tried against the others.
        max_answer_chars: longer extracted answers are format errors and never reach the parser.
        use_math_verify: False keeps to the exact and numeric paths (symbolic answers then only match exactly).
        significant_digits: how many significant digits a decimal must carry to count as a correctly rounded value
            of a more precise one (``0.333333`` for 1/3, ``1.41421`` for ``\\sqrt{2}``, ``6.02214e23``); the
            rounding must be correct at its last digit, so the tolerance scales with the magnitude. The default 6
            matches math-verify's six decimal places for values of order one.
        pool: the worker pool; by default one shared by every grader in the process.
    """

    correct_reward: float = 1.0
    incorrect_reward: float = 0.0
    format_error_reward: float = 0.0
    time_limit: float = 5.0
    max_answer_chars: int = 1000
    use_math_verify: bool = True
    significant_digits: int = 6
    pool: MathVerifyPool | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("correct_reward", "incorrect_reward", "format_error_reward", "time_limit"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"MathGrader {name} must be a finite number, got {value!r}")
        if not 0.1 <= self.time_limit <= 600:
            raise ValueError(f"MathGrader time_limit must lie in [0.1, 600] seconds, got {self.time_limit!r}")
        if (
            not isinstance(self.max_answer_chars, int)
            or isinstance(self.max_answer_chars, bool)
            or self.max_answer_chars < 1
        ):
            raise ValueError(f"MathGrader max_answer_chars must be a positive int, got {self.max_answer_chars!r}")
        if not isinstance(self.use_math_verify, bool):
            raise ValueError(f"MathGrader use_math_verify must be True or False, got {self.use_math_verify!r}")
        if (
            not isinstance(self.significant_digits, int)
            or isinstance(self.significant_digits, bool)
            or not 1 <= self.significant_digits <= 30
        ):
            raise ValueError(
                f"MathGrader significant_digits must be an int in [1, 30], got {self.significant_digits!r}"
            )
        if self.pool is not None and not isinstance(self.pool, MathVerifyPool):
            raise ValueError(f"MathGrader pool must be a MathVerifyPool or None (shared), got {self.pool!r}")

    def _cheap_verdict(self, answer: str, ground_truth: str) -> tuple[tuple[bool, str] | None, str, str]:
        """``(verdict, answer, gold)``: the verdict ``(is_correct, path)`` when the exact, word and numeric paths
        decide (microseconds), else None with the two strings math-verify is to compare (each normalized once)."""
        (norm_answer, answer_words), (norm_gold, gold_words) = _normalize(answer), _normalize(ground_truth)
        if norm_answer and norm_answer == norm_gold:
            return (True, "exact"), answer, ground_truth
        if "words" in (answer_words, gold_words):  # math-verify would read "3 is not it" as 3
            return (False, "words"), answer, ground_truth
        if unevaluated_reason(norm_answer, norm_gold) is not None:  # \int, 1+1: the grader would do the task
            return (False, "unevaluated"), answer, ground_truth
        verdict = numeric_verdict(norm_gold, norm_answer, self.significant_digits)
        if verdict is not None:
            return (verdict, "numeric"), answer, ground_truth
        if not self.use_math_verify:
            return (False, "exact"), answer, ground_truth
        if answer_words or gold_words:  # what the words said is in the normalized forms; math-verify gets those
            answer, ground_truth = norm_answer, norm_gold
        return None, exact_scientific(answer), exact_scientific(ground_truth)

    def _math_verify(self, answer: str, gold: str) -> tuple[bool, str]:
        verdict, outcome = (self.pool or shared_pool()).verify(gold, answer, self.time_limit)
        return verdict, "math_verify" if outcome == "ok" else outcome

    def grade_answer(self, answer: str, ground_truth: str) -> tuple[bool, str]:
        """``(is_correct, path)`` for a bare answer against one reference answer."""
        verdict, answer, gold = self._cheap_verdict(answer, ground_truth)
        return verdict if verdict is not None else self._math_verify(answer, gold)

    def _extract(self, action: str) -> tuple[str | None, str | None]:
        answer, error = extract_answer(action)
        if answer is not None and len(answer) > self.max_answer_chars:
            answer, error = None, f"the answer is longer than {self.max_answer_chars} characters"
        return answer, error

    def _grade(self, task_info: dict[str, Any], action: str, cheap_only: bool) -> RewardOutput | None:
        """:meth:`__call__`'s verdict; with ``cheap_only``, None as soon as a reference needs math-verify."""
        golds = _ground_truths(task_info)
        answer, error = self._extract(action)
        metadata: dict[str, Any] = {"extracted_answer": answer, "ground_truth": golds[0], "format_error": False}
        if answer is None:
            metadata.update(format_error=True, path="format_error", error=error)
            return RewardOutput(reward=self.format_error_reward, is_correct=False, metadata=metadata)
        is_correct, path = False, "exact"
        norm_golds = [normalize_answer(gold) for gold in golds]
        if restated_reason(normalize_answer(answer), task_info.get("question"), norm_golds) is not None:
            is_correct, path, golds = False, "unevaluated", []  # "(x+1)^2" for "Expand (x+1)^2": nothing to compare
        for gold in golds:  # the first correct reference ends the search
            verdict, verify_answer, verify_gold = self._cheap_verdict(answer, gold)
            if verdict is None:
                if cheap_only:
                    return None
                verdict = self._math_verify(verify_answer, verify_gold)
            is_correct, path = verdict
            if is_correct or path == "timeout":
                break  # an answer that kept math-verify busy past time_limit is not tried against the rest

        metadata["path"] = path.partition(":")[0]
        if path.startswith("error"):
            metadata["error"] = path.partition(": ")[2]
            # The worker process died (the host's memory, a crash): the infrastructure's failure, not a wrong answer.
            metadata["infra_failed"] = infrastructure_failed(path)
        reward = self.correct_reward if is_correct else self.incorrect_reward
        return RewardOutput(reward=reward, is_correct=is_correct, metadata=metadata)

    def grade_cheaply(self, task_info: dict[str, Any], action: str) -> RewardOutput | None:
        """What :meth:`__call__` returns when the exact, word and numeric paths decide it (microseconds, never
        blocking), or None when grading ``action`` asks math-verify (a worker process, up to ``time_limit`` s)."""
        return self._grade(task_info, action, cheap_only=True)

    def needs_math_verify(self, task_info: dict[str, Any], action: str) -> bool:
        """Whether grading ``action`` would ask math-verify (a worker process, up to ``time_limit`` seconds); when
        False, :meth:`__call__` decides in microseconds on the exact, word and numeric paths, never blocking."""
        return self.grade_cheaply(task_info, action) is None

    def __call__(self, task_info: dict[str, Any], action: str) -> RewardOutput:
        graded = self._grade(task_info, action, cheap_only=False)
        assert graded is not None  # only cheap_only grading stops short
        return graded

    async def agrade(self, task_info: dict[str, Any], action: str) -> RewardOutput:
        """:meth:`__call__` off the event loop, so a slow answer never blocks other coroutines."""
        return await asyncio.to_thread(self, task_info, action)


_DEFAULT_GRADER = MathGrader()


def math_reward_fn(task_info: dict[str, Any], action: str) -> RewardOutput:
    """Grade ``action`` against ``task_info["ground_truth"]`` (or ``task_info["answer"]``): 1.0 if correct, else 0.0.

    Example::

        >>> math_reward_fn({"ground_truth": "42"}, "... so the answer is \\\\boxed{42}").is_correct
        True
    """
    return _DEFAULT_GRADER(task_info, action)
