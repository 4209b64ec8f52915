"""Answers that ask the math grader to do the task pay nothing; the correct values beside them still pay 1.0.

Every attack below was paid 1.0 before ``rllm_gym.rewards._math_forms``: math-verify evaluates integrals, sums,
limits, derivatives and arithmetic, so restating the question was as good as answering it.
"""

from __future__ import annotations

import pytest

import rllm_gym
from rllm_gym.rewards._math_forms import restated_reason, unevaluated_reason
from rllm_gym.rewards.math import MathGrader, normalize_answer

GRADER = MathGrader(time_limit=10)

ATTACKS = [
    # calculus and big operators: sympy computes them
    ("2", r"\int_0^2 1\,dx"),
    ("2", r"\int_{0}^{1} 2 dx"),
    ("x^2", r"\int 2x\,dx"),
    ("2", r"\sum_{i=1}^{2} 1"),
    ("2", r"\prod_{i=1}^{2} i"),
    ("2", r"\lim_{x\to 2} x"),
    ("2", r"\lim_{n\to\infty} 2"),
    ("2x", r"\frac{d}{dx} x^2"),
    ("2x", r"\dfrac{d}{dx}\left(x^2\right)"),
    # arithmetic left undone against a plain number
    ("2", "1+1"),
    ("42", "17 + 25"),
    ("8", "2^3"),
    ("1024", "2^{10}"),
    ("12", r"3 \cdot 4"),
    ("8", "16/2"),
    ("3", r"\dfrac{6}{2}"),
    ("6", "3!"),
    ("2", r"\binom{2}{1}"),
    ("2", r"\log_2 4"),
    ("2", r"\max(1,2)"),
    ("2", r"\gcd(4,6)"),
    ("2", r"\lceil 1.5 \rceil"),
    ("2", r"\operatorname{lcm}(1,2)"),
    ("10", r"20\% \cdot 50"),
    ("\\frac{5}{6}", r"\frac{1}{2}+\frac{1}{3}"),
    ("3", "(11-2)/3"),
    ("\\frac{1}{2}", r"\sin(\pi/6)"),
    ("3.5", "3+0.5"),
]


@pytest.mark.parametrize(("gold", "answer"), ATTACKS)
def test_an_answer_that_is_work_for_the_grader_pays_nothing(gold: str, answer: str) -> None:
    graded = GRADER({"ground_truth": gold}, f"The answer is \\boxed{{{answer}}}.")
    assert (graded.reward, graded.is_correct, graded.metadata["path"]) == (0.0, False, "unevaluated")


CONTROLS = [
    ("2", "2", "exact"),
    ("42", "x = 42", "exact"),
    ("-3", "(-3)", "math_verify"),
    ("1000", "1,000", "numeric"),
    ("1000", "10^3", "numeric"),
    ("1000", r"1 \times 10^{3}", "numeric"),
    ("0.5", r"\frac12", "numeric"),
    ("0.5", r"\frac{2}{4}", "numeric"),
    ("50\\%", r"\frac{1}{2}", "numeric"),
    ("1.5", r"1\frac{1}{2}", "math_verify"),
    ("9", r"9\text{ cm}^2", "math_verify"),
    ("5", r"\{5\}", "math_verify"),
    ("1.41421356", r"\sqrt{2}", "numeric"),
    ("0.693147", r"\ln 2", "math_verify"),
    ("\\sqrt{2}", r"\frac{2}{\sqrt{2}}", "math_verify"),
    ("x^2", r"x \cdot x", "math_verify"),
    ("\\frac{1+\\sqrt{5}}{2}", r"\frac{1}{2}+\frac{\sqrt{5}}{2}", "math_verify"),
    ("\\frac{10}{5}", "10/5", "numeric"),  # the reference is written as a fraction itself
    ("\\int_0^1 x dx", r"\int_0^1 x\,dx", "exact"),  # the reference is an integral itself
    ("\\sum_{k=1}^{n} k", r"\sum_{k=1}^{n}k", "exact"),
]


@pytest.mark.parametrize(("gold", "answer", "path"), CONTROLS)
def test_values_in_every_usual_form_still_pay(gold: str, answer: str, path: str) -> None:
    graded = GRADER({"ground_truth": gold}, f"The answer is \\boxed{{{answer}}}.")
    assert (graded.reward, graded.metadata["path"]) == (1.0, path)


@pytest.mark.parametrize(
    ("question", "gold", "answer"),
    [
        ("Expand $(x+1)^2$.", "x^2+2x+1", "(x+1)^2"),
        ("Expand $(x + 1)^{2}$.", "x^2+2x+1", r"1\cdot\left((x+1)^{2}\right)+0"),  # trivially wrapped
        ("Simplify $\\dfrac{x^2-1}{x-1}$.", "x+1", r"\frac{x^2-1}{x-1}"),
        ("Factor $x^2 - 1$.", "(x-1)(x+1)", "x^2-1"),
    ],
)
def test_an_expression_copied_from_the_question_pays_nothing(question: str, gold: str, answer: str) -> None:
    task = {"question": question, "ground_truth": gold}
    graded = GRADER(task, f"\\boxed{{{answer}}}")
    assert (graded.reward, graded.metadata["path"]) == (0.0, "unevaluated")
    assert restated_reason(normalize_answer(answer), question, [gold]) is not None


def test_a_question_may_quote_the_answer_it_asks_for() -> None:
    question = "Which is larger: $2^{10}$ or $10^3$? Or is it 12?"
    assert GRADER({"question": question, "ground_truth": "2^{10}"}, "\\boxed{2^{10}}").reward == 1.0
    assert GRADER({"question": question, "ground_truth": "12"}, "\\boxed{12}").reward == 1.0
    assert restated_reason("12", question, ["13"]) is None  # a bare number is no copied expression


def test_a_tower_against_a_number_is_refused_before_math_verify() -> None:
    grader = MathGrader(time_limit=10)
    assert grader.needs_math_verify({"ground_truth": "9"}, "\\boxed{9^{9^{9^{9}}}}") is False
    assert grader({"ground_truth": "9"}, "\\boxed{10^{10^{10}}}").metadata["path"] == "unevaluated"


def test_unevaluated_reason_names_what_the_answer_asks() -> None:
    assert "integral" in unevaluated_reason(r"\int_0^2x\,dx", "2")
    assert "derivative" in unevaluated_reason(r"\frac{d}{dx}x^2", "2x")
    assert "plain number" in unevaluated_reason("1+1", "2")
    assert unevaluated_reason(r"\frac{d}{2}", r"\frac{d}{3}") is None  # d is a length here, not a differential


def test_math_env_pays_nothing_for_the_question_restated() -> None:
    env = rllm_gym.make("rllm/Math-v0")
    task = {"question": "What is 17 + 25?", "ground_truth": "42"}
    env.reset(options={"task": task})
    _, reward, terminated, _, info = env.step("\\boxed{17+25}")
    assert (reward, terminated, info["grading_path"], info["infra_failed"]) == (0.0, True, "unevaluated", False)
    env.reset(options={"task": task})
    assert env.step("\\boxed{42}")[1] == 1.0
