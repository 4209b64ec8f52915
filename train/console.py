"""What a training run shows and keeps as it goes: progress bars, one line per logging step and per checkpoint,
``metrics.jsonl`` and the reward curve; and no library output repeated at every step or checkpoint.

Bars go to stderr and are drawn only when it is a terminal (``progress: false`` or ``TQDM_DISABLE=1`` never draws
them); lines go to stdout, above the bars.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import huggingface_hub
import transformers
from tqdm import tqdm
from transformers import TrainerCallback

from rllm_gym.log import logger, quiet_deepspeed_import
from rllm_gym.train.config import TrainConfig


def quiet_libraries(progress: bool) -> None:
    """Silence what transformers, TRL and DeepSpeed would print again and again; each filter names its message and
    why. Python warnings and messages not named here still show."""
    # TRL 1.16 reads model.is_gradient_checkpointing at every generation (trl/models/utils.py), a property transformers
    # 5.23 deprecates. Something in each step resets Python's memory of the warnings already shown (as any
    # warnings.catch_warnings does), so it came again every step or two; there is nothing for the user to change.
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    # DeepSpeed 0.19's ZeRO calls torch.distributed.all_gather_into_tensor, which torch 2.13 deprecates: one
    # FutureWarning per process at the first step, about DeepSpeed's code, not the user's.
    warnings.filterwarnings(
        "ignore", message=r"`torch\.distributed\.all_gather_into_tensor` is deprecated", category=FutureWarning
    )
    quiet_deepspeed_import()  # again: main() may run in a process that did not start as the command line
    # transformers' own bars: "Loading weights" / "Loading checkpoint shards" when the model loads, "Writing model
    # shards" at every checkpoint; the "saved checkpoint-N" line says what matters. A download from the hub keeps its
    # bar (for a large model it takes minutes), unless progress is off.
    hub_bars = not huggingface_hub.utils.are_progress_bars_disabled()
    transformers.utils.logging.disable_progress_bar()
    if hub_bars and progress:
        huggingface_hub.utils.enable_progress_bars()


@contextmanager
def without_build_notices() -> Iterator[None]:
    """Drop the "DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully" line that DeepSpeed's CPU
    backend prints (a plain ``print`` to stdout, once per process, whenever it starts its communication backend);
    every other line passes at once, unchanged. ``sys.stdout`` is restored after the block."""
    stream = sys.stdout
    sys.stdout = filtered = _WithoutLines(stream, BUILD_NOTICE)
    try:
        yield
    finally:
        filtered.close_pending()
        sys.stdout = stream


BUILD_NOTICE = re.compile(r"DeepSpeed [\w.]+ built successfully")


class _WithoutLines(io.TextIOBase):
    """A text stream that passes each line written to ``stream`` except those ``pattern`` matches whole."""

    def __init__(self, stream: Any, pattern: re.Pattern[str]):
        self.stream, self.pattern, self.pending = stream, pattern, ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        kept = "".join(line + "\n" for line in lines if not self.pattern.fullmatch(line.strip()))
        if kept:
            self.stream.write(kept)
        return len(text)

    def flush(self) -> None:
        if (
            self.pending
            and not "DeepSpeed ".startswith(self.pending[:10])
            and not self.pending.startswith("DeepSpeed")
        ):
            self.stream.write(self.pending)  # a partial line that cannot be the notice: shown now, as flushed
            self.pending = ""
        self.stream.flush()

    def close_pending(self) -> None:
        if self.pending and not self.pattern.fullmatch(self.pending.strip()):
            self.stream.write(self.pending)
        self.pending = ""
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")


def progress_bar(config: TrainConfig, total: int, desc: str, unit: str, *, show: bool = True) -> tqdm:
    """A bar on stderr, drawn only when stderr is a terminal, ``progress`` is on and ``show`` (the main process)."""
    # disable=None is tqdm's "only on a terminal"; passed explicitly it would override TQDM_DISABLE, so read it here.
    off = not (config.progress and show) or os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true")
    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, disable=True if off else None)


def say(line: str) -> None:
    """Print a line on stdout, above any progress bar (which tqdm redraws below it)."""
    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


class ConsoleLog(TrainerCallback):
    """One line per logging step and per evaluation (instead of transformers' dict dumps) and one per checkpoint saved,
    and every log kept for the curve (``history``: training logs, ``evaluations``: evaluation logs).

    ``metrics.jsonl`` holds one run: a new run empties it; a run resumed from the checkpoint of step N keeps the
    records up to step N (a killed run may have logged steps after its last checkpoint, which are redone) and goes on
    from there, its ``elapsed_s`` continuing the earlier run's.
    """

    def __init__(self, output_dir: Path, resume_step: int | None = None, *, write: bool = True):
        self.path = output_dir / "metrics.jsonl"
        records: list[dict[str, Any]] = []
        if resume_step is not None and self.path.exists():
            records = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
            records = [record for record in records if record["step"] <= resume_step]
        if write:
            self.path.write_text("".join(json.dumps(record) + "\n" for record in records))
        self.history = [record for record in records if "reward" in record]
        self.evaluations = [record for record in records if is_evaluation(record)]
        earlier = records[-1]["elapsed_s"] if records else 0.0
        self.start = time.monotonic() - earlier

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or not state.is_world_process_zero or not ("reward" in logs or is_evaluation(logs)):
            return
        record = {"step": state.global_step, "elapsed_s": time.monotonic() - self.start, **logs}
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        if "reward" not in logs:
            self.evaluations.append(record)
            say(
                f"eval  {state.global_step:>5}  " + "  ".join(evaluation_parts(logs)) + f"  {record['elapsed_s']:.0f}s"
            )
            return
        self.history.append(record)
        errors = logs.get("rollout/termination/error", 0.0)
        # The end-of-run log carries the steps since the last logging step, and train_loss (the run's mean), no loss.
        loss = f"{logs['loss']:.4f}" if "loss" in logs else "-"
        say(
            f"step {state.global_step:>5}  reward {logs['reward']:.3f}  loss {loss}  "
            f"turns {logs.get('rollout/turns', float('nan')):.2f}  {record['elapsed_s']:.0f}s"
            + (f"  ERROR episodes {errors:.0%}" if errors else "")
        )
        if math.isnan(logs.get("loss", 0.0)):
            logger.warning("step %d: the loss is nan: %s", state.global_step, nan_reason(logs))

    def on_step_end(self, args, state, control, **kwargs):
        # The trainer logs, then evaluates, then saves. The last step (and the one Ctrl-C stops after) is logged now,
        # whatever logging_steps says: otherwise its line would come from the end-of-run log, after that step's eval
        # and checkpoint lines. (Callbacks that stop the run must come before this one.)
        if state.global_step >= state.max_steps or control.should_training_stop:
            control.should_log = True
        return control

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            say(f"saved checkpoint-{state.global_step} (step {state.global_step}/{state.max_steps})")


def is_evaluation(logs: dict[str, Any]) -> bool:
    """Whether a log holds an evaluation's metrics (train/evaluation.py names them ``eval_<split>/...``)."""
    return any(key.startswith(("eval_train/", "eval_heldout/")) for key in logs)


def evaluation_parts(logs: dict[str, Any]) -> list[str]:
    """``held-out greedy 0.500 (32/64)``, ``train greedy 0.750 (48/64)``, ``held-out pass@8 0.900``: the all-env
    figures of a log."""
    parts = []
    for key, value in logs.items():
        split, _, name = key.partition("/")
        if split in ("eval_heldout", "eval_train") and "/" not in name and name != "tasks":
            shown = share_and_count(logs, split) if name == "greedy" else f"{value:.3f}"
            parts.append(f"{'held-out' if split == 'eval_heldout' else 'train'} {name} {shown}")
    return sorted(parts)


def share_and_count(metrics: dict[str, float], split: str) -> str:
    """``0.641 (41/64)``: a split's greedy success as a share and, where the metrics say of how many tasks, a count."""
    share, count = metrics[f"{split}/greedy"], metrics.get(f"{split}/tasks")
    return f"{share:.3f}" + (f" ({round(share * count)}/{int(count)})" if count else "")


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


class StepBar(TrainerCallback):
    """A progress bar over the optimizer steps (on the main process), with the last logged reward."""

    def __init__(self, config: TrainConfig):
        self.config = config
        self.bar: tqdm | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.bar = progress_bar(self.config, state.max_steps, "train", "step", show=state.is_world_process_zero)
        self.bar.update(state.global_step)  # a resumed run starts at its checkpoint's step

    def on_step_end(self, args, state, control, **kwargs):
        self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "reward" in logs:
            self.bar.set_postfix(reward=f"{logs['reward']:.3f}")

    def close(self) -> None:
        """End the bar's line; main calls it however training ended, so that what follows starts a line of its own."""
        if self.bar is not None:
            self.bar.close()


def plot_rewards(history: list[dict[str, Any]], path: Path, evaluations: list[dict[str, Any]] = ()) -> None:
    """The run's figure: the mean training reward per logging step and, from ``evaluations``, each split's greedy
    success (and the held-out pass@k) at each evaluation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.plot([h["step"] for h in history], [h["reward"] for h in history], label="training reward (sampled)")
    labels = {
        "eval_train/greedy": "greedy success, training tasks",
        "eval_heldout/greedy": "greedy success, held-out tasks",
    }
    for key in sorted({key for record in evaluations for key in record}):
        if key in labels or (key.startswith("eval_heldout/pass@") and "/" not in key.removeprefix("eval_heldout/")):
            points = [(record["step"], record[key]) for record in evaluations if key in record]
            label = labels.get(key, f"held-out {key.removeprefix('eval_heldout/')}")
            axes.plot(*zip(*points, strict=True), marker="o", markersize=3, linestyle="--", label=label)
    axes.set_xlabel("step")
    axes.set_ylabel("reward / success")
    axes.set_title("GRPO training")
    axes.grid(alpha=0.3)
    if evaluations:
        axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
