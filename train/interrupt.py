"""Ctrl-C during training: the step under way finishes, a checkpoint is saved, the run stops with one line (the
trainer's ``train()`` then returns before ``max_steps``, which is how train/grpo.py knows)."""

from __future__ import annotations

import signal
from typing import Any

from transformers import TrainerCallback

__all__ = ["StopOnInterrupt"]


class StopOnInterrupt(TrainerCallback):
    """Ctrl-C (SIGINT) during training: finish the current step, save a checkpoint, stop. During the last step there is
    nothing to stop: the run finishes as it would have.

    A second Ctrl-C quits at once (KeyboardInterrupt), leaving the last checkpoint saved before it.
    """

    def __init__(self, announce: bool = True):
        self.announce = announce
        self.requested = False
        self._step = 0
        self._max_steps = 0
        self._previous: Any = None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        self.requested = True
        if self.announce and self._step + 1 >= self._max_steps:
            print(
                f"Ctrl-C: step {self._step + 1} is the last: the run ends after it (Ctrl-C again quits at once)",
                flush=True,
            )
        elif self.announce:
            print(
                f"Ctrl-C: stopping after step {self._step + 1} with a checkpoint (continue with --resume true; "
                f"Ctrl-C again quits at once)",
                flush=True,
            )

    def on_train_begin(self, args, state, control, **kwargs):
        self._step, self._max_steps = state.global_step, state.max_steps
        self._previous = signal.signal(signal.SIGINT, self._handle)

    def on_step_end(self, args, state, control, **kwargs):
        self._step = state.global_step
        if self.requested and state.global_step < state.max_steps:
            control.should_save = True
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
