"""GRPO training of an LLM agent in rllm-gym's environments, on TRL + Accelerate (+ DeepSpeed).

    accelerate launch --config_file train/accelerate/cpu_1.yaml train/grpo.py --config train/configs/demo_cpu.yaml
    python -m rllm_gym.train.grpo --config train/configs/demo_cpu.yaml --max_steps 50      # CLI flags override

Reads top to bottom: config, model, environments and data, a format warm start, the trainer, the run (with a greedy
evaluation before and after), and the reward curve. Generation goes through our envs, agents and engine
(:mod:`rllm_gym.train.trl_rollout`), advantages through :mod:`rllm_gym.train.advantages`, the loss through TRL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import json
import math
import os
import random
import sys
import time
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16; we pin its range

import torch
import yaml
from accelerate import PartialState
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser, TrainerCallback
from transformers.trainer_callback import PrinterCallback
from trl import GRPOConfig
from trl.models import unwrap_model_for_generation

import rllm_gym
from rllm_gym.engine import engine_for
from rllm_gym.engine.arguments import check_arguments
from rllm_gym.engine.report import describe_errors
from rllm_gym.log import LOG_LEVELS, configure_logging, logger
from rllm_gym.policies.base import SamplingParams, check_model_source
from rllm_gym.policies.hf import HFPolicy
from rllm_gym.policies.scripted import ScriptedPolicy
from rllm_gym.registry import env_ids
from rllm_gym.train.advantages import ESTIMATORS, MODES, AdvantageConfig
from rllm_gym.train.model_record import training_record, write_model_record
from rllm_gym.train.run_dir import (
    OutputDirError,
    StopOnInterrupt,
    clear_run,
    last_checkpoint,  # noqa: F401  (re-exported: tests and scripts find the checkpoint to resume from)
    prepare_output_dir,
    write_run_record,
)
from rllm_gym.train.trl_rollout import EnvSetup, EpisodeRollout, RLLMGRPOTrainer, TrainingStopped, encode_prompt
from rllm_gym.types import Episode

# Config

# GRPOConfig fields left to TRL (TrainConfig sets the others; the batch size follows from prompts_per_step).
_OURS = {"per_device_train_batch_size"}


@dataclass
class TrainConfig:
    """Every knob of a run; YAML files in train/configs/ set these fields and CLI flags override them."""

    # Environments and data
    env: list[str] = field(
        default_factory=lambda: ["rllm/FrozenLake-v0"],
        metadata={
            "help": "Env ids to train on; several ids mix environments in one run (see env_weights). A multi-agent "
            "id (rllm/SolverJudge-v0) trains every role: each task gives one prompt per trajectory (solver_0, "
            "solver_1, judge_0), kept next to each other so that they share episodes."
        },
    )
    env_weights: list[float] | None = field(
        default=None, metadata={"help": "Share of the prompts drawn from each env (default: equal)."}
    )
    tasks: list[str] | None = field(
        default=None,
        metadata={
            "help": "Per env, where its tasks come from: a JSONL file of task dicts, or 'seeds:N' for N reset seeds "
            "(the env draws its own tasks). Default: seeds:64 for every env."
        },
    )
    agent_args: str = field(
        default="{}",
        metadata={
            "help": "JSON dict of agent arguments, e.g. a system prompt; for a multi-agent env, keyed by role "
            '({"judge": {...}}).'
        },
    )
    env_args: str = field(default="{}", metadata={"help": "JSON dict of env constructor arguments."})
    max_turns: int = field(default=8, metadata={"help": "LLM calls per episode (one move per turn on FrozenLake)."})
    # Model
    model: str | None = field(default=None, metadata={"help": "Model folder or hub name; default: the tiny model."})
    lora: bool = field(default=False, metadata={"help": "Train a LoRA adapter instead of all weights (needs peft)."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank (16 is a common start)."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha (usually 2 x rank)."})
    # Format warm start
    warm_start_steps: int = field(
        default=0,
        metadata={
            "help": "Supervised steps on replies drawn at random from warm_start_replies, before RL: teaches the "
            "reply FORMAT only (random valid moves, not solutions). 0 = off; ~300 suits the tiny model."
        },
    )
    warm_start_replies: list[str] = field(
        default_factory=lambda: ["up", "down", "left", "right"],
        metadata={"help": "Replies the warm start imitates, one drawn uniformly per turn."},
    )
    warm_start_lr: float = field(default=3e-3, metadata={"help": "Learning rate of the warm start."})
    # GRPO
    num_generations: int = field(default=8, metadata={"help": "Group size G: rollouts per task (GRPO uses 8-64)."})
    prompts_per_step: int = field(
        default=8, metadata={"help": "Distinct tasks per optimizer step, over all processes together."}
    )
    max_completion_length: int = field(default=16, metadata={"help": "Tokens per reply (per turn)."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of rollouts (1.0 for GRPO)."})
    estimator: str = field(
        default="grpo", metadata={"help": f"Advantage estimator, one of {list(ESTIMATORS)} (see train/advantages.py)."}
    )
    advantage_mode: str = field(
        default="broadcast", metadata={"help": f"Multi-turn advantages, one of {list(MODES)}."}
    )
    norm_adv_by_std: bool = field(default=True, metadata={"help": "Divide GRPO advantages by the group std."})
    drop_uniform_groups: bool = field(default=False, metadata={"help": "Drop groups whose rewards are all equal."})
    exclude_termination: list[str] = field(
        default_factory=list,
        metadata={"help": "Termination reasons whose episodes are masked, e.g. max_response_length_exceeded."},
    )
    gamma: float = field(default=1.0, metadata={"help": "Discount of Monte Carlo returns (used by per_step)."})
    loss_type: str = field(
        default="dapo",
        metadata={"help": "TRL loss aggregation: grpo, dr_grpo, dapo, bnpo (Liu et al. 2025 for dr_grpo)."},
    )
    beta: float = field(default=0.0, metadata={"help": "KL coefficient; 0 needs no reference model (recommended)."})
    learning_rate: float = field(default=1e-6, metadata={"help": "Learning rate (1e-6 for 1B+ models; 1e-3 tiny)."})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "Learning-rate schedule (cosine recommended)."})
    max_steps: int = field(default=100, metadata={"help": "Optimizer steps."})
    seed: int = field(default=0, metadata={"help": "Seed of the data order, sampling and warm start."})
    warmup_ratio: float = field(
        default=0.0,
        metadata={"help": "Share of max_steps over which the learning rate warms up linearly (0.03-0.1 is common)."},
    )
    trl_args: str = field(
        default="{}",
        metadata={
            "help": "JSON dict of further TRL GRPOConfig fields. Each GRPOConfig field that TrainConfig lacks is also "
            "a --flag and a YAML key of its own (e.g. gradient_accumulation_steps, max_grad_norm, weight_decay, "
            "num_iterations, epsilon, save_total_limit, bf16; see --help); those land here."
        },
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "Recompute activations to save memory (on for billion-parameter models)."}
    )
    # Running
    output_dir: str = field(default="runs/grpo", metadata={"help": "Checkpoints, metrics.jsonl and reward_curve.png."})
    save_steps: int = field(default=100, metadata={"help": "Checkpoint every N steps (resume with --resume)."})
    resume: bool = field(
        default=False,
        metadata={
            "help": "Continue the run in output_dir from its last checkpoint (same settings; max_steps may grow)."
        },
    )
    overwrite: bool = field(
        default=False,
        metadata={
            "help": "Replace the run in output_dir (its checkpoints, final/, metrics; nothing else is deleted)."
        },
    )
    logging_steps: int = field(default=10, metadata={"help": "Log metrics every N steps."})
    report_to: list[str] = field(default_factory=list, metadata={"help": "TRL/transformers loggers (e.g. wandb)."})
    eval_greedy: bool = field(default=True, metadata={"help": "Greedy success on the tasks before and after."})
    max_error_steps: int = field(
        default=3,
        metadata={
            "help": "Stop (exit status 1, the errors named) after this many steps in a row whose episodes all ended "
            "in ERROR: a down server or a broken env would otherwise train on nothing. 0 = never stop."
        },
    )
    debug: bool = field(default=False, metadata={"help": "Show the traceback of an error, not only its message."})
    log_level: str = field(
        default="info", metadata={"help": f"Messages of the rllm_gym logger printed to stderr, one of {LOG_LEVELS}."}
    )
    use_vllm: bool = field(
        default=False, metadata={"help": "Generate with TRL's vLLM integration (GPU, the vllm extra); see vllm_mode."}
    )
    vllm_mode: str = field(
        default="colocate",
        metadata={
            "help": "'colocate': a vLLM engine inside each training process (tensor parallel 1); 'server': a "
            "`trl vllm-serve` process on GPUs of its own (see vllm_server_base_url and the README)."
        },
    )
    vllm_server_base_url: str | None = field(
        default=None, metadata={"help": "Server mode: the `trl vllm-serve` address, e.g. http://10.0.0.5:8000."}
    )
    vllm_server_timeout: float = field(
        default=240.0, metadata={"help": "Server mode: seconds to wait for the server to come up."}
    )
    vllm_gpu_memory_utilization: float = field(
        default=0.3, metadata={"help": "Share of each GPU vLLM may take in colocate mode (0.3 leaves room to train)."}
    )

    def __post_init__(self) -> None:
        if isinstance(self.env, str):
            raise ValueError(f"env must be a list of env ids, got the string {self.env!r}: write [{self.env!r}]")
        unknown = [env_id for env_id in self.env if env_id not in env_ids()]
        if unknown:
            raise ValueError(f"env {unknown} is not a registered id; choose from {env_ids()}")
        if self.env_weights is not None and len(self.env_weights) != len(self.env):
            raise ValueError(f"env_weights has {len(self.env_weights)} entries for {len(self.env)} envs: one each")
        if self.tasks is not None and len(self.tasks) != len(self.env):
            raise ValueError(f"tasks has {len(self.tasks)} entries for {len(self.env)} envs: one source per env")
        if self.num_generations < 2:
            raise ValueError(f"num_generations must be >= 2 (GRPO compares a group), got {self.num_generations}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        try:
            trl_args = json.loads(self.trl_args)
        except json.JSONDecodeError:
            trl_args = None
        if not isinstance(trl_args, dict):
            example = '{"max_grad_norm": 0.5}'
            raise ValueError(f"trl_args must be a JSON object such as '{example}', got {self.trl_args!r}")
        unknown = sorted(set(trl_args) - set(TRL_FIELDS))
        if unknown:
            raise ValueError(
                f"trl_args: {unknown[0]!r} is not a GRPOConfig field that TrainConfig leaves to TRL"
                f"{closest(unknown[0], sorted(TRL_FIELDS))}"
            )
        if self.max_error_steps < 0:
            raise ValueError(f"max_error_steps must be >= 0 (0 = never stop), got {self.max_error_steps}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {list(LOG_LEVELS)}, got {self.log_level!r}")
        for name in ("prompts_per_step", "max_turns", "max_completion_length", "max_steps", "save_steps", "lora_r"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warm_start_steps < 0 or (self.warm_start_steps and not self.warm_start_replies):
            raise ValueError("warm_start_steps must be >= 0, and > 0 needs at least one entry in warm_start_replies")
        for name, ok, allowed in (
            ("temperature", self.temperature >= 0, ">= 0"),
            ("learning_rate", self.learning_rate > 0, "> 0"),
            ("beta", self.beta >= 0, ">= 0 (0 = no KL term)"),
            ("gamma", 0 <= self.gamma <= 1, "in [0, 1]"),
        ):
            if not ok:
                raise ValueError(f"{name} must be {allowed}, got {getattr(self, name)}")
        if self.env_weights is not None and (min(self.env_weights) < 0 or sum(self.env_weights) <= 0):
            raise ValueError(f"env_weights must be >= 0 with a positive sum, got {self.env_weights}")
        if self.vllm_mode not in ("colocate", "server"):
            raise ValueError(f"vllm_mode must be 'colocate' or 'server', got {self.vllm_mode!r}")
        if self.vllm_server_base_url is not None and not self.vllm_server_base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"vllm_server_base_url must be an http(s) URL such as http://10.0.0.5:8000, "
                f"got {self.vllm_server_base_url!r}"
            )
        AdvantageConfig(self.estimator, self.advantage_mode, exclude_termination=tuple(self.exclude_termination))
        for name in ("agent_args", "env_args"):
            try:
                json.loads(getattr(self, name))
            except json.JSONDecodeError as error:
                raise ValueError(
                    f'{name} must be a JSON object, e.g. \'{{"system_prompt": "..."}}\': {error}'
                ) from error
        # agent_args and env_args go to every env of the run: a mix needs each argument to fit at least one of them.
        failures = []
        for env_id in self.env:
            try:
                check_arguments(env_id, agent_args=json.loads(self.agent_args), env_args=json.loads(self.env_args))
            except ValueError as error:
                failures.append(error)
        if len(failures) == len(self.env):
            raise failures[0]
        if self.model is not None:
            check_model_source(self.model, "model")


TRL_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(GRPOConfig)
    if f.init and f.name not in TrainConfig.__dataclass_fields__ and f.name not in _OURS
)


def closest(name: str, names: list[str], prefix: str = "") -> str:
    """`` (did you mean x?)`` for the closest of ``names`` to ``name`` (written after ``prefix``), or nothing."""
    close = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def trl_options() -> type:
    """A dataclass of the GRPOConfig fields TrainConfig lacks (their TRL defaults and help), for the parser."""
    hints = typing.get_type_hints(GRPOConfig)
    specs = []
    for name in TRL_FIELDS:
        original = GRPOConfig.__dataclass_fields__[name]
        help_text = f"(TRL) {original.metadata.get('help', '')}"
        kwargs = {"metadata": {**original.metadata, "help": help_text}}
        if original.default_factory is not dataclasses.MISSING:
            kwargs["default_factory"] = original.default_factory
        else:
            kwargs["default"] = original.default
        specs.append((name, hints[name], field(**kwargs)))
    return dataclasses.make_dataclass("TRLOptions", specs)


def load_config(argv: list[str] | None = None) -> tuple[TrainConfig, Path]:
    """Defaults, then the YAML of --config, then the other CLI flags; also the folder relative paths start from.

    Keys and flags named after GRPOConfig fields that TrainConfig lacks are collected into ``trl_args``.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    options = trl_options()
    parser = HfArgumentParser((TrainConfig, options))
    parser.add_argument("--config", help="YAML file of TrainConfig (and TRL GRPOConfig) fields")
    config_dir = Path.cwd()
    fields = sorted({*TrainConfig.__dataclass_fields__, *TRL_FIELDS})
    values: dict[str, Any] = {}
    if "--config" in argv:
        path = Path(argv[argv.index("--config") + 1])
        if not path.is_file():
            raise ValueError(f"--config {path}: no such file")
        config_dir = path.parent
        values = yaml.safe_load(path.read_text()) or {}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ValueError(
                f"{path}: unknown fields {unknown}{closest(unknown[0], fields)}; see TrainConfig in train/grpo.py "
                f"and TRL's GRPOConfig"
            )
        for key in ("agent_args", "env_args", "trl_args"):
            if isinstance(values.get(key), dict):
                values[key] = json.dumps(values[key])
        parser.set_defaults(**values)
    parsed = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    config, trl, remaining = parsed[0], parsed[1], parsed[-1]  # between them: the namespace of --config
    if remaining:
        flag = next((item for item in remaining if item.startswith("-")), remaining[0])
        name = flag.lstrip("-").split("=")[0].replace("-", "_")
        raise ValueError(f"unknown flag {flag}{closest(name, fields, '--')}; every TrainConfig field is a --flag")
    given = set(values) | {item.lstrip("-").split("=")[0] for item in argv if item.startswith("--")}
    chosen = {name: getattr(trl, name) for name in TRL_FIELDS if name in given}
    if chosen:
        config.trl_args = json.dumps({**json.loads(config.trl_args), **chosen}, default=str)
    return config, config_dir


