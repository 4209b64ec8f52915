"""Procedurally generated reasoning tasks from the ``reasoning-gym`` package: ``rllm/ReasoningGym-v0``.

Any of reasoning-gym's datasets (``chain_sum``, ``basic_arithmetic``, ``countdown``, ``sudoku``, ...) or a weighted
mix of them, seeded, split into disjoint train and eval sets, and scored by each dataset's own ``score_answer``, run
as untrusted code: in the sandbox unless it is a plain string comparison (:mod:`rllm_gym.rewards.reasoning_gym`).
reasoning-gym is an optional extra (``pip install -e ".[reasoning-gym]"``) imported only when the env is made.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from gymnasium.error import DependencyNotInstalled

from rllm_gym.envs.base import MultiTurnEnv, answer_feedback
from rllm_gym.rewards.math import last_boxed
from rllm_gym.rewards.reasoning_gym import (
    Verdict,
    runs_in_process,
    sandbox_score,
    score_in_process,
    scoring_sandbox,
    unsafe_answer_reason,
)
from rllm_gym.rewards.reasoning_gym_checks import UNSOUND_DATASETS, oracle_problem, wrapper_check
from rllm_gym.types import RewardOutput

__all__ = ["ReasoningGymEnv", "ReasoningGymScorer", "extract_reply_answer", "split_of"]

INSTALL_HINT = 'pip install -e ".[reasoning-gym]"'
ANSWER_FORMATS = ("boxed", "answer_tag")
SPLITS = ("train", "eval")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def _reasoning_gym() -> Any:
    """The reasoning_gym module, imported on first use so that ``import rllm_gym`` never pays for it."""
    try:
        import reasoning_gym
    except ImportError as error:
        raise DependencyNotInstalled(
            f"rllm/ReasoningGym-v0 needs the reasoning-gym package, which is not installed ({error}); "
            f"install the extra with: {INSTALL_HINT}"
        ) from None
    return reasoning_gym


# Answer extraction


def extract_reply_answer(text: str, answer_format: str = "boxed") -> tuple[str | None, str | None]:
    """``(answer, None)`` or ``(None, why)``: the last ``\\boxed{...}`` (``"boxed"``) or the last
    ``<answer>...</answer>`` (``"answer_tag"``) after the last ``</think>``; an unclosed ``<think>`` gives none."""
    if "</think>" in text:
        text = text.rpartition("</think>")[2]
    elif "<think>" in text:
        return None, "the reply opens <think> but never closes it, so it has no final answer"
    if answer_format == "boxed":
        answer, where = last_boxed(text), "\\boxed{...}"
    else:
        # Only up to the last closing tag: past it every opening tag would scan to the end in vain (quadratic).
        end = text.rfind("</answer>")
        found = _ANSWER_TAG.findall(text, 0, end + len("</answer>")) if end >= 0 else []
        answer, where = (found[-1] if found else None), "<answer>...</answer>"
    if answer is None or not answer.strip():
        return None, f"no final answer found: put it in {where}"
    return answer.strip(), None


# Tasks


def _dataset_spec(dataset: Any, config: Any) -> dict[str, Any]:
    """``{"mix": {name: weight}, "configs": {name: config}}``, checked, for one dataset name or a weighted mix."""
    if isinstance(dataset, str):
        if config is not None and not isinstance(config, Mapping):
            raise TypeError(f"config must be a dict of {dataset!r} settings, got {type(config).__name__}")
        mix, configs = {dataset: 1.0}, {dataset: dict(config or {})}
    elif isinstance(dataset, Mapping) and dataset:
        mix = {}
        for name, weight in dataset.items():
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
                raise ValueError(f"dataset weights must be positive numbers, got {name!r}: {weight!r}")
            mix[str(name)] = float(weight)
        config = dict(config or {})
        unknown = sorted(set(config) - set(mix))
        if unknown:
            raise ValueError(
                f"config of a dataset mix is keyed by dataset name; {unknown} is not in the mix {sorted(mix)}"
            )
        configs = {name: dict(config.get(name) or {}) for name in mix}
    else:
        raise TypeError(
            "dataset must be a reasoning-gym dataset name ('chain_sum') or a non-empty dict of weights "
            f"({{'chain_sum': 2, 'basic_arithmetic': 1}}), got {dataset!r}"
        )
    registered = set(_reasoning_gym().factory.DATASETS) - {"composite"}
    for name in mix:
        if name not in registered:
            close = difflib.get_close_matches(name, sorted(registered), n=3)
            hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise ValueError(f"reasoning-gym has no dataset {name!r}.{hint} It has: {', '.join(sorted(registered))}.")
    return {"mix": mix, "configs": configs}


@lru_cache(maxsize=16)
def _generator(spec_json: str, seed: int, capacity: int) -> Any:
    """The reasoning-gym dataset (a ``CompositeDataset`` for a mix) of a spec; cached: envs are made per episode."""
    reasoning_gym = _reasoning_gym()
    spec = json.loads(spec_json)
    try:
        if len(spec["mix"]) == 1:
            (name,) = spec["mix"]
            return reasoning_gym.create_dataset(name, **{**spec["configs"][name], "seed": seed, "size": capacity})
        from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

        specs = [DatasetSpec(name, weight, spec["configs"][name]) for name, weight in spec["mix"].items()]
        return CompositeDataset(CompositeConfig(size=capacity, seed=seed, datasets=specs))
    except (TypeError, ValueError, AssertionError) as error:
        raise ValueError(f"reasoning-gym rejected the dataset settings {spec}: {error}") from None


def split_of(question: str) -> str:
    """``"train"`` or ``"eval"``, decided by the question's SHA-256: the same question is always in the same split."""
    return "eval" if hashlib.sha256(question.encode()).digest()[0] % 2 else "train"


