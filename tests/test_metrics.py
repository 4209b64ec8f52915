import re
from math import comb

import pytest

from rllm_gym.metrics import pass_at_k, pass_hat_k, summarize
from rllm_gym.types import Episode, TerminationReason, Trajectory


def test_pass_at_k_matches_the_definition():
    # 1 - C(n-c, k) / C(n, k) computed by hand for n=5, c=2, k=2: 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 4, 2) == 1.0  # fewer than k wrong samples: some draw must hold a right one
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    for n, c, k in [(10, 3, 4), (8, 5, 2)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_pass_hat_k():
    assert pass_hat_k(4, 2, 2) == pytest.approx(1 / 6)
    assert pass_hat_k(4, 4, 4) == 1.0
    assert pass_hat_k(4, 3, 4) == 0.0
    with pytest.raises(ValueError, match=re.escape("need 0 <= c <= n and 1 <= k <= n, got n=2, c=3, k=1")):
        pass_hat_k(2, 3, 1)


def test_summarize():
    def episode(task, idx, correct, reason=TerminationReason.ENV_DONE):
        return Episode(
            id=f"{task}:{idx}",
            is_correct=correct,
            termination_reason=reason,
            trajectories=[Trajectory(reward=float(correct))],
            metrics={"turns": 2.0},
        )

    episodes = [
        episode("a", 0, True),
        episode("a", 1, False),
        episode("b", 0, False),
        episode("b", 1, False, TerminationReason.TIMEOUT),
    ]
    summary = summarize(episodes)
    assert summary["tasks"] == 2 and summary["n"] == 2
    assert summary["pass@1"] == pytest.approx(0.25)
    assert summary["pass@2"] == pytest.approx(0.5)
    assert summary["pass^2"] == 0.0
    assert summary["mean_reward"] == pytest.approx(0.25)
    assert summary["mean_turns"] == 2.0
    assert summary["termination_reasons"] == {"env_done": 3, "timeout": 1}
    assert summarize([]) == {"episodes": 0, "tasks": 0}
