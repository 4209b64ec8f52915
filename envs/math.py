"""Math problems graded by :mod:`rllm_gym.rewards.math`: ``rllm/Math-v0``, single-turn or with retries."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from rllm_gym.data import Dataset, MathTaskGenerator, load_dataset, map_math_row
from rllm_gym.envs.base import MultiTurnEnv, answer_feedback
from rllm_gym.rewards import RewardFunction
from rllm_gym.rewards.math import MathGrader
from rllm_gym.types import RewardOutput

__all__ = ["MathEnv"]


def _reward_ranges(reward_fn: Any, max_turns: int) -> dict[str, tuple[float, float]]:
    """``metadata``'s ``step_reward_range`` and ``episode_return_range`` for a math grader's rewards (see
    ``## Rewards``); unknown, ``(-inf, inf)``, for any other reward function."""
    if not isinstance(reward_fn, MathGrader):
        return {"step_reward_range": (-math.inf, math.inf), "episode_return_range": (-math.inf, math.inf)}
    right = float(reward_fn.correct_reward)
    wrong = (float(reward_fn.incorrect_reward), float(reward_fn.format_error_reward))
    # An episode's return is linear in how many wrong replies come first, so the extremes lie at 0 or all of them.
    returns = [right, *((max_turns - 1) * w + right for w in wrong), *(max_turns * w for w in wrong)]
    return {
        "step_reward_range": (min(right, *wrong), max(right, *wrong)),
        "episode_return_range": (min(returns), max(returns)),
    }


class MathEnv(MultiTurnEnv):
    """Solve a math problem; the reply's final answer is graded against the ground truth.

    ## Description
    Each episode poses one problem (from a data set, or from the built-in offline generator of arithmetic,
    fraction, percentage and algebra problems). By default one reply is allowed; with ``max_turns=N``
    (``gym.make("rllm/Math-v0", max_turns=3)``) the env tells the model when an answer is wrong and lets it try
    again, up to N replies.

    ## Action Space
    ``TextSpace(max_length=1_000_000)``: the model's full reply, reasoning included. An action outside the space
    (``bytes``, ``None``, a number, longer text) is an invalid action, graded as the empty reply: a format error.

    ## Observation Space
    ``TextSpace(max_length=1_000_000)``: the problem text; in the multi-turn variant, after a wrong reply, a line
    that says so (quoting the extracted answer, or saying that none was found) and how many attempts are left;
    ``""`` once the episode has ended.

    ## Prompt Format
    The observation is only the problem: agents (``rllm_gym.agents``) add the instructions, e.g. "put your final
    answer within \\boxed{}". Example: ``What is 17 + 25?``

    ## Action Parsing
    :func:`rllm_gym.rewards.math.extract_answer`: only the text after the last ``</think>`` counts; the last
    ``\\boxed{}``/``\\fbox{}``, else the last ``#### N``, else the last "The answer is N", else a reply that is only
    a short answer. A reply with none of these (or an unclosed ``<think>``) is a format error, never an exception.

    ## Starting State
    ``reset(options={"task": {"question": ..., "ground_truth": ...}})`` poses that task (rows in GSM8K, MATH or
    DeepScaleR format are mapped too); otherwise a task is drawn from the data set with the env's seeded generator,
    so ``reset(seed=s)`` always poses the same task.

    ## Rewards
    From the grader (:class:`rllm_gym.rewards.math.MathGrader`): ``correct_reward`` (1.0), ``incorrect_reward``
    (0.0) or ``format_error_reward`` (0.0), set with ``reward_config``. Every reply of a multi-turn episode is
    rewarded. With the default ``reward_config`` a step earns 0.0 or 1.0 and, since a correct reply ends the
    episode, an episode returns 0.0 or 1.0 (``metadata["step_reward_range"]`` and ``["episode_return_range"]``,
    set per env). Other rewards move them: a step earns within ``[min(rewards), max(rewards)]``, and an episode
    returns ``k`` wrong replies' rewards plus ``correct_reward`` (``k < max_turns``) or ``max_turns`` wrong ones. With
    a ``reward_fn`` other than a ``MathGrader`` the bounds are unknown: both ranges are ``(-inf, inf)``.

    ## Episode End
    Terminated after a correct reply or after ``max_turns`` replies (default 1). Truncated only by a
    ``max_episode_steps`` wrapper.

    ## Information
    ``reset``: ``task`` (the task dict), ``task_id``. ``step``: ``is_correct``, ``extracted_answer`` (None on a
    format error), ``ground_truth``, ``format_error`` (bool), ``grading_path`` (``exact``, ``numeric``,
    ``words`` (words after the number change its meaning, e.g. ``3 is not it``: wrong), ``unevaluated`` (the answer
    is work for the grader rather than a value, e.g. ``\\int_0^2 1\\,dx``, ``17+25`` for 42, or an expression copied
    from the question: wrong), ``math_verify``, ``timeout``,
    ``error``, ``format_error``), ``turn`` (1-based), ``turns_left``,
    ``invalid_action`` (the action was outside the action space), ``infra_failed`` (bool).

    Whose failure: no answer, a wrong one, or one math-verify computed on past ``time_limit`` (``timeout``) is the
    model's. The math-verify worker dying (a crash, the host's memory) or starved by the host (a quarter of
    ``time_limit`` in CPU time not reached in three times the limit: a loaded machine, a stopped process) is the
    infrastructure's: ``error`` with ``infra_failed`` True; the engine retries such an episode and the trainer
    leaves it out. A step grades within three times ``time_limit`` whatever the reply.

    ## Arguments
    ``dataset``: a :class:`rllm_gym.data.Dataset` or list of task dicts, a ``.jsonl``/``.parquet`` path, a Hugging
    Face folder or hub name, a name registered in :class:`rllm_gym.data.DatasetRegistry`, or None for the built-in
    generator. ``split`` (str, "train"): the split to load by name. ``difficulty`` (1-5 or None for a mix): level of
    the built-in generator; ``seed`` (int, 0): its task stream. ``reward_config`` (dict): keyword arguments of
    ``MathGrader`` (``correct_reward``, ``incorrect_reward``, ``format_error_reward``, ``time_limit``,
    ``max_answer_chars``, ``significant_digits``: 6 by default, an int in [1, 30], the fewest significant digits a
    decimal needs to count as a more precise value correctly rounded at its last digit, so ``0.333333`` matches
    ``1/3`` but ``0.33333`` does not). ``reward_fn``: any RewardFunction instead of the math grader. ``max_turns``
    (int, 1).
    ``render_mode`` (``"human"``, ``"ansi"`` or None; see :class:`~rllm_gym.envs.base.SingleTurnEnv`).

    ## Version History
    * v0: initial version; a non-string action (e.g. the int ``4``) became a format error instead of being graded
      as its ``str()``, and ``render_mode="human"`` was added.
    """

    metadata = {
        **MultiTurnEnv.metadata,
        "step_reward_range": (0.0, 1.0),  # with the default reward_config (see ## Rewards)
        "episode_return_range": (0.0, 1.0),
    }

    def __init__(
        self,
        dataset: Dataset | Sequence[Mapping[str, Any]] | str | os.PathLike[str] | None = None,
        split: str = "train",
        difficulty: int | None = None,
        seed: int = 0,
        reward_config: Mapping[str, Any] | None = None,
        reward_fn: RewardFunction | None = None,
        max_turns: int = 1,
        render_mode: str | None = None,
    ):
        if reward_fn is not None and reward_config is not None:
            raise ValueError("pass reward_config (options of the math grader) or reward_fn (your own), not both")
        if reward_config is not None and not isinstance(reward_config, Mapping):
            raise TypeError(f"reward_config must be a dict of MathGrader options, got {type(reward_config).__name__}")
        if reward_fn is None:
            try:
                reward_fn = MathGrader(**dict(reward_config or {}))
            except TypeError as error:
                raise ValueError(f"invalid reward_config {dict(reward_config or {})}: {error}") from None
        if dataset is None:
            tasks: Sequence[dict[str, Any]] = MathTaskGenerator(seed=seed, difficulty=difficulty)
        else:
            tasks = load_dataset(dataset, split=split)
        super().__init__(reward_fn, tasks, max_turns=max_turns, render_mode=render_mode)
        self.metadata = {**type(self).metadata, **_reward_ranges(reward_fn, max_turns)}
        # The verdict inline_call reached for the step about to run: (action, task, grade, invalid), or None.
        self._cheap_grade: tuple[Any, dict[str, Any], RewardOutput, bool] | None = None

    def validate_task(self, task: Any) -> dict[str, Any]:
        if isinstance(task, dict) and "question" not in task and "problem" in task:
            task = map_math_row(task, "auto", source="task")
        task = super().validate_task(task)
        if task.get("ground_truth") is None and task.get("answer") is None:
            raise ValueError(
                f"a math task needs 'ground_truth' (the reference answer), got keys {sorted(task)}; "
                "e.g. {'question': 'What is 2+2?', 'ground_truth': '4'}"
            )
        return task

    def inline_call(self, method: str, *args: Any, **kwargs: Any) -> bool:
        """Whether this call takes microseconds and never blocks, so the engine may run it on its event loop
        (:func:`rllm_gym.engine.workflow.inline_call`): a reset (the tasks are in memory or generated), and a step
        that the math grader decides on its exact, word or numeric path. A step that needs math-verify (a worker
        process, up to ``time_limit`` seconds) or a custom ``reward_fn`` (of unknown cost) runs in the executor.

        The verdict of a step decided here is kept for that step (the same action object, on the same task), so the
        reply is not extracted and graded twice."""
        self._cheap_grade = None
        if method == "reset":
            return True
        if method != "step" or len(args) != 1 or kwargs or not isinstance(self.reward_fn, MathGrader):
            return False
        if self._done or self.task is None:
            return True  # step raises at once
        invalid = not self.action_space.contains(args[0])
        graded = self.reward_fn.grade_cheaply(self.task, "" if invalid else args[0])  # as _grade grades it
        if graded is None:
            return False
        self._cheap_grade = (args[0], self.task, graded, invalid)
        return True

    def _grade(self, action: Any) -> tuple[RewardOutput, bool]:
        kept, self._cheap_grade = self._cheap_grade, None
        if kept is not None and kept[0] is action and kept[1] is self.task:
            return kept[2], kept[3]
        return super()._grade(action)

    def step_info(self, reward_output: RewardOutput) -> dict[str, Any]:
        metadata = reward_output.metadata
        assert self.task is not None
        return {
            "extracted_answer": metadata.get("extracted_answer"),
            "ground_truth": metadata.get("ground_truth", self.task.get("ground_truth", self.task.get("answer"))),
            "format_error": bool(metadata.get("format_error", False)),
            "grading_path": metadata.get("path"),
        }

    def feedback(self, reward_output: RewardOutput, turns_left: int) -> str:
        return answer_feedback(reward_output.metadata.get("extracted_answer"), turns_left)