@lru_cache(maxsize=32)
def _tasks(spec_json: str, size: int, seed: int, split: str) -> tuple[dict[str, Any], ...]:
    """The first ``size`` items of the seeded stream whose question falls in ``split``, as task dicts."""
    capacity = 4 * size + 64
    generator = _generator(spec_json, seed, capacity)
    label = "+".join(json.loads(spec_json)["mix"])
    tasks = []
    for index in range(capacity):
        entry = generator[index]
        if split_of(entry["question"]) != split:
            continue
        metadata = dict(entry.get("metadata") or {})
        dataset = metadata.get("source_dataset", label)
        if unsafe_answer_reason(dataset, str(entry["answer"])) is not None or oracle_problem(dataset, entry):
            # The oracle itself restates the task (intermediate_integration's "Integral(x**2*cos(x), x) + C" where
            # sympy found no closed form) or fails the wrapper's own check (polynomial_equations' "0.0" for a
            # quartic with four real roots): no answer could be paid honestly, so the task is not posed.
            continue
        tasks.append(
            {
                "id": f"{label}/{seed}/{index}",
                "question": entry["question"],
                "ground_truth": entry["answer"],
                "dataset": dataset,
                "metadata": metadata,
            }
        )
        if len(tasks) == size:
            break
    if not tasks:
        raise ValueError(f"reasoning-gym produced no {split} tasks for {label}: use a larger size or another config")
    return tuple(tasks)


# Scoring


REWARD_MODES = ("binary", "partial")


