"""The trainer's command line, the same for ``rllm-gym train ARGS`` and ``python -m rllm_gym.train.grpo ARGS`` (or
``accelerate launch train/grpo.py ARGS``): each entry point reads its argv once and hands it here.

A run that its flags alone refuse (an output_dir taken by another run, a task file that does not exist) is refused
before torch and TRL load (seconds, :func:`rllm_gym.train.run_dir.exit_status_before_imports`); then :func:`cli`
parses the flags once into a ``TrainConfig``, runs it (:func:`rllm_gym.train.grpo.start`) and turns how it ended into
an exit status. This module imports nothing heavy: :func:`cli` loads the trainer when it is called.
"""

from __future__ import annotations

import os
import sys

__all__ = ["cli", "train_command"]


def train_command(argv: list[str], prog: str | None = None) -> int:
    """The exit status of the training run ``argv`` asks for (the flags after the program's name); ``prog`` is the
    name its ``--help`` and usage lines give the command (default: argparse's, the script's file name)."""
    from rllm_gym.train.run_dir import exit_status_before_imports

    if (status := exit_status_before_imports(argv)) is not None:
        return status
    from rllm_gym.log import quiet_deepspeed_import

    quiet_deepspeed_import()  # before the trainer's imports bring DeepSpeed (with TRL)
    return cli(argv, prog=prog)


def cli(argv: list[str], prog: str | None = None) -> int:
    """The exit status of the run ``argv`` asks for, its flags parsed once into a ``TrainConfig``: a run that cannot
    go on ends with one line on stderr and exit status 1 (130 on Ctrl-C); a usage error (a setting that cannot be
    used, an output_dir taken by another run) with exit status 2, as in ``rllm-gym eval``. ``--debug true`` shows the
    traceback of an error too. Loads the trainer (torch, TRL); :func:`train_command` refuses what it can first."""
    from rllm_gym.train.config import load_config
    from rllm_gym.train.config_file import ConfigError
    from rllm_gym.train.grpo import Interrupted, start
    from rllm_gym.train.run_dir import OutputDirError, RunFinished
    from rllm_gym.train.trainer import TrainingStopped

    try:
        config, config_dir = load_config(argv, prog=prog)
    except ConfigError as error:
        for line in str(error).splitlines():
            print(f"rllm-gym train: error: {line}", file=sys.stderr, flush=True)
        return 2
    try:
        start(config, config_dir)
    except OutputDirError as error:
        print(f"rllm-gym train: {error}", file=sys.stderr, flush=True)
        return 2
    except RunFinished as finished:
        if int(os.environ.get("RANK", "0")) == 0:  # said once, not by every process of a launch
            print(f"rllm-gym train: {finished}", flush=True)
        return 0
    except TrainingStopped as stop:
        print(f"rllm-gym train: {stop}", file=sys.stderr, flush=True)
        return 1
    except Interrupted:
        return 130  # StopOnInterrupt said so when Ctrl-C came
    except Exception as error:
        if config.debug:
            raise
        print(f"rllm-gym train: {type(error).__name__}: {error} (--debug shows the traceback)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rllm-gym train: interrupted; the last checkpoint saved before it is kept", file=sys.stderr, flush=True)
        return 130
    return 0