def load_tasks(source: str | None, config_dir: Path) -> list[Any]:
    """Task dicts from a JSONL file, or reset seeds from 'seeds:N'."""
    source = source or "seeds:64"
    if source.startswith("seeds:"):
        return list(range(int(source.removeprefix("seeds:"))))
    path = Path(source) if Path(source).is_absolute() or Path(source).exists() else config_dir / source
    if not path.is_file():
        raise ValueError(f"tasks: {source} is neither 'seeds:N' nor a JSONL file (looked for {path})")
    tasks = []
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    tasks.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(f"tasks: {path}:{number} is not JSON: {error.msg}") from None
    return tasks


def trajectory_slots(env_id: str, env_args: dict[str, Any]) -> int:
    """Trajectories per episode: 1 for a single-agent env, one per PettingZoo agent for a multi-agent one."""
    if env_id not in env_ids(multi_agent=True):
        return 1
    return len(rllm_gym.make(env_id, **env_args).possible_agents)


def build_prompts(config: TrainConfig, config_dir: Path) -> tuple[Dataset, dict[str, list[Any]]]:
    """One dataset row per prompt of the run, envs mixed by weight; also each env's task list (for evaluation).

    The rows are in a seeded random order, and a multi-agent task's prompts (one per trajectory slot) are next to each
    other; with a multi-agent env the trainer keeps this order (no second shuffle), so they reach the same rollout
    call and share its episodes.
    """
    sources = config.tasks or [None] * len(config.env)
    tasks = {env_id: load_tasks(src, config_dir) for env_id, src in zip(config.env, sources, strict=True)}
    slots = {env_id: trajectory_slots(env_id, json.loads(config.env_args)) for env_id in config.env}
    weights = config.env_weights or [1.0] * len(config.env)
    rng = random.Random(config.seed)
    rows: list[dict[str, str]] = []
    while len(rows) < config.max_steps * config.prompts_per_step:
        env_id = rng.choices(config.env, weights=weights)[0]
        task = rng.choice(tasks[env_id])
        rows += [{"prompt": encode_prompt(env_id, task, slot)} for slot in range(slots[env_id])]
    return Dataset.from_list(rows[: config.max_steps * config.prompts_per_step]), tasks


