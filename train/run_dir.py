"""A training run's output folder: one run per folder, checkpoints to resume from, and what a resume may change.

A folder holds a run when it has any of :data:`RUN_FILES` or a ``checkpoint-N`` folder. A new run refuses such a
folder unless told to continue it (``resume``) or replace it (``overwrite``, which deletes only those files, never
anything else in the folder). ``run.json`` records the run's settings and its "before" evaluation, so that a resumed
run keeps both and a run with other settings cannot be appended to it. A finished run (``final/`` written at its last
step) resumed without a larger ``max_steps`` is left as it is (:class:`RunFinished`); with one, it is extended and
keeps its earlier results (:func:`earlier_results`). This module imports nothing heavy: the command line checks the
folder with it before loading torch and TRL (:func:`refuse_taken_output_dir`).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_OUTPUT_DIR",
    "RUN_FILE",
    "RUN_FILES",
    "RUN_ONLY_FIELDS",
    "OutputDirError",
    "RunFinished",
    "check_same_split",
    "clear_run",
    "earlier_results",
    "exit_status_before_imports",
    "last_checkpoint",
    "prepare_output_dir",
    "read_run_record",
    "refuse_taken_output_dir",
    "run_artifacts",
    "write_run_record",
]

RUN_FILE = "run.json"
DEFAULT_OUTPUT_DIR = "runs/grpo"  # TrainConfig.output_dir's default
RUN_FILES = (RUN_FILE, "metrics.jsonl", "summary.json", "reward_curve.png", "final")
# The settings a resume may change: how the run is shown, logged and saved, not what it trains. Any other setting
# differing from the run's would mix two runs in one folder (max_steps may grow: that extends the run).
RUN_ONLY_FIELDS = (
    "max_steps",
    "resume",
    "overwrite",
    "output_dir",
    "progress",
    "log_level",
    "debug",
    "report_to",
    "save_steps",
    "logging_steps",
    "max_error_steps",
    "vllm_server_base_url",
    "vllm_server_timeout",
)
JSON_FIELDS = ("agent_args", "env_args", "chat_template_kwargs", "trl_args")
# What an evaluation after the last step left in summary.json: kept under "earlier" when the run is extended.
AFTER_KEYS = ("greedy_after", "heldout_after", "evaluation_after", "reward_first", "reward_last", "train_seconds")


class OutputDirError(ValueError):
    """The output folder cannot be used as asked (it holds another run, or has nothing to resume)."""


def last_checkpoint(output_dir: Path) -> Path | None:
    """The newest ``checkpoint-N`` folder that was written to the end, or None.

    The trainer writes the model first and ``trainer_state.json`` last, so a run killed mid-save (SIGTERM, OOM)
    leaves a newest folder without a readable trainer state; resuming from it fails, the one before it is whole.
    """
    steps = []
    for folder in Path(output_dir).glob("checkpoint-*"):
        step = folder.name.removeprefix("checkpoint-")
        if not step.isdigit():
            continue
        try:
            json.loads((folder / "trainer_state.json").read_text())
        except (OSError, ValueError):
            continue
        steps.append((int(step), folder))
    return max(steps)[1] if steps else None


def run_artifacts(output_dir: Path) -> list[Path]:
    """What an earlier run left in ``output_dir``: run files and checkpoint folders."""
    found = [output_dir / name for name in RUN_FILES if (output_dir / name).exists()]
    return found + sorted(output_dir.glob("checkpoint-*"))


def read_run_record(output_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((output_dir / RUN_FILE).read_text())
    except FileNotFoundError:
        return {}


def write_run_record(output_dir: Path, record: dict[str, Any]) -> None:
    (output_dir / RUN_FILE).write_text(json.dumps(record, indent=2, default=str) + "\n")


class RunFinished(Exception):
    """A resume of a run that already reached its ``max_steps``: nothing to do; the message says so and how to extend
    it. The command line prints it and exits 0."""


def _settings(config: dict[str, Any]) -> dict[str, Any]:
    """The settings of a run that a resume must keep (every field but :data:`RUN_ONLY_FIELDS`), the dict fields as
    dicts (runs recorded before they were parsed once hold them as JSON text) so that both spellings compare equal."""
    values = {name: value for name, value in config.items() if name not in RUN_ONLY_FIELDS}
    for name in JSON_FIELDS:
        if isinstance(values.get(name), str):
            values[name] = json.loads(values[name])
    return values


def settings_changed(earlier: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``learning_rate: 0.001 there, 0.01 now`` for each setting a resume may not change that differs."""
    before, after = _settings(earlier), _settings(now)
    return [
        f"{name}: {before[name]!r} there, {after.get(name)!r} now"
        for name in before
        if before[name] != after.get(name)
    ]