class ReasoningGymScorer:
    """A :class:`~rllm_gym.rewards.RewardFunction` that extracts the answer and has the dataset's scorer grade it.

    The scorer runs in this process only for the string-comparison datasets of
    :data:`~rllm_gym.rewards.reasoning_gym.IN_PROCESS_DATASETS`; every other one runs in the sandbox
    (:func:`~rllm_gym.rewards.reasoning_gym.sandbox_score`), and an answer that such a scorer would run as code is
    refused before scoring. ``reward="binary"`` pays 1.0 when the dataset's score is 1.0 (and the wrapper's own
    checks agree, :func:`~rllm_gym.rewards.reasoning_gym_checks.wrapper_check`), else 0.0; ``"partial"`` pays the
    dataset's score. A verdict without a score (timeout, memory limit, scorer error, unsafe answer, sandbox
    error) pays 0.0. A reply with no answer in ``answer_format`` pays ``format_error_reward`` (default 0.0).
    ``score_fns`` maps dataset names to their host ``score_answer`` (used only when allow-listed) and ``configs``
    to their settings (the sandbox rebuilds the dataset from them).
    """

    def __init__(
        self,
        score_fns: Mapping[str, Callable[[str | None, dict[str, Any]], float]],
        answer_format: str = "boxed",
        format_error_reward: float | None = None,
        max_answer_chars: int = 10_000,
        reward: str = "binary",
        configs: Mapping[str, Mapping[str, Any]] | None = None,
    ):
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(f"answer_format must be one of {ANSWER_FORMATS}, got {answer_format!r}")
        if reward not in REWARD_MODES:
            raise ValueError(f"reward must be one of {REWARD_MODES}, got {reward!r}")
        if format_error_reward is not None and (
            isinstance(format_error_reward, bool)
            or not isinstance(format_error_reward, (int, float))
            or not -1.0 <= format_error_reward <= 1.0
        ):
            raise ValueError(f"format_error_reward must be a number in [-1, 1] or None, got {format_error_reward!r}")
        if isinstance(max_answer_chars, bool) or not isinstance(max_answer_chars, int) or max_answer_chars < 1:
            raise ValueError(f"max_answer_chars must be a positive int, got {max_answer_chars!r}")
        self.score_fns = dict(score_fns)
        self.configs = {name: dict(config) for name, config in (configs or {}).items()}
        self.answer_format = answer_format
        self.format_error_reward = 0.0 if format_error_reward is None else float(format_error_reward)
        self.max_answer_chars = max_answer_chars
        self.reward = reward

    def verdict(self, dataset: str, answer: str, entry: dict[str, Any]) -> Verdict:
        """The dataset's verdict on ``answer``: in this process for an allow-listed string scorer, else sandboxed."""
        why = unsafe_answer_reason(dataset, answer)
        if why is not None:
            return Verdict("unsafe_answer", error=why)
        return wrapper_check(dataset, answer, entry, self.dataset_verdict(dataset, answer, entry))

    def dataset_verdict(self, dataset: str, answer: str, entry: dict[str, Any]) -> Verdict:
        """What the dataset's own scorer says (checked to be a number in [0, 1]), wherever it must run."""
        score_fn = self.score_fns.get(dataset)
        if runs_in_process(dataset, score_fn):
            return score_in_process(score_fn, answer, entry)  # type: ignore[arg-type]
        return sandbox_score(dataset, self.configs.get(dataset, {}), answer, entry)

    def __call__(self, task_info: dict[str, Any], action: str) -> RewardOutput:
        answer, error = extract_reply_answer(action, self.answer_format)
        if answer is not None and len(answer) > self.max_answer_chars:
            answer, error = None, f"the answer is longer than {self.max_answer_chars} characters"
        ground_truth = task_info.get("ground_truth", task_info.get("answer"))
        metadata: dict[str, Any] = {
            "extracted_answer": answer,
            "ground_truth": ground_truth,
            "format_error": answer is None,
            "source_dataset": task_info["dataset"],
            "score": 0.0,
        }
        if answer is None:
            metadata.update(path="format_error", error=error)
            return RewardOutput(reward=self.format_error_reward, is_correct=False, metadata=metadata)
        entry = {"question": task_info["question"], "answer": ground_truth, "metadata": task_info["metadata"]}
        verdict = self.verdict(task_info["dataset"], answer, entry)
        score = verdict.score if verdict.score is not None else 0.0
        # The sandbox could not run the scorer: no verdict on the answer at all (a scorer that raised or ran out of
        # time or memory on the answer is the answer's doing).
        metadata.update(
            path=verdict.path, score=score, error=verdict.error, infra_failed=verdict.path == "sandbox_error"
        )
        correct = verdict.path == "score_answer" and score == 1.0
        reward = score if self.reward == "partial" else float(correct)
        return RewardOutput(reward=reward, is_correct=correct, metadata=metadata)


# The env