def run_episodes(config: TrainConfig, env_id: str, policy: Any, tasks: list[Any], **kwargs: Any) -> list[Episode]:
    """Episodes of ``tasks`` with the run's agent, env arguments and turn limit (``kwargs``: engine options)."""
    n_rollouts = kwargs.pop("n_rollouts", 1)
    engine = engine_for(
        env_id,
        policy,
        agent_args=json.loads(config.agent_args),
        env_args=json.loads(config.env_args),
        max_steps=config.max_turns,
        **kwargs,
    )
    return asyncio.run(engine.run(tasks, n_rollouts=n_rollouts))


def greedy_success(model: Any, tokenizer: Any, config: TrainConfig, tasks: dict[str, list[Any]]) -> dict[str, float]:
    """Share of each env's tasks (the first 64) solved with greedy decoding; leaves the model in train mode."""
    policy = HFPolicy(model, tokenizer=tokenizer, device=str(model.device))
    sampling = SamplingParams(temperature=0.0, max_tokens=config.max_completion_length)
    scores = {}
    for env_id, env_tasks in tasks.items():
        episodes = run_episodes(config, env_id, policy, env_tasks[:64], sampling_params=sampling)
        scores[env_id] = sum(e.is_correct for e in episodes) / len(episodes)
    model.train()
    return scores


