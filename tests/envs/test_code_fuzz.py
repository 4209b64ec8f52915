"""Property test: rllm/Code-v0 ``step`` grades any reply, including replies whose fenced code misbehaves."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rllm_gym.envs.code import CodeEnv

_TASK = {"id": "echo", "prompt": "Print the input back.", "tests": [{"input": "5\n", "output": "5\n"}]}
_programs = st.sampled_from(
    ["print(input())", "print(", "raise SystemExit(3)", "import sys; sys.stdout.write('x' * 10)", "while True: pass"]
)
_replies = (
    st.text(max_size=200)
    | st.lists(st.sampled_from(["```", "```python\n", "\n", "print(1)", "`"]) | st.text(max_size=6), max_size=20).map(
        "".join
    )
    | _programs.map(lambda code: f"Here:\n```python\n{code}\n```")
)


@settings(max_examples=60, deadline=None)
@given(replies=st.lists(_replies, min_size=1, max_size=2))
def test_step_grades_any_reply_and_ends_on_a_pass_or_after_the_revisions(replies):
    env = CodeEnv(tasks=[_TASK], max_revisions=1, timeout=0.5)
    env.reset(options={"task": _TASK})
    for attempt, reply in enumerate(replies, 1):
        observation, reward, terminated, truncated, info = env.step(reply)
        assert isinstance(observation, str) and observation and truncated is False
        assert info["attempt"] == attempt and info["total"] in (0, 1)
        assert reward in (0.0, 1.0) and reward == float(bool(info["is_correct"]))
        if "```" not in reply:
            assert info["is_correct"] is False and info["graded"] is True
        if terminated:
            assert info["is_correct"] or attempt == 2 or not info["graded"]
            break
