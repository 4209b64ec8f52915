"""The cross-field checks of a training config (:class:`~rllm_gym.train.config.TrainConfig` runs them when it is
built), and the one place its JSON-object fields are read: each check raises ValueError naming the field, what it must
be and, where there is one, the fix. Kept apart from the fields so that each file reads as one thing."""

from __future__ import annotations

import difflib
import json
from typing import Any

from rllm_gym.engine.arguments import check_arguments
from rllm_gym.log import LOG_LEVELS
from rllm_gym.policies.base import check_model_source
from rllm_gym.registry import UnknownEnvError, env_spec
from rllm_gym.tiny_model import SHAPES
from rllm_gym.train.advantages import ESTIMATORS, MODES, AdvantageConfig
from rllm_gym.train.off_policy import LEVELS as IS_LEVELS
from rllm_gym.train.off_policy import MODES as IS_MODES
from rllm_gym.types import TerminationReason

__all__ = ["DTYPES", "JSON_OBJECT_FIELDS", "check_config", "closest", "json_object"]

# The dtype names TrainConfig.dtype accepts -> the name transformers loads with ("auto": the checkpoint's own).
DTYPES = {
    "auto": "auto",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "fp32": "float32",
    "float32": "float32",
}
# The fields that hold a dict, with an example of one for messages; a flag gives them as JSON text.
JSON_OBJECT_FIELDS = {
    "agent_args": '{"system_prompt": "..."}',
    "env_args": '{"size": 6}',
    "chat_template_kwargs": '{"enable_thinking": false}',
    "trl_args": '{"max_grad_norm": 0.5}',
}

TRAINER_THREADS = ("share", "fixed")  # async_trainer_threads: train/async_generation.py's share_threads


def closest(name: str, names: list[str], prefix: str = "") -> str:
    """`` (did you mean x?)`` for the closest of ``names`` to ``name`` (written after ``prefix``), or nothing."""
    close = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def json_object(name: str, value: Any) -> dict[str, Any]:
    """The dict a JSON-object field holds: a dict as it is, JSON text (a flag's value) parsed; anything else is an
    error naming the field and an example of what it takes."""
    example = JSON_OBJECT_FIELDS[name]
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"{name} must be a JSON object, e.g. '{example}': {error}") from error
    else:
        parsed = value
    if not isinstance(parsed, dict):
        raise ValueError(f"{name} must be a JSON object, e.g. '{example}', got {value!r}")
    return dict(parsed)


def check_config(config: Any, trl_fields: tuple[str, ...]) -> None:
    """Every check of ``config`` (its JSON-object fields already dicts); ``trl_fields`` are the GRPOConfig fields that
    ``trl_args`` may set. Raises one ValueError naming every problem found, one per line."""
    problems = _problems(config, trl_fields)
    if problems:
        raise ValueError("\n".join(problems))


