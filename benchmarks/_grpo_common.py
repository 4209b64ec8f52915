"""What ``bench_grpo.py``'s single-turn table, ``grpo_multi_turn.py``'s multi-turn table and ``bench_gpu.py`` share:
the settings every trainer of a comparison gets, the phase clocks patched onto a trainer, the baton that lets two
trainers in threads take turns one optimizer step at a time (so both see the same machine load), the step timer, and
the profile of the steps after the warm-up."""

from __future__ import annotations

import cProfile
import functools
import gc
import io
import pstats
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from rllm_gym.train.trl_adapter import step_phase_methods


@dataclass
class TrainerSettings:
    """What every trainer of one comparison shares (each table's settings add their own fields and defaults)."""

    prompts_per_step: int = 8
    num_generations: int = 8
    max_completion_length: int = 32
    learning_rate: float = 1e-3
    loss_type: str = "dapo"
    seed: int = 0
    warmup: int = 2


RUNNING: dict[str, str | None] = {"kind": None}  # the trainer holding the baton (only one runs at a time)


STEP_PHASES: dict[str, float] = defaultdict(float)  # seconds per phase in the running step (one runs at a time)


PHASES = {
    "generate_and_score": "batch building: generation, rewards, advantages",
    "generate": "  generation (ours: the rollout = engine + env + agent + policy)",
    "model_generate": "    model.generate calls",
    "rewards": "  TRL reward functions",
    "advantages": "  our compute_advantages",
    "loss_forward": "loss: the policy's forward pass (compute_loss)",
    "backward": "backward",
    "optimizer_and_rest": "optimizer step and the trainer's own bookkeeping (the rest)",
}


def timed(phase: str, function: Any) -> Any:
    """``function``, adding its wall seconds to ``STEP_PHASES[phase]``."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            STEP_PHASES[phase] += time.perf_counter() - start

    return wrapper


def instrument(trainer: GRPOTrainer, kind: str) -> None:
    """Phase clocks on one trainer's own methods (instance attributes, so the other trainer is untouched).

    "generate" is where each trainer's completions are made: TRL's ``_generate``; for ours the rollout's call (the
    episodes: engine, env, agent, policy), which runs inside ``_generate_and_score_completions`` before TRL's part.
    Our ``_generate`` only hands TRL the rows the trainer collected (its ``rollout_func``): timing it instead would
    put next to nothing there, and generation tokens/s about 100x too high.
    """
    methods = {**step_phase_methods(generates_itself=kind == "trl"), "compute_loss": "loss_forward"}
    for name, phase in methods.items():
        setattr(trainer, name, timed(phase, getattr(trainer, name)))
    trainer.accelerator.backward = timed("backward", trainer.accelerator.backward)
    if getattr(trainer, "use_vllm", False):  # bench_gpu.py: TRL syncs inside _generate, ours before the rollout
        generation = trainer.vllm_generation
        generation.sync_weights = timed("sync_weights", generation.sync_weights)
    if kind != "trl":
        # The trainer's collect (the rollout's episodes and rows); the latest batch is kept for the checks. Only the
        # latest: every step's episodes kept alive made each garbage collection of our steps (and only ours) longer.
        collect = timed("generate", trainer.collect)
        trainer.collected = []

        def recorded(prompts: list[Any]) -> Any:
            batch = collect(prompts)
            trainer.collected[:] = [batch]
            return batch

        trainer.collect = recorded


class Turns:
    """A baton between two trainers in threads: only the holder runs; a finished trainer gives it up for good.

    The steps go A, B, B, A, A, B, ...: each trainer goes first in every other pair of steps and follows its own step
    as often as the other's. Strictly alternating (A, B, A, B) let one trainer lead every pair of a round, so an
    order effect (the issue saw one; bench_grpo.py's rounds then read 1.19x and 0.90x) fell on one side per round."""

    def __init__(self, names: list[str]) -> None:
        self.events = {name: threading.Event() for name in names}
        self.order = [names[0], names[1], names[1], names[0]]
        self.position = 0  # steps taken by both, so far
        self.finished: set[str] = set()
        self.events[names[0]].set()

    def wait(self, name: str) -> None:
        self.events[name].wait()
        self.events[name].clear()

    def hand_over(self, name: str) -> None:
        """Let the trainer whose turn it is run one step (unless it has finished) and wait for the baton to come
        back; when the next turn is this trainer's own, go on at once."""
        self.position += 1
        following = self.order[self.position % len(self.order)]
        if following != name and following not in self.finished:
            self.events[following].set()
            self.wait(name)

    def finish(self, name: str) -> None:
        self.finished.add(name)
        for other, event in self.events.items():
            if other != name:
                event.set()


class StepTimer(TrainerCallback):
    """Wall and CPU seconds of every optimizer step (generation, rewards, loss, backward, update); with ``turns``,
    hands the machine to the other trainer after each step.

    With ``seed``, torch's global generator is seeded with ``seed + k`` (untimed) before step ``k``: both trainers
    of a comparison then sample step ``k``'s completions from the same random stream. Without it their streams part
    after the first step (our HFPolicy samples in a forked generator, TRL in the global one), so each graded other
    completions: another count of math-verify calls (30-200 ms each on the tiny model's garbage), another step."""

    def __init__(self, name: str, turns: Turns | None = None, seed: int | None = None) -> None:
        self.name, self.turns, self.seed = name, turns, seed
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.phases: list[dict[str, float]] = []
        self.logs: dict[str, float] = {}  # TRL's metrics, averaged over the run (one log at the end)
        self._wall = self._cpu = 0.0

    def _start(self) -> None:
        if self.seed is not None:
            torch.manual_seed(self.seed + len(self.wall))
        RUNNING["kind"] = self.name
        STEP_PHASES.clear()
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def on_train_begin(self, args, state, control, **kwargs):
        if self.turns is not None:
            self.turns.wait(self.name)
        self._start()

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.update(logs or {})

    def on_step_end(self, args, state, control, **kwargs):
        self.wall.append(time.perf_counter() - self._wall)
        self.cpu.append(time.process_time() - self._cpu)
        phases = dict(STEP_PHASES)
        phases["optimizer_and_rest"] = self.wall[-1] - sum(
            phases.get(name, 0.0) for name in ("generate_and_score", "loss_forward", "backward")
        )
        self.phases.append(phases)
        if self.turns is not None:
            # Untimed: one trainer's garbage is collected here, not on the other trainer's clock.
            gc.collect()
            self.turns.hand_over(self.name)
        self._start()


def grpo_args(settings: TrainerSettings, output_dir: str, max_steps: int) -> GRPOConfig:
    return GRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=settings.prompts_per_step * settings.num_generations,
        num_generations=settings.num_generations,
        max_completion_length=settings.max_completion_length,
        learning_rate=settings.learning_rate,
        loss_type=settings.loss_type,
        beta=0.0,
        temperature=1.0,
        max_steps=max_steps,
        logging_steps=max_steps,
        seed=settings.seed,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        gradient_checkpointing=False,
    )


