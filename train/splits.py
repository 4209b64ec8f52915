"""Where a run's tasks come from, and their split into tasks to train on and tasks held out for evaluation.

A source (``tasks`` and ``eval_tasks`` in :class:`~rllm_gym.train.config.TrainConfig`) is one of

* ``seeds:N`` (reset seeds 0 to N-1) or ``seeds:A-B`` (seeds A to B-1): the env's own seeded generator draws each
  task (FrozenLake's random lakes, a draw from Math-v0's or Code-v0's shipped tasks);
* a ``.jsonl`` file of task dicts (relative to the config's folder, or to the working folder);
* a ``.parquet`` file, a Hugging Face data set (a ``save_to_disk`` folder, a local data folder, or a hub name for users
  with a network) or a name registered in :class:`rllm_gym.data.DatasetRegistry`, with ``@split`` to name the split
  (``data/gsm8k@test``; default ``train``). Rows reach the env as they are: Math-v0 reads GSM8K, MATH and DeepScaleR
  columns itself.

An eval split is a source of its own (a named split: another file, ``@test``, another seed range) or a number: a
fraction in (0, 1) or a count of the training source's tasks, drawn with ``split_seed`` and removed from training.

Train and eval never share a task, whatever the sources: a task is known by what the env poses, not by its seed, id or
row (the ``info["task"]`` that ``reset`` returns, less its ``id``; :func:`task_key`). Every training task drawn is
checked against the eval split's keys and drawn again if it is held out, so two seeds that generate the same lake, or a
question that sits in both files, are never trained on. The split is a pure function of the sources, ``split_seed``
and the data, so a resumed run rebuilds the same one; :func:`split_record` is what the run keeps to check that.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import rllm_gym
from rllm_gym.train.config_file import config_relative

__all__ = ["TaskSplit", "load_source", "make_split", "split_record", "task_key"]

_SEEDS = re.compile(r"^seeds:(?:(\d+)-)?(\d+)$")
_NUMBER = re.compile(r"^\d*\.?\d+$")
# Draws of a training task that may land in the eval split in a row before the split is called degenerate.
_MAX_REDRAWS = 1000


def load_source(source: str, config_dir: Path) -> Sequence[Any]:
    """The tasks of ``source`` (see the module docstring): a range of seeds or a sequence of task dicts."""
    seeds = _SEEDS.match(source)
    if seeds:
        start, stop = int(seeds.group(1) or 0), int(seeds.group(2))
        if stop <= start:
            raise ValueError(f"tasks: {source!r} is an empty seed range: write seeds:N or seeds:A-B with A < B")
        return range(start, stop)
    if source.startswith("seeds:"):
        raise ValueError(f"tasks: {source!r} is not a seed range: write seeds:N (seeds 0 to N-1) or seeds:A-B")
    location, _, split = source.partition("@")
    path = config_relative(location, config_dir)
    if path.suffix == ".jsonl":
        return _read_jsonl(path, source)
    if path.exists():
        location = str(path)
    from rllm_gym.data import load_dataset

    try:
        tasks = load_dataset(location, split=split or "train", format="none")
    except Exception as error:  # a missing file, a hub name without a network, a split that is not there
        raise ValueError(
            f"tasks: cannot load {source!r} ({type(error).__name__}: {error}); a source is seeds:N, a .jsonl or "
            f".parquet file, a Hugging Face data set folder or name (with @split), or a registered data set name"
        ) from error
    if not len(tasks):
        raise ValueError(f"tasks: {source!r} holds no tasks")
    return tasks


def _read_jsonl(path: Path, source: str) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ValueError(f"tasks: {source}: no such file (looked for {path}); a source is seeds:N or a file")
    tasks = []
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    task = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"tasks: {path}:{number} is not JSON: {error.msg}") from None
                if not isinstance(task, dict):
                    raise ValueError(f"tasks: {path}:{number} is a {type(task).__name__}, not a task dict")
                tasks.append(task)
    if not tasks:
        raise ValueError(f"tasks: {path} holds no tasks")
    return tasks


def task_key(env: Any, task: Any) -> str:
    """What identifies ``task`` (a seed or a task dict) in ``env``: a digest of the task the env poses on reset
    (``info["task"]`` without its ``id``), so that the same lake or question has one key however it was named.

    An env whose reset info carries no ``task`` is keyed by the task dict itself (without ``id``), or by the seed."""
    result = env.reset(**({"seed": task} if isinstance(task, int) else {"options": {"task": dict(task)}}))
    info = result[1] if isinstance(result, tuple) and len(result) == 2 else {}
    if info and all(isinstance(value, dict) for value in info.values()) and "task" not in info:
        info = next(iter(info.values()))  # a PettingZoo env: one info per agent, each with the same task
    posed = info.get("task") if isinstance(info, dict) else None
    if not isinstance(posed, dict):
        posed = task if isinstance(task, dict) else {"seed": task}
    content = json.dumps({k: v for k, v in posed.items() if k != "id"}, sort_keys=True, default=str)
    return hashlib.sha256(content.encode()).hexdigest()[:20]


@dataclass
class TaskSplit:
    """One env's tasks: ``train`` to draw from (a seed range or task dicts) and ``eval``, held out from training.

    ``draw`` and ``train_sample`` skip every training task whose :func:`task_key` is one of the eval split's."""

    env_id: str
    train: Sequence[Any]
    eval: list[Any]
    env_args: dict[str, Any] = field(default_factory=dict)
    eval_keys: frozenset[str] = frozenset()
    _env: Any = field(default=None, repr=False)
    _held_out: dict[str, bool] = field(default_factory=dict, repr=False)

    def key(self, task: Any) -> str:
        if self._env is None:
            self._env = rllm_gym.make(self.env_id, **self.env_args, **self._parallel())
        return task_key(self._env, task)

    def _parallel(self) -> dict[str, Any]:
        from rllm_gym.registry import env_ids

        return {"parallel": True} if self.env_id in env_ids(multi_agent=True) else {}

    def held_out(self, task: Any) -> bool:
        """Whether ``task`` is one of the eval split's tasks (by what the env poses, see :func:`task_key`)."""
        if not self.eval_keys:
            return False
        name = json.dumps(task, sort_keys=True, default=str)
        if name not in self._held_out:
            self._held_out[name] = self.key(task) in self.eval_keys
        return self._held_out[name]

    def draw(self, rng: random.Random) -> Any:
        """A training task drawn uniformly (with replacement), never one of the eval split's."""
        for _ in range(_MAX_REDRAWS):
            task = self.train[rng.randrange(len(self.train))]
            if not self.held_out(task):
                return task
        raise ValueError(
            f"{self.env_id}: {_MAX_REDRAWS} training tasks drawn in a row were all in the eval split: the training "
            f"source holds (almost) nothing else; use a larger training source or a smaller eval split"
        )

    def train_sample(self, limit: int) -> list[Any]:
        """The first ``limit`` training tasks in the source's order, held-out ones skipped (for evaluation)."""
        sample: list[Any] = []
        for task in self.train:
            if len(sample) == limit:
                break
            if not self.held_out(task):
                sample.append(task)
        return sample

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