def _problems(config: Any, trl_fields: tuple[str, ...]) -> list[str]:
    """Each check's message for ``config`` (empty when it is good); a check that needs a valid field runs only when
    that field is valid."""
    problems: list[str] = []
    if isinstance(config.env, str):
        return [f"env must be a list of env ids, got the string {config.env!r}: write [{config.env!r}]"]
    envs_known = True
    for env_id in config.env:
        try:
            env_spec(env_id)  # the closest ids, as rllm_gym.make and rllm-gym eval --env name them
        except UnknownEnvError as error:
            problems.append(f"env: {error}")
            envs_known = False
    if config.env_weights is not None and len(config.env_weights) != len(config.env):
        problems.append(f"env_weights has {len(config.env_weights)} entries for {len(config.env)} envs: one each")
    if config.tasks is not None and len(config.tasks) != len(config.env):
        problems.append(f"tasks has {len(config.tasks)} entries for {len(config.env)} envs: one source per env")
    if config.eval_tasks is not None:
        config.eval_tasks = [str(source) for source in config.eval_tasks]  # YAML may give 0.1 or 64 as numbers
        if len(config.eval_tasks) != len(config.env):
            problems.append(
                f"eval_tasks has {len(config.eval_tasks)} entries for {len(config.env)} envs: one eval split per env"
            )
    for name in ("eval_steps", "eval_n"):
        if getattr(config, name) < 0:
            problems.append(f"{name} must be >= 0 (0 = off), got {getattr(config, name)}")
    if config.eval_n == 1:
        problems.append("eval_n must be 0 (greedy only) or >= 2 samples per task: pass@k compares samples")
    if config.eval_n and config.eval_tasks is None:
        problems.append("eval_n samples the eval split: set eval_tasks too (e.g. [0.1] or ['seeds:1000-1064'])")
    if config.eval_steps and not (config.eval_greedy or config.eval_n):
        problems.append("eval_steps needs something to evaluate: eval_greedy: true, or eval_n with eval_tasks")
    if config.num_generations < 2:
        problems.append(f"num_generations must be >= 2 (GRPO compares a group), got {config.num_generations}")
    if not 0 <= config.warmup_ratio < 1:
        problems.append(f"warmup_ratio must be in [0, 1), got {config.warmup_ratio}")
    unknown = sorted(set(config.trl_args) - set(trl_fields))
    if unknown:
        problems.append(
            f"trl_args: {unknown[0]!r} is not a GRPOConfig field that TrainConfig leaves to TRL"
            f"{closest(unknown[0], sorted(trl_fields))}"
        )
    if config.max_error_steps < 0:
        problems.append(f"max_error_steps must be >= 0 (0 = never stop), got {config.max_error_steps}")
    if config.log_level not in LOG_LEVELS:
        problems.append(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {config.log_level!r}")
    for name in (
        "prompts_per_step",
        "max_turns",
        "max_completion_length",
        "max_steps",
        "save_steps",
        "lora_r",
        "eval_limit",
    ):
        if getattr(config, name) < 1:
            problems.append(f"{name} must be >= 1, got {getattr(config, name)}")
    if config.warm_start_steps < 0 or (config.warm_start_steps and not config.warm_start_replies):
        problems.append("warm_start_steps must be >= 0, and > 0 needs at least one entry in warm_start_replies")
    for name, ok, allowed in (
        ("temperature", config.temperature >= 0, ">= 0"),
        ("learning_rate", config.learning_rate > 0, "> 0"),
        ("beta", config.beta >= 0, ">= 0 (0 = no KL term)"),
        ("gamma", 0 <= config.gamma <= 1, "in [0, 1]"),
    ):
        if not ok:
            problems.append(f"{name} must be {allowed}, got {getattr(config, name)}")
    if config.env_weights is not None and (min(config.env_weights) < 0 or sum(config.env_weights) <= 0):
        problems.append(f"env_weights must be >= 0 with a positive sum, got {config.env_weights}")
    if config.token_history not in ("sampled", "template"):
        problems.append(
            f"token_history must be 'sampled' (continue the sampled tokens) or 'template' (re-render the chat "
            f"each call), got {config.token_history!r}"
        )
    if config.vllm_mode not in ("colocate", "server"):
        problems.append(f"vllm_mode must be 'colocate' or 'server', got {config.vllm_mode!r}")
    if config.vllm_server_base_url is not None and not config.vllm_server_base_url.startswith(("http://", "https://")):
        problems.append(
            f"vllm_server_base_url must be an http(s) URL such as http://10.0.0.5:8000, "
            f"got {config.vllm_server_base_url!r}"
        )
    # Checked here too, to name the choices as text (AdvantageConfig's messages print Python lists).
    for name, value, allowed in (
        ("estimator", config.estimator, ESTIMATORS),
        ("advantage_mode", config.advantage_mode, MODES),
    ):
        if value not in allowed:
            problems.append(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    reasons = [reason.value for reason in TerminationReason]
    unknown = [reason for reason in config.exclude_termination if reason not in reasons]
    if unknown:
        allowed = ", ".join(reasons)
        problems.append(f"exclude_termination: unknown reasons {', '.join(unknown)}; allowed: {allowed}")
    elif config.estimator in ESTIMATORS and config.advantage_mode in MODES:
        try:
            AdvantageConfig(
                config.estimator, config.advantage_mode, exclude_termination=tuple(config.exclude_termination)
            )
        except ValueError as error:
            problems.append(str(error))
    if config.dtype not in DTYPES:
        problems.append(f"dtype must be one of {', '.join(DTYPES)} ('auto': the saved one), got {config.dtype!r}")
    if DTYPES.get(config.dtype) == "float16" and config.trl_args.get("fp16"):
        problems.append(
            "dtype: fp16 with fp16: true cannot train (the fp16 loss scaler cannot unscale fp16 weights): "
            "use dtype: fp32 with fp16: true (fp16 autocast), or dtype: bf16"
        )
    # agent_args and env_args go to every env of the run: a mix needs each argument to fit at least one of them.
    failures = []
    for env_id in config.env:
        try:
            check_arguments(env_id, agent_args=config.agent_args, env_args=config.env_args)
        except ValueError as error:
            failures.append(str(error))
    if envs_known and len(failures) == len(config.env):
        problems.append(failures[0])
    if config.model is not None:
        try:
            check_model_source(config.model, "model")
        except ValueError as error:
            problems.append(str(error))
    if config.model_shape not in SHAPES:
        problems.append(f"model_shape must be one of {', '.join(sorted(SHAPES))}, got {config.model_shape!r}")
    if config.model is not None and config.model_shape != "tiny":
        problems.append("model_shape sizes the embedded model: drop it when model names a model")
    try:
        check_agent_program(config.agent_program, config.reward_fn)
    except (ValueError, ImportError, AttributeError) as error:
        problems.append(str(error))
    return problems + async_problems(config)


def one_of(values: tuple[str, ...]) -> str:
    """``'a', 'b' or 'c'``: the values a field takes, as its error names them."""
    quoted = [repr(value) for value in values]
    return " or ".join([", ".join(quoted[:-1]), quoted[-1]]) if len(quoted) > 1 else quoted[0]


def async_problems(config: Any) -> list[str]:
    """The problems of the asynchronous-generation fields, and the combinations ``max_staleness >= 1`` does not
    support yet, each refused with its reason rather than half-run."""
    problems = []
    if config.max_staleness < 0:
        problems.append(f"max_staleness must be >= 0 (0 = synchronous), got {config.max_staleness}")
    if not config.async_is_cap > 1:
        problems.append(f"async_is_cap must be > 1 (2.0 recommended), got {config.async_is_cap}")
    if config.async_is_level not in IS_LEVELS:
        problems.append(f"async_is_level must be {one_of(IS_LEVELS)}, got {config.async_is_level!r}")
    if config.async_trainer_threads not in TRAINER_THREADS:
        problems.append(
            f"async_trainer_threads must be {one_of(TRAINER_THREADS)}, got {config.async_trainer_threads!r}"
        )
    if config.async_is_mode not in IS_MODES:
        problems.append(f"async_is_mode must be {one_of(IS_MODES)}, got {config.async_is_mode!r}")
    elif config.async_is_mode == "clip" and config.async_is_level == "sequence":
        problems.append(
            "async_is_level: sequence applies to async_is_mode truncate and mask: with clip the ratio's level is the "
            "loss's (set trl_args: {importance_sampling_level: sequence})"
        )
    if config.max_staleness < 1:
        return problems
    refusal = f"max_staleness: {config.max_staleness} (asynchronous generation) is not supported"
    if config.use_vllm and config.vllm_mode != "colocate":
        problems.append(
            f"{refusal} with vllm_mode: {config.vllm_mode} (the generator runs a vLLM engine of its own next to the "
            "trainer): use vllm_mode: colocate"
        )
    trl_args = config.trl_args
    if trl_args.get("num_iterations", 1) != 1:
        problems.append(f"{refusal} with num_iterations > 1 (each batch would train at several versions)")
    accumulation = trl_args.get("gradient_accumulation_steps", 1)
    if trl_args.get("steps_per_generation", accumulation) != accumulation:
        problems.append(f"{refusal} with steps_per_generation != gradient_accumulation_steps (one batch per step)")
    if config.loss_type == "vespo":
        problems.append(f"{refusal} with loss_type vespo (its weights are not linear in the advantage)")
    filtered = trl_args.get("top_p", 1.0) != 1.0 or bool(trl_args.get("top_k"))
    if not config.use_vllm and filtered:
        # The CPU worker's policy records log-probabilities at the sampling temperature (HFPolicy's
        # logprobs_mode="temperature", what the loss scores), before top-k/top-p: with a filter on, the distribution
        # it samples from is not the one it records, and the importance weights would be off even for fresh rows.
        # vLLM's processed_logprobs (0.31: Sampler.sample, then TopKTopPSampler's log_softmax after apply_top_k_top_p)
        # are those of the filtered distribution it samples from: the true behaviour policy, so pi_theta / pi_behaviour
        # is the right weight there (below 1 on the nucleus's tokens even for fresh rows, as the filter wants).
        problems.append(
            f"{refusal} on the CPU generation worker with top_p/top_k set in trl_args (its behaviour "
            "log-probabilities are those at the temperature before the filter, the rows are sampled after it): "
            "leave top_p/top_k unset, or use_vllm: true"
        )
    return problems


def check_agent_program(agent_program: str | None, reward_fn: str | None) -> None:
    """The agent program and its reward function import (names as ``module:function``)."""
    from rllm_gym.sdk import load_function

    if reward_fn is not None and agent_program is None:
        raise ValueError("reward_fn scores an agent_program's output: set agent_program too (envs grade their own)")
    if agent_program is not None:
        load_function(agent_program, "agent_program")
    if reward_fn is not None:
        load_function(reward_fn, "reward_fn")
