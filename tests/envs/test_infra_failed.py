"""Real infrastructure faults, forced from here, end as ``info["infra_failed"]``, never as a plain 0.0 row.

Every fault is real: the sandbox's zygote process is SIGKILLed while runs need it, a math-verify worker is stopped
(SIGSTOP: the host does not run it, as on an overloaded machine) or killed mid-answer. The controls beside them
check that the same replies still earn 1.0 once the infrastructure is back, and that an answer which keeps a running
worker busy is still the model's own timeout. (OpenEnv's unreachable and killed servers: tests/envs/test_openenv.py.)
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

import rllm_gym
from rllm_gym.envs import solver_judge
from rllm_gym.envs.code import CodeEnv, builtin_code_tasks
from rllm_gym.envs.math import MathEnv
from rllm_gym.rewards.math import MathGrader, MathVerifyPool

SYMBOLIC = {"id": "sq", "question": "Write x squared.", "ground_truth": "x^2", "answer": "x^2"}  # needs math-verify
TOWER = "\\boxed{x+9^{9^{9^{9}}}}"  # keeps a math-verify worker computing against the reference x+9


def _children(marker: bytes) -> list[int]:
    """This process's child processes whose command line holds ``marker``, read from /proc as `ps` would."""
    pids = []
    for children in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        for pid in children.read_text().split():
            try:
                if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                    pids.append(int(pid))
            except OSError:  # gone meanwhile
                continue
    return pids


@contextmanager
def zygotes_killed() -> Iterator[None]:
    """Every sandbox zygote of this process is SIGKILLed as soon as it appears, until the block ends."""
    stop = threading.Event()

    def kill() -> None:
        while not stop.is_set():
            for pid in _children(b"_zygote.py"):
                with suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    killer = threading.Thread(target=kill)
    killer.start()
    try:
        yield
    finally:
        stop.set()
        killer.join()


def _warm_worker(pool: MathVerifyPool) -> int:
    """Start ``pool``'s one worker with a real grade; its pid."""
    before = set(_children(b"_math_worker.py"))
    assert MathGrader(pool=pool)(SYMBOLIC, "\\boxed{x \\cdot x}").reward == 1.0
    (pid,) = set(_children(b"_math_worker.py")) - before
    return pid


def _fence(code: str) -> str:
    return f"```python\n{code}```"


def test_code_env_zygote_killed_during_the_tests_is_infra_failed() -> None:
    tasks = builtin_code_tasks()
    for task in (next(t for t in tasks if t.get("fn_name")), next(t for t in tasks if not t.get("fn_name"))):
        env = CodeEnv(tasks=[task])
        env.reset(options={"task": task})
        with zygotes_killed():
            _, reward, terminated, _, info = env.step(_fence(task["reference_solution"]))
        assert (reward, terminated, info["infra_failed"], info["graded"]) == (0.0, True, True, False)
        env.reset(options={"task": task})
        _, reward, _, _, info = env.step(_fence(task["reference_solution"]))
        assert (reward, info["infra_failed"]) == (1.0, False)


@pytest.mark.slow  # two starts of the scoring zygote, which imports reasoning-gym: a minute each on a loaded host
def test_reasoning_gym_scoring_zygote_killed_is_infra_failed() -> None:
    env = rllm_gym.make("rllm/ReasoningGym-v0", dataset="puzzle24")
    _, info = env.reset(seed=0)
    right = f"\\boxed{{{info['task']['ground_truth']}}}"
    with zygotes_killed():
        _, reward, _, _, info = env.step(right)
    assert (reward, info["infra_failed"], info["grading_path"]) == (0.0, True, "sandbox_error")
    env.reset(seed=0)
    _, reward, _, _, info = env.step(right)
    assert (reward, info["infra_failed"]) == (1.0, False)


def test_tool_env_python_tool_with_its_zygote_killed_is_infra_failed() -> None:
    env = rllm_gym.make("rllm/Tool-v0")
    env.reset(options={"task": {"question": "What is 6 * 7?", "ground_truth": "42"}})
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'
    with zygotes_killed():
        _, reward, terminated, _, info = env.step(call)
    assert (reward, terminated, info["infra_failed"]) == (0.0, False, True)
    observation, _, _, _, info = env.step(call)
    assert "42" in observation and info["infra_failed"] is False


def test_math_env_stopped_worker_is_infra_failed_not_a_timeout() -> None:
    pool = MathVerifyPool(max_workers=1)
    try:
        os.kill(_warm_worker(pool), signal.SIGSTOP)  # the host does not run it: no CPU time at all
        env = MathEnv(reward_config={"time_limit": 0.5, "pool": pool})
        env.reset(options={"task": SYMBOLIC})
        start = time.monotonic()
        _, reward, _, _, info = env.step("\\boxed{x \\cdot x}")
        assert (reward, info["infra_failed"], info["grading_path"]) == (0.0, True, "error")
        assert time.monotonic() - start < 3 * 0.5 + 2  # the documented bound: three time limits
        env.reset(options={"task": SYMBOLIC})
        assert env.step("\\boxed{x \\cdot x}")[1] == 1.0  # a fresh worker grades it
    finally:
        pool.close()


def test_math_worker_killed_mid_answer_is_infra_failed() -> None:
    pool = MathVerifyPool(max_workers=1)
    try:
        threading.Timer(0.5, os.kill, (_warm_worker(pool), signal.SIGKILL)).start()
        graded = MathGrader(time_limit=30, pool=pool)({"ground_truth": "x+9"}, TOWER)
        assert (graded.is_correct, graded.metadata["infra_failed"]) == (False, True)
        assert "exited" in graded.metadata["error"]
    finally:
        pool.close()


def test_an_answer_keeping_a_running_worker_busy_is_the_models_timeout() -> None:
    pool = MathVerifyPool(max_workers=1)
    try:
        _warm_worker(pool)
        graded = MathGrader(time_limit=1.0, pool=pool)({"ground_truth": "x+9"}, TOWER)
        assert graded.metadata["path"] == "timeout" and not graded.metadata.get("infra_failed")
    finally:
        pool.close()


def test_tool_env_final_answer_graded_by_a_stopped_worker_is_infra_failed() -> None:
    pool = MathVerifyPool(max_workers=1)
    try:
        os.kill(_warm_worker(pool), signal.SIGSTOP)
        env = rllm_gym.make("rllm/Tool-v0", reward_fn=MathGrader(time_limit=0.5, pool=pool))
        env.reset(options={"task": SYMBOLIC})
        _, reward, terminated, _, info = env.step("The answer is \\boxed{x \\cdot x}.")
        assert (reward, terminated, info["infra_failed"]) == (0.0, True, True)
    finally:
        pool.close()


def test_solver_judge_grader_on_a_stopped_worker_is_infra_failed() -> None:
    pool = MathVerifyPool(max_workers=1)
    try:
        os.kill(_warm_worker(pool), signal.SIGSTOP)
        grader = MathGrader(time_limit=0.5, pool=pool)
        env = solver_judge.parallel_env(tasks=[SYMBOLIC], grader=grader, n_solvers=1)
        env.reset(seed=0)
        _, rewards, _, _, infos = env.step({"solver_0": "\\boxed{x \\cdot x}"})
        assert (rewards["solver_0"], infos["solver_0"]["infra_failed"]) == (0.0, True)
        env.reset(seed=0)
        _, rewards, _, _, infos = env.step({"solver_0": "\\boxed{x \\cdot x}"})
        assert (rewards["solver_0"], infos["solver_0"]["infra_failed"]) == (1.0, False)
    finally:
        pool.close()
