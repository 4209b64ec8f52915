"""Property tests for the math answer parser and grader on arbitrary and adversarial model replies.

Bounded for CI: a few hundred examples per property, no deadline (the machine is shared and loaded).
"""

from __future__ import annotations

from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rllm_gym.rewards.math import MathGrader, extract_answer, last_boxed, normalize_answer, parse_number
from rllm_gym.types import RewardOutput

# Replies built from the pieces that trip answer extraction: boxes, braces, think tags, answer labels, numbers.
_fragments = st.sampled_from(
    [
        "\\boxed{",
        "\\boxed",
        "\\fbox{",
        "{",
        "}",
        "\\frac{",
        "\\frac12",
        "\\sqrt{",
        "\\pi",
        "<think>",
        "</think>",
        "####",
        "The answer is ",
        "Answer: ",
        "final answer is",
        "$",
        "$$",
        "\\left(",
        "\\right)",
        "\\text{ cm}",
        "%",
        "\\%",
        "1,000",
        "-3",
        "0.5",
        "1/0",
        "\\frac{1}{0}",
        "(1, 2]",
        "x = ",
        ".",
        "\n",
        " ",
        "\x00",
        "é",
        "\U0001f600",
        "\u200b",
        "９",  # a fullwidth digit: str.isdigit but not ASCII
    ]
)
_adversarial = st.lists(_fragments | st.text(max_size=6), max_size=40).map("".join)
_replies = st.text(max_size=300) | _adversarial
_pathological = st.sampled_from(
    [
        "\\boxed{" * 5000 + "1" + "}" * 5000,  # deep nesting, balanced
        "\\boxed{" * 5000 + "1",  # deep nesting, never closed
        "}" * 10_000 + "\\boxed{2}",  # unbalanced closing braces first
        "\\boxed{1}" * 3000,  # box spam
        "\\boxed " * 3000,  # boxes without braces or content
        "{" * 20_000,
        "<think>" * 1000 + "</think>" * 999,
        "The answer is " * 2000,
        "#### " * 2000 + "7",
        "9" * 5000,  # one huge number
        "1/" + "9" * 4000,
    ]
)
_GRADER = MathGrader(use_math_verify=False, format_error_reward=-1.0, incorrect_reward=0.25)


@settings(max_examples=400, deadline=None)
@given(text=_replies)
def test_extract_answer_never_raises_and_gives_exactly_one_of_answer_or_reason(text):
    answer, why = extract_answer(text)
    assert (answer is None) != (why is None)
    if answer is not None:
        assert isinstance(answer, str)
        final = text.rpartition("</think>")[2] if "</think>" in text else text
        assert answer in final  # the answer is a piece of the final part of the reply, never invented
    else:
        assert isinstance(why, str) and why


@settings(max_examples=50, deadline=None)
@given(text=_pathological, prefix=_replies)
def test_extract_answer_survives_pathological_replies(text, prefix):
    for reply in (text, prefix + text, text + prefix):
        answer, why = extract_answer(reply)
        assert (answer is None) != (why is None)


@settings(max_examples=300, deadline=None)
@given(inner=st.text(alphabet=st.characters(blacklist_characters="{}"), max_size=40), noise=_replies)
def test_last_boxed_round_trips_a_brace_free_answer(inner, noise):
    # Whatever came before, the last balanced box wins and gives back its (stripped) content.
    assert last_boxed(f"{noise}\\boxed{{{inner}}}") == inner.strip()
    answer, why = extract_answer(f"<think>{noise}</think>So \\boxed{{{inner}}}.")
    assert (answer, why) == (inner.strip(), None)


@settings(max_examples=300, deadline=None)
@given(text=_replies)
def test_normalize_answer_drops_all_spacing_and_parse_number_is_typed(text):
    normalized = normalize_answer(text)
    assert isinstance(normalized, str)
    assert not any(char.isspace() for char in normalized)
    assert len(normalized) <= len(text)
    number = parse_number(normalized)
    if number is not None:
        value, exact, percent = number
        assert isinstance(value, Fraction) and isinstance(exact, bool) and isinstance(percent, bool)


@settings(max_examples=300, deadline=None)
@given(numerator=st.integers(-(10**6), 10**6), denominator=st.integers(1, 10**6))
def test_parse_number_round_trips_fractions_and_integers(numerator, denominator):
    assert parse_number(f"{numerator}/{denominator}")[0] == Fraction(numerator, denominator)
    assert parse_number(f"\\frac{{{numerator}}}{{{denominator}}}")[0] == Fraction(numerator, denominator)
    assert parse_number(normalize_answer(f"{numerator:,}")) == (Fraction(numerator), True, False)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reply=_replies | _pathological, gold=st.sampled_from(["42", "\\frac{1}{2}", "0.5", "2\\sqrt{7}", "(1, 2]"]))
def test_grader_returns_one_of_its_documented_rewards_on_any_reply(reply, gold):
    result = _GRADER({"ground_truth": gold}, reply)
    assert isinstance(result, RewardOutput)
    assert result.reward in (1.0, 0.25, -1.0)
    assert result.is_correct == (result.reward == 1.0)
    assert result.metadata["path"] in ("exact", "numeric", "words", "unevaluated", "format_error")
    assert result.metadata["format_error"] == (result.metadata["path"] == "format_error")
    assert result.metadata["ground_truth"] == gold
    if result.metadata["format_error"]:
        assert result.reward == -1.0 and result.metadata["error"]


@settings(max_examples=300, deadline=None)
@given(value=st.integers(-(10**9), 10**9), noise=st.text(max_size=100))
def test_grader_finds_a_boxed_integer_after_any_reasoning(value, noise):
    reply = f"<think>{noise}</think>The result is \\boxed{{{value}}}."
    assert _GRADER({"ground_truth": str(value)}, reply).is_correct
    assert not _GRADER({"ground_truth": str(value + 1)}, reply).is_correct


@settings(max_examples=25, deadline=None)
@given(reply=_adversarial)
def test_math_verify_path_never_raises_and_reports_its_path(reply):
    # The full grader (math-verify in its worker pool) on the symbolic answers random replies produce.
    grader = MathGrader(time_limit=3.0)
    result = grader({"ground_truth": "\\frac{\\pi}{3}"}, f"\\boxed{{{reply}}}")
    assert result.reward in (0.0, 1.0)
    paths = ("exact", "numeric", "words", "unevaluated", "math_verify", "timeout", "error", "format_error")
    assert result.metadata["path"] in paths
