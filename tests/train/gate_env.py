"""A one-step env whose grading waits at a gate (tests/train/test_async_worker.py): shows from outside the worker
process which env calls have started, and holds them until the test opens the gate.

A task is ``{"id": name, "question": ..., "folder": path}`` (:func:`gate_task`). Its grading writes the file
``folder/name`` holding the seed its env was reset with, then waits until ``folder/OPEN`` exists (at most 120 s):
reward 1.0 once the gate opened, 0.0 if it never did. The generation worker is a spawned process: it imports this
module when it loads :class:`GateAgent` (named ``gate_env:GateAgent``, with this folder on ``sys.path``), which
registers :data:`ENV_ID` there too.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

from rllm_gym.agent import BaseAgent
from rllm_gym.envs.base import SingleTurnEnv
from rllm_gym.types import RewardOutput

ENV_ID = "test/Gate-v0"
AGENT = "gate_env:GateAgent"
OPEN = "OPEN"


def gate_task(folder: Path, name: str) -> dict[str, str]:
    """A task graded at the gate of ``folder``, its started file named ``name`` (also the episode's task id)."""
    return {"id": name, "question": "Wait at the gate.", "folder": str(folder)}


def started(folder: Path, names: list[str]) -> bool:
    """Whether the grading of every task named in ``names`` has started."""
    return all((folder / name).exists() for name in names)


class GateEnv(SingleTurnEnv):
    """One question per task; graded at its folder's gate (see the module's docstring)."""

    def __init__(self, render_mode: str | None = None):
        super().__init__(self._at_gate, tasks=None, render_mode=render_mode)
        self._seed: int | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._seed = seed
        return super().reset(seed=seed, options=options)

    def _at_gate(self, task: dict, action: str) -> RewardOutput:
        folder = Path(task["folder"])
        partial = folder / f".{task['id']}.{os.getpid()}"
        partial.write_text(str(self._seed))
        partial.replace(folder / task["id"])  # whole, for a reader in another process
        deadline = time.monotonic() + 120.0
        while not (folder / OPEN).exists():
            if time.monotonic() > deadline:
                return RewardOutput(reward=0.0, is_correct=False)
            time.sleep(0.02)
        return RewardOutput(reward=1.0, is_correct=True)


class GateAgent(BaseAgent):
    """The question as the only user message, no system prompt."""


if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point=GateEnv)
