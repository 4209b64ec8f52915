"""The limits of one sandboxed run: each default written once, every value checked by one rule.

:class:`SandboxLimits` is what :func:`rllm_gym.sandbox.run_python`, :class:`rllm_gym.rewards.code.CodeReward`,
:class:`rllm_gym.tools.PythonTool` and the envs built on them take and check, so a value one of them accepts is
accepted by all, and a refused one is refused with the same message naming the caller, the field and what to pass.
"""

from __future__ import annotations

import math
from dataclasses import InitVar, dataclass, fields
from typing import Any

__all__ = ["DEFAULT_LIMITS", "SandboxLimits"]

# field -> (kind, exclusive lower bound, what the value means, an example): the one rule per limit.
_RULES: dict[str, tuple[type, int, str, str]] = {
    "timeout": (float, 0, "wall-clock, per run", "5.0"),
    "memory_mb": (int, 16, "megabytes per run", "512"),
    "cpu_time_s": (float, 0, "CPU time, per run; None: the timeout", "5.0"),
    "max_output_bytes": (int, 0, "bytes per output stream", "1048576"),
    "file_size_mb": (int, 0, "megabytes per written file", "16"),
    "max_processes": (int, 0, "processes per run", "32"),
}


def _check(owner: str, name: str, value: Any) -> None:
    """Raise ValueError naming ``owner``, the field and the fix unless ``value`` obeys the field's rule.

    Counts are exact ints (``512.0`` and ``True`` are refused: a limit is never silently rounded, ``0.5`` MB never
    becomes 0); seconds are finite numbers (``inf`` would leave the host waiting forever on a run)."""
    kind, bound, meaning, example = _RULES[name]
    if kind is int:
        valid = type(value) is int and value > bound
        wanted = f"an int > {bound}"
    else:
        valid = type(value) in (int, float) and bound < value < math.inf
        wanted = "a positive number of seconds, finite"
    if not valid:
        raise ValueError(f"{owner} {name} must be {wanted} ({meaning}), got {value!r}; pass e.g. {name}={example}")


@dataclass(frozen=True, kw_only=True)
class SandboxLimits:
    """Limits of one run; invalid values raise ValueError at construction.

    Args:
        timeout: wall-clock seconds. memory_mb: address-space limit and, where a memory cgroup exists, the limit of
            every page the run touches. cpu_time_s: CPU-time limit (None: ``timeout``). max_output_bytes: cap per
            output stream; past it the run is killed (``output_limit``). file_size_mb: largest file it may write
            (its workdir holds twice that). max_processes: processes it may run.
        owner: who asked, named in error messages (``"CodeReward"``); not a field.
    """

    timeout: float = 5.0
    memory_mb: int = 512
    cpu_time_s: float | None = None
    max_output_bytes: int = 1 << 20
    file_size_mb: int = 16
    max_processes: int = 32
    owner: InitVar[str] = "sandbox"

    def __post_init__(self, owner: str) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if not (item.name == "cpu_time_s" and value is None):
                _check(owner, item.name, value)

    @property
    def cpu_seconds(self) -> float:
        """The CPU-time limit in effect: ``cpu_time_s``, else ``timeout``."""
        return self.timeout if self.cpu_time_s is None else self.cpu_time_s


DEFAULT_LIMITS = SandboxLimits()
