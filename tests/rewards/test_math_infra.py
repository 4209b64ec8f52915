"""Real faults of the math-verify workers are the infrastructure's failures, never a wrong answer of the model's.

The workers are real processes, stopped or killed from here: a worker the host does not run (stopped, or starved on
a loaded machine) or one that dies mid-answer gives ``infra_failed``; an answer that keeps a running worker busy past
the limit stays the model's ``timeout``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import rllm_gym
from rllm_gym.envs.math import MathEnv
from rllm_gym.rewards.math import MathGrader, MathVerifyPool

SYMBOLIC = {"question": "Write x squared.", "ground_truth": "x^2"}  # graded by math-verify, not the cheap paths


def _workers() -> list[int]:
    """This process's math-verify worker processes, found the way `ps` would: children running _math_worker.py."""
    pids = []
    for children in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        for pid in children.read_text().split():
            try:
                if b"_math_worker.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    pids.append(int(pid))
            except OSError:
                continue
    return pids


def _warm(pool: MathVerifyPool) -> int:
    before = set(_workers())
    assert MathGrader(pool=pool)(SYMBOLIC, "\\boxed{x \\cdot x}").reward == 1.0
    (pid,) = set(_workers()) - before
    return pid


def test_a_stopped_worker_is_an_infrastructure_failure_not_a_timeout() -> None:
    pool = MathVerifyPool(max_workers=1)
    try:
        os.kill(_warm(pool), signal.SIGSTOP)  # the host does not run it: no CPU time at all
        env = MathEnv(reward_config={"time_limit": 0.5, "pool": pool})
        env.reset(options={"task": SYMBOLIC})
        _, reward, _, _, info = env.step("\\boxed{x \\cdot x}")
        assert (reward, info["infra_failed"], info["grading_path"]) == (0.0, True, "error")
        assert env.reward_fn(SYMBOLIC, "\\boxed{x \\cdot x}").reward == 1.0  # a fresh worker grades it right
    finally:
        pool.close()


def test_a_worker_killed_mid_answer_is_an_infrastructure_failure() -> None:
    pool = MathVerifyPool(max_workers=1)
    try:
        pid = _warm(pool)
        threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
        grader = MathGrader(time_limit=30, pool=pool)
        graded = grader({"ground_truth": "x+9"}, "\\boxed{x+9^{9^{9^{9}}}}")  # keeps the worker busy for long
        assert (graded.is_correct, graded.metadata["infra_failed"]) == (False, True)
        assert "exited" in graded.metadata["error"]
    finally:
        pool.close()


def test_an_answer_that_keeps_a_running_worker_busy_is_the_models_timeout() -> None:
    pool = MathVerifyPool(max_workers=1)
    try:
        _warm(pool)
        start = time.monotonic()
        graded = MathGrader(time_limit=1.0, pool=pool)({"ground_truth": "x+9"}, "\\boxed{x+9^{9^{9^{9}}}}")
        assert graded.metadata["path"] == "timeout" and not graded.metadata.get("infra_failed")
        assert time.monotonic() - start < 3 * 1.0 + 2  # the documented bound: three time limits at most
    finally:
        pool.close()


def test_tool_env_final_answer_graded_by_a_dead_worker_is_infra_failed() -> None:
    pool = MathVerifyPool(max_workers=1)
    try:
        os.kill(_warm(pool), signal.SIGSTOP)
        env = rllm_gym.make("rllm/Tool-v0", reward_fn=MathGrader(time_limit=0.5, pool=pool))
        env.reset(options={"task": SYMBOLIC})
        _, reward, terminated, _, info = env.step("The answer is \\boxed{x \\cdot x}.")
        assert (reward, terminated, info["infra_failed"]) == (0.0, True, True)
    finally:
        pool.close()
