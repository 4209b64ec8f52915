"""TRL's GRPOTrainer with generation through rllm-gym's envs, agents and engine, and our advantages in its loss.

:class:`RLLMGRPOTrainer` narrows TRL's ``_generate_and_score_completions``: it collects the step's episodes first
(:meth:`~rllm_gym.train.rollout.EpisodeRollout.collect`, a :class:`~rllm_gym.train.rollout.RolloutBatch` with one
training row or more per prompt, padded with untrained rows to a size every process shares), gathers the episodes of
every process and builds the step's :class:`~rllm_gym.train.batch.TrainingBatch` (train/batch.py: the one place that
says what a step trains on, its advantages, loss mask and metrics). TRL is handed that batch's rows once (its
``rollout_func`` returns them; TRL's inputs are repeated once per row), builds its tensors from them, and its
advantages are replaced with the batch's, per row (``broadcast``) or per token (``per_step``, ``state``), its
``tool_mask`` multiplied by the batch's loss mask. Tested with TRL 1.16 (the ``rollout_func`` hook is experimental
there, hence the pinned range in pyproject.toml).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import TrainerCallback
from trl import GRPOTrainer
from trl.models import unwrap_model_for_generation

from rllm_gym.engine.report import ErrorTally, all_errored, describe_errors
from rllm_gym.train.advantages import AdvantageConfig
from rllm_gym.train.batch import PaddingFacts, TrainingBatch, build_training_batch, row_counts, training_view
from rllm_gym.train.rollout import EnvSetup, EpisodeRollout, RolloutBatch
from rllm_gym.train.sequences import (
    TrainingSequence,
    decode_prompt,
    encode_prompt,
    placeholder_sequence,
    trajectory_to_sequences,
    width_groups,
)
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


def _outside_a_step(prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
    """TRL's ``rollout_func`` between steps: rows exist only inside ``_generate_and_score_completions``."""
    raise RuntimeError("RLLMGRPOTrainer's rows exist only in _generate_and_score_completions (collect, then TRL)")


def episode_reward(prompts: list[Any], completions: list[Any], trajectory_reward: list[float], **kwargs: Any):
    """TRL reward function: the trajectory reward the env gave (our advantages replace TRL's; this feeds its logs)."""
    return list(trajectory_reward)


@contextmanager
def _completion_positions_only() -> Iterator[None]:
    """While inside, TRL's fused LM head (``trl.trainer.utils.add_fused_lm_head``) computes the log-probabilities and
    entropies of the scored positions only (labels not -100: the completion), as it does where its Triton kernel runs.

    TRL 1.16 couples the two: off CUDA/XPU it runs its PyTorch kernel over every position of every row, prompt and
    padding included, then zeroes what is not scored. Our rows are long prompts with replies of a few tokens (the main
    job: ~46 prompt tokens, 2 reply tokens), so that was most of the LM head's forward and backward on a CPU: ~0.4 s of
    a ~1.6 s step. The kernel itself still takes its own device check (the PyTorch one here); only the choice of rows
    changes, and every scored position gets the same value up to the rounding of a smaller matrix product (tested).
    Restored on exit; a TRL without ``_use_triton`` in that module is left as it is. Process-wide while inside, which
    the trainer's single-threaded loss computation allows."""
    from trl.trainer import utils as trl_utils

    original = getattr(trl_utils, "_use_triton", None)
    if original is None:
        yield
        return
    trl_utils._use_triton = lambda device: True  # read by the fused forward only, to pick the compact rows
    try:
        yield
    finally:
        trl_utils._use_triton = original


class RLLMGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose completions come from :class:`EpisodeRollout` and whose loss uses our advantages.

    It counts the run's episodes per termination reason (``terminations``) and its distinct errors (``errors``), and
    raises :class:`TrainingStopped` once ``max_error_steps`` steps in a row had only ERROR episodes (0 = never).

    ``evaluation`` (a :class:`rllm_gym.train.evaluation.Evaluator`) is what :meth:`evaluate` runs whenever the
    trainer's control asks for it (train/evaluation.py's ``EvalSchedule``); its metrics go through ``log`` to the
    callbacks and ``report_to`` loggers, and the last ones stay in ``last_evaluation``. ``evaluation_before``, the
    metrics taken before training, are logged at step 0 once those loggers are up.
    """

    def __init__(
        self,
        *args: Any,
        rollout: EpisodeRollout,
        advantage_config: AdvantageConfig,
        max_error_steps: int = 0,
        evaluation: Any = None,
        evaluation_before: dict[str, float] | None = None,
        **kwargs: Any,
    ):
        kwargs.setdefault("reward_funcs", [episode_reward])
        super().__init__(*args, rollout_func=_outside_a_step, **kwargs)
        self.rollout = rollout
        self.generation = rollout.generation_for(self)  # the backend, chosen once (train/generation.py)
        self.advantage_config = advantage_config
        self.max_error_steps = max_error_steps
        self.terminations: Counter[str] = Counter()
        self.errors = ErrorTally()
        self.error_streak = 0  # steps in a row whose episodes all ended in ERROR
        self.evaluation = evaluation
        self.last_evaluation: dict[str, float] | None = None
        if evaluation_before:
            self.add_callback(_LogAtStart(self, evaluation_before))

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **multimodal: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """TRL's, with its fused LM head scoring only the completion positions on every device (see
        :func:`_completion_positions_only`), run on groups of rows of similar length, each cut to its own widest row.

        TRL pads every prompt on the left to the batch's longest: one long prompt (a reply the env could not parse
        brings its error message into the next one) made every row of a main-job step ~108 tokens wide instead of ~48,
        and the step twice as slow. Rows are grouped by their width without the left padding
        (:func:`~rllm_gym.train.sequences.width_groups`) and put back in order; each row's values are the same up to
        rounding (its positions shift, and rotary attention depends only on their differences). Rows with images
        are scored as TRL scores them; with several processes the rows are one group, cut to their common padding
        only: every process must run the same number of forwards there (DDP syncs buffers, DeepSpeed ZeRO-3 and FSDP
        gather parameters, collectively at each one), and each process's rows group differently.
        """

        def score(rows: torch.Tensor | slice, width: int) -> tuple[torch.Tensor, torch.Tensor | None, Any]:
            width = min(max(width, logits_to_keep + 1), input_ids.size(1))  # the last prompt token scores the first
            return super(RLLMGRPOTrainer, self)._get_per_token_logps_and_entropies(
                model,
                input_ids[rows, -width:],
                attention_mask[rows, -width:],
                logits_to_keep,
                batch_size,
                compute_entropy,
                compute_aux_loss,
                **multimodal,
            )

        with _completion_positions_only():
            if any(value is not None for value in multimodal.values()):
                return score(slice(None), input_ids.size(1))
            widths = (input_ids.size(1) - (attention_mask.cumsum(dim=1) == 0).sum(dim=1)).tolist()  # (B,) no left pad
            groups = width_groups(widths) if self.accelerator.num_processes == 1 else []
            if len(groups) <= 1:
                return score(slice(None), max(widths, default=0))
            device = input_ids.device
            scored = [score(torch.tensor(rows, device=device), max(widths[row] for row in rows)) for rows in groups]
            order = torch.tensor([row for rows in groups for row in rows], device=device).argsort()  # (B,) as before
            logps = torch.cat([logps for logps, _, _ in scored])[order]  # (B, T)
            entropies = torch.cat([entropies for _, entropies, _ in scored])[order] if compute_entropy else None
            aux_loss = torch.stack([aux for _, _, aux in scored]).mean() if compute_aux_loss else None
            return logps, entropies, aux_loss

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

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """Warn about the missing keys of a resumed checkpoint that were really not loaded. A tied weight (the
        embedded model's lm_head is its embedding) is saved once, under the name it shares, so every resume "missed"
        it although loading the shared tensor loaded it too: that warning looked like a corrupt checkpoint."""
        state = self.model.state_dict(keep_vars=True)
        missing = set(load_result.missing_keys)
        loaded = {tensor.data_ptr() for name, tensor in state.items() if name not in missing}
        kept = [name for name in load_result.missing_keys if name not in state or state[name].data_ptr() not in loaded]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=kept))

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

    def collect(self, prompts: list[Any]) -> RolloutBatch:
        """The step's episodes for this process's ``prompts``, padded to the rows every process trains."""
        batch = self.rollout.collect(prompts, self.generation)
        return batch.padded(self._row_count(len(batch.sequences)))

    @contextmanager
    def _trl_rows(self, batch: TrainingBatch) -> Iterator[None]:
        """TRL's ``rollout_func`` answers with ``batch``'s rows for the block: TRL calls the function it holds from
        inside ``_generate`` (with the trainer, not our batch), so the batch is bound to it for this one call."""

        def rows(prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
            if len(prompts) != len(batch.rows):
                raise RuntimeError(f"{len(prompts)} prompts for {len(batch.rows)} collected rows")
            return batch.trl_output()

        self.rollout_func = rows
        try:
            yield
        finally:
            self.rollout_func = _outside_a_step

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        from accelerate.utils import gather_object

        # The episodes run first, so that TRL's batch can hold a row per training sample (a trajectory whose template
        # rewrote its history has several, see trajectory_to_sequences): TRL's inputs are repeated per row, padded
        # with untrained rows to a size every process shares. TRL syncs vLLM's weights in _generate, after the
        # rollout: here that would be too late, so it is done before.
        if self.use_vllm and self.state.global_step != self._last_loaded_step:
            from rllm_gym.train.vllm_cpu import sync_weights  # TRL's sync, or on vLLM's CPU build one that can load

            sync_weights(self.vllm_generation)
            self._last_loaded_step = self.state.global_step
        rollout = self.collect([example["prompt"] for example in inputs])
        local = [training_view(e, s) for e, s in zip(rollout.episodes, rollout.slots, strict=True)]
        everyone = gather_object(local)
        self._count_episodes(everyone)
        batch = build_training_batch(
            rollout.sequences,
            local,
            everyone,
            self.advantage_config,
            PaddingFacts(self.processing_class.pad_token_id, self.args.pad_to_multiple_of),
            rewards=rollout.rewards,
            counts=gather_object([row_counts(rollout.sequences, rollout.episodes)]),
            seconds=rollout.seconds,
            backend_metrics=rollout.metrics,
        )
        with self._trl_rows(batch):
            output = super()._generate_and_score_completions([dict(inputs[max(s.source, 0)]) for s in batch.rows])
        return self._with_batch(output, batch)

    def _with_batch(self, output: dict[str, Any], batch: TrainingBatch) -> dict[str, Any]:
        """TRL's batch ``output`` with ``batch``'s advantages and loss mask in it, and ``batch``'s metrics logged."""
        completion_ids = output["completion_ids"]
        if tuple(completion_ids.shape) != batch.completion_ids.shape:
            raise RuntimeError(
                f"TRL built completions of shape {tuple(completion_ids.shape)} from rows the TrainingBatch pads to "
                f"{batch.completion_ids.shape}: TRL's padding changed, update train/batch.py's PaddingFacts"
            )
        device = completion_ids.device
        output["advantages"] = torch.as_tensor(batch.loss_advantages, device=device)
        mask = output.get("tool_mask")  # TRL's env_mask, less truncated completions when it masks those
        loss_mask = torch.as_tensor(batch.loss_mask, device=device)
        output["tool_mask"] = loss_mask if mask is None else mask * loss_mask
        trained_tokens = (output["completion_mask"] * output["tool_mask"]).sum()
        output["num_items_in_batch"] = self.accelerator.gather(trained_tokens).sum()
        mode = "train" if self.model.training else "eval"
        for name, value in batch.metrics.items():
            self._metrics[mode][name].append(value)
        return output