def make_split(
    env_id: str,
    source: str | None,
    eval_source: str | None,
    config_dir: Path,
    *,
    split_seed: int = 0,
    eval_limit: int = 64,
    env_args: dict[str, Any] | None = None,
) -> TaskSplit:
    """The split of one env's tasks: ``source`` to train on (default ``seeds:64``); ``eval_source`` a source of its
    own, a fraction or count carved out of ``source`` with ``split_seed``, or None (no held-out tasks). The eval split
    keeps its first ``eval_limit`` distinct tasks (a task posed twice is evaluated once; the rest of the withheld tasks
    are still kept out of training)."""
    train = load_source(source or "seeds:64", config_dir)
    if eval_source is None:
        return TaskSplit(env_id, train, [], dict(env_args or {}))
    withheld: list[Any] = []
    if _NUMBER.match(eval_source):
        share = float(eval_source)
        count = round(share * len(train)) if share < 1 else int(share)
        if (share != count and share >= 1) or not 1 <= count < len(train):
            raise ValueError(
                f"eval_tasks: {eval_source!r} for {env_id} must be a fraction in (0, 1) or a whole count that leaves "
                f"tasks to train on ({len(train)} in {source or 'seeds:64'}), e.g. 0.1 or 64"
            )
        rng = random.Random(split_seed)
        chosen = set(rng.sample(range(len(train)), count))
        withheld = [train[index] for index in sorted(chosen)]
        rng.shuffle(withheld)
    else:
        withheld = list(load_source(eval_source, config_dir))
    split = TaskSplit(env_id, train, [], dict(env_args or {}))
    keys: dict[str, Any] = {}  # the first task of each key: the same lake drawn twice is evaluated once
    for task in withheld:
        keys.setdefault(split.key(task), task)
    split.eval = list(keys.values())[:eval_limit]
    split.eval_keys = frozenset(keys)  # every withheld task stays out of training, also those past eval_limit
    return split


def split_record(splits: Sequence[TaskSplit], config: dict[str, Any]) -> dict[str, Any]:
    """What a run keeps of its split (in ``run.json``): the sources, the seed, and a digest of the held-out tasks,
    so that a resumed run can check it rebuilt the same split."""
    return {
        "split_seed": config.get("split_seed"),
        "envs": {
            split.env_id: {
                "eval_tasks": len(split.eval),
                "withheld": len(split.eval_keys),
                "eval_digest": hashlib.sha256("".join(sorted(split.eval_keys)).encode()).hexdigest()[:20],
            }
            for split in splits
        },
    }
