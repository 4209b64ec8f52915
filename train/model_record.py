"""What a trained model folder says about its training: ``rllm_gym_training.json`` and a model card (README.md).

The trainer writes both into ``final/`` and every ``checkpoint-N``: the env ids, agent and env arguments, chat
template options (``chat_template_kwargs``: the trainer's, with the agent's ``enable_thinking``), the dtype, turn and
reply limits the model was trained with, its base, its steps and its greedy success before (and, in ``final/``,
after) training; for a run extended after it finished, also its success where it ended before (``earlier``).
``rllm-gym eval --model <folder>`` reads the record and evaluates in the same prompt format unless flags say
otherwise. This module imports nothing heavy: the CLI reads records with it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rllm_gym.train.config_file import config_relative

__all__ = [
    "EVAL_SETTINGS",
    "TRAINING_FILE",
    "eval_settings",
    "model_card",
    "read_training_record",
    "training_record",
    "write_model_record",
]

TRAINING_FILE = "rllm_gym_training.json"
# rllm-gym eval's option -> the record's key it is read from.
EVAL_SETTINGS = {
    "env": "env",
    "agent_args": "agent_args",
    "env_args": "env_args",
    "max_turns": "max_turns",
    "max_tokens": "max_completion_length",
}


def training_record(config: dict[str, Any], *, steps: int, scores: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record of a model trained with ``config`` (a TrainConfig as a dict) for ``steps`` steps; ``scores`` (the
    run's summary) gives its greedy success before and after, per env, on the training tasks (``greedy_*``) and on
    the held-out tasks (``heldout_*``)."""
    scores = scores or {}
    agent_args = json.loads(config["agent_args"]) if isinstance(config["agent_args"], str) else config["agent_args"]
    env_args = json.loads(config["env_args"]) if isinstance(config["env_args"], str) else config["env_args"]
    template_kwargs = config.get("chat_template_kwargs") or {}
    template_kwargs = json.loads(template_kwargs) if isinstance(template_kwargs, str) else dict(template_kwargs)
    thinking = agent_args.get("enable_thinking") if isinstance(agent_args, dict) else None
    if thinking is not None:  # the agent's switch, as its policies pass it to the template
        template_kwargs.setdefault("enable_thinking", thinking)
    return {
        "format": 1,
        "base_model": config.get("model") or embedded_model(config.get("model_shape") or "tiny"),
        "lora": bool(config.get("lora")),
        "env": list(config["env"]),
        "env_weights": config.get("env_weights"),
        "tasks": config.get("tasks") or ["seeds:64"] * len(config["env"]),
        "eval_tasks": config.get("eval_tasks"),
        # Each env's held-out task file as the run found it (None where its eval split is not a file).
        "heldout_data": scores.get("heldout_data"),
        "agent_args": agent_args,
        "env_args": env_args,
        "chat_template_kwargs": template_kwargs,
        "dtype": config.get("dtype") or "auto",
        "max_turns": config["max_turns"],
        "max_completion_length": config["max_completion_length"],
        "temperature": config["temperature"],
        "algorithm": f"GRPO ({config['estimator']} advantages, {config['num_generations']} rollouts per task)",
        "steps": steps,
        "max_steps": config["max_steps"],
        "greedy_before": scores.get("greedy_before"),
        "greedy_after": scores.get("greedy_after"),
        "heldout_before": scores.get("heldout_before"),
        "heldout_after": scores.get("heldout_after"),
        # What a policy blind to the observation reaches on the held-out tasks (train/baselines.py), when defined.
        "heldout_blind_baseline": scores.get("heldout_blind_baseline"),
        "heldout_blind_moves": scores.get("heldout_blind_moves"),
        # A run extended after it finished (a resume with a larger max_steps): where each earlier end left it.
        "earlier": [
            {key: part.get(key) for key in ("steps", "greedy_after", "heldout_after")}
            for part in scores.get("earlier", [])
        ],
    }


def embedded_model(shape: str) -> str:
    """How a record names the embedded model of ``shape``."""
    if shape == "tiny":
        return "the embedded tiny model (rllm_gym.tiny_model)"
    return f"the embedded tiny model, shape {shape!r} (rllm_gym.tiny_model.SHAPES)"


def read_training_record(folder: str | Path) -> dict[str, Any] | None:
    """The record in a model folder, or None when the folder was not written by rllm-gym's trainer."""
    path = Path(folder) / TRAINING_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def eval_settings(record: dict[str, Any]) -> dict[str, Any]:
    """The ``rllm-gym eval`` options the record gives (its first env when it was trained on several)."""
    settings = {option: record[key] for option, key in EVAL_SETTINGS.items()}
    settings["env"] = record["env"][0]
    thinking = record.get("chat_template_kwargs", {}).get("enable_thinking")
    if thinking is not None:
        settings["thinking"] = "on" if thinking else "off"
    others = {k: v for k, v in record.get("chat_template_kwargs", {}).items() if k != "enable_thinking"}
    if others:  # needs rllm-gym eval's --chat-template-kwargs (rllm_gym/cli.py)
        settings["chat_template_kwargs"] = others
    return settings


def _scores(scores: dict[str, float] | None, missing: str) -> str:
    if not scores:
        return missing
    return ", ".join(f"{env_id} {value:.3f}" for env_id, value in scores.items())


