"""GRPO training of an LLM agent in rllm-gym's environments, on TRL + Accelerate (+ DeepSpeed).

    accelerate launch --config_file train/accelerate/cpu_1.yaml train/grpo.py --config train/configs/demo_cpu.yaml
    python -m rllm_gym.train.grpo --config train/configs/demo_cpu.yaml --max_steps 50      # CLI flags override

Reads top to bottom, as :func:`run` does: the config (parsed once into a ``TrainConfig`` by
:mod:`rllm_gym.train.config`, from the argv the command line, :mod:`rllm_gym.train.command`, reads once), the model,
environments and data (each env's tasks split into training and held-out ones, :mod:`rllm_gym.train.splits`), what
training starts from (a format warm start, :mod:`rllm_gym.train.warm_start`, and the evaluation before, on training
and held-out tasks, :mod:`rllm_gym.train.evaluation`), the trainer, the training, and the results. The summary is
built from what these functions return (:mod:`rllm_gym.train.summary`): the scores before, the training's
``TrainingOutcome`` (its steps, episodes and the run's own ``metrics.jsonl``), the evaluation after. What the run
prints is in :mod:`rllm_gym.train.console`. Each step's episodes go through our envs, agents and engine
(:mod:`rllm_gym.train.rollout`; the generation backend, chosen once, in :mod:`rllm_gym.train.generation`), the
trainer that turns them into the step's batch is :mod:`rllm_gym.train.trainer` (the batch:
:mod:`rllm_gym.train.batch`), the loss TRL's.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16; we pin its range
if __name__ == "__main__":  # the command line reads argv here, once, and refuses what it can before the imports below
    from rllm_gym.train.command import train_command  # (seconds); the run is this file imported as a module

    sys.exit(train_command(sys.argv[1:], prog=os.path.basename(sys.argv[0])))

import torch
from accelerate import PartialState
from datasets import Dataset
from tqdm.contrib.logging import logging_redirect_tqdm
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from transformers.trainer_callback import PrinterCallback
from trl import GRPOConfig

import rllm_gym
from rllm_gym.log import configure_logging, logger
from rllm_gym.registry import env_ids
from rllm_gym.train.advantages import AdvantageConfig
from rllm_gym.train.baselines import blind_baselines, describe_blind_baselines
from rllm_gym.train.command import cli  # noqa: F401  (re-exported: the command line, as before)
from rllm_gym.train.config import DTYPES, TrainConfig, load_config
from rllm_gym.train.console import ConsoleLog, StepBar, plot_rewards, quiet_libraries, say, without_build_notices
from rllm_gym.train.evaluation import EvalSchedule, Evaluator, describe_scores
from rllm_gym.train.interrupt import StopOnInterrupt
from rllm_gym.train.model_record import heldout_files, read_training_record, training_record, write_model_record
from rllm_gym.train.off_policy import OffPolicyCorrection
from rllm_gym.train.run_dir import (
    check_same_split,
    clear_run,
    earlier_results,
    last_checkpoint,  # noqa: F401  (re-exported: tests and scripts find the checkpoint to resume from)
    prepare_output_dir,
    write_run_record,
)
from rllm_gym.train.splits import TaskSplit, make_split, split_record
from rllm_gym.train.summary import (
    TrainingOutcome,
    episode_fields,
    evaluation_fields,
    read_run_log,
    report_episodes,
    reward_fields,
    scores,
    write_summary,
)
from rllm_gym.train.trainer import EnvSetup, EpisodeRollout, RLLMGRPOTrainer, TrainingStopped, encode_prompt
from rllm_gym.train.warm_start import warm_start

# Config: TrainConfig and load_config (YAML, then CLI flags) live in train/config.py, its checks in config_checks.py.

# What run.json keeps of the summary: what a resume reads back (train/run_dir.py).
RUN_RECORD_KEYS = ("config", "split", "warm_start_loss", "evaluation_before")


# Model


def model_path(config: TrainConfig) -> str:
    """The model folder or hub id the run loads (the embedded model when ``config.model`` is unset)."""
    if config.model is None:
        from rllm_gym.tiny_model import default_model_path

        return str(default_model_path(shape=config.model_shape))
    return config.model


def load_dtype(config: TrainConfig) -> torch.dtype:
    """The dtype :func:`load_model` gives the model, known before loading it ('auto': the checkpoint's config)."""
    name = DTYPES[config.dtype]
    if name == "auto":
        saved = AutoConfig.from_pretrained(model_path(config)).dtype
        return saved if isinstance(saved, torch.dtype) else getattr(torch, saved or "float32")
    return getattr(torch, name)


def load_model(config: TrainConfig) -> tuple[Any, Any, Any]:
    """The model (in the config's dtype), its tokenizer and the LoRA config (None for full fine-tuning).

    Call it after :func:`grpo_args`: under DeepSpeed ZeRO-3 with ``zero3_init_flag``, building the training arguments
    is what makes ``from_pretrained`` partition the weights as it loads them (no process holds the whole model)."""
    # Explicit on every launcher: a resumed run loads its checkpoint's weights into this model, in this dtype.
    model = AutoModelForCausalLM.from_pretrained(model_path(config), dtype=DTYPES[config.dtype])
    tokenizer = AutoTokenizer.from_pretrained(model_path(config))
    peft_config = None
    if config.lora:
        try:
            from peft import LoraConfig
        except ImportError as error:
            raise SystemExit("lora: true needs peft: pip install peft") from error
        peft_config = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, target_modules="all-linear")
    return model, tokenizer, peft_config