def warm_start(model: Any, tokenizer: Any, config: TrainConfig, tasks: dict[str, list[Any]]) -> float:
    """Supervised steps on random replies in the agent's chat format; returns the last loss."""
    rng = random.Random(config.seed)
    policy = ScriptedPolicy(lambda messages: rng.choice(config.warm_start_replies), tokenizer=tokenizer)
    examples: list[tuple[list[dict[str, Any]], str]] = []  # (the chat sent, the reply)
    for env_id, env_tasks in tasks.items():
        for episode in run_episodes(config, env_id, policy, env_tasks[:64], n_rollouts=4):
            # The reply format is the same at every turn: the first turns (short prompts) teach it cheaply.
            for trajectory in episode.trajectories:
                for step in trajectory.steps[:2]:
                    examples.append((list(step.chat_completions[:-1]), step.chat_completions[-1]["content"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.warm_start_lr)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(config.warm_start_steps):
        batch = rng.sample(examples, min(16, len(examples)))
        inputs, labels = [], []
        for messages, reply in batch:
            prompt = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            answer = [*tokenizer.encode(reply, add_special_tokens=False), tokenizer.eos_token_id]
            inputs.append([*prompt, *answer])
            labels.append([-100] * len(prompt) + answer)
        width = max(len(ids) for ids in inputs)
        pad = tokenizer.pad_token_id or 0
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids in inputs], device=model.device)
        label_ids = torch.tensor([ids + [-100] * (width - len(ids)) for ids in labels], device=model.device)
        attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in inputs], device=model.device)
        loss = model(input_ids=input_ids, attention_mask=attention, labels=label_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return float(loss.detach())


class ConsoleLog(TrainerCallback):
    """One line per logging step (instead of transformers' dict dumps), and every log kept for the curve.

    ``metrics.jsonl`` holds one run: a new run empties it; a run resumed from the checkpoint of step N keeps the
    records up to step N (a killed run may have logged steps after its last checkpoint, which are redone) and goes on
    from there, its ``elapsed_s`` continuing the earlier run's.
    """

    def __init__(self, output_dir: Path, resume_step: int | None = None, *, write: bool = True):
        self.path = output_dir / "metrics.jsonl"
        self.history: list[dict[str, Any]] = []
        if resume_step is not None and self.path.exists():
            records = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
            self.history = [record for record in records if record["step"] <= resume_step]
        if write:
            self.path.write_text("".join(json.dumps(record) + "\n" for record in self.history))
        earlier = self.history[-1]["elapsed_s"] if self.history else 0.0
        self.start = time.monotonic() - earlier

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "reward" not in logs or not state.is_world_process_zero:
            return
        record = {"step": state.global_step, "elapsed_s": time.monotonic() - self.start, **logs}
        self.history.append(record)
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        errors = logs.get("rollout/termination/error", 0.0)
        print(
            f"step {state.global_step:>5}  reward {logs['reward']:.3f}  loss {logs.get('loss', float('nan')):.4f}  "
            f"turns {logs.get('rollout/turns', float('nan')):.2f}  {record['elapsed_s']:.0f}s"
            + (f"  ERROR episodes {errors:.0%}" if errors else ""),
            flush=True,
        )
        if math.isnan(logs.get("loss", 0.0)):
            logger.warning("step %d: the loss is nan: %s", state.global_step, nan_reason(logs))


def nan_reason(logs: dict[str, Any]) -> str:
    """Why a logged loss is nan, as far as the step's other metrics tell."""
    if logs.get("rollout/termination/error", 0.0) >= 1.0:
        return "every episode of the step ended in ERROR, so no token was trained (see the errors above)"
    if math.isnan(logs.get("grad_norm", 0.0)) or math.isinf(logs.get("grad_norm", 0.0)):
        return (
            "the gradients overflowed (grad_norm is not finite): lower learning_rate, keep max_grad_norm > 0, "
            "or train in bf16/fp32 rather than fp16"
        )
    return (
        "no trained token or a diverged model: check that episodes produce replies (rollout/turns) and that "
        "exclude_termination does not mask them all; otherwise lower learning_rate"
    )


class RecordTraining(TrainerCallback):
    """Writes the training record and model card (train/model_record.py) into each checkpoint folder."""

    def __init__(self, output_dir: Path, config: dict[str, Any], summary: dict[str, Any]):
        self.output_dir, self.config, self.summary = output_dir, config, summary

    def on_save(self, args, state, control, **kwargs):
        folder = self.output_dir / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and folder.is_dir():
            before = self.summary.get("greedy_before")
            write_model_record(folder, training_record(self.config, steps=state.global_step, greedy_before=before))


def plot_rewards(history: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.plot([h["step"] for h in history], [h["reward"] for h in history])
    axes.set_xlabel("step")
    axes.set_ylabel("mean episode reward")
    axes.set_title("GRPO reward")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def load_model(config: TrainConfig) -> tuple[Any, Any, Any]:
    """The model, its tokenizer and the LoRA config (None for full fine-tuning)."""
    if config.model is None:
        from rllm_gym.tiny_model import default_model_path

        model_path = str(default_model_path())
    else:
        model_path = config.model
    model = AutoModelForCausalLM.from_pretrained(model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    peft_config = None
    if config.lora:
        try:
            from peft import LoraConfig
        except ImportError as error:
            raise SystemExit("lora: true needs peft: pip install peft") from error
        peft_config = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, target_modules="all-linear")
    return model, tokenizer, peft_config


def grpo_args(config: TrainConfig, output_dir: Path) -> GRPOConfig:
    """TRL's config of the run (building it sets up the processes: Accelerate's state exists afterwards)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    trl_args = json.loads(config.trl_args)
    accumulation = trl_args.get("gradient_accumulation_steps", 1)
    rollouts_per_step = config.prompts_per_step * config.num_generations
    if rollouts_per_step % (world_size * accumulation):
        raise ValueError(
            f"prompts_per_step x num_generations = {rollouts_per_step} rollouts per step must divide among "
            f"{world_size} processes x {accumulation} gradient accumulation steps: change prompts_per_step, "
            f"gradient_accumulation_steps or the number of processes"
        )
    ours = dict(
        output_dir=str(output_dir),
        # prompts_per_step stays per optimizer step: accumulation splits it into micro-batches.
        per_device_train_batch_size=rollouts_per_step // (world_size * accumulation),
        num_generations=config.num_generations,
        max_completion_length=config.max_completion_length,
        temperature=config.temperature,
        learning_rate=config.learning_rate,
        lr_scheduler_type=config.lr_scheduler_type,
        beta=config.beta,
        loss_type=config.loss_type,
        max_steps=config.max_steps,
        logging_steps=config.logging_steps,
        save_steps=config.save_steps,
        seed=config.seed,
        report_to=config.report_to,
        disable_tqdm=True,
        gradient_checkpointing=config.gradient_checkpointing,
        use_vllm=config.use_vllm,
        vllm_mode=config.vllm_mode,
        vllm_gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        vllm_server_base_url=config.vllm_server_base_url,
        vllm_server_timeout=config.vllm_server_timeout,
        # The rows are already in a seeded random order; TRL's shuffle on top would split a multi-agent task's
        # prompts (which share episodes only when they arrive together), so it is off when there are any.
        shuffle_dataset=not any(env_id in env_ids(multi_agent=True) for env_id in config.env),
        use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        warmup_steps=config.warmup_ratio,  # a float below 1 is a share of max_steps
    )
    return GRPOConfig(**{**ours, **trl_args})  # trl_args were set on purpose: they win


def main(argv: list[str] | None = None) -> dict[str, Any]:
    config, config_dir = load_config(argv)
    configure_logging(config.log_level)
    output_dir = Path(config.output_dir)
    # Checked on every process before anything loads; nothing is deleted until all of them have checked.
    checkpoint, record = prepare_output_dir(
        output_dir, asdict(config), resume=config.resume, overwrite=config.overwrite
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    random.seed(config.seed)
    torch.manual_seed(config.seed)

    # Model
    model, tokenizer, peft_config = load_model(config)

    # Environments and data
    dataset, tasks = build_prompts(config, config_dir)
    rollout = EpisodeRollout(
        [
            EnvSetup(env_id, agent_args=json.loads(config.agent_args), env_args=json.loads(config.env_args))
            for env_id in config.env
        ],
        max_steps=config.max_turns,
        gamma=config.gamma,
    )
    advantage_config = AdvantageConfig(
        estimator=config.estimator,
        mode=config.advantage_mode,
        norm_by_std=config.norm_adv_by_std,
        drop_uniform_groups=config.drop_uniform_groups,
        exclude_termination=tuple(config.exclude_termination),
    )
    args = grpo_args(config, output_dir)
    state = PartialState()
    state.wait_for_everyone()
    if config.overwrite and state.is_main_process:
        clear_run(output_dir)
    state.wait_for_everyone()

    # Warm start and the score to beat (a resumed run keeps the ones its first part recorded)
    summary: dict[str, Any] = {"config": asdict(config)}
    resume_step = int(checkpoint.name.removeprefix("checkpoint-")) if checkpoint else None
    if checkpoint is not None and state.is_main_process:
        print(f"resuming from {checkpoint} (step {resume_step} of {config.max_steps})", flush=True)
    for key in ("warm_start_loss", "greedy_before"):
        if key in record:
            summary[key] = record[key]
    if config.warm_start_steps and checkpoint is None:
        summary["warm_start_loss"] = warm_start(model, tokenizer, config, tasks)
    if config.eval_greedy:
        recorded = "greedy_before" in summary
        if not recorded:
            summary["greedy_before"] = greedy_success(model, tokenizer, config, tasks)
        if state.is_main_process:
            print(f"greedy success before{' (recorded)' if recorded else ''}: {summary['greedy_before']}", flush=True)
    if state.is_main_process:
        write_run_record(
            output_dir, {key: summary[key] for key in ("config", "warm_start_loss", "greedy_before") if key in summary}
        )

    # Training
    console = ConsoleLog(output_dir, resume_step, write=state.is_main_process)
    interrupt = StopOnInterrupt(announce=state.is_main_process)
    trainer = RLLMGRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=args,
        train_dataset=dataset,
        rollout=rollout,
        advantage_config=advantage_config,
        peft_config=peft_config,
        callbacks=[console, interrupt, RecordTraining(output_dir, asdict(config), summary)],
        max_error_steps=config.max_error_steps,
    )
    trainer.remove_callback(PrinterCallback)
    start = time.monotonic()
    try:
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    except TrainingStopped as stop:
        summary["stopped"] = str(stop)
        record_outcome(summary, trainer, output_dir)
        raise
    summary["train_seconds"] = time.monotonic() - start
    record_outcome(summary, trainer, output_dir)
    if interrupt.stopped_at is not None:
        summary["interrupted_at"] = interrupt.stopped_at
        raise Interrupted(f"checkpoint-{interrupt.stopped_at} saved in {output_dir}")

    # Results
    if config.eval_greedy:
        # Gathers ZeRO-3 shards once for the whole evaluation rather than layer by layer per token.
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as trained:
            summary["greedy_after"] = greedy_success(trained, tokenizer, config, tasks)
        if trainer.is_world_process_zero():
            print(f"greedy success after: {summary['greedy_after']}", flush=True)
    trainer.save_model(str(output_dir / "final"))  # on every rank: ZeRO-3 gathers the weights collectively
    summary["num_processes"] = trainer.accelerator.num_processes
    if trainer.is_world_process_zero():
        record = training_record(
            asdict(config),
            steps=trainer.state.global_step,
            greedy_before=summary.get("greedy_before"),
            greedy_after=summary.get("greedy_after"),
        )
        write_model_record(output_dir / "final", record)
        history = console.history
        if history:
            summary["reward_first"], summary["reward_last"] = history[0]["reward"], history[-1]["reward"]
            plot_rewards(history, output_dir / "reward_curve.png")
        write_summary(summary, output_dir)
        print(json.dumps({k: v for k, v in summary.items() if k != "config"}, default=str), flush=True)
    return summary


class Interrupted(Exception):
    """Training stopped on Ctrl-C after saving a checkpoint; the message names it."""


def record_outcome(summary: dict[str, Any], trainer: RLLMGRPOTrainer, output_dir: Path) -> None:
    """Put the run's termination counts and errors in the summary (and summary.json), and say what failed."""
    summary["termination_reasons"] = dict(sorted(trainer.terminations.items()))
    summary["errors"] = trainer.errors.groups()
    if trainer.errors and trainer.is_world_process_zero():
        count = sum(group["count"] for group in summary["errors"])
        logger.warning("%d training episodes ended in ERROR:\n%s", count, describe_errors(summary["errors"]))
    if trainer.is_world_process_zero():
        write_summary(summary, output_dir)


def write_summary(summary: dict[str, Any], output_dir: Path) -> None:
    with open(output_dir / "summary.json", "w") as handle:
        json.dump(summary, handle, indent=2, default=str)


def cli(argv: list[str] | None = None) -> int:
    """The command line: a run that cannot go on ends with one line on stderr and exit status 1 (130 on Ctrl-C);
    ``--debug true`` shows the traceback of an error too."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        main(argv)
    except (TrainingStopped, OutputDirError) as stop:
        print(f"rllm-gym train: {stop}", file=sys.stderr, flush=True)
        return 1
    except Interrupted:
        return 130  # StopOnInterrupt said so when Ctrl-C came
    except Exception as error:
        if "--debug" in argv:
            raise
        print(f"rllm-gym train: {type(error).__name__}: {error} (--debug shows the traceback)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rllm-gym train: interrupted; the last checkpoint saved before it is kept", file=sys.stderr, flush=True)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(cli())
