"""An env that raises in ``reset`` or in ``step``: those episodes end with ERROR and the error recorded, are retried,
and the batch (every other episode, the episode file) goes on; on the event loop (inline envs) and in threads alike."""

from __future__ import annotations

import threading
from collections import Counter

import gymnasium as gym
import pytest

from rllm_gym.agents.math import MathAgent
from rllm_gym.engine import AgentExecutionEngine
from rllm_gym.policies.scripted import ScriptedPolicy
from rllm_gym.spaces import TextSpace
from rllm_gym.store import read_episodes
from rllm_gym.types import TerminationReason


class FaultyEnv(gym.Env):
    """A one-step text env; ``task["fail"]`` says where it raises: ``reset``, ``step`` or ``reset-once`` (only the
    first reset of that task, as a transient fault would)."""

    resets: Counter[str] = Counter()
    lock = threading.Lock()

    def __init__(self, inline: bool = False):
        self.metadata = {"rllm_gym.inline_step": inline}
        self.observation_space = TextSpace(100)
        self.action_space = TextSpace(100)
        self.task: dict = {}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.task = options["task"]
        with self.lock:
            self.resets[self.task["id"]] += 1
            first = self.resets[self.task["id"]] == 1
        if self.task.get("fail") == "reset" or (self.task.get("fail") == "reset-once" and first):
            raise ConnectionError(f"reset of {self.task['id']} lost its backend")
        return self.task["id"], {}

    def step(self, action):
        if self.task.get("fail") == "step":
            raise ZeroDivisionError(f"step of {self.task['id']} divided by zero")
        return "", 1.0, True, False, {"is_correct": True}


@pytest.mark.parametrize("inline", [False, True], ids=["thread", "inline"])
async def test_env_errors_end_only_their_episodes_with_the_error_recorded(inline, tmp_path):
    FaultyEnv.resets.clear()
    tasks = [
        {"id": "ok0"},
        {"id": "bad-reset", "fail": "reset"},
        {"id": "ok1"},
        {"id": "bad-step", "fail": "step"},
        {"id": "transient", "fail": "reset-once"},
        {"id": "ok2"},
    ]
    out = tmp_path / "episodes.jsonl"
    engine = AgentExecutionEngine(
        env_id=FaultyEnv,
        env_args={"inline": inline},
        agent_cls=MathAgent,
        policy=ScriptedPolicy(["42"], cycle=True),
        n_parallel=3,
        retry_limit=3,
        out=out,
    )
    episodes = await engine.run(tasks, n_rollouts=2)
    by_id = {episode.id: episode for episode in episodes}
    assert len(by_id) == 12

    for rollout in (0, 1):
        reset_failed = by_id[f"bad-reset:{rollout}"]
        assert reset_failed.termination_reason is TerminationReason.ERROR and not reset_failed.is_correct
        assert reset_failed.metadata["attempts"] == 3
        error = reset_failed.metadata["error"]
        assert (error["type"], error["message"]) == ("ConnectionError", "reset of bad-reset lost its backend")
        assert "in reset" in error["traceback"]
        assert reset_failed.trajectories[0].steps == []

        step_failed = by_id[f"bad-step:{rollout}"]
        assert step_failed.termination_reason is TerminationReason.ERROR
        assert step_failed.metadata["attempts"] == 3
        error = step_failed.metadata["error"]
        assert (error["type"], error["message"]) == ("ZeroDivisionError", "step of bad-step divided by zero")
        assert "in step" in error["traceback"]
        (step,) = step_failed.trajectories[0].steps  # the model's reply before the env failed is kept
        assert step.model_response == "42"

    # Only the first reset of "transient" failed: that episode was retried once and is a normal episode.
    transient = by_id["transient:0"]
    assert transient.termination_reason is TerminationReason.ENV_DONE and transient.is_correct
    assert transient.metadata["attempts"] == 2 and "error" not in transient.metadata
    assert by_id["transient:1"].metadata["attempts"] == 1

    for uid in ("ok0:0", "ok0:1", "ok1:0", "ok1:1", "ok2:0", "ok2:1"):
        episode = by_id[uid]
        assert episode.termination_reason is TerminationReason.ENV_DONE and episode.is_correct
        assert episode.metadata["attempts"] == 1 and episode.trajectories[0].reward == 1.0
    assert FaultyEnv.resets == Counter({"bad-reset": 6, "bad-step": 6, "transient": 3, "ok0": 2, "ok1": 2, "ok2": 2})

    stored = [episode.id for episode in read_episodes(out)]
    assert sorted(stored) == sorted(by_id)
    # A rerun resumes from the file: nothing is redone, not even the failed episodes.
    again = await engine.run(tasks, n_rollouts=2)
    assert [episode.id for episode in again] == [episode.id for episode in episodes]
    assert sum(FaultyEnv.resets.values()) == 21
