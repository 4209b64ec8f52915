"""Evaluation of a run's model through the same engine, agents and envs as its rollouts: greedy success on the tasks it
trains on and on the tasks held out from training, and sampled pass@k on the held-out ones.

It runs before training, every ``eval_steps`` steps, and after the last step (see :class:`EvalSchedule` and
:meth:`rllm_gym.train.trainer.RLLMGRPOTrainer.evaluate`). The results are flat metrics named after their split
(``eval_train/...``: tasks drawn for training; ``eval_heldout/...``: the eval split, never trained on), so that
transformers' loggers file them under ``eval/`` next to the training curves:

* ``eval_train/greedy``, ``eval_heldout/greedy``: share of tasks solved with greedy decoding;
* ``eval_heldout/pass@1`` and ``eval_heldout/pass@N`` (``eval_n`` = N samples per task at the training temperature):
  the unbiased estimates of Chen et al. (2021), "Evaluating Large Language Models Trained on Code";
* with several envs, each of these also per env (``eval_heldout/greedy/rllm/Math-v0``).

With several processes each evaluates a share of the tasks and the results are gathered.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from rllm_gym.engine import engine_for
from rllm_gym.policies.base import SamplingParams
from rllm_gym.policies.hf import HFPolicy
from rllm_gym.train.config import TrainConfig
from rllm_gym.train.console import progress_bar, share_and_count
from rllm_gym.train.splits import TaskSplit
from rllm_gym.types import Episode

__all__ = ["EvalSchedule", "Evaluator", "describe_scores", "pass_at_k", "run_episodes"]


def run_episodes(
    config: TrainConfig,
    env_id: str,
    policy: Any,
    tasks: list[Any],
    *,
    n_rollouts: int = 1,
    progress: Callable[[Episode], None] | None = None,
    **kwargs: Any,
) -> list[Episode]:
    """Episodes of ``tasks`` with the run's agent, env arguments and turn limit, or its ``agent_program`` (``kwargs``:
    engine options); ``progress`` is called with each episode as it finishes."""
    if config.agent_program is not None:  # the program plays the env's tasks through a gateway (rllm_gym.sdk)
        from rllm_gym.sdk import AgentProgramEngine

        engine = AgentProgramEngine(
            config.agent_program,
            policy,
            reward_fn=config.reward_fn,
            max_turns=config.max_turns,
            seed=config.seed,
            **kwargs,
        )
        return asyncio.run(engine.run(tasks, n_rollouts=n_rollouts, progress=progress))
    engine = engine_for(
        env_id,
        policy,
        agent_args=config.agent_args,
        env_args=config.env_args,
        max_turns=config.max_turns,
        seed=config.seed,
        **kwargs,
    )
    return asyncio.run(engine.run(tasks, n_rollouts=n_rollouts, progress=progress))


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The unbiased pass@k of a task with ``correct`` of ``n`` samples right: 1 - C(n-c, k) / C(n, k)."""
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


