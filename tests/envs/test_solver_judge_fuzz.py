"""Property tests for the solver-judge game on adversarial replies, beyond the verdict-parser fuzz in
test_solver_judge.py: tag soup with think blocks and repeated verdicts, and whole episodes on arbitrary text."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rllm_gym.envs.solver_judge import SolverJudgeParallelEnv, read_verdict
from rllm_gym.rewards.math import MathGrader

_fragments = st.sampled_from(
    ["<verdict>", "</verdict>", "<VERDICT>", "<think>", "</think>", "1", "2", "07", " ", "\n", "٣", "-", "\\boxed{42}"]
)
_replies = st.text(max_size=120) | st.lists(_fragments | st.text(max_size=4), max_size=25).map("".join)
_TASK = {"id": "add", "question": "What is 40 + 2?", "ground_truth": "42"}


@settings(max_examples=400, deadline=None)
@given(text=_replies, n=st.integers(1, 4))
def test_read_verdict_on_tag_soup_is_in_range_and_only_reads_the_final_part(text, n):
    verdict, error = read_verdict(text, n)
    assert (verdict is None) != (error is None)
    if verdict is not None:
        assert 1 <= verdict <= n
        final = text.rpartition("</think>")[2]
        assert "<think>" not in final and "<verdict>" in final.lower()
        # The same verdict with anything wrapped in a closed think block before it is still read the same way.
        assert read_verdict(f"<think>{text}</think>{final}", n) == (verdict, None)


@settings(max_examples=150, deadline=None)
@given(solutions=st.lists(_replies, min_size=2, max_size=2), verdict=_replies)
def test_an_episode_on_arbitrary_text_never_raises_and_pays_documented_rewards(solutions, verdict):
    env = SolverJudgeParallelEnv(grader=MathGrader(use_math_verify=False), invalid_verdict_reward=-0.5)
    env.reset(options={"task": _TASK})
    _, rewards, terminations, _, infos = env.step(dict(zip(env.solvers, solutions, strict=True)))
    assert all(rewards[s] in (0.0, 1.0) and terminations[s] for s in env.solvers if s in rewards)
    _, rewards, terminations, truncations, infos = env.step({"judge_0": verdict})
    info = infos["judge_0"]
    assert terminations == {"judge_0": True} and truncations == {"judge_0": False} and env.agents == []
    assert info["invalid_verdict"] == (info["verdict"] is None)
    if info["invalid_verdict"]:
        assert rewards["judge_0"] == -0.5 and info["verdict_error"]
    else:
        assert rewards["judge_0"] == float(info["solutions_correct"][info["verdict"] - 1])
