"""The math-verify worker pool (``rllm_gym/rewards/math_pool.py``): its import paths and what counts as the
infrastructure's failure."""

from __future__ import annotations

import rllm_gym.rewards.math as math_rewards
from rllm_gym.rewards import math_pool
from rllm_gym.rewards.math import MathVerifyPool


def test_the_pool_keeps_its_import_path_from_the_math_rewards():
    assert MathVerifyPool is math_pool.MathVerifyPool
    assert math_rewards.shared_pool is math_pool.shared_pool
    assert "MathVerifyPool" in math_rewards.__all__


def test_an_exited_or_starved_worker_is_the_infrastructure_not_the_answer():
    assert math_pool.infrastructure_failed("error: the math-verify worker exited")
    assert math_pool.infrastructure_failed("error: the math-verify worker was starved: 0.01 s of CPU in 3 s")
    for answer_side in ("ok", "timeout", "error: ParseError: bad latex"):
        assert not math_pool.infrastructure_failed(answer_side)


def test_a_pool_grades_and_reuses_its_worker():
    pool = MathVerifyPool(max_workers=1)
    try:
        assert pool.verify("x^2+2x", "x(x+2)", 30) == (True, "ok")
        assert pool.verify("1/2", "0.3", 30) == (False, "ok")
        assert pool.workers_killed == 0 and len(pool._idle) == 1
    finally:
        pool.close()
