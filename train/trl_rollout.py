"""Deprecated name of :mod:`rllm_gym.train.trainer` (the trainer's module, named for the trainer since issue 44).

Importing it works as before and warns once; import from :mod:`rllm_gym.train.trainer` instead.
"""

from __future__ import annotations

import warnings

from rllm_gym.train.trainer import *  # noqa: F403  (the same public names, unchanged)
from rllm_gym.train.trainer import __all__  # noqa: F401

warnings.warn(
    "rllm_gym.train.trl_rollout is deprecated and will be removed: import from rllm_gym.train.trainer",
    FutureWarning,
    stacklevel=2,
)