# Environments and data


def make_splits(config: TrainConfig, config_dir: Path) -> list[TaskSplit]:
    """Each env's tasks split into training and held-out tasks (train/splits.py; paths relative to ``config_dir``)."""
    sources = config.tasks or [None] * len(config.env)
    held_out = config.eval_tasks or [None] * len(config.env)
    env_args = config.env_args
    return [
        make_split(
            env_id,
            source,
            eval_source,
            config_dir,
            split_seed=config.split_seed,
            eval_limit=config.eval_limit,
            env_args=env_args,
        )
        for env_id, source, eval_source in zip(config.env, sources, held_out, strict=True)
    ]


def trajectory_slots(env_id: str, env_args: dict[str, Any]) -> int:
    """Trajectories per episode: 1 for a single-agent env, one per PettingZoo agent for a multi-agent one."""
    if env_id not in env_ids(multi_agent=True):
        return 1
    return len(rllm_gym.make(env_id, **env_args).possible_agents)


def build_prompts(config: TrainConfig, splits: list[TaskSplit]) -> Dataset:
    """One dataset row per prompt of the run, envs mixed by weight, each task drawn from its env's training tasks
    (never one of its held-out tasks).

    The rows are in a seeded random order, and a multi-agent task's prompts (one per trajectory slot) are next to each
    other; with a multi-agent env the trainer keeps this order (no second shuffle), so they reach the same rollout
    call and share its episodes.
    """
    slots = {split.env_id: trajectory_slots(split.env_id, config.env_args) for split in splits}
    weights = config.env_weights or [1.0] * len(splits)
    rng = random.Random(config.seed)
    rows: list[dict[str, str]] = []
    while len(rows) < config.max_steps * config.prompts_per_step:
        split = rng.choices(splits, weights=weights)[0]
        task = split.draw(rng)
        rows += [{"prompt": encode_prompt(split.env_id, task, slot)} for slot in range(slots[split.env_id])]
    return Dataset.from_list(rows[: config.max_steps * config.prompts_per_step])