def final_step(output_dir: Path) -> int | None:
    """The step ``final/`` was saved at (from its training record), or None when the run has not finished."""
    from rllm_gym.train.model_record import read_training_record

    record = read_training_record(output_dir / "final") if (output_dir / "final").is_dir() else None
    return int(record["steps"]) if record else None


def prepare_output_dir(
    output_dir: Path, config: dict[str, Any], *, resume: bool, overwrite: bool
) -> tuple[Path | None, dict[str, Any]]:
    """Check ``output_dir`` against the flags; returns the checkpoint to resume from and the run record kept there.

    Raises :class:`OutputDirError` naming the folder and what to pass instead (a resume with other settings names each
    difference), and :class:`RunFinished` for a resume of a finished run whose ``max_steps`` does not grow. Changes
    nothing: with ``overwrite``, the caller deletes the earlier run with :func:`clear_run` (on the main process, once
    every process has checked).
    """
    if resume and overwrite:
        raise OutputDirError(
            "resume and overwrite exclude each other: --resume true continues a run, --overwrite true replaces it"
        )
    if not resume:
        check_free(output_dir, overwrite)
        return None, {}
    checkpoint = last_checkpoint(output_dir)
    if checkpoint is None:
        raise OutputDirError(
            f"--resume true: {output_dir} has no complete checkpoint-N folder to continue from; start the run "
            f"without --resume (with --overwrite true if the folder holds files of an earlier run)"
        )
    record = read_run_record(output_dir)
    changed = settings_changed(record.get("config", {}), config) if record else []
    if changed:
        raise OutputDirError(
            f"--resume true: {output_dir} holds a run with other settings ({'; '.join(changed)}); resume with the "
            f"same settings (only max_steps may grow), or start a new run in another output_dir"
        )
    reached = int(checkpoint.name.removeprefix("checkpoint-"))
    finished = final_step(output_dir)
    if finished is not None and finished >= reached and config["max_steps"] <= finished:
        raise RunFinished(
            f"{output_dir} holds a finished run (step {finished} of {finished}; its results are in summary.json and "
            f"final/): nothing to do. To train it further, resume with a larger --max_steps (above {finished})"
        )
    if config["max_steps"] < reached:
        raise OutputDirError(
            f"--resume true: {output_dir} reached step {reached}, past --max_steps {config['max_steps']}: resume with "
            f"--max_steps {reached} or more"
        )
    return checkpoint, record


