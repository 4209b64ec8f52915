"""The trainer's configuration: :class:`TrainConfig` (every knob of a run, with help; its cross-field checks are in
:mod:`rllm_gym.train.config_checks`) and :func:`load_config`, which reads it from defaults, a YAML file
(``--config PATH`` or ``--config=PATH``) and CLI flags, once: the dict fields (``agent_args``, ``env_args``,
``chat_template_kwargs``, ``trl_args``) are dicts from then on, a flag's JSON text parsed when the config is built.

Each GRPOConfig field that TrainConfig lacks is a YAML key and a ``--flag`` too (TRL's default and help); the values
given land in ``trl_args``, which :func:`rllm_gym.train.grpo.grpo_args` passes on to TRL. Unknown keys and flags fail
with the closest valid name.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import HfArgumentParser
from trl import GRPOConfig

from rllm_gym.log import LOG_LEVELS
from rllm_gym.train.advantages import ESTIMATORS, MODES
from rllm_gym.train.config_checks import DTYPES, JSON_OBJECT_FIELDS, check_config, closest, json_object
from rllm_gym.train.config_file import ConfigError, read_config_file
from rllm_gym.train.run_dir import DEFAULT_OUTPUT_DIR, missing_task_files
from rllm_gym.types import DEFAULT_MAX_TURNS

__all__ = ["DTYPES", "TRL_FIELDS", "TrainConfig", "closest", "load_config", "trl_options"]

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
    eval_tasks: list[str] | None = field(
        default=None,
        metadata={
            "help": "Per env, its eval split: tasks held out from training and evaluated before, during (eval_steps) "
            "and after training. Either a source of its own (a named split: a JSONL file, 'data/gsm8k@test', "
            "'seeds:100000-100064'), or a fraction (0.1) or count (64) of that env's tasks, drawn with split_seed. "
            "Train and eval never share a task: a training task the env poses like an eval task is skipped. "
            "Default: none (evaluation on the training tasks only)."
        },
    )
    split_seed: int = field(
        default=0, metadata={"help": "Seed of the eval split's draw (kept apart from seed: the split stays put)."}
    )
    agent_args: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "Dict of agent arguments (a flag takes it as JSON text), e.g. a system prompt; for a "
            "multi-agent env, keyed by role "
            '({"judge": {...}}).'
        },
    )
    env_args: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "Dict of env constructor arguments (a flag takes it as JSON text)."}
    )
    agent_program: str | None = field(
        default=None,
        metadata={
            "help": "module:function of an agent program fn(task, base_url) trained in place of the env's agent "
            "(rllm_gym.sdk): the env's tasks go to the program, whose calls through a gateway are the episode."
        },
    )
    reward_fn: str | None = field(
        default=None,
        metadata={
            "help": "module:function scoring an agent program's output, fn(task, output) -> float or "
            "RewardOutput; default: the reward the program posts to its session."
        },
    )
    max_turns: int = field(
        default=DEFAULT_MAX_TURNS,
        metadata={"help": "LLM calls per episode (one move per turn on FrozenLake); the engines' and eval's default."},
    )
    # Model
    model: str | None = field(default=None, metadata={"help": "Model folder or hub name; default: the tiny model."})
    model_shape: str = field(
        default="tiny",
        metadata={
            "help": "Size of the embedded model when model is not set: 'tiny' (0.14M parameters, the default) or "
            "'small' (0.55M, for skills that must generalize); see SHAPES in rllm_gym/tiny_model.py."
        },
    )
    dtype: str = field(
        default="auto",
        metadata={
            "help": f"Dtype the model and its checkpoints load in (resume too), one of {list(DTYPES)}: 'auto' keeps "
            "the saved one. bf16 halves memory on GPUs from Ampere on (recommended there; on a float32 model, "
            "'auto' still trains with bf16 autocast on such a GPU); fp16 weights train without a loss scaler "
            "(prefer bf16); fp32 turns autocast off."
        },
    )
    chat_template_kwargs: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "Dict passed to the tokenizer's chat template by every policy the trainer builds (rollouts, "
            "warm start, greedy evaluations), e.g. '{\"enable_thinking\": false}' for Qwen3 without reasoning. "
            "Recorded in the model folder for rllm-gym eval."
        },
    )
    token_history: str = field(
        default="sampled",
        metadata={
            "help": "How each LLM call's prompt is built in an episode: 'sampled' (recommended) continues the "
            "previous call's prompt and sampled tokens with the new messages' tokens, so a trajectory is one "
            "training row of exactly what the model saw; 'template' re-renders the whole chat each call with the "
            "chat template (e.g. Qwen3 then drops earlier <think> blocks), and the trajectory splits into rows "
            "where that rewrites history (rollout/prefix_mismatch)."
        },
    )
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
        default="broadcast",
        metadata={
            "help": f"Multi-turn advantages, one of {list(MODES)}: broadcast gives every step its trajectory's; "
            "per_step compares steps by turn index; state adds to broadcast a comparison of the discounted returns "
            "(gamma < 1) of steps taken from the same observation (GiGPO, Feng et al. 2025; see train/advantages.py)."
        },
    )
    norm_adv_by_std: bool = field(default=True, metadata={"help": "Divide GRPO advantages by the group std."})
    drop_uniform_groups: bool = field(default=False, metadata={"help": "Drop groups whose rewards are all equal."})
    exclude_termination: list[str] = field(
        default_factory=lambda: ["error", "infra_failed"],
        metadata={
            "help": "Termination reasons whose episodes are masked, e.g. max_response_length_exceeded. Default "
            "['error', 'infra_failed']: an episode that an exception ended (a policy or env server unreachable, an "
            "env or agent crash) or whose reward the infrastructure gave (sandbox or grader failed) has no reward "
            "of the model's own, so it is no training sample (both are retried first, and counted)."
        },
    )
    gamma: float = field(default=1.0, metadata={"help": "Discount of Monte Carlo returns (per_step, state)."})
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
    trl_args: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "Dict of further TRL GRPOConfig fields (a flag takes it as JSON text). Each GRPOConfig field "
            "that TrainConfig lacks is also "
            "a --flag and a YAML key of its own (e.g. gradient_accumulation_steps, max_grad_norm, weight_decay, "
            "num_iterations, epsilon, save_total_limit, bf16; see --help); those land here."
        },
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "Recompute activations to save memory (on for billion-parameter models)."}
    )
    # Running
    output_dir: str = field(
        default=DEFAULT_OUTPUT_DIR, metadata={"help": "Checkpoints, metrics.jsonl and reward_curve.png."}
    )
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
    progress: bool = field(
        default=True,
        metadata={
            "help": "Progress bars on stderr for the warm start, the greedy evaluations and the training steps; "
            "drawn only when stderr is a terminal. false (or --no_progress, or TQDM_DISABLE=1) never draws them."
        },
    )
    report_to: list[str] = field(default_factory=list, metadata={"help": "TRL/transformers loggers (e.g. wandb)."})
    eval_greedy: bool = field(
        default=True,
        metadata={
            "help": "Greedy success before and after training (and every eval_steps), on up to eval_limit training "
            "tasks per env and on the eval split (eval_tasks)."
        },
    )
    eval_steps: int = field(
        default=0, metadata={"help": "Evaluate every N optimizer steps as well (0: only before and after)."}
    )
    eval_n: int = field(
        default=0,
        metadata={
            "help": "Samples per held-out task at the training temperature, for pass@1 and pass@eval_n on the eval "
            "split (0: greedy only). 4-16 is common."
        },
    )
    eval_limit: int = field(
        default=64, metadata={"help": "Tasks per env and split that an evaluation runs (the first ones)."}
    )
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

    # Asynchronous generation (train/async_generation.py)
    max_staleness: int = field(
        default=0,
        metadata={
            "help": "K: how many policy versions (optimizer steps) generation may run ahead of training. 0 "
            "is the synchronous trainer; K >= 1 generates the next K steps' episodes in a worker process while a "
            "step trains, each step with the weights of K steps before (K + 1 copies of the weights in shared "
            "memory: a run is the same on every rerun of its seed, see async_trainer_threads), drops any row "
            "sampled more than K versions before the weights it trains and corrects the rest for being off-policy "
            "(async_is_*). "
            "The worker runs the model on the CPU or, with use_vllm, a vLLM engine of its own; "
            "several processes, DeepSpeed ZeRO-2/3, multi-agent envs and LoRA run too (README: Asynchronous GRPO)."
        },
    )
    async_trainer_threads: str = field(
        default="share",
        metadata={
            "help": "With max_staleness >= 1 and the model on the CPU: 'share' (the trainer gives up the worker's "
            "torch threads while the worker runs a step and takes them back while it waits: faster) or 'fixed' "
            "(the trainer keeps to the threads the worker leaves it). With 'share' the trainer's thread count "
            "follows the worker's timing: a rerun of a seed is the same bit for bit only where torch's CPU kernels "
            "give the same results at any thread count (they did for the main job and the tests' models; a sum over "
            "some sizes does not); 'fixed' keeps every rerun the same whatever the kernels."
        },
    )
    async_is_cap: float = field(
        default=2.0,
        metadata={
            "help": "With max_staleness >= 1 and async_is_mode truncate or mask: the cap C of the importance weights "
            "pi_theta / pi_behaviour (truncated to at most C, or masked above C; 2.0 as in TRL's vLLM correction)."
        },
    )
    async_is_level: str = field(
        default="token",
        metadata={
            "help": "With max_staleness >= 1 and async_is_mode truncate or mask: importance weights per 'token' "
            "(recommended) or per 'sequence' (with clip, the ratio's level is trl_args' importance_sampling_level)."
        },
    )
    async_is_mode: str = field(
        default="clip",
        metadata={
            "help": "With max_staleness >= 1: 'clip' (recommended: GRPO's clipped ratio measured against the "
            "behaviour log-probabilities, PPO's trust region around the policy that sampled each row), 'truncate' "
            "(weights min(pi_theta / pi_behaviour, cap), as in IMPALA and TRL's vLLM correction), 'mask' (weights "
            "above the cap train nothing), or 'off' (no correction: the stale rows train as if on-policy, for "
            "comparison only)."
        },
    )

    def __post_init__(self) -> None:
        # The one place the JSON-object fields are read: a flag's JSON text becomes a dict, and stays one.
        for name in JSON_OBJECT_FIELDS:
            setattr(self, name, json_object(name, getattr(self, name)))
        check_config(self, TRL_FIELDS)


TRL_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(GRPOConfig)
    if f.init and f.name not in TrainConfig.__dataclass_fields__ and f.name not in _OURS
)


def _parser_fields(name: str, source: type, names: tuple[str, ...], help_prefix: str = "") -> type:
    """A dataclass of ``source``'s fields ``names`` as the flag parser takes them: same defaults and help, a
    JSON-object field as text (HfArgumentParser cannot parse a dict; :class:`TrainConfig` reads the text once)."""
    hints = typing.get_type_hints(source)
    specs = []
    for field_name in names:
        original = source.__dataclass_fields__[field_name]
        help_text = f"{help_prefix}{original.metadata.get('help', '')}"
        kwargs: dict[str, Any] = {"metadata": {**original.metadata, "help": help_text}}
        hint = hints[field_name]
        if source is TrainConfig and field_name in JSON_OBJECT_FIELDS:
            hint, kwargs["default"] = str, "{}"
        elif original.default_factory is not dataclasses.MISSING:
            kwargs["default_factory"] = original.default_factory
        else:
            kwargs["default"] = original.default
        specs.append((field_name, hint, field(**kwargs)))
    return dataclasses.make_dataclass(name, specs)


def trl_options() -> type:
    """A dataclass of the GRPOConfig fields TrainConfig lacks (their TRL defaults and help), for the parser."""
    return _parser_fields("TRLOptions", GRPOConfig, TRL_FIELDS, help_prefix="(TRL) ")


class _Parser(HfArgumentParser):
    """HfArgumentParser whose usage errors (a flag's value of the wrong type, a missing value) raise
    :class:`ConfigError` with argparse's one line, instead of printing the trainer's whole usage and exiting."""

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(f"{message} (rllm-gym train --help lists every flag)")


def config_path(argv: list[str]) -> Path | None:
    """The YAML file of ``--config PATH`` or ``--config=PATH`` in ``argv`` (None without one); a missing path or a
    second --config is a :class:`ConfigError`."""
    paths = []
    for index, item in enumerate(argv):
        if item.startswith("--config="):
            paths.append(item.removeprefix("--config="))
        elif item == "--config":
            following = argv[index + 1] if index + 1 < len(argv) else ""
            paths.append("" if following.startswith("--") else following)
    if len(paths) > 1:
        raise ConfigError(f"--config is given {len(paths)} times: give one YAML file (flags override its keys)")
    if paths and not paths[0]:
        raise ConfigError("--config needs a YAML file: --config train/configs/demo_cpu.yaml")
    return Path(paths[0]) if paths else None


def load_config(argv: list[str], prog: str | None = None) -> tuple[TrainConfig, Path]:
    """Defaults, then the YAML of --config, then the other flags of ``argv`` (a command line without the program's
    name, which ``prog`` gives ``--help``); also the folder relative paths start from.

    Keys and flags named after GRPOConfig fields that TrainConfig lacks are collected into ``trl_args``. Every setting
    that cannot be used raises :class:`ConfigError` (one line naming it; a YAML value's also names the file).
    """
    argv = list(argv)
    options = trl_options()
    flags = _parser_fields("TrainFlags", TrainConfig, tuple(TrainConfig.__dataclass_fields__))
    parser = _Parser((flags, options), prog=prog)
    parser.add_argument("--config", help="YAML file of TrainConfig (and TRL GRPOConfig) fields")
    fields = sorted({*TrainConfig.__dataclass_fields__, *TRL_FIELDS})
    values: dict[str, Any] = {}
    path = config_path(argv)
    config_dir = path.parent if path is not None else Path.cwd()
    if path is not None:
        hints = {**typing.get_type_hints(options), **typing.get_type_hints(TrainConfig)}
        values = read_config_file(path, hints)
        parser.set_defaults(**values)
    given = {item.lstrip("-").split("=")[0].replace("-", "_") for item in argv if item.startswith("--")}
    # look_for_args_file off: HfArgumentParser would also read flags from a file named after sys.argv[0] (grpo.args)
    parsed, trl, _, remaining = parser.parse_args_into_dataclasses(
        args=argv, return_remaining_strings=True, look_for_args_file=False
    )
    if remaining:  # between trl and remaining: the namespace of --config
        flag = next((item for item in remaining if item.startswith("-")), remaining[0])
        name = flag.lstrip("-").split("=")[0].replace("-", "_")
        raise ConfigError(f"unknown flag {flag}{closest(name, fields, '--')}; every TrainConfig field is a --flag")
    settings = {name: getattr(parsed, name) for name in TrainConfig.__dataclass_fields__}
    chosen = {name: getattr(trl, name) for name in TRL_FIELDS if name in given | set(values)}
    try:
        if chosen:  # a TRL field's own key or flag wins over the same key in trl_args
            settings["trl_args"] = {**json_object("trl_args", settings["trl_args"]), **chosen}
        config = TrainConfig(**settings)
    except ValueError as error:  # TrainConfig's checks, every problem on a line of its own
        file_keys = set(values) - given
        problems = [from_file(line, path, file_keys) for line in str(error).splitlines()]
        problems += missing_task_files(settings["tasks"], settings["eval_tasks"], config_dir)
        raise ConfigError(*problems) from error
    missing = missing_task_files(config.tasks, config.eval_tasks, config_dir)
    if missing:
        raise ConfigError(*missing)
    return config, config_dir


def from_file(message: str, path: Path | None, file_keys: set[str]) -> str:
    """A check's message, prefixed with the config file when the field it starts with was set there (not by a flag)."""
    field_name = message.split(" ", 1)[0].rstrip(":")
    return f"{path}: {message}" if path is not None and field_name in file_keys else message