def clear_earlier_run(output_dir: Path, state: PartialState, *, overwrite: bool) -> None:
    """With ``overwrite``, delete the earlier run in ``output_dir`` (process 0), once every process has checked the
    folder and before any of them writes to it."""
    state.wait_for_everyone()
    if overwrite and state.is_main_process:
        clear_run(output_dir)
    state.wait_for_everyone()


@contextmanager
def whole_weights(model: Any, *, modify: bool = False) -> Iterator[None]:
    """The whole model on every process, for what runs before the trainer wraps it (warm start, evaluation before).

    Under ZeRO-3 with ``zero3_init_flag`` the loaded weights are partitioned; these are gathered for the block and
    partitioned again after it, with process 0's values when ``modify`` (the warm start runs the same steps on every
    process). Without ZeRO-3 partitioning it does nothing."""
    from transformers.integrations import is_deepspeed_zero3_enabled

    if not is_deepspeed_zero3_enabled():
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0 if modify else None):
        yield


# Training


# TrainConfig fields that GRPOConfig has under the same name and meaning: passed on as they are.
SAME_IN_TRL = (
    "num_generations", "max_completion_length", "temperature", "learning_rate", "lr_scheduler_type", "beta",
    "loss_type", "max_steps", "logging_steps", "save_steps", "seed", "report_to", "use_vllm", "vllm_mode",
    "vllm_gpu_memory_utilization", "vllm_server_base_url", "vllm_server_timeout",
)  # fmt: skip


