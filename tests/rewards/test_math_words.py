"""Words after a number in a math answer (issue 29): units are dropped, scale words applied, any other words make the
answer not that number; and on real answers (reasoning-gym's numeric data sets) no correct answer is lost."""

from __future__ import annotations

import pytest

from rllm_gym.rewards.math import MathGrader, normalize_answer


@pytest.fixture(scope="module")
def grader():
    return MathGrader()


@pytest.mark.parametrize(
    ("gold", "reply", "correct"),
    [
        # other words change the meaning: not equal, whatever math-verify would make of them
        ("3", "\\boxed{3 \\text{ is not it}}", False),
        ("3", "\\boxed{3\\text{ or more}}", False),
        ("3", "The answer is 3 or 4.", False),
        ("5", "\\boxed{5 \\text{ is wrong}}", False),
        ("5", "\\boxed{5 \\text{ at least}}", False),
        ("5", "The answer is 5 but I am not sure.", False),
        ("12", "\\boxed{12 \\text{ plus } x}", False),
        ("0", "\\boxed{0 \\text{ is impossible}}", False),
        # scale words are applied
        ("10000000", "\\boxed{10 \\text{ million}}", True),
        ("10", "\\boxed{10 \\text{ million}}", False),
        ("7000", "The answer is 7 thousand", True),
        ("7", "The answer is 7 thousand", False),
        ("2500000", "\\boxed{2.5 \\text{ million dollars}}", True),
        ("1,200", "\\boxed{12 \\text{ hundred}}", True),
        ("3000000000", "The answer is 3 billion.", True),
        ("7200", "The answer is 7 thousand", False),  # a scale word does not round
        ("10 \\text{ million}", "\\boxed{10000000}", True),
        ("1200000", "\\boxed{\\$1.2 \\text{ million}}", True),
        ("24", "The answer is 2 dozen.", True),
        ("2", "The answer is 2 dozen.", False),
        ("18", "\\boxed{1.5 \\text{ dozen eggs}}", True),
        # units are dropped, as before
        ("10", "\\boxed{10 \\text{ cm}}", True),
        ("10", "\\boxed{10\\text{ cm}}", True),
        ("18", "The answer is 18 dollars.", True),
        ("5", "The answer is 5 apples each.", True),
        ("60", "\\boxed{60 \\text{ miles per hour}}", True),
        ("12", "\\boxed{12 \\text{ square units}}", True),
        ("12", "\\boxed{13 \\text{ square units}}", False),
        ("\\frac{1}{2}", "\\boxed{\\frac{1}{2} \\text{ cup}}", True),
        # percent stays as it was: 50% is 50 or 0.5
        ("50", "\\boxed{50\\%}", True),
        ("0.5", "\\boxed{50\\%}", True),
        ("0.5", "The answer is 50 percent.", True),
        ("50", "\\boxed{50 \\text{ percent}}", True),
        ("0.4", "\\boxed{50\\%}", False),
        # expressions are not words
        ("2\\pi", "\\boxed{2\\pi}", True),
        ("3x", "\\boxed{3x}", True),
    ],
)
def test_trailing_words_count(grader, gold, reply, correct):
    result = grader({"ground_truth": gold}, reply)
    assert result.is_correct is correct, (gold, reply, result.metadata)


def test_meaning_words_are_kept_in_the_normalized_form():
    assert normalize_answer("3 \\text{ is not it}") != normalize_answer("3")
    assert normalize_answer("10 \\text{ million}") == "10e6"
    assert normalize_answer("10\\text{ cm}") == "10"
    assert normalize_answer("50 percent") == "50%"


# reasoning-gym data sets whose answers are numbers (integers, decimals, fractions)
NUMERIC_DATASETS = [
    "basic_arithmetic",
    "chain_sum",
    "coin_flip",
    "count_bits",
    "decimal_arithmetic",
    "decimal_chain_sum",
    "dice",
    "gcd",
    "gsm_symbolic",
    "lcm",
    "leg_counting",
    "number_sequence",
    "products",
    "simple_equations",
    "simple_geometry",
]
FORMS = {
    "boxed": "So the result follows. \\boxed{{{answer}}}",
    "answer_is": "Working through it step by step.\nThe answer is {answer}.",
    "boxed_unit": "\\boxed{{{answer} \\text{{ units}}}}",
    "hashes": "#### {answer}",
}


def test_no_correct_reasoning_gym_answer_is_lost(grader):
    """The true answer of 25 items from each numeric data set, in each of the forms, grades correct: the false
    negatives trailing words could cause are measured on real answers, and there are none."""
    reasoning_gym = pytest.importorskip("reasoning_gym")
    misses, graded = [], 0
    for name in NUMERIC_DATASETS:
        for item in reasoning_gym.create_dataset(name, size=25, seed=29):
            answer = str(item["answer"]).strip()
            for form, template in FORMS.items():
                result = grader({"ground_truth": answer}, template.format(answer=answer))
                graded += 1
                if not result.is_correct:
                    misses.append((name, form, answer, result.metadata.get("path")))
    assert graded == len(NUMERIC_DATASETS) * 25 * len(FORMS)
    assert misses == [], misses
