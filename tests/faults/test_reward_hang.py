"""A reward function that hangs must not hang the run.

The math grader has its own hard time limit (worker processes that are killed, tests/rewards/test_math.py); a user
:class:`~rllm_gym.rewards.RewardFunction` in :class:`~rllm_gym.envs.base.SingleTurnEnv` has none, so the engine's
``timeout_s`` is what ends such an episode: with TIMEOUT, without touching the other episodes, and without keeping
the process alive afterwards.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from rllm_gym.agents.math import MathAgent
from rllm_gym.engine import AgentExecutionEngine
from rllm_gym.envs.base import SingleTurnEnv
from rllm_gym.policies.scripted import ScriptedPolicy
from rllm_gym.types import RewardOutput, TerminationReason

TIMEOUT_S = 0.5


@pytest.fixture
def release():
    """Set at teardown, so the threads stuck in the hanging reward function end with the test."""
    event = threading.Event()
    yield event
    event.set()


def hanging_engine(release: threading.Event, **kwargs) -> AgentExecutionEngine:
    def reward(task: dict, action: str) -> RewardOutput:
        if task["id"].startswith("hang"):
            release.wait()
        return RewardOutput(reward=1.0, is_correct=True)

    return AgentExecutionEngine(
        env_id=SingleTurnEnv,
        env_args={"reward_fn": reward},
        agent_cls=MathAgent,
        policy=ScriptedPolicy(["42"], cycle=True),
        timeout_s=TIMEOUT_S,
        **kwargs,
    )


@pytest.mark.parametrize("n_parallel", [1, 3])
async def test_a_hanging_reward_function_times_out_only_its_episodes(release, n_parallel):
    # With one worker the hung episode comes first: the next ones must get a fresh env, not the one still grading.
    ids = ["hang0", "ok0", "ok1", "hang1", "ok2"]
    engine = hanging_engine(release, n_parallel=n_parallel)
    start = time.monotonic()
    episodes = await engine.run([{"id": i, "question": f"question {i}"} for i in ids])
    elapsed = time.monotonic() - start
    assert [e.id for e in episodes] == [f"{i}:0" for i in ids]
    for episode in episodes:
        if episode.id.startswith("hang"):
            assert episode.termination_reason is TerminationReason.TIMEOUT and not episode.is_correct
            # A timeout is an outcome, not an error: it is neither retried nor given an error record.
            assert episode.metadata["attempts"] == 1 and "error" not in episode.metadata
            # The model's reply was recorded before grading hung.
            assert [s.model_response for s in episode.trajectories[0].steps] == ["42"]
        else:
            assert episode.termination_reason is TerminationReason.ENV_DONE and episode.is_correct
    hung_serially = 2 if n_parallel == 1 else 1
    assert elapsed < hung_serially * TIMEOUT_S + 2.0


def test_the_process_exits_although_the_reward_function_never_returns(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(
        textwrap.dedent(
            """
            import asyncio, threading
            from rllm_gym.agents.math import MathAgent
            from rllm_gym.engine import AgentExecutionEngine
            from rllm_gym.envs.base import SingleTurnEnv
            from rllm_gym.policies.scripted import ScriptedPolicy

            def reward(task, action):
                threading.Event().wait()  # never returns

            engine = AgentExecutionEngine(env_id=SingleTurnEnv, env_args={"reward_fn": reward}, agent_cls=MathAgent,
                                          policy=ScriptedPolicy(["42"], cycle=True), timeout_s=0.3)
            (episode,) = asyncio.run(engine.run([{"id": "hang", "question": "q"}]))
            print(episode.termination_reason.value, flush=True)
            """
        )
    )
    try:
        result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"the process did not exit after its run ended: {error.stdout!r}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "timeout"