def grpo_args(config: TrainConfig, output_dir: Path, dtype: torch.dtype = torch.float32) -> GRPOConfig:
    """TRL's config of the run for a model loaded in ``dtype`` (building it sets up the processes: Accelerate's state
    exists afterwards)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    trl_args = config.trl_args
    accumulation = trl_args.get("gradient_accumulation_steps", 1)
    rollouts_per_step = config.prompts_per_step * config.num_generations
    if rollouts_per_step % (world_size * accumulation):
        raise ValueError(
            f"prompts_per_step x num_generations = {rollouts_per_step} rollouts per step must divide among "
            f"{world_size} processes x {accumulation} gradient accumulation steps: change prompts_per_step, "
            f"gradient_accumulation_steps or the number of processes"
        )
    # bf16 weights train with bf16 set (DeepSpeed's "auto" reads it); float32 ones with bf16 autocast on a GPU that has
    # it, unless dtype: fp32 asked for float32 throughout; fp16 weights without autocast (no loss scaler takes them).
    gpu_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    bf16 = dtype == torch.bfloat16 or (dtype == torch.float32 and config.dtype == "auto" and gpu_bf16)
    ours = dict(
        {name: getattr(config, name) for name in SAME_IN_TRL},
        output_dir=str(output_dir),
        # prompts_per_step stays per optimizer step: accumulation splits it into micro-batches.
        per_device_train_batch_size=rollouts_per_step // (world_size * accumulation),
        disable_tqdm=True,
        # Every parameter that trains gets a gradient each step: DDP's search for unused ones (transformers turns it
        # on without activation checkpointing) only costs a graph traversal and a warning per process.
        ddp_find_unused_parameters=False,
        **{checkpointing_name(): config.gradient_checkpointing},
        # The rows are already in a seeded random order; TRL's shuffle on top would split a multi-agent task's
        # prompts (which share episodes only when they arrive together), so it is off when there are any.
        shuffle_dataset=not any(env_id in env_ids(multi_agent=True) for env_id in config.env),
        use_cpu=not torch.cuda.is_available(),
        bf16=bf16,
        chat_template_kwargs=config.chat_template_kwargs,
        warmup_steps=config.warmup_ratio,  # a float below 1 is a share of max_steps
    )
    return GRPOConfig(**{**ours, **trl_args})  # trl_args were set on purpose: they win


def checkpointing_name() -> str:
    """GRPOConfig's name for activation checkpointing: transformers 5.23 renamed gradient_checkpointing (the old name
    still works but warns once per run); older versions know only the old one."""
    fields = GRPOConfig.__dataclass_fields__
    return "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"


# Run


def main(argv: list[str]) -> dict[str, Any]:
    """One run with the flags ``argv`` (the command line's, without the program's name); returns its summary. Errors
    propagate: :func:`cli` is the command line, which turns them into a message and an exit status."""
    return start(*load_config(argv))


def start(config: TrainConfig, config_dir: Path) -> dict[str, Any]:
    """The run of a loaded config, with its logging set up; returns its summary."""
    configure_logging(config.log_level)
    quiet_libraries(config.progress)
    # Log records print above the progress bars, not on their line; DeepSpeed's CPU backend prints a build notice on
    # stdout whenever it starts its communication (at the processes' start, again when the trainer is built).
    with logging_redirect_tqdm(loggers=[logger]), without_build_notices():
        return run(config, config_dir)


def run(config: TrainConfig, config_dir: Path) -> dict[str, Any]:
    """The run of ``config`` (relative task paths start from ``config_dir``); returns its summary."""
    settings, output_dir = asdict(config), Path(config.output_dir)
    # Checked on every process before anything loads; nothing is deleted until all of them have checked.
    checkpoint, record = prepare_output_dir(output_dir, settings, resume=config.resume, overwrite=config.overwrite)
    random.seed(config.seed)
    torch.manual_seed(config.seed)

    # Environments and data: the eval split first, so that no training task is one of its tasks. Read before the
    # output folder is made: data that cannot be read leaves no empty folder behind.
    splits = make_splits(config, config_dir)
    split = split_record(splits, settings)
    if checkpoint is not None:
        check_same_split(split, record, output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    # Model: the training arguments first (under ZeRO-3 they make the load partition the weights, see load_model)
    args = grpo_args(config, output_dir, load_dtype(config))
    model, tokenizer, peft_config = load_model(config)
    dataset = build_prompts(config, splits)
    evaluator = Evaluator(config, tokenizer, splits)
    state = PartialState()
    clear_earlier_run(output_dir, state, overwrite=config.overwrite)

    # Warm start and the scores to beat (a resumed run keeps the ones its first part recorded)
    before = {"config": settings, "split": split, "heldout_data": heldout_files(config.eval_tasks, config_dir)}
    before |= before_training(config, model, tokenizer, evaluator, (checkpoint, record, output_dir), state)
    if state.is_main_process:  # what a resume reads back: the settings, the split, the warm start and the eval before
        write_run_record(output_dir, {key: before[key] for key in RUN_RECORD_KEYS if key in before})

    # Training
    started_at = checkpoint_step(checkpoint)
    steps = StepBar(config)
    # RecordTraining first: a checkpoint's folder is complete when ConsoleLog says it was saved; StopOnInterrupt
    # before ConsoleLog: the step Ctrl-C stops after is logged before its checkpoint is saved.
    callbacks = [RecordTraining(output_dir, settings, before), StopOnInterrupt(announce=state.is_main_process)]
    callbacks += [ConsoleLog(output_dir, started_at or None, write=state.is_main_process), steps]
    logged_before = before.get("evaluation_before") if checkpoint is None else None  # at step 0 of a new run
    trainer = build_trainer(
        config, args, (model, tokenizer, peft_config), dataset, evaluator, callbacks, logged_before
    )
    try:
        outcome = train(trainer, checkpoint, started_at, output_dir)
    except TrainingStopped as stop:
        episodes = episode_fields(trainer.terminations, trainer.errors.groups())
        report_episodes(before | {"stopped": str(stop)} | episodes, output_dir, write=state.is_main_process)
        raise
    finally:
        steps.close()
        for task_split in splits:
            task_split.close()
    summary = before | {"train_seconds": outcome.seconds} | outcome.episodes
    report_episodes(summary, output_dir, write=state.is_main_process)
    if outcome.steps < config.max_steps:  # Ctrl-C stopped it (train/interrupt.py), which said so
        raise Interrupted(f"checkpoint-{outcome.steps} saved in {output_dir}")
    return finish(config, trainer, summary | evaluation_fields(outcome, config.env), outcome, state)


def before_training(
    config: TrainConfig, model: Any, tokenizer: Any, evaluator: Evaluator, resumed: tuple, state: PartialState
) -> dict[str, Any]:
    """The summary's fields of what training starts from: the format warm start's loss, the evaluation before and its
    scores, and the figure a policy blind to the observation reaches on the held-out tasks (process 0 only). A run
    resumed from ``resumed`` (its checkpoint, run record and output folder) keeps what its first part recorded, and
    one that extends a finished run its earlier results."""
    checkpoint, record, output_dir = resumed
    show = state.is_main_process
    found = {key: record[key] for key in ("warm_start_loss", "evaluation_before") if key in record}
    if checkpoint is not None:
        if show:
            say(f"resuming from {checkpoint} (step {checkpoint_step(checkpoint)} of {config.max_steps})")
        found |= earlier_parts(output_dir, checkpoint, write=show)
    if config.warm_start_steps and checkpoint is None:
        with whole_weights(model, modify=True):
            found["warm_start_loss"] = warm_start(model, tokenizer, config, evaluator.train_tasks, show=show)
    if evaluator.enabled:
        recorded = "evaluation_before" in found
        if not recorded:
            with whole_weights(model):
                found["evaluation_before"] = evaluator(
                    model, "eval before", rank=state.process_index, world=state.num_processes, show=show
                )
        found |= scores(found["evaluation_before"], "before", config.env)
        if show:
            say(describe_scores(found["evaluation_before"], "before" + (" (recorded)" if recorded else "")))
    if show:
        found |= blind_baselines(config.env, config.env_args, evaluator.heldout_tasks, config.max_turns)
        for line in describe_blind_baselines(found):
            say(line)
    return found


def checkpoint_step(checkpoint: Path | None) -> int:
    """The step a ``checkpoint-N`` folder was saved at (0 for None: a run that starts from the beginning)."""
    return int(checkpoint.name.removeprefix("checkpoint-")) if checkpoint is not None else 0


def earlier_parts(output_dir: Path, checkpoint: Path, *, write: bool) -> dict[str, Any]:
    """A resume that extends a finished run keeps what the run reached before: the results after each earlier end
    (the summary's ``earlier``, then summary.json's and final/'s record), and the checkpoint saved at that end, the
    same weights as final/ then, gets final/'s record and card, its scores after included. Empty for a run that had
    not finished."""
    earlier = earlier_results(output_dir)
    if not earlier:
        return {}
    final = read_training_record(output_dir / "final")
    if write and final is not None and checkpoint.name == f"checkpoint-{final['steps']}":
        write_model_record(checkpoint, final)
        say(f"extending the run finished at step {final['steps']}: its results are kept (summary.json's 'earlier')")
    return {"earlier": earlier}


# Training


def build_trainer(
    config: TrainConfig,
    args: GRPOConfig,
    loaded: tuple[Any, Any, Any],
    dataset: Dataset,
    evaluator: Evaluator,
    callbacks: list[TrainerCallback],
    evaluation_before: dict[str, float] | None,
) -> RLLMGRPOTrainer:
    """The trainer of the run: the ``loaded`` model, tokenizer and LoRA config, episodes of the config's envs
    through our agents and engine, our advantages, the ``callbacks`` and the evaluator's schedule;
    ``evaluation_before`` (None: nothing) is logged at step 0."""
    model, tokenizer, peft_config = loaded
    rollout = EpisodeRollout(
        [EnvSetup(env_id, agent_args=config.agent_args, env_args=config.env_args) for env_id in config.env],
        max_turns=config.max_turns,
        gamma=config.gamma,
        chat_template_kwargs=config.chat_template_kwargs,
        token_history=config.token_history,
        agent_program=config.agent_program,
        reward_fn=config.reward_fn,
    )
    advantage_config = AdvantageConfig(
        estimator=config.estimator,
        mode=config.advantage_mode,
        norm_by_std=config.norm_adv_by_std,
        drop_uniform_groups=config.drop_uniform_groups,
        exclude_termination=tuple(config.exclude_termination),
    )
    evaluation: dict[str, Any] = {"callbacks": callbacks, "evaluation_before": evaluation_before}
    if evaluator.enabled:
        evaluation |= {"callbacks": [*callbacks, EvalSchedule(config.eval_steps)], "evaluation": evaluator}
    trainer = RLLMGRPOTrainer(
        model, args=args, processing_class=tokenizer, train_dataset=dataset, peft_config=peft_config,
        rollout=rollout, advantage_config=advantage_config, max_error_steps=config.max_error_steps, **evaluation,
        max_staleness=config.max_staleness, async_trainer_threads=config.async_trainer_threads,
        off_policy=OffPolicyCorrection(config.async_is_cap, config.async_is_level, config.async_is_mode),
    )  # fmt: skip
    trainer.remove_callback(PrinterCallback)
    return trainer


def train(trainer: RLLMGRPOTrainer, checkpoint: Path | None, started_at: int, output_dir: Path) -> TrainingOutcome:
    """Train from ``checkpoint`` (step ``started_at``; None: from the start) to the last step, or to the step Ctrl-C
    stopped it after; returns what it reached, its episodes and the run's log (read once every process is done).
    Raises :class:`TrainingStopped` when too many steps in a row had only ERROR episodes."""
    start = time.monotonic()
    output = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    seconds = time.monotonic() - start
    trainer.accelerator.wait_for_everyone()  # process 0 has logged the evaluation after the last step
    return TrainingOutcome(
        started_at=started_at,
        steps=output.global_step,
        seconds=seconds,
        episodes=episode_fields(trainer.terminations, trainer.errors.groups()),
        log=read_run_log(output_dir),
    )


class RecordTraining(TrainerCallback):
    """Writes the training record and model card (train/model_record.py) into each checkpoint folder, with the
    ``scores`` before training."""

    def __init__(self, output_dir: Path, config: dict[str, Any], scores: dict[str, Any]):
        self.output_dir, self.config, self.scores = output_dir, config, scores

    def on_save(self, args, state, control, **kwargs):
        folder = self.output_dir / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and folder.is_dir():
            write_model_record(folder, training_record(self.config, steps=state.global_step, scores=self.scores))


class Interrupted(Exception):
    """Training stopped on Ctrl-C after saving a checkpoint; the message names it."""


# Results


def finish(
    config: TrainConfig,
    trainer: RLLMGRPOTrainer,
    summary: dict[str, Any],
    outcome: TrainingOutcome,
    state: PartialState,
) -> dict[str, Any]:
    """Save the trained model in final/ with its record and card, draw the reward curve, and write and print the
    summary (the evaluation after the last step ran in the trainer, which logged it); returns the summary."""
    output_dir = Path(config.output_dir)
    show = state.is_main_process
    if "evaluation_after" in summary and show:
        say(describe_scores(summary["evaluation_after"], "after"))
    trainer.save_model(str(output_dir / "final"))  # on every rank: ZeRO-3 gathers the weights collectively
    summary = summary | {"num_processes": state.num_processes}
    if not show:
        return summary
    write_model_record(output_dir / "final", training_record(asdict(config), steps=outcome.steps, scores=summary))
    say(f"saved {output_dir / 'final'} (the trained model, step {outcome.steps})")
    summary |= reward_fields(outcome.log)
    if outcome.log.training:
        plot_rewards(outcome.log.training, output_dir / "reward_curve.png", outcome.log.evaluations)
    write_summary(summary, output_dir)
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}, default=str), flush=True)
    return summary
