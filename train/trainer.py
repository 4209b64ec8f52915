"""TRL's GRPOTrainer with generation through rllm-gym's envs, agents and engine, and our advantages in its loss.

:class:`RLLMGRPOTrainer` is the trainer (TRL's, through the one adapter that knows TRL's internals,
:class:`~rllm_gym.train.trl_adapter.GRPOAdapter`): at each step it collects the step's episodes first
(:meth:`~rllm_gym.train.rollout.EpisodeRollout.collect`, a :class:`~rllm_gym.train.rollout.RolloutBatch` with one
training row or more per prompt, padded with untrained rows to a size every process shares), gathers the episodes of
every process and builds the step's :class:`~rllm_gym.train.batch.TrainingBatch` (train/batch.py: the one place that
says what a step trains on, its advantages, loss mask and metrics). TRL is handed that batch's rows once (its
``rollout_func`` returns them; TRL's inputs are repeated once per row), builds its tensors from them, and its
advantages are replaced with the batch's, per row (``broadcast``) or per token (``per_step``, ``state``), its
``tool_mask`` multiplied by the batch's loss mask. Tested with TRL 1.16 (the ``rollout_func`` hook is experimental
there, hence the pinned range in pyproject.toml).

With ``max_staleness >= 1`` the episodes come from a generation worker process instead, up to that many optimizer steps
ahead (train/async_generation.py; with ``use_vllm``, a vLLM engine of its own in that process, train/async_vllm.py);
rows older than that are dropped from the loss and the rest weighted by train/off_policy.py's importance weights.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from transformers import TrainerCallback
from trl.models import unwrap_model_for_generation

from rllm_gym.engine.common import usable_cpus
from rllm_gym.engine.report import ErrorTally, all_errored, describe_errors
from rllm_gym.train.advantages import AdvantageConfig
from rllm_gym.train.async_generation import AsyncGenerator, WorkerSettings
from rllm_gym.train.async_vllm import VLLMGenerator, engine_settings
from rllm_gym.train.batch import (
    PaddingFacts,
    Staleness,
    TrainingBatch,
    build_training_batch,
    row_counts,
    training_view,
)
from rllm_gym.train.config_checks import TRAINER_THREADS, one_of
from rllm_gym.train.look_ahead import LookAhead
from rllm_gym.train.off_policy import OffPolicyCorrection
from rllm_gym.train.rollout import EnvSetup, EpisodeRollout, RolloutBatch
from rllm_gym.train.sequences import (
    TrainingSequence,
    decode_prompt,
    encode_prompt,
    placeholder_sequence,
    trajectory_to_sequences,
)
from rllm_gym.train.trl_adapter import SUPPORTED_TRL, GRPOAdapter, available
from rllm_gym.train.vllm_colocate import TrainerVLLMPolicy
from rllm_gym.types import Episode

# The rollout's names are re-exported: scripts and tests import the trainer and what it is built from in one place.
__all__ = [
    "EnvSetup",
    "EpisodeRollout",
    "RLLMGRPOTrainer",
    "RolloutBatch",
    "TrainerVLLMPolicy",
    "TrainingSequence",
    "TrainingStopped",
    "decode_prompt",
    "encode_prompt",
    "placeholder_sequence",
    "trajectory_to_sequences",
]


class TrainingStopped(RuntimeError):
    """Training cannot go on (e.g. every episode of several steps in a row ended in ERROR); the message says why."""


class _LogAtStart(TrainerCallback):
    """Logs the evaluation before training at step 0, after the ``report_to`` loggers have started."""

    def __init__(self, trainer: RLLMGRPOTrainer, metrics: dict[str, float]):
        self.trainer, self.metrics = trainer, metrics

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            self.trainer.log_evaluation(self.metrics)


def episode_reward(prompts: list[Any], completions: list[Any], trajectory_reward: list[float], **kwargs: Any):
    """TRL reward function: the trajectory reward the env gave (our advantages replace TRL's; this feeds its logs)."""
    return list(trajectory_reward)


def process_cores(num_processes: int) -> int:
    """The CPU cores one training process has: those it may run on, over the training processes on this machine
    (``LOCAL_WORLD_SIZE``, which torchrun sets under ``accelerate launch``; else all ``num_processes``)."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    local_processes = int(local) if local.isdigit() and int(local) >= 1 else num_processes
    return max(1, usable_cpus() // max(1, local_processes))


class RLLMGRPOTrainer(GRPOAdapter):
    """GRPOTrainer whose completions come from :class:`EpisodeRollout` and whose loss uses our advantages.

    It counts the run's episodes per termination reason (``terminations``) and its distinct errors (``errors``), and
    raises :class:`TrainingStopped` once ``max_error_steps`` steps in a row had only ERROR episodes (0 = never).

    ``evaluation`` (a :class:`rllm_gym.train.evaluation.Evaluator`) is what :meth:`evaluate` runs whenever the
    trainer's control asks for it (train/evaluation.py's ``EvalSchedule``); its metrics go through ``log`` to the
    callbacks and ``report_to`` loggers, and the last ones stay in ``last_evaluation``. ``evaluation_before``, the
    metrics taken before training, are logged at step 0 once those loggers are up.

    ``max_staleness`` (K, default 0: every step generates its own episodes with the weights it trains) starts a
    :class:`~rllm_gym.train.async_generation.AsyncGenerator` when training starts, hands it the weights after each
    optimizer step and the next K steps' prompts as TRL's batches are drawn (:meth:`get_batch_samples`), drops rows
    sampled more than K versions before the step's weights and corrects the rest with ``off_policy`` (default
    :class:`~rllm_gym.train.off_policy.OffPolicyCorrection`: GRPO's clipped ratio against the behaviour
    log-probabilities). With ``use_vllm`` in ``args`` (given by keyword) the worker is a
    :class:`~rllm_gym.train.async_vllm.VLLMGenerator` with a vLLM engine of its own (``vllm_engine``), and TRL's
    lock-step engine is not started (``self.args.use_vllm`` is False). ``async_trainer_threads`` ('share' or
    'fixed') is TrainConfig's: whether the trainer takes the worker's torch threads back while the worker waits.
    """

    def __init__(
        self,
        *args: Any,
        rollout: EpisodeRollout,
        advantage_config: AdvantageConfig,
        max_error_steps: int = 0,
        evaluation: Any = None,
        evaluation_before: dict[str, float] | None = None,
        max_staleness: int = 0,
        off_policy: OffPolicyCorrection | None = None,
        async_trainer_threads: str = "share",
        **kwargs: Any,
    ):
        if async_trainer_threads not in TRAINER_THREADS:
            raise ValueError(f"async_trainer_threads must be {one_of(TRAINER_THREADS)}, got {async_trainer_threads!r}")
        kwargs.setdefault("reward_funcs", [episode_reward])
        training_args = kwargs.get("args")
        async_vllm = bool(max_staleness and training_args is not None and training_args.use_vllm)
        if async_vllm:  # the generator's engine replaces TRL's, which would generate in the training's lock-step
            kwargs["args"] = copy.copy(training_args)
            kwargs["args"].use_vllm = False
        super().__init__(*args, **kwargs)
        # The worker's vLLM engine (its model folder, dtype, TRL's vllm_* settings), refused here when it cannot run.
        self.vllm_engine = None
        if async_vllm:
            self.vllm_engine = engine_settings(self.args, self.accelerator.unwrap_model(self.model))
        self.rollout = rollout
        self.generation = rollout.generation_for(self)  # the backend, chosen once (train/generation.py)
        self.max_staleness = max_staleness
        self.share_threads = async_trainer_threads == "share"
        # The worker of max_staleness >= 1, started with the training.
        self.generator: AsyncGenerator | VLLMGenerator | None = None
        self.look_ahead: LookAhead | None = None
        if max_staleness:
            self._check_async(rollout)
            self.off_policy = off_policy or OffPolicyCorrection()
            if self.off_policy.in_the_loss and not available("old_per_token_logps"):
                raise ValueError(
                    f"max_staleness={max_staleness} with the off-policy correction 'clip' needs TRL's loss to read "
                    f"old_per_token_logps from its inputs (TRL {SUPPORTED_TRL}): use async_is_mode truncate"
                )
            self.add_callback(_PublishWeights(self))
        self.advantage_config = advantage_config
        self.max_error_steps = max_error_steps
        self.terminations: Counter[str] = Counter()
        self.errors = ErrorTally()
        self.error_streak = 0  # steps in a row whose episodes all ended in ERROR
        self.evaluation = evaluation
        self.last_evaluation: dict[str, float] | None = None
        if evaluation_before:
            self.add_callback(_LogAtStart(self, evaluation_before))

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """Run :attr:`evaluation` on the model being trained (ZeRO-3 shards gathered once for all of it) and log it."""
        if self.evaluation is None:
            return {}
        with unwrap_model_for_generation(self.model_wrapped, self.accelerator) as model:
            metrics = self.evaluation(
                model,
                f"eval at step {self.state.global_step}",
                rank=self.accelerator.process_index,
                world=self.accelerator.num_processes,
                show=self.is_world_process_zero(),
            )
        self.last_evaluation = {"step": self.state.global_step, **metrics}
        self.log_evaluation(metrics)
        # As transformers' own evaluate: the callbacks hear of it, and the request is cleared (or the end of the epoch,
        # which checks it again, would evaluate the same weights a second time).
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def log_evaluation(self, metrics: dict[str, float]) -> None:
        """Log evaluation metrics on their own: in eval mode, GRPOTrainer.log leaves the training metrics of the steps
        since the last logging step where they are, for that step's line."""
        training = self.model.training
        self.model.eval()
        try:
            self.log(dict(metrics))
        finally:
            self.model.train(training)

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: train/grpo.py writes a filled-in card into each model folder (train/model_record.py)."""

    def _count_episodes(self, episodes: list[Episode]) -> None:
        """Add a step's episodes (every process's, each once) to the run's counts; stop on too many failed steps."""
        unique = list({episode.id: episode for episode in episodes}.values())
        self.terminations.update(e.termination_reason.value if e.termination_reason else "unknown" for e in unique)
        self.errors.add(unique)
        self.error_streak = self.error_streak + 1 if all_errored(unique) else 0
        if self.max_error_steps and self.error_streak >= self.max_error_steps:
            step_errors = ErrorTally()
            step_errors.add(unique)
            raise TrainingStopped(
                f"training stopped at step {self.state.global_step + 1}: every episode of the last "
                f"{self.error_streak} steps ended in ERROR (max_error_steps={self.max_error_steps}):\n"
                f"{describe_errors(step_errors.groups())}"
            )

    def _row_count(self, count: int) -> int:
        """Rows every process trains: the most any process has, then up to a batch TRL can group and split whole
        (a multiple of ``num_generations`` over all processes, of ``steps_per_generation`` on each)."""
        from accelerate.utils import gather_object

        rows = max(gather_object([count]))
        group = self.num_generations if self.model.training else self.num_generations_eval
        world = self.accelerator.num_processes
        while rows % self.args.steps_per_generation or (rows * world) % group:
            rows += 1
        return rows

    def _check_async(self, rollout: EpisodeRollout) -> None:
        """What asynchronous generation needs (train/config_checks.py refuses the same in a run's config)."""
        refused = {
            "TRL's own vLLM engine (pass args=... by keyword: the generator then runs an engine of its own)": (
                self.use_vllm
            ),
            "a policy_factory": rollout.policy_factory is not None,
            "num_iterations > 1": self.num_iterations != 1,
            "steps_per_generation != gradient_accumulation_steps": (
                self.args.steps_per_generation != self.args.gradient_accumulation_steps
            ),
        }
        for name, present in refused.items():
            if present:
                raise ValueError(f"max_staleness={self.max_staleness} is not supported with {name} yet: use 0")

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """TRL's training; with ``max_staleness >= 1`` the generation worker is stopped however it ends."""
        try:
            return super().train(*args, **kwargs)
        finally:
            self.close_generator()

    def start_generator(self) -> None:
        """Start the generation worker with the weights of now, as version ``global_step``, and the look-ahead that
        feeds it the coming steps' prompts."""
        self.close_generator()
        # Each training process starts its own worker (train/async_generation.py): half the process's cores are theirs.
        cores = process_cores(self.accelerator.num_processes)
        settings = WorkerSettings(
            self.generation.sampling_params(), self.generation.run_seed, self.generation.filler_id,
            self.generation.chat_template_kwargs, self.generation.token_history, max(1, cores // 2),
            self.accelerator.process_index, rollouts=self.max_staleness + 1,  # every step it may be handed, at once
            cores=cores,
        )  # fmt: skip
        # The steps in flight when version v is published were handed over at v - K .. v - 1: K + 1 copies.
        versions = self.max_staleness + 1
        with self.whole_weights() as model:
            if self.vllm_engine is not None:
                self.generator = VLLMGenerator(
                    self.rollout, model, self.processing_class, settings, self.vllm_engine,
                    version=self.state.global_step, versions=versions, share_threads=self.share_threads,
                )  # fmt: skip
            else:
                self.generator = AsyncGenerator(
                    self.rollout, model, self.processing_class, settings, version=self.state.global_step,
                    versions=versions, share_threads=self.share_threads,
                )  # fmt: skip
        self.look_ahead = LookAhead(self.max_staleness, self.generator.submit, self.args.steps_per_generation)

    @contextmanager
    def whole_weights(self) -> Iterator[Any]:
        """The trained model with whole parameters, for the generation worker: under DeepSpeed ZeRO-3 its shards
        gathered for the time of the block (every process must enter it: a collective), as the synchronous
        generation gathers them."""
        if not (self.is_deepspeed_enabled and self.accelerator.state.deepspeed_plugin.zero_stage == 3):
            yield self.accelerator.unwrap_model(self.model)
            return
        model = self.model_wrapped
        was_training = model.training
        with unwrap_model_for_generation(model, self.accelerator, gather_deepspeed3_params=True) as unwrapped:
            yield unwrapped
        model.train(was_training)

    def close_generator(self) -> None:
        """Stop the generation worker, if there is one."""
        if self.generator is not None:
            self.generator.close()
            self.generator, self.look_ahead = None, None

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
        """The step's batches; with ``max_staleness >= 1`` drawn through the look-ahead, which hands the generator
        the prompts of the next ``max_staleness`` steps as it draws them."""
        if self.look_ahead is not None:
            epoch_iterator = self.look_ahead.batches(epoch_iterator)
        return super().get_batch_samples(epoch_iterator, num_batches, device)

    def collect(self, prompts: list[Any]) -> RolloutBatch:
        """The step's episodes for this process's ``prompts``, padded to the rows every process trains."""
        batch = self.rollout.collect(prompts, self.generation)
        return batch.padded(self._row_count(len(batch.sequences)))

    def training_batch(self, prompts: list[Any]) -> TrainingBatch:
        """The step's batch: this process's episodes for ``prompts`` (vLLM's weights synced first), every process's
        gathered for the advantages and counts (:func:`~rllm_gym.train.batch.build_training_batch`)."""
        from accelerate.utils import gather_object

        # The episodes run first, so that TRL's batch can hold a row per training sample (a trajectory whose template
        # rewrote its history has several, see trajectory_to_sequences): TRL's inputs are repeated per row, padded
        # with untrained rows to a size every process shares. TRL syncs vLLM's weights in _generate, after the
        # rollout: here that would be too late, so it is done before.
        if self.use_vllm:
            from rllm_gym.train.vllm_cpu import sync_weights  # TRL's sync, or on vLLM's CPU build one that can load

            self.sync_vllm_weights(sync_weights)
        staleness = None
        if self.generator is not None:
            batch = self.generator.result(prompts)
            rollout = batch.padded(self._row_count(len(batch.sequences)))
            staleness = Staleness(self.state.global_step, self.max_staleness)
            # Workers started again after a crash (a generator that never restarts its worker counts none).
            restarts = {"async/restarts": float(getattr(self.generator, "restarts", 0))}
            rollout = dataclasses.replace(rollout, metrics={**rollout.metrics, **restarts})
        else:
            rollout = self.collect(prompts)
        local = [training_view(e, s) for e, s in zip(rollout.episodes, rollout.slots, strict=True)]
        everyone = gather_object(local)
        self._count_episodes(everyone)
        return build_training_batch(
            rollout.sequences,
            local,
            everyone,
            self.advantage_config,
            PaddingFacts(self.processing_class.pad_token_id, self.args.pad_to_multiple_of),
            rewards=rollout.rewards,
            counts=gather_object([row_counts(rollout.sequences, rollout.episodes)]),
            seconds=rollout.seconds,
            backend_metrics=rollout.metrics,
            staleness=staleness,
        )


class _PublishWeights(TrainerCallback):
    """Starts the generation worker when training starts (after a resume loaded its weights) and hands it the new
    weights after each optimizer step, before the trainer draws the next step's batch."""

    def __init__(self, trainer: RLLMGRPOTrainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer.start_generator()

    def on_step_end(self, args, state, control, **kwargs):
        trainer = self.trainer
        if trainer.generator is not None:
            with trainer.whole_weights() as model:
                trainer.generator.publish(model, state.global_step)
