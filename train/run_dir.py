"""A training run's output folder: one run per folder, checkpoints to resume from, and a clean stop on Ctrl-C.

A folder holds a run when it has any of :data:`RUN_FILES` or a ``checkpoint-N`` folder. A new run refuses such a
folder unless told to continue it (``resume``) or replace it (``overwrite``, which deletes only those files, never
anything else in the folder). ``run.json`` records the run's settings and its "before" evaluation, so that a resumed
run keeps both and a run with other settings cannot be appended to it.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

__all__ = [
    "IDENTITY_FIELDS",
    "RUN_FILE",
    "RUN_FILES",
    "OutputDirError",
    "StopOnInterrupt",
    "clear_run",
    "last_checkpoint",
    "prepare_output_dir",
    "read_run_record",
    "run_artifacts",
    "write_run_record",
]

RUN_FILE = "run.json"
RUN_FILES = (RUN_FILE, "metrics.jsonl", "summary.json", "reward_curve.png", "final")
# Settings that make a run what it is: resuming with another value would mix two runs in one metrics file.
IDENTITY_FIELDS = (
    "env",
    "env_weights",
    "tasks",
    "eval_tasks",
    "split_seed",
    "agent_args",
    "env_args",
    "max_turns",
    "chat_template_kwargs",
    "model",
    "model_shape",
    "lora",
    "num_generations",
    "prompts_per_step",
    "estimator",
    "seed",
)


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


def _identity(config: dict[str, Any]) -> dict[str, Any]:
    values = {name: config.get(name) for name in IDENTITY_FIELDS}
    for name in ("agent_args", "env_args"):  # JSON text: compare what it means, not its spelling
        if isinstance(values[name], str):
            values[name] = json.loads(values[name])
    return values


def prepare_output_dir(
    output_dir: Path, config: dict[str, Any], *, resume: bool, overwrite: bool
) -> tuple[Path | None, dict[str, Any]]:
    """Check ``output_dir`` against the flags; returns the checkpoint to resume from and the run record kept there.

    Raises :class:`OutputDirError` naming the folder and what to pass instead. Changes nothing: with ``overwrite``,
    the caller deletes the earlier run with :func:`clear_run` (on the main process, once every process has checked).
    """
    if resume and overwrite:
        raise OutputDirError(
            "resume and overwrite exclude each other: --resume true continues a run, --overwrite true replaces it"
        )
    if resume:
        checkpoint = last_checkpoint(output_dir)
        if checkpoint is None:
            raise OutputDirError(
                f"--resume true: {output_dir} has no complete checkpoint-N folder to continue from; start the run "
                f"without --resume (with --overwrite true if the folder holds files of an earlier run)"
            )
        record = read_run_record(output_dir)
        if record:
            earlier, now = _identity(record.get("config", {})), _identity(config)
            changed = [
                f"{name}: {earlier[name]!r} there, {now[name]!r} now" for name in earlier if earlier[name] != now[name]
            ]
            if changed:
                raise OutputDirError(
                    f"--resume true: {output_dir} holds a run with other settings ({'; '.join(changed)}); resume "
                    f"with the same settings, or start a new run in another output_dir"
                )
        return checkpoint, record
    artifacts = run_artifacts(output_dir)
    if artifacts and not overwrite:
        names = ", ".join(path.name for path in artifacts[:4]) + (", ..." if len(artifacts) > 4 else "")
        raise OutputDirError(
            f"output_dir {output_dir} holds another run ({names}): pass --resume true to continue it, "
            f"--overwrite true to replace it, or choose another --output_dir"
        )
    return None, {}


def clear_run(output_dir: Path) -> None:
    """Delete what an earlier run left in ``output_dir`` (:func:`run_artifacts`), nothing else."""
    for path in run_artifacts(output_dir):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


class StopOnInterrupt(TrainerCallback):
    """Ctrl-C (SIGINT) during training: finish the current step, save a checkpoint, stop; ``stopped_at`` is the step.

    A second Ctrl-C quits at once (KeyboardInterrupt), leaving the last checkpoint saved before it.
    """

    def __init__(self, announce: bool = True):
        self.announce = announce
        self.requested = False
        self.stopped_at: int | None = None
        self._step = 0
        self._previous: Any = None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        self.requested = True
        if self.announce:
            print(
                f"Ctrl-C: stopping after step {self._step + 1} with a checkpoint (continue with --resume true; "
                f"Ctrl-C again quits at once)",
                flush=True,
            )

    def on_train_begin(self, args, state, control, **kwargs):
        self._step = state.global_step
        self._previous = signal.signal(signal.SIGINT, self._handle)

    def on_step_end(self, args, state, control, **kwargs):
        self._step = state.global_step
        if self.requested:
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step

    def on_train_end(self, args, state, control, **kwargs):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