def earlier_results(output_dir: Path) -> list[dict[str, Any]]:
    """The results of the finished parts of the run in ``output_dir``, oldest first: for each time it reached its
    ``max_steps``, the step and what the evaluation after it gave (summary.json's ``greedy_after``,
    ``heldout_after``, ``evaluation_after``, rewards and seconds). A resume that extends the run keeps them."""
    try:
        summary = json.loads((output_dir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    parts = list(summary.get("earlier", []))
    step = final_step(output_dir)
    if step is not None and step not in {part.get("steps") for part in parts}:
        parts.append({"steps": step, **{key: summary[key] for key in AFTER_KEYS if key in summary}})
    return parts


def check_same_split(split: dict[str, Any], record: dict[str, Any], output_dir: Path) -> None:
    """Raise :class:`OutputDirError` when a resumed run's eval ``split``, rebuilt from its sources, is not the one its
    run ``record`` says it was trained with."""
    if record.get("split", split) != split:
        raise OutputDirError(
            f"--resume true: the eval split rebuilt from the run's sources differs from the one {output_dir} was "
            f"trained with (the data changed since): restore the data, or start a new run in another output_dir"
        )


def check_free(output_dir: Path, overwrite: bool) -> None:
    """Raise :class:`OutputDirError` when ``output_dir`` holds a run and ``overwrite`` is off."""
    artifacts = run_artifacts(output_dir)
    if artifacts and not overwrite:
        names = ", ".join(path.name for path in artifacts[:4]) + (", ..." if len(artifacts) > 4 else "")
        raise OutputDirError(
            f"output_dir {output_dir} holds another run ({names}): pass --resume true to continue it, "
            f"--overwrite true to replace it, or choose another --output_dir"
        )


def refuse_taken_output_dir(argv: list[str]) -> None:
    """Raise at once what can be said of the run ``argv`` asks for before torch and TRL load (about 20 s), reading
    only its --config YAML and a few flags: :class:`ConfigError` for a YAML file that cannot be read or a task file
    (``tasks``, ``eval_tasks``) that does not exist, :class:`OutputDirError` for a taken output_dir (no --resume, no
    --overwrite).

    The trainer checks all of it again once its config is complete. The folder is checked here only when every key of
    the YAML is a TrainConfig field: a key that is not (a typo, or a TRL field) is left to the complete check, which
    names every mistake of the config before it looks at the folder.
    """
    from rllm_gym.train.config_file import TRUE, ConfigError, read_config_file, read_yaml_mapping, train_config_hints

    if "-h" in argv or "--help" in argv:
        return
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--config")
    parser.add_argument("--output_dir", "--output-dir")
    for flag in ("resume", "overwrite"):
        parser.add_argument(f"--{flag}", nargs="?", const="true")
    for flag in ("tasks", "eval_tasks"):
        parser.add_argument(f"--{flag}", f"--{flag.replace('_', '-')}", nargs="+")
    try:
        given, _ = parser.parse_known_args(argv)
    except SystemExit:  # a flag without its value: the complete check says so
        return
    config_file = Path(given.config) if given.config else None
    values = read_yaml_mapping(config_file) if config_file else {}
    hints = train_config_hints()
    if set(map(str, values)) - set(hints):
        return  # a key that may be TRL's: the complete check reads the whole config
    problems = []
    if config_file is not None:
        try:
            values = read_config_file(config_file, hints)
        except ConfigError as error:
            problems += error.problems

    def setting(name: str, default: Any) -> Any:
        flag = getattr(given, name)
        return flag if flag is not None else values.get(name, default)

    problems += missing_task_files(
        setting("tasks", None), setting("eval_tasks", None), config_file.parent if config_file else Path.cwd()
    )
    if problems:
        raise ConfigError(*problems)
    resume, overwrite = (str(setting(name, False)).lower() in TRUE for name in ("resume", "overwrite"))
    if not (resume or overwrite):
        check_free(Path(str(setting("output_dir", DEFAULT_OUTPUT_DIR))), overwrite=False)


def missing_task_files(tasks: Any, eval_tasks: Any, config_dir: Path) -> list[str]:
    """A line for each source of ``tasks`` and ``eval_tasks`` that names a .jsonl or .parquet file found neither where
    the command runs nor next to the config (where train/splits.py looks for them)."""
    return [
        f"{name}: {source}: no such file (looked for {' and '.join(map(str, places))})"
        for name, sources in (("tasks", tasks), ("eval_tasks", eval_tasks))
        for source, places in _missing_files(sources, config_dir)
    ]


def _missing_files(sources: Any, config_dir: Path) -> list[tuple[str, list[Path]]]:
    """The sources of a ``tasks``/``eval_tasks`` value that name a .jsonl or .parquet file found neither where the
    command runs nor next to the config (how train/splits.py looks for them), with the places looked at."""
    from rllm_gym.train.config_file import config_relative

    if not isinstance(sources, list):
        return []
    missing = []
    for source in map(str, sources):
        location = source.partition("@")[0]
        if Path(location).suffix not in (".jsonl", ".parquet"):
            continue
        if not config_relative(location, config_dir).exists():
            places = [Path(location)] if Path(location).is_absolute() else [Path(location), config_dir / location]
            missing.append((source, list(dict.fromkeys(places))))
    return missing


def clear_run(output_dir: Path) -> None:
    """Delete what an earlier run left in ``output_dir`` (:func:`run_artifacts`), nothing else."""
    for path in run_artifacts(output_dir):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def exit_status_before_imports(argv: list[str]) -> int | None:
    """2, having said why on stderr, when the trainer's command line ``argv`` can be refused before its imports (see
    :func:`refuse_taken_output_dir`); None when the run may go on to load the trainer. Under a launcher
    (``accelerate launch``) only the first process says it: every process exits with 2."""
    import os
    import sys

    from rllm_gym.train.config_file import ConfigError

    try:
        refuse_taken_output_dir(argv)
    except (OutputDirError, ConfigError) as error:
        if os.environ.get("RANK", "0") == "0":
            prefix = "rllm-gym train: error: " if isinstance(error, ConfigError) else "rllm-gym train: "
            for line in str(error).splitlines():
                print(prefix + line, file=sys.stderr, flush=True)
        return 2
    return None
