"""Generic single-turn and multi-turn text environments around any reward function.

Wrap your own task set and :class:`~rllm_gym.rewards.RewardFunction` in a real Gymnasium env in a few lines: the
env shows the task's question, hands the model's reply to the reward function, and (multi-turn) tells the model
it was wrong and lets it try again. Subclasses override :meth:`SingleTurnEnv.format_observation`,
:meth:`SingleTurnEnv.validate_task`, :meth:`SingleTurnEnv.step_info` or :meth:`MultiTurnEnv.feedback` to change
the text or the ``info`` they produce.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from rllm_gym.rewards import RewardFunction
from rllm_gym.spaces import TextSpace
from rllm_gym.types import RewardOutput

__all__ = [
    "MultiTurnEnv",
    "SingleTurnEnv",
    "TextRendering",
    "answer_feedback",
    "check_observation_length",
    "checked_grade",
]


def checked_grade(graded: Any, reward_fn: Any) -> RewardOutput:
    """``graded``, what ``reward_fn`` returned, once it is a :class:`~rllm_gym.types.RewardOutput` with a finite
    reward. Anything else is a broken reward function, not a wrong answer: a ``TypeError`` or ``ValueError`` that
    names it, raised to the caller instead of a crash further on or a NaN reward handed to the trainer."""
    if not isinstance(graded, RewardOutput):
        raise TypeError(
            f"reward_fn {reward_fn!r} returned {type(graded).__name__}, not a RewardOutput: return "
            "RewardOutput(reward=..., is_correct=...)"
        )
    if not math.isfinite(graded.reward):
        raise ValueError(
            f"reward_fn {reward_fn!r} returned a non-finite reward {graded.reward!r}: return a finite one"
        )
    return graded


def check_observation_length(observation: str, space: TextSpace) -> None:
    """Raise ``ValueError`` when a task's first observation (its question, as the env shows it) is longer than the
    observation space admits: the task is bad input, not something to hand on outside the declared space."""
    if len(observation) > space.max_length:
        raise ValueError(
            f"task['question'] makes an observation of {len(observation)} characters, over the observation space's "
            f"limit of {space.max_length}: shorten the question"
        )


def answer_feedback(
    answer: str | None, turns_left: int, *, where: str = "\\boxed{}", verdict: str = "is incorrect"
) -> str:
    """The observation after a wrong final answer: what was wrong (no answer ``where`` it belongs, or the answer,
    quoted up to 60 characters, and ``verdict``) and the attempts left. Right or wrong only: a quoted partial score
    would let a policy search for the answer over turns."""
    if answer is None:
        head = f"No final answer found: put your final answer in {where}."
    else:
        quoted = answer if len(answer) <= 60 else answer[:60] + "..."
        head = f"Your answer {quoted} {verdict}."
    plural = "s" if turns_left != 1 else ""
    return f"{head} You have {turns_left} attempt{plural} left. Please try again."


class TextRendering:
    """``render()`` for the text envs: ``"ansi"`` returns :meth:`render_text`, ``"human"`` prints it (returns None).

    Set ``render_mode`` with :meth:`set_render_mode` (checked against ``metadata["render_modes"]``) and pass each
    reset's and step's result through :meth:`rendered`, which prints it for ``"human"``.
    """

    metadata: dict[str, Any]
    render_mode: str | None
    _last_observation: str
    render_end = "\n"  # what "human" prints after the text

    def set_render_mode(self, render_mode: str | None) -> None:
        modes = self.metadata["render_modes"]
        if render_mode is not None and render_mode not in modes:
            raise ValueError(f"{type(self).__name__} render_mode must be one of {modes} or None, got {render_mode!r}")
        self.render_mode = render_mode

    def render_text(self) -> str:
        """The text to render: the current observation."""
        return self._last_observation

    def render(self) -> str | None:
        """``"ansi"``: the current observation; ``"human"``: the same text printed (returns None)."""
        if self.render_mode == "human":
            print(self.render_text(), end=self.render_end)
        return self.render_text() if self.render_mode == "ansi" else None

    def rendered(self, result: Any) -> Any:
        """``result`` (a reset's or step's), after printing the env for ``"human"``."""
        if self.render_mode == "human":
            self.render()
        return result


MAX_OBSERVATION_CHARS = 1_000_000
MAX_ACTION_CHARS = 1_000_000


class SingleTurnEnv(TextRendering, gym.Env[str, str]):
    """One question, one reply, one reward from ``reward_fn``.

    ## Description
    A generic text environment: ``reset`` picks a task, the observation is its question, and the one ``step``
    grades the reply with ``reward_fn(task, action)`` and ends the episode.

    ## Action Space
    ``TextSpace(max_length=1_000_000)``: the model's full reply. An action outside the space (``bytes``, ``None``,
    a number, longer text) is an invalid action: it is graded as the empty reply ``""`` and
    ``info["invalid_action"]`` is True.

    ## Observation Space
    ``TextSpace(max_length=1_000_000)``: the task's ``question`` (see :meth:`format_observation`); ``""`` after the
    final step.

    ## Starting State
    ``reset(options={"task": {...}})`` uses that task dict; otherwise a task is drawn from ``tasks`` with the env's
    seeded generator (``reset(seed=s)`` draws the same task every time).

    ## Rewards
    Whatever ``reward_fn`` returns for the reply (``RewardOutput.reward``); for an invalid action, what it returns
    for ``""``. A reward function that returns no ``RewardOutput`` or a non-finite reward is broken: ``step`` raises
    ``TypeError``/``ValueError`` naming it (:func:`checked_grade`) rather than pass NaN on.

    ## Episode End
    Terminated after the one step. Never truncated by the env itself.

    ## Information
    ``reset``: ``task`` (the task dict), ``task_id``. ``step``: ``is_correct`` (from the reward function, False when it
    does not say), ``reward_metadata`` (its metadata dict), ``turn`` (1-based), ``invalid_action`` (the action was
    outside the action space), ``infra_failed`` (the reward function's ``metadata["infra_failed"]``: its grade came
    from the infrastructure, not the model; the engine retries such an episode and the trainer leaves it out).

    ## Arguments
    ``reward_fn`` (RewardFunction): grades ``(task, action)``. ``tasks`` (a sequence of task dicts, e.g. a
    :class:`rllm_gym.data.Dataset`, or None: then every reset needs ``options["task"]``).
    ``render_mode`` (``"human"``: the current observation printed after every reset and step; ``"ansi"``:
    ``render()`` returns it; or None).

    ## Version History
    * v0: initial version.
    """

    metadata = {"render_modes": ["human", "ansi"], "render_fps": 4}

    def __init__(
        self,
        reward_fn: RewardFunction,
        tasks: Sequence[dict[str, Any]] | None = None,
        render_mode: str | None = None,
    ):
        if not callable(reward_fn):
            raise TypeError(
                f"reward_fn must be callable as reward_fn(task_info, action) -> RewardOutput, got {reward_fn!r}"
            )
        if tasks is not None and (not isinstance(tasks, Sequence) or isinstance(tasks, (str, bytes))):
            raise TypeError(
                f"tasks must be a sequence of task dicts (a list or a Dataset), got {type(tasks).__name__}"
            )
        if tasks is not None and len(tasks) == 0:
            raise ValueError("tasks is empty: pass at least one task dict, or None and give options={'task': ...}")
        self.reward_fn = reward_fn
        self.tasks = tasks
        self.set_render_mode(render_mode)
        self.observation_space = TextSpace(max_length=MAX_OBSERVATION_CHARS)
        self.action_space = TextSpace(max_length=MAX_ACTION_CHARS)
        self.task: dict[str, Any] | None = None
        self.turn = 0
        self._done = True
        self._last_observation = ""

    # Extension points

    def validate_task(self, task: Any) -> dict[str, Any]:
        """Check a task dict and return it; raise ``ValueError`` naming the field and the fix."""
        if not isinstance(task, dict):
            raise ValueError(f"a task must be a dict like {{'question': ..., ...}}, got {type(task).__name__}")
        if not isinstance(task.get("question"), str):
            raise ValueError(
                f"task['question'] must be a string (the text the model sees), got keys {sorted(task)}; "
                "add a 'question' or override format_observation()"
            )
        return task

    def format_observation(self, task: dict[str, Any]) -> str:
        """The text the model sees for ``task``."""
        return task["question"]

    def step_info(self, reward_output: RewardOutput) -> dict[str, Any]:
        """``info`` entries for a graded step besides ``is_correct`` and ``turn``."""
        return {"reward_metadata": dict(reward_output.metadata)}

    # Gymnasium API

    def _draw_task(self) -> dict[str, Any]:
        if self.tasks is None:
            raise ValueError(f"{type(self).__name__} has no tasks: pass tasks= or reset(options={{'task': {{...}}}})")
        return dict(self.tasks[int(self.np_random.integers(len(self.tasks)))])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        task = (options or {}).get("task")
        self.task = self.validate_task(dict(task) if isinstance(task, dict) else task) if task is not None else None
        if self.task is None:
            self.task = self.validate_task(self._draw_task())
        self._done = True  # until the task is known to fit: a failed reset leaves no episode to step
        observation = self.format_observation(self.task)
        check_observation_length(observation, self.observation_space)
        self.turn, self._done = 0, False
        self._last_observation = observation
        info = {"task": dict(self.task), "task_id": str(self.task.get("id", ""))}
        return self.rendered((self._last_observation, info))

    def _grade(self, action: Any) -> tuple[RewardOutput, bool]:
        """The grade of ``action`` and whether it was invalid (outside the action space: graded as ``""``)."""
        assert self.task is not None
        invalid = not self.action_space.contains(action)
        return checked_grade(self.reward_fn(self.task, "" if invalid else action), self.reward_fn), invalid

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.task is None:
            raise RuntimeError(f"{type(self).__name__}.step called before reset(): call reset() first")
        if self._done:
            raise RuntimeError(f"{type(self).__name__}.step called after the episode ended: call reset() first")
        self.turn += 1
        output, invalid = self._grade(action)
        self._done = True
        self._last_observation = ""
        info = {
            "is_correct": bool(output.is_correct),
            "infra_failed": bool(output.metadata.get("infra_failed", False)),
            "turn": self.turn,
            "invalid_action": invalid,
            **self.step_info(output),
        }
        return self.rendered(("", float(output.reward), True, False, info))


class MultiTurnEnv(SingleTurnEnv):
    """Like :class:`SingleTurnEnv`, but a wrong reply gets feedback and another try, up to ``max_turns`` replies.

    ## Description
    The first observation is the task's question. After each reply the env grades it with ``reward_fn``; a correct
    reply (``is_correct``) ends the episode, a wrong one earns its reward and an observation from :meth:`feedback`
    (by default: the answer was wrong, N attempts left) until ``max_turns`` replies have been made.

    ## Action Space
    ``TextSpace(max_length=1_000_000)``: the model's full reply at each turn.

    ## Observation Space
    ``TextSpace(max_length=1_000_000)``: the question, then the feedback text; ``""`` after the final step.

    ## Starting State
    As :class:`SingleTurnEnv`: ``options["task"]`` or a seeded draw from ``tasks``.

    ## Rewards
    Each step earns ``reward_fn``'s reward for that reply (so a wrong try earns the grader's incorrect reward).

    ## Episode End
    Terminated on a correct reply or after ``max_turns`` replies (running out of tries is the rule of the game,
    not a time limit). Not truncated by the env itself.

    ## Information
    As :class:`SingleTurnEnv`, plus ``turns_left`` after each step.

    ## Arguments
    As :class:`SingleTurnEnv`, plus ``max_turns`` (int, 3): the number of replies allowed, at least 1.

    ## Version History
    * v0: initial version.
    """

    def __init__(
        self,
        reward_fn: RewardFunction,
        tasks: Sequence[dict[str, Any]] | None = None,
        max_turns: int = 3,
        render_mode: str | None = None,
    ):
        super().__init__(reward_fn, tasks, render_mode=render_mode)
        if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1:
            raise ValueError(f"max_turns must be a positive int (the number of replies allowed), got {max_turns!r}")
        self.max_turns = max_turns

    def feedback(self, reward_output: RewardOutput, turns_left: int) -> str:
        """The observation after a wrong reply."""
        plural = "s" if turns_left != 1 else ""
        return f"Your answer is incorrect. You have {turns_left} attempt{plural} left. Please try again."

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.task is None:
            raise RuntimeError(f"{type(self).__name__}.step called before reset(): call reset() first")
        if self._done:
            raise RuntimeError(f"{type(self).__name__}.step called after the episode ended: call reset() first")
        self.turn += 1
        output, invalid = self._grade(action)
        turns_left = self.max_turns - self.turn
        self._done = bool(output.is_correct) or turns_left == 0
        self._last_observation = "" if self._done else self.feedback(output, turns_left)
        info = {
            "is_correct": bool(output.is_correct),
            "infra_failed": bool(output.metadata.get("infra_failed", False)),
            "turn": self.turn,
            "turns_left": turns_left,
            "invalid_action": invalid,
            **self.step_info(output),
        }
        return self.rendered((self._last_observation, float(output.reward), self._done, False, info))
