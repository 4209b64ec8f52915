"""Fixtures shared across the suite."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import termios
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest

from rllm_gym.sandbox import Sandbox, SandboxUnavailableError
from rllm_gym.tiny_model import build_tiny_model

REPO = Path(__file__).resolve().parents[1]
# One thread per process and no progress bars or GPUs: the command-line tests run on 2 shared cores and read stderr.
QUIET_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "CUDA_VISIBLE_DEVICES": ""}


def _run_python(
    *args: str, env: dict[str, str] | None = None, cwd: Path = REPO, timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=QUIET_ENV if env is None else env,
        timeout=timeout,
        cwd=cwd,
    )


@pytest.fixture
def run_python() -> Callable[..., subprocess.CompletedProcess]:
    """Runs ``python ARGS...`` (e.g. ``"-m", "rllm_gym.cli", "eval", ...``) as the user would, from the repository
    with ``QUIET_ENV`` unless ``env=`` is given, and gives the finished process with its text output."""
    return _run_python


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded tiny model, built once per test session into a temporary folder (no download)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="module")
def strict_sandbox():
    """A started Sandbox with every required isolation layer, one per test module; the module skips, saying why,
    where the strict sandbox refuses the machine."""
    try:
        box = Sandbox(max_parallel=8)
        box.start()
    except SandboxUnavailableError as exc:
        pytest.skip(f"the strict sandbox refuses this machine: {exc}")
    with box:
        yield box


def _run_with_stderr_on_a_terminal(
    command: list[str],
    *,
    stdout: int | IO = subprocess.DEVNULL,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> tuple[int, str]:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    process = subprocess.Popen(command, stdout=stdout, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the process closed its end
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return process.wait(timeout=timeout), b"".join(chunks).decode(errors="replace")


@pytest.fixture
def stderr_on_a_terminal() -> Callable[..., tuple[int, str]]:
    """Runs a command with stderr on a pseudo-terminal of 100 columns, as in an interactive shell (progress bars draw
    only there): ``run(command, stdout=..., env=...)`` gives its exit status and what it wrote to stderr."""
    return _run_with_stderr_on_a_terminal


@pytest.fixture
def generate_seconds(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[], str]], dict[str, float]]:
    """Clocks every transformers ``generate`` call (HFPolicy's and TRL's alike) on its own, for the benchmarks'
    generation timings: ``seconds = generate_seconds(key)`` sums each call's wall seconds under ``key()``."""
    import time

    from transformers.generation.utils import GenerationMixin

    def start(key: Callable[[], str]) -> dict[str, float]:
        seconds: dict[str, float] = {}
        original = GenerationMixin.generate

        def generate(model: object, *args: object, **kwargs: object) -> object:
            began = time.perf_counter()
            try:
                return original(model, *args, **kwargs)
            finally:
                name = key()
                seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - began

        monkeypatch.setattr(GenerationMixin, "generate", generate)
        return seconds

    return start