def _blind(record: dict[str, Any]) -> str:
    """The card's line on the blind baseline: what a policy that ignores the observation solves of the held-out
    tasks (the best fixed sequence of moves on FrozenLake), or why there is none."""
    shares = record.get("heldout_blind_baseline")
    if not shares:
        return "none defined for these envs and tasks (train/baselines.py)"
    moves = record.get("heldout_blind_moves") or {}
    return "; ".join(
        f"{env_id} {share:.3f}" + (f" (the fixed moves {', '.join(moves[env_id])})" if env_id in moves else "")
        for env_id, share in shares.items()
    )


def _arguments(values: dict[str, Any], owner: str) -> str:
    return f"`{json.dumps(values)}`" if values else f"none ({owner}'s defaults)"


def model_card(name: str, record: dict[str, Any]) -> str:
    """A README.md for the model folder: what was trained, from which base, on which envs, for how long, and how it
    scored. Every field says something (a score not measured says why)."""
    not_measured = "not measured (eval_greedy: false)"
    at_checkpoint = "not measured at a checkpoint (final/ has it)"
    after = _scores(record["greedy_after"], not_measured if record["greedy_before"] is None else at_checkpoint)
    no_split = "not measured (no eval_tasks: no tasks were held out)"
    heldout_before = _scores(record.get("heldout_before"), no_split if not record.get("eval_tasks") else not_measured)
    heldout_after = _scores(
        record.get("heldout_after"), heldout_before if not record.get("heldout_before") else at_checkpoint
    )
    envs = ", ".join(
        f"`{env_id}` (tasks: {tasks})" for env_id, tasks in zip(record["env"], record["tasks"], strict=False)
    )
    lines = [
        "---",
        "library_name: transformers",
        "tags: [rllm-gym, grpo, reinforcement-learning]",
        "---",
        "",
        f"# {name}",
        "",
        f"Trained with [rllm-gym](https://github.com/rllm-gym/rllm-gym) by {record['algorithm']}"
        + (" as a LoRA adapter." if record["lora"] else "."),
        "",
        f"- Base model: {record['base_model']}",
        f"- Environments: {envs}",
        f"- Steps: {record['steps']} of {record['max_steps']}",
        f"- Agent arguments: {_arguments(record['agent_args'], 'the agent')}",
        f"- Env arguments: {_arguments(record['env_args'], 'the env')}",
        f"- Chat template options: {_arguments(record['chat_template_kwargs'], 'the tokenizer')}",
        f"- Dtype: {record.get('dtype', 'auto')} (the weights are saved in it)",
        f"- Turns per episode: {record['max_turns']}; tokens per reply: {record['max_completion_length']}",
        f"- Greedy success on training tasks, before training: {_scores(record['greedy_before'], not_measured)}",
        f"- Greedy success on training tasks, after training: {after}",
        f"- Greedy success on held-out tasks (never trained on), before training: {heldout_before}",
        f"- Greedy success on held-out tasks (never trained on), after training: {heldout_after}",
        f"- Blind baseline on the held-out tasks: {_blind(record)}",
        *[
            f"- Earlier, when the run ended at step {part['steps']} (it was extended since): greedy success "
            f"{_scores(part['greedy_after'], 'not measured')} on training tasks, "
            f"{_scores(part['heldout_after'], 'not measured')} on held-out tasks"
            for part in record.get("earlier", [])
        ],
        "",
        "## Evaluate",
        "",
        f"`{TRAINING_FILE}` records these settings; `rllm-gym eval` uses them by default (flags override). "
        + eval_command(record)[0],
        "",
        "```bash",
        eval_command(record)[1],
        "```",
        "",
    ]
    return "\n".join(lines)


def eval_command(record: dict[str, Any]) -> tuple[str, str]:
    """What the card suggests to evaluate the model with, and why: the first env's held-out tasks when they are a file
    or a seed range, else tasks drawn by seed, which the card says may include ones it trained on."""
    heldout = (record.get("heldout_data") or [None])[0]
    source = str((record.get("eval_tasks") or [""])[0])
    seeds = re.fullmatch(r"seeds:(?:(\d+)-)?(\d+)", source)
    if heldout:
        return (
            "On the held-out tasks (never trained on):",
            f"rllm-gym eval --model <this folder> --data {heldout} --n 4",
        )
    if seeds:
        start, stop = int(seeds.group(1) or 0), int(seeds.group(2))
        return (
            "On the held-out tasks (never trained on), the reset seeds of its eval split:",
            f"rllm-gym eval --model <this folder> --seed {start} --tasks {stop - start} --n 4",
        )
    return (
        "Its held-out tasks are not a file or a seed range, so this draws tasks by seed 0-63, which may include tasks "
        "it trained on:",
        "rllm-gym eval --model <this folder> --tasks 64 --n 4",
    )


def heldout_files(eval_tasks: list[str] | None, config_dir: Path) -> list[str | None] | None:
    """Each eval source that is a .jsonl or .parquet file, as a path from where the command runs when it lies below
    it (else absolute), the way train/splits.py finds it; None for the other sources (and without eval_tasks)."""
    if not eval_tasks:
        return None
    found: list[str | None] = []
    for source in map(str, eval_tasks):
        location = source.partition("@")[0]
        if Path(location).suffix not in (".jsonl", ".parquet"):
            found.append(None)
            continue
        path = config_relative(location, config_dir).resolve()
        found.append(str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path))
    return found


def write_model_record(folder: str | Path, record: dict[str, Any]) -> None:
    """Write ``rllm_gym_training.json`` and README.md (the model card) into a model folder."""
    folder = Path(folder)
    (folder / TRAINING_FILE).write_text(json.dumps(record, indent=2) + "\n")
    (folder / "README.md").write_text(model_card(f"{folder.parent.name}/{folder.name}", record))
