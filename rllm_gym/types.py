"""The typed records every part of rllm-gym shares, from eval to training.

An :class:`Episode` is one rollout of one task; it holds one :class:`Trajectory` per agent (or role), and each
trajectory is an ordered list of :class:`Step`, one per LLM call. The fields follow rLLM's data model (the seed
documents in ``shared/seeds``), including the token-level fields the trainer needs. Every record is a pydantic v2
model: bad input raises a ``ValidationError`` that names the field, and ``to_dict()`` / ``from_dict()`` /
``to_json()`` / ``from_json()`` round-trip losslessly (NaN and infinities included).
"""

from __future__ import annotations

import itertools
import os
from enum import Enum
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "DEFAULT_MAX_TURNS",
    "Episode",
    "ModelOutput",
    "Record",
    "RewardOutput",
    "Step",
    "Task",
    "TerminationReason",
    "ToolCall",
    "Trajectory",
    "TrajectoryGroup",
]


def _renew_id_prefix() -> None:
    global _id_prefix, _id_counter
    _id_prefix, _id_counter = os.urandom(8).hex(), itertools.count()


_renew_id_prefix()
os.register_at_fork(after_in_child=_renew_id_prefix)  # a forked worker must not repeat its parent's ids


def _new_id() -> str:
    """32 hex digits, unique across processes and runs: a random prefix per process and a counter. A uuid4 per record
    read the OS's random source every time, a few microseconds per Step on the engine's event loop."""
    return f"{_id_prefix}{next(_id_counter):016x}"


class Record(BaseModel):
    """Base of every record: strict about unknown fields, JSON round-trip including NaN and infinities."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants", validate_assignment=True)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible dict (``json.dumps`` takes it) that :meth:`from_dict` turns back into an equal record."""
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        return cls.model_validate(data)

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> Self:
        return cls.model_validate_json(text)


# The per-episode LLM-call limit when none is given: the engines, the trainer (TrainConfig, EpisodeRollout) and
# `rllm-gym eval` all take this one default.
DEFAULT_MAX_TURNS = 10


class TerminationReason(str, Enum):
    """Why an episode ended. Only ``ERROR`` and ``INFRA_FAILED`` episodes are retried by the engines; the others are
    outcomes. ``INFRA_FAILED``: a step's ``info["infra_failed"]`` said its reward came from the infrastructure (the
    sandbox, a grader, a scorer or a server failed), not from the model; the trainer leaves such episodes out of the
    advantages by default."""

    ENV_DONE = "env_done"
    MAX_TURNS_EXCEEDED = "max_turns_exceeded"
    MAX_PROMPT_LENGTH_EXCEEDED = "max_prompt_length_exceeded"
    MAX_RESPONSE_LENGTH_EXCEEDED = "max_response_length_exceeded"
    TIMEOUT = "timeout"
    ERROR = "error"
    INFRA_FAILED = "infra_failed"
    UNKNOWN = "unknown"


