"""The package's logging: everything logs through the ``rllm_gym`` logger (and its children, ``rllm_gym.engine``...).

A library only attaches a ``NullHandler`` (done on import); the ``rllm-gym`` command and the trainer call
:func:`configure_logging` with their ``--log-level`` to print records to stderr. Applications that configure
``logging`` themselves need nothing from here.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["LOG_LEVELS", "configure_logging", "logger", "quiet_deepspeed_import"]

LOG_LEVELS = ("debug", "info", "warning", "error")
logger = logging.getLogger("rllm_gym")


class _ConsoleHandler(logging.StreamHandler):
    """The handler :func:`configure_logging` adds (once)."""


def configure_logging(level: str = "warning") -> None:
    """Print the ``rllm_gym`` logger's records at ``level`` and above to stderr (a second call changes the level)."""
    if level.lower() not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {list(LOG_LEVELS)}, got {level!r}")
    logger.setLevel(level.upper())
    if not any(isinstance(handler, _ConsoleHandler) for handler in logger.handlers):
        handler = _ConsoleHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)


def quiet_deepspeed_import() -> None:
    """Drop DeepSpeed's "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it"
    notice, which each process of a run without CUDA prints on stdout when TRL imports DeepSpeed (the trainer chose the
    CPU itself then: use_cpu). The filter sits on DeepSpeed's logger, which keeps it when DeepSpeed loads, so the
    trainer's command line adds it before its imports; it drops that notice only (a GPU run never gets it)."""
    deepspeed_logger = logging.getLogger("DeepSpeed")
    if _not_the_cpu_notice not in deepspeed_logger.filters:  # once, however often a process runs the trainer
        deepspeed_logger.addFilter(_not_the_cpu_notice)


def _not_the_cpu_notice(record: logging.LogRecord) -> bool:
    return "Setting accelerator to CPU" not in record.getMessage()
