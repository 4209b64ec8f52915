"""What a training run reports: ``summary.json`` (the dict :func:`rllm_gym.train.grpo.main` returns), built from
values the run's parts return, not read back from their attributes.

Three values make it: the scores before training (:func:`rllm_gym.train.grpo.before_training`), the
:class:`TrainingOutcome` the training returns (its steps and seconds, the trainer's episode counts, and the run's
own log, ``metrics.jsonl``, read back as a :class:`RunLog`), and the run's size. The functions below turn them into
the summary's fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rllm_gym.engine.report import describe_errors
from rllm_gym.log import logger
from rllm_gym.train.console import is_evaluation
from rllm_gym.train.evaluation import per_env

__all__ = [
    "METRICS_FILE",
    "RunLog",
    "TrainingOutcome",
    "episode_fields",
    "evaluation_fields",
    "read_run_log",
    "report_episodes",
    "reward_fields",
    "scores",
    "write_summary",
]

METRICS_FILE = "metrics.jsonl"
# The prefixes of the metrics an evaluation returns (train/evaluation.py): what a logged evaluation record holds
# besides the step, the elapsed time and the trainer's own fields (epoch).
EVALUATION_PREFIXES = ("eval_train/", "eval_heldout/")


@dataclass(frozen=True)
class RunLog:
    """The records of a run's ``metrics.jsonl`` in order: the training logs (those with a reward) and the
    evaluations, each with its ``step``."""

    training: list[dict[str, Any]]
    evaluations: list[dict[str, Any]]

    def evaluation_after(self, since: int) -> dict[str, Any] | None:
        """The last evaluation logged after step ``since`` (the step training started from), as the evaluation
        returned it with its ``step`` first; None when none ran."""
        later = [record for record in self.evaluations if record["step"] > since]
        if not later:
            return None
        last = later[-1]
        return {"step": last["step"], **{k: v for k, v in last.items() if k.startswith(EVALUATION_PREFIXES)}}


def read_run_log(output_dir: Path) -> RunLog:
    """``output_dir``'s ``metrics.jsonl`` (written by :class:`rllm_gym.train.console.ConsoleLog`); empty without it."""
    path = output_dir / METRICS_FILE
    lines = path.read_text().splitlines() if path.exists() else []
    records = [json.loads(line) for line in lines if line.strip()]
    return RunLog(
        training=[record for record in records if "reward" in record],
        evaluations=[record for record in records if is_evaluation(record)],
    )


@dataclass(frozen=True)
class TrainingOutcome:
    """What a training that ran returns: the step it started from (0, or its checkpoint's) and the one it reached,
    the seconds it took, the summary's fields of its episodes (:func:`episode_fields`) and the run's log."""

    started_at: int
    steps: int
    seconds: float
    episodes: dict[str, Any]
    log: RunLog


def episode_fields(terminations: dict[str, int], errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary's fields of the episodes a training ran: how many ended each way (``infra_failed`` ones were left
    out of the advantages) and their distinct errors (``ErrorTally.groups()``)."""
    return {
        "termination_reasons": dict(sorted(terminations.items())),
        "infra_failed": terminations.get("infra_failed", 0),
        "errors": errors,
    }


def evaluation_fields(outcome: TrainingOutcome, env_ids: list[str]) -> dict[str, Any]:
    """The summary's fields of the evaluation after the training's last step (none when no evaluation ran since the
    step it started from): the evaluation and its per-env scores."""
    evaluation = outcome.log.evaluation_after(outcome.started_at)
    if evaluation is None:
        return {}
    return {"evaluation_after": evaluation, **scores(evaluation, "after", env_ids)}


def reward_fields(log: RunLog) -> dict[str, float]:
    """``reward_first`` and ``reward_last``: the mean training reward at the first and last logging steps."""
    if not log.training:
        return {}
    return {"reward_first": log.training[0]["reward"], "reward_last": log.training[-1]["reward"]}


def scores(metrics: dict[str, float], when: str, env_ids: list[str]) -> dict[str, dict[str, float]]:
    """The summary's per-env fields of an evaluation: ``greedy_<when>`` (training tasks) and ``heldout_<when>``."""
    found = {f"greedy_{when}": per_env(metrics, "eval_train/greedy", env_ids)}
    found[f"heldout_{when}"] = per_env(metrics, "eval_heldout/greedy", env_ids)
    return {key: value for key, value in found.items() if value}


def report_episodes(summary: dict[str, Any], output_dir: Path, *, write: bool) -> None:
    """Say what failed among the training's episodes (the summary's ``errors``) and write summary.json, on the
    process that ``write``s."""
    if write and summary["errors"]:
        count = sum(group["count"] for group in summary["errors"])
        logger.warning("%d training episodes ended in ERROR:\n%s", count, describe_errors(summary["errors"]))
    if write:
        write_summary(summary, output_dir)


def write_summary(summary: dict[str, Any], output_dir: Path) -> None:
    """``summary.json`` in ``output_dir`` (values JSON cannot hold written as their text)."""
    with open(output_dir / "summary.json", "w") as handle:
        json.dump(summary, handle, indent=2, default=str)
