"""Fixtures shared across the suite."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
from hypothesis import settings

from rllm_gym.agents.frozenlake import FrozenLakeAgent
from rllm_gym.engine import AgentExecutionEngine
from rllm_gym.policies.base import SamplingParams
from rllm_gym.sandbox import Sandbox, SandboxUnavailableError
from rllm_gym.tiny_model import build_tiny_model

REPO = Path(__file__).resolve().parents[1]
# The property tests draw the same examples on every run (CI stays reproducible); HYPOTHESIS_PROFILE=explore draws new
# ones each run, for hunting.
settings.register_profile("reproducible", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "reproducible"))
# One thread per process and no progress bars or GPUs: the command-line tests run on 2 shared cores and read stderr.
QUIET_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "CUDA_VISIBLE_DEVICES": ""}


def _checkout_runs() -> dict[str, float]:
    """Every path under the checkout's runs/ (where the README's commands write) with its modification time."""
    runs = REPO / "runs"
    return {str(path.relative_to(runs)): path.stat().st_mtime for path in runs.rglob("*")} if runs.is_dir() else {}


@pytest.fixture(scope="session", autouse=True)
def _tests_leave_the_checkouts_runs_alone() -> Iterator[None]:
    """Tests never write into, or depend on, the checkout's runs/ (a user's own runs live there): they give each run
    an output_dir under tmp_path. Fails the session at its end when a test wrote there."""
    before = _checkout_runs()
    yield
    after = _checkout_runs()
    changed = sorted(path for path in after.keys() | before.keys() if after.get(path) != before.get(path))
    assert not changed, f"tests wrote into the checkout's runs/: {changed[:10]} (give each run a tmp_path output_dir)"


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


@pytest.fixture
def frozenlake_engine() -> Callable[..., AgentExecutionEngine]:
    """``make(policy, max_turns=N, max_tokens=M)``: the engine on FrozenLake with its agent, sampling at temperature 1
    with seed 0, as the end-to-end tests of each policy (HF, vLLM, a vLLM server) run their episodes."""

    def make(policy: Any, *, max_turns: int, max_tokens: int) -> AgentExecutionEngine:
        return AgentExecutionEngine(
            env_id="rllm/FrozenLake-v0",
            agent_cls=FrozenLakeAgent,
            policy=policy,
            max_turns=max_turns,
            sampling_params=SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=0),
        )

    return make


@contextmanager
def _server_process(
    command: Callable[[int], list[str]], log_path: Path, *, env: dict[str, str], start_s: float, stop_s: float
) -> Iterator[str]:
    with socket.socket() as sock:  # a free loopback port: other tests may serve at the same time
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = log_path.open("w")
    process = subprocess.Popen(command(port), env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + start_s
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited with {process.returncode}: {log_path.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not come up in {start_s:.0f} s; see {log_path}")
            time.sleep(0.25)
        yield f"{url}/v1"
    finally:
        process.terminate()
        try:
            process.wait(timeout=stop_s)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@pytest.fixture(scope="session")
def server_process() -> Callable[..., Any]:
    """``with server_process(command, log_path, env=..., start_s=..., stop_s=...) as base_url:`` runs
    ``command(port)`` (a model server) on a free loopback port, its output in ``log_path``, until its ``/health``
    answers (an error with the log's tail if it exits or takes over ``start_s``); gives its ``/v1`` URL, and stops it
    (terminate, then kill after ``stop_s``) on leaving."""
    return _server_process


@pytest.fixture(scope="session")
def openenv_frozenlake_url() -> Iterator[str]:
    """The URL of ``rllm/FrozenLake-v0`` served over OpenEnv on loopback by this process, for the session."""
    from rllm_gym.integrations.openenv import LocalServer

    server = LocalServer("rllm/FrozenLake-v0", max_sessions=64)
    yield server.base_url
    server.stop()


@pytest.fixture(autouse=True)
def _openenv_url_for_registry_wide_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test parametrized with ``rllm/OpenEnv-v0`` (the registry-wide suites make every id without arguments) gets
    a served FrozenLake as that env's base_url, through ``RLLM_GYM_OPENENV_URL``, unless the variable is set."""
    if "rllm/OpenEnv-v0" in request.node.name and "RLLM_GYM_OPENENV_URL" not in os.environ:
        monkeypatch.setenv("RLLM_GYM_OPENENV_URL", request.getfixturevalue("openenv_frozenlake_url"))


@pytest.fixture
def mcp_http_url() -> Iterator[str]:
    """The URL (``.../mcp``) of the MCP tests' server (tests/tools/mcp_test_server.py, FastMCP) over streamable HTTP
    on a free loopback port, for one test; killed after it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = [sys.executable, str(REPO / "tests" / "tools" / "mcp_test_server.py"), "--http", str(port)]
    process = subprocess.Popen(server, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120  # the server imports the MCP SDK: seconds on 2 loaded cores
        while time.monotonic() < deadline and process.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait()
