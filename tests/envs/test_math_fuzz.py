"""Property test: rllm/Math-v0 ``step`` grades any reply (never raises) and keeps its documented info contract."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from rllm_gym.envs.math import MathEnv

_fragments = st.sampled_from(["\\boxed{", "}", "{", "<think>", "</think>", "####", "The answer is ", "42", "$", "\n"])
_replies = st.text(max_size=200) | st.lists(_fragments | st.text(max_size=6), max_size=30).map("".join)
_TASK = {"question": "What is 6 * 7?", "ground_truth": "42"}
# The paths MathEnv documents without math-verify; "unevaluated" (work for the grader, e.g. a bare "\\frac") is wrong.
_PATHS = {"exact", "numeric", "words", "unevaluated", "format_error"}


@settings(max_examples=300, deadline=None)
@given(replies=st.lists(_replies, min_size=1, max_size=3))
@example(replies=["\\frac"])  # found by CI: graded "unevaluated", a documented path
def test_step_grades_any_reply_with_a_documented_reward(replies):
    env = MathEnv(max_turns=3, reward_config={"use_math_verify": False, "format_error_reward": -0.5})
    env.reset(options={"task": _TASK})
    for turn, reply in enumerate(replies, 1):
        observation, reward, terminated, truncated, info = env.step(reply)
        assert isinstance(observation, str) and truncated is False
        assert (info["turn"], info["turns_left"]) == (turn, 3 - turn)
        assert info["grading_path"] in _PATHS and info["ground_truth"] == "42"
        assert info["format_error"] == (info["extracted_answer"] is None)
        assert reward == (-0.5 if info["format_error"] else float(info["is_correct"]))
        assert not (info["grading_path"] == "unevaluated" and info["is_correct"])
        assert terminated == (info["is_correct"] or turn == 3)
        if terminated:
            assert observation == ""
            break
        assert "attempt" in observation
