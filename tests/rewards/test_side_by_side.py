"""Tests for rllm_gym/rewards/side_by_side.py: every reply graded at once, within one budget."""

from __future__ import annotations

import threading

from rllm_gym.rewards.math import MathGrader
from rllm_gym.rewards.side_by_side import grade_side_by_side
from rllm_gym.types import RewardOutput


def test_replies_are_graded_at_once_and_failures_are_the_infrastructures():
    barrier = threading.Barrier(3, timeout=20)  # breaks unless the three grades run at the same time
    release = threading.Event()

    def grader(task, reply):
        barrier.wait()
        if reply == "stall":
            release.wait(30)
        if reply == "crash":
            raise OSError("scorer unreachable")
        if reply == "odd":
            return 1.0
        return RewardOutput(reward=float(reply == task["answer"]), is_correct=reply == task["answer"])

    try:
        grades = grade_side_by_side(grader, {"answer": "4"}, {"a": "4", "b": "stall", "c": "crash"}, 1.0)
    finally:
        release.set()
    assert grades["a"].reward == 1.0 and not grades["a"].metadata.get("infra_failed")
    assert grades["b"].metadata == {"error": "the grader did not finish within 1 s", "infra_failed": True}
    assert grades["c"].metadata["error"] == "the grader crashed: OSError: scorer unreachable"
    assert grades["b"].reward == grades["c"].reward == 0.0 and grades["c"].is_correct is None
    (odd,) = grade_side_by_side(lambda task, reply: 1.0, {}, {"x": "odd"}, 5.0).values()
    assert odd.metadata["error"] == "the grader returned float, not a RewardOutput"


def test_a_non_finite_reward_is_an_infrastructure_failure_never_passed_on():
    grades = grade_side_by_side(
        lambda task, reply: RewardOutput(reward=float(reply), is_correct=True), {}, {"n": "nan", "i": "inf"}, 5.0
    )
    assert grades["n"].metadata == {"error": "the grader returned a non-finite reward nan", "infra_failed": True}
    assert grades["i"].metadata["error"] == "the grader returned a non-finite reward inf"
    assert grades["n"].reward == grades["i"].reward == 0.0 and grades["n"].is_correct is None


def test_the_math_grader_side_by_side():
    grades = grade_side_by_side(MathGrader(), {"ground_truth": "42"}, {"r": "\\boxed{42}", "w": "\\boxed{41}"}, 20.0)
    assert (grades["r"].is_correct, grades["w"].is_correct) == (True, False)