class ToolCall(Record):
    """One function call parsed out of a model reply: the tool's name and its keyword arguments."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class ModelOutput(Record):
    """What a policy returns for one LLM call: the text, its parts, and the token-level data the trainer needs.

    ``logprobs`` holds one log-probability per token of ``completion_ids`` when the backend returns them.
    ``text_rendered`` is True when the server took the chat as text and rendered it itself (an OpenAI-compatible
    chat endpoint without token prompts): the model was then not given the previous calls' sampled tokens, and any
    ``prompt_ids`` are a local rendering of the chat, not necessarily the tokens it saw. ``policy_version`` is the
    version of the weights that sampled it (the trainer's optimizer steps; always 0 under the synchronous trainer,
    whose rollouts are sampled by the weights being trained).
    """

    text: str = ""
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    prompt_ids: list[int] = Field(default_factory=list)
    completion_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    prompt_length: int = 0
    completion_length: int = 0
    finish_reason: str | None = None
    text_rendered: bool = False
    policy_version: int = 0

    @model_validator(mode="after")
    def _check_lengths(self) -> Self:
        if self.logprobs and self.completion_ids and len(self.logprobs) != len(self.completion_ids):
            raise ValueError(
                f"logprobs has {len(self.logprobs)} entries but completion_ids has {len(self.completion_ids)}: "
                "pass one log-probability per completion token, or none"
            )
        return self


class RewardOutput(Record):
    """What a reward function returns: the scalar reward, correctness when it is known, and grading details."""

    reward: float
    metadata: dict[str, Any] = Field(default_factory=dict)
    is_correct: bool | None = None


class Task(Record):
    """A task as the data sets hand it to envs: an id and the task dict (question, ground truth, tests, ...)."""

    id: str
    data: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id")
    @classmethod
    def _id_not_empty(cls, value: str) -> str:
        if not value:
            raise ValueError("a task id must be a non-empty string, e.g. 'gsm8k_42'")
        return value


class Step(Record):
    """One LLM call: what was sent, what came back, the parsed action, and the reward the env gave for it.

    ``input``/``output``/``action``/``reward``/``done``/``metadata`` are rLLM's canonical fields; the rest are the
    training extension that the execution engines fill in (token ids, logprobs, the chat that was sent, the
    advantage and the Monte Carlo return).
    """

    id: str = Field(default_factory=_new_id)
    input: Any | None = None
    output: Any | None = None
    action: Any | None = None
    reward: float = 0.0
    done: bool = False
    metadata: dict[str, Any] | None = None
    # Training extension.
    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    chat_completions: list[dict[str, Any]] = Field(default_factory=list)
    advantage: float | None = None
    observation: Any | None = None
    thought: str = ""
    model_response: str = ""
    model_output: ModelOutput | None = None
    mc_return: float = 0.0
    info: dict[str, Any] = Field(default_factory=dict)


class Trajectory(Record):
    """The steps one agent (or role) took in an episode. ``name`` is the role; training groups by it."""

    uid: str = Field(default_factory=_new_id)
    name: str = "agent"
    task: Any = None
    steps: list[Step] = Field(default_factory=list)
    reward: float | None = None
    input: dict[str, Any] | None = None
    output: Any = None
    signals: dict[str, float] = Field(default_factory=dict)
    metadata: dict[str, Any] | None = None

    def is_cumulative(self) -> bool:
        """True when each step's chat extends the previous step's chat (messages plus the reply).

        A cumulative trajectory can be trained as one sequence with the observations masked; otherwise each step is
        its own sequence.
        """
        for previous, current in zip(self.steps, self.steps[1:], strict=False):
            before = previous.chat_completions
            if current.chat_completions[: len(before)] != before:
                return False
        return True


class Episode(Record):
    """One rollout of one task: ``id`` is ``"{task_id}:{rollout_idx}"``, split on the last colon."""

    id: str = Field(default_factory=lambda: f"{_new_id()}:0")
    task: Any = None
    termination_reason: TerminationReason | None = None
    is_correct: bool = False
    trajectories: list[Trajectory] = Field(default_factory=list)
    artifacts: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id")
    @classmethod
    def _id_has_rollout_index(cls, value: str) -> str:
        task_id, sep, rollout_idx = value.rpartition(":")
        if not sep or not task_id or not rollout_idx:
            raise ValueError(
                f"episode id {value!r} is not of the form '{{task_id}}:{{rollout_idx}}'; "
                f"write e.g. Episode(id='{value or 'task'}:0')"
            )
        return value

    @property
    def task_id(self) -> str:
        return self.id.rpartition(":")[0]

    @property
    def rollout_idx(self) -> str:
        return self.id.rpartition(":")[2]


class TrajectoryGroup(Record):
    """Trajectories of one role on one task, compared with each other when computing advantages.

    ``group_id`` is ``"{task_id}:{trajectory.name}"``; ``episode_ids`` says which episode each trajectory came from.
    """

    group_id: str
    trajectories: list[Trajectory] = Field(default_factory=list)
    episode_ids: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check_parallel_lists(self) -> Self:
        if self.episode_ids and len(self.episode_ids) != len(self.trajectories):
            raise ValueError(
                f"episode_ids has {len(self.episode_ids)} entries for {len(self.trajectories)} trajectories: "
                "give one episode id per trajectory, or none"
            )
        return self

    @property
    def task_id(self) -> str:
        return self.group_id.rpartition(":")[0]

    @property
    def name(self) -> str:
        return self.group_id.rpartition(":")[2]

    @classmethod
    def from_episodes(cls, episodes: list[Episode]) -> list[TrajectoryGroup]:
        """Group every trajectory of ``episodes`` by ``{task_id}:{trajectory.name}``, in first-seen order."""
        groups: dict[str, TrajectoryGroup] = {}
        for episode in episodes:
            for trajectory in episode.trajectories:
                group_id = f"{episode.task_id}:{trajectory.name}"
                group = groups.get(group_id)
                if group is None:
                    group = groups[group_id] = cls(group_id=group_id)
                group.trajectories.append(trajectory)
                group.episode_ids.append(episode.id)
        return list(groups.values())