class Evaluator:
    """The run's evaluation: greedy on up to ``eval_limit`` training tasks per env and on the eval split, and pass@k
    on the eval split when ``eval_n`` > 0. Call it with a model and a name for its progress bar."""

    def __init__(self, config: TrainConfig, tokenizer: Any, splits: list[TaskSplit]):
        self.config, self.tokenizer = config, tokenizer
        self.train_tasks = {split.env_id: split.train_sample(config.eval_limit) for split in splits}
        self.heldout_tasks = {split.env_id: split.eval for split in splits if split.eval}

    @property
    def enabled(self) -> bool:
        return self.config.eval_greedy or bool(self.config.eval_n and self.heldout_tasks)

    def __call__(self, model: Any, desc: str, *, rank: int = 0, world: int = 1, show: bool = True) -> dict[str, float]:
        """The metrics of ``model`` (left in train mode); with ``world`` processes, this one runs every
        ``world``-th task from ``rank`` and the results of all are gathered."""
        config = self.config
        template_kwargs = config.chat_template_kwargs
        policy = HFPolicy(
            model, tokenizer=self.tokenizer, device=str(model.device), chat_template_kwargs=template_kwargs
        )
        greedy = SamplingParams(temperature=0.0, max_tokens=config.max_completion_length)
        sampled = SamplingParams(temperature=config.temperature, max_tokens=config.max_completion_length)
        # (split, kind, env, tasks, samples per task)
        runs: list[tuple[str, str, str, list[Any], int]] = []
        if config.eval_greedy:
            runs += [("train", "greedy", env_id, tasks, 1) for env_id, tasks in self.train_tasks.items()]
            runs += [("heldout", "greedy", env_id, tasks, 1) for env_id, tasks in self.heldout_tasks.items()]
        if config.eval_n:
            runs += [
                ("heldout", "sampled", env_id, tasks, config.eval_n) for env_id, tasks in self.heldout_tasks.items()
            ]
        total = sum(len(tasks[rank::world]) * n for *_, tasks, n in runs)
        bar = progress_bar(config, total, desc, "ep", show=show)
        mine: list[tuple[str, str, str, int, int]] = []  # (split, kind, env, samples, correct) per task
        for split, kind, env_id, tasks, n in runs:
            share = tasks[rank::world]
            if not share:
                continue
            episodes = run_episodes(
                config,
                env_id,
                policy,
                share,
                n_rollouts=n,
                sampling_params=greedy if kind == "greedy" else sampled,
                progress=lambda _: bar.update(),
            )
            by_task: dict[str, list[bool]] = {}
            for episode in episodes:
                by_task.setdefault(episode.task_id, []).append(bool(episode.is_correct))
            mine += [(split, kind, env_id, len(results), sum(results)) for results in by_task.values()]
        bar.close()
        model.train()
        return self.metrics(gather(mine) if world > 1 else mine)

    def metrics(self, results: list[tuple[str, str, str, int, int]]) -> dict[str, float]:
        """Flat metrics from per-task results ``(split, kind, env, samples, correct)``."""
        scores: dict[str, list[float]] = {}
        n = self.config.eval_n
        for split, kind, env_id, samples, correct in results:
            names = {f"eval_{split}/greedy": correct / samples} if kind == "greedy" else {}
            if kind == "sampled":
                names = {"eval_heldout/pass@1": pass_at_k(samples, correct, 1)}
                names[f"eval_heldout/pass@{n}"] = pass_at_k(samples, correct, n)
            for name, value in names.items():
                scores.setdefault(name, []).append(value)
                if len(self.train_tasks) > 1:
                    scores.setdefault(f"{name}/{env_id}", []).append(value)
        found = {name: sum(values) / len(values) for name, values in sorted(scores.items())}
        for split in ("train", "heldout"):  # how many tasks a greedy share is of, so lines can say 41/64 too
            count = sum(1 for entry in results if entry[:2] == (split, "greedy"))
            if count:
                found[f"eval_{split}/tasks"] = count
        return found


def gather(results: list[Any]) -> list[Any]:
    from accelerate.utils import gather_object

    return list(gather_object(results))


def per_env(metrics: dict[str, float], name: str, env_ids: list[str]) -> dict[str, float]:
    """``{env: score}`` of metric ``name`` (``eval_train/greedy``), the shape of the summary's fields."""
    if len(env_ids) == 1:
        return {env_ids[0]: metrics[name]} if name in metrics else {}
    return {env_id: metrics[f"{name}/{env_id}"] for env_id in env_ids if f"{name}/{env_id}" in metrics}


def describe_scores(metrics: dict[str, float], when: str) -> str:
    """One line on an evaluation: ``greedy success before: training tasks 0.250, held-out tasks 0.125; ...``."""
    parts = []
    if "eval_train/greedy" in metrics:
        parts.append(f"training tasks {share_and_count(metrics, 'eval_train')}")
    if "eval_heldout/greedy" in metrics:
        parts.append(f"held-out tasks (never trained on) {share_and_count(metrics, 'eval_heldout')}")
    lines = [f"greedy success {when}: {', '.join(parts)}"] if parts else []
    sampled = [
        f"{name.removeprefix('eval_heldout/')} {value:.3f}"
        for name, value in metrics.items()
        if name.startswith("eval_heldout/pass@") and "/" not in name.removeprefix("eval_heldout/")  # all envs only
    ]
    if sampled:
        lines.append(f"held-out {', '.join(sampled)} {when}")
    return "; ".join(lines)


class EvalSchedule(TrainerCallback):
    """Asks the trainer to evaluate every ``eval_steps`` steps (0: never in between) and after the last step."""

    def __init__(self, eval_steps: int):
        self.eval_steps = eval_steps

    def on_step_end(self, args, state, control, **kwargs):
        periodic = self.eval_steps and state.global_step % self.eval_steps == 0
        if periodic or state.global_step == state.max_steps:
            control.should_evaluate = True
        return control
