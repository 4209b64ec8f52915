"""The package's logging: everything logs through the ``rllm_gym`` logger (and its children, ``rllm_gym.engine``...).

A library only attaches a ``NullHandler`` (done on import); the ``rllm-gym`` command and the trainer call
:func:`configure_logging` with their ``--log-level`` to print records to stderr. Applications that configure
``logging`` themselves need nothing from here.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["LOG_LEVELS", "configure_logging", "logger"]

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