class ReasoningGymEnv(MultiTurnEnv):
    """Solve a task from a reasoning-gym dataset (or a weighted mix); the dataset's own scorer gives the reward.

    ## Description
    Each episode poses one procedurally generated task of `reasoning-gym <https://github.com/open-thought/
    reasoning-gym>`_: ``gym.make("rllm/ReasoningGym-v0", dataset="chain_sum", size=500, seed=0,
    config={"min_terms": 2})``, or a mix ``dataset={"chain_sum": 2, "basic_arithmetic": 1}`` (reasoning-gym's
    ``CompositeDataset``). By default one reply is allowed; with ``max_turns=N`` a reply that is not fully correct
    gets feedback and another try, as in ``rllm/Math-v0``. The model's answer is untrusted: a scorer that may
    evaluate it (``eval``, sympy's ``parse_expr``) runs in :mod:`rllm_gym.sandbox` with a time and memory limit,
    and only a number in [0, 1] comes back; only the datasets of
    :data:`~rllm_gym.rewards.reasoning_gym.IN_PROCESS_DATASETS` (string comparison) are scored in this process.
    Datasets whose scorer pays answers that solve nothing
    (:data:`~rllm_gym.rewards.reasoning_gym_checks.UNSOUND_DATASETS`: ``game_of_life_halting``,
    ``propositional_logic``) are refused unless ``allow_unsound=True``; a task whose own oracle restates the question
    or fails the wrapper's check (``polynomial_equations``' missed roots) is not posed. Needs
    ``pip install -e ".[reasoning-gym]"``; without it ``gym.make`` raises ``DependencyNotInstalled`` naming that
    command.

    ## Action Space
    ``TextSpace(max_length=1_000_000)``: the model's full reply, reasoning included.

    ## Observation Space
    ``TextSpace(max_length=1_000_000)``: the task's question as reasoning-gym writes it (with its own instructions
    on the answer's form, e.g. "a comma-separated list"); in the multi-turn variant, after a reply that is not fully
    correct, a line that says so (quoting the extracted answer, never its score: a partial score would let a policy
    search for the answer over turns) and how many attempts are left; ``""`` once the episode has ended.

    ## Prompt Format
    The observation is only the question; the agent adds how to mark the answer. The default agent
    (``rllm_gym.agents.math:MathAgent``) asks for the final answer "within \\boxed{}", which matches the default
    ``answer_format="boxed"``. For reasoning-gym's own convention (``<answer>...</answer>``, as in its
    ``SYSTEM_PROMPTS``), pass ``answer_format="answer_tag"`` and a system prompt that asks for it.
    Example: ``State the final answer to the following arithmetic problem: 4 - 1 - 7 =``

    ## Action Parsing
    :func:`extract_reply_answer`: only the text after the last ``</think>`` counts; the answer is the content of
    the last ``\\boxed{...}`` (braces balanced; ``answer_format="boxed"``) or of the last ``<answer>...</answer>``
    (``"answer_tag"``), stripped. No such answer, an empty one, one longer than ``max_answer_chars`` or an unclosed
    ``<think>`` is a format error, never an exception.

    ## Starting State
    Tasks are the first ``size`` items of the dataset's seeded stream (``seed``) that fall in ``split``: a question
    is in ``"eval"`` when the first byte of its SHA-256 is odd, else in ``"train"``, so the two splits never share a
    question and do not depend on ``size``. ``reset(seed=s)`` draws the same task every time;
    ``reset(options={"task": t})`` poses ``t``, a task dict from ``info["task"]`` or a raw reasoning-gym entry
    (``{"question", "answer", "metadata": {"source_dataset", ...}}``).

    ## Rewards
    ``reward="binary"`` (the default, for training): 1.0 when the dataset's scorer says fully correct (a score of
    1.0, confirmed by the wrapper's own check where the scorer is known to be loose: ``puzzle24`` and ``countdown``
    must use exactly the puzzle's numbers and reach the target exactly, ``coin_flip`` must be the probability within
    1e-4, ``complex_arithmetic`` must not be ``nan``), else 0.0. ``reward="partial"``: the dataset's own score in
    [0, 1] (some datasets pay substring or distance credit; such scores can be farmed by hedging). Every verdict
    without a score pays 0.0 in both modes, with ``info["grading_path"]`` saying which: ``unsafe_answer`` (an answer
    that the dataset's scorer would run as code), ``timeout`` (past 5 s), ``memory_limit`` (past 1 GB),
    ``scorer_error``, ``invalid_score`` (not a finite number in [0, 1]), ``rejected_by_check`` and ``sandbox_error``
    (the sandbox itself failed: drop such samples). A format error pays ``format_error_reward`` (0.0; at most
    [-1, 1]). In a multi-turn episode a step pays only what it improves on the best reward so far (a negative
    ``format_error_reward`` is paid in full), so an episode never returns more than answering correctly at once.
    Bounds, also in ``metadata["step_reward_range"]`` and ``["episode_return_range"]``: a step earns within
    ``[min(0, format_error_reward), 1]`` and an episode within ``[max_turns * min(0, format_error_reward), 1]``.

    ## Episode End
    Terminated after a fully correct reply or after ``max_turns`` replies (default 1). Truncated only by a
    ``max_episode_steps`` wrapper.

    ## Information
    ``reset``: ``task`` (the task dict: ``id``, ``question``, ``ground_truth``, ``dataset``, ``metadata``),
    ``task_id``. ``step``: ``is_correct`` (score 1.0), ``score``, ``extracted_answer`` (None on a format error),
    ``ground_truth``, ``source_dataset``, ``format_error`` (bool), ``grading_path`` (``score_answer``,
    ``format_error`` or one of the verdicts without a score listed under Rewards), ``grading_error`` (why, or None),
    ``turn`` (1-based), ``turns_left``, ``infra_failed`` (bool).

    Whose failure: an answer the check refuses (``unsafe_answer``, ``rejected_by_check``), or one the scorer raised on
    (``scorer_error``), ran past its time or memory on (``timeout``, ``memory_limit``) or scored outside [0, 1]
    (``invalid_score``) is the model's. ``sandbox_error`` (the scoring sandbox could not run) is the
    infrastructure's: ``infra_failed`` True; the engine retries such an episode and the trainer leaves it out.

    ## Arguments
    ``dataset`` (str or dict, ``"chain_sum"``): a reasoning-gym dataset name, or ``{name: weight}`` for a mix.
    ``size`` (int, 500): tasks in the split. ``seed`` (int, 0): the dataset's seed. ``config`` (dict or None): the
    dataset's settings (its config dataclass fields), or for a mix ``{name: settings}``. ``split`` (``"train"`` or
    ``"eval"``). ``answer_format`` (``"boxed"`` or ``"answer_tag"``). ``reward_config`` (dict):
    ``format_error_reward`` (a number in [-1, 1]; None or absent: 0.0) and ``max_answer_chars`` (10000).
    ``max_turns`` (int, 1). ``render_mode`` (``"ansi"`` or None). ``reward`` (``"binary"`` or ``"partial"``).
    ``allow_unsound`` (bool, False): accept the datasets of ``UNSOUND_DATASETS``.

    ## Version History
    * v0: initial version (reasoning-gym 0.1.x); scorers since run as untrusted code (sandboxed unless plain string
      comparisons), ``reward="binary"`` made the default, multi-turn steps paid as improvements, feedback without
      the score, loose scorers checked and unsound ones refused.
    """

    def __init__(
        self,
        dataset: str | Mapping[str, float] = "chain_sum",
        size: int = 500,
        seed: int = 0,
        config: Mapping[str, Any] | None = None,
        split: str = "train",
        answer_format: str = "boxed",
        reward_config: Mapping[str, Any] | None = None,
        max_turns: int = 1,
        render_mode: str | None = None,
        reward: str = "binary",
        allow_unsound: bool = False,
    ):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive int (tasks in the split), got {size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        if split not in SPLITS:
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if reward_config is not None and not isinstance(reward_config, Mapping):
            raise TypeError(f"reward_config must be a dict, got {type(reward_config).__name__}")
        if not isinstance(allow_unsound, bool):
            raise ValueError(f"allow_unsound must be True or False, got {allow_unsound!r}")
        spec = _dataset_spec(dataset, config)
        refused = {name: UNSOUND_DATASETS[name] for name in spec["mix"] if name in UNSOUND_DATASETS}
        if refused and not allow_unsound:
            reasons = "; ".join(f"{name}: {why}" for name, why in refused.items())
            raise ValueError(
                f"reasoning-gym dataset(s) {sorted(refused)} have a scorer that pays answers which solve nothing "
                f"({reasons}). Pass allow_unsound=True to use them anyway."
            )
        spec_json = json.dumps(spec, sort_keys=True)
        tasks = _tasks(spec_json, size, seed, split)
        generator, mix = _generator(spec_json, seed, 4 * size + 64), spec["mix"]
        # A mix scores each task with its own sub-dataset (configured as the env's), as CompositeDataset does.
        score_fns = {name: generator.datasets[name].score_answer for name in mix} if len(mix) > 1 else {}
        score_fns = score_fns or {next(iter(mix)): generator.score_answer}
        try:
            scorer = ReasoningGymScorer(
                score_fns,
                answer_format=answer_format,
                reward=reward,
                configs=spec["configs"],
                **dict(reward_config or {}),
            )
        except TypeError as error:
            raise ValueError(f"invalid reward_config {dict(reward_config or {})}: {error}") from None
        self.split, self.answer_format, self.reward_mode = split, answer_format, reward
        super().__init__(scorer, list(tasks), max_turns=max_turns, render_mode=render_mode)
        if any(not runs_in_process(name, fn) for name, fn in score_fns.items()):
            scoring_sandbox()  # a machine that cannot isolate the scorers says so here, not at the first step
        penalty = min(0.0, scorer.format_error_reward)
        self.metadata = {
            **type(self).metadata,
            "step_reward_range": (penalty, 1.0),
            "episode_return_range": (max_turns * penalty, 1.0),
        }
        self._best = 0.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self._best = 0.0
        return super().reset(seed=seed, options=options)

    def _grade(self, action: Any) -> tuple[RewardOutput, bool]:
        """The reply's grade, paid as an improvement: over a multi-turn episode the rewards add up to the best
        reward reached (a negative ``format_error_reward`` is paid in full), never more than answering at once."""
        output, invalid = super()._grade(action)
        value = float(output.reward)
        paid = value if value < 0 else max(value, self._best) - self._best
        self._best = max(self._best, value)
        return RewardOutput(reward=paid, is_correct=output.is_correct, metadata=output.metadata), invalid

    def validate_task(self, task: Any) -> dict[str, Any]:
        task = copy.deepcopy(task)  # the cached tasks and every info["task"] must not share the nested metadata
        if isinstance(task, dict) and "ground_truth" not in task and "answer" in task:
            task = {**task, "ground_truth": task["answer"]}  # a raw reasoning-gym entry
        task = super().validate_task(task)
        metadata = task.get("metadata")
        if not isinstance(metadata, dict) or not isinstance(metadata.get("source_dataset", task.get("dataset")), str):
            raise ValueError(
                "a reasoning-gym task needs 'metadata' (a dict with 'source_dataset', as reasoning-gym entries "
                f"have), got keys {sorted(task)}; pass an entry of a reasoning-gym dataset or a task from info['task']"
            )
        task.setdefault("dataset", metadata.get("source_dataset"))
        task.setdefault("id", "")
        return task

    def step_info(self, reward_output: RewardOutput) -> dict[str, Any]:
        metadata = reward_output.metadata
        return {
            "score": float(metadata.get("score", 0.0)),
            "extracted_answer": metadata.get("extracted_answer"),
            "ground_truth": metadata.get("ground_truth"),
            "source_dataset": metadata.get("source_dataset"),
            "format_error": bool(metadata.get("format_error", False)),
            "grading_path": metadata.get("path"),
            "grading_error": metadata.get("error"),
        }

    def feedback(self, reward_output: RewardOutput, turns_left: int) -> str:
        where = "\\boxed{}" if self.answer_format == "boxed" else "<answer></answer> tags"
        answer = reward_output.metadata.get("extracted_answer")
        return answer_feedback(answer, turns_left, where=where, verdict="is not correct")