def run_interleaved(
    kinds: list[str],
    model_path: Path,
    settings: Any,
    data: dict[str, Dataset],
    max_steps: int,
    build: Callable[..., GRPOTrainer],
) -> tuple[dict[str, StepTimer], dict[str, GRPOTrainer]]:
    """Train every kind for ``max_steps`` steps, each in its own thread, taking turns step by step; ``build`` makes a
    kind's trainer from (kind, model_path, settings, data, output_dir, max_steps, timer), as
    ``bench_grpo.build_trainer`` does."""
    turns = Turns(kinds)
    timers = {kind: StepTimer(kind, turns, settings.seed) for kind in kinds}
    errors: dict[str, BaseException] = {}
    with tempfile.TemporaryDirectory(prefix="bench-grpo-") as output_root:
        # Built one after another in this thread (construction is not timed), then run in turns.
        trainers = {
            kind: build(kind, model_path, settings, data[kind], f"{output_root}/{kind}", max_steps, timers[kind])
            for kind in kinds
        }

        def run(kind: str) -> None:
            try:
                trainers[kind].train()
            except BaseException as error:  # reported below; the other trainer must not wait forever
                errors[kind] = error
            finally:
                turns.finish(kind)

        threads = [threading.Thread(target=run, args=(kind,), name=f"bench-{kind}") for kind in kinds]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for kind, error in errors.items():
        raise RuntimeError(f"the {kind} trainer failed: {type(error).__name__}: {error}") from error
    for kind, timer in timers.items():
        if len(timer.wall) != max_steps:
            raise RuntimeError(f"{kind}: expected {max_steps} timed steps, got {len(timer.wall)}")
    return timers, trainers


class ProfileAfterWarmup(TrainerCallback):
    """cProfile of the steps after the first ``warmup``: the trainer's thread and every thread started meanwhile
    (our rollout generates in worker threads, which a cProfile of the trainer's thread alone sees only as waiting)."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.main = cProfile.Profile()
        self.threads: list[cProfile.Profile] = []
        self.active = False

    def _profile_new_thread(self, frame: Any, event: str, arg: Any) -> None:
        sys.setprofile(None)
        profiler = cProfile.Profile()
        self.threads.append(profiler)
        profiler.enable()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.warmup and not self.active:
            self.active = True
            threading.setprofile(self._profile_new_thread)
            self.main.enable()

    def on_train_end(self, args, state, control, **kwargs):
        if self.active:
            self.main.disable()
            threading.setprofile(None)  # type: ignore[arg-type]
            self.active = False

    def stats(self) -> pstats.Stats:
        stats = pstats.Stats(self.main)
        for profiler in self.threads:
            profiler.disable()
            stats.add(profiler)
        # Idle pool threads waiting for work are not costs; they would top the cumulative list.
        for key in list(stats.stats):  # type: ignore[attr-defined]
            filename, _, function = key
            if (
                filename.endswith("concurrent/futures/thread.py") and function == "_worker"
            ) or "SimpleQueue" in function:
                del stats.stats[key]  # type: ignore[attr-defined]
        return stats


def top_costs(stats: pstats.Stats, sort: str, limit: int) -> str:
    stream = io.StringIO()
    stats.stream = stream  # type: ignore[attr-defined]
    stats.sort_stats(sort).print_stats(limit)
    return stream.getvalue().split("\n", 1)[-1].strip("\n")


def summarize(values: list[float]) -> dict[str, float]:
    return {
        "median_s": statistics.median(values),
        "mean_s": statistics.mean(values),
        "min_s": min(values),
        "n": len(values),
    }
