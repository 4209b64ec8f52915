"""Every command the README's bash blocks and the headers of train/configs/*.yaml give runs as written (issue 34,
point 4). The commands are parsed out of those files, so a new or changed one is covered without editing this test.

Executed, bounded by flags appended at the end (later flags win): trainer runs (``--max_steps 1``, a short warm
start, 2 tasks per evaluation), ``rllm-gym eval`` (4 tasks x 2 rollouts, 2 turns), and as written ``rllm-gym list``
and ``view``, in the README's order in one folder, so that the main job's output exists when later commands use it
(and a later run into another folder is not refused). Checked, not executed: ``accelerate launch`` (multi-process
or GPU: its launcher config, script and trainer YAML must exist and the YAML must load), eval against an OpenAI
server (the flags must parse), model servers (``vllm serve``, ``trl vllm-serve``, ``transformers serve``: their
program is named only), installs (``pip``, ``python3 -m venv``, ``.``), and ``pytest``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "CUDA_VISIBLE_DEVICES": ""}
TRAIN_BOUNDS = ["--max_steps", "1", "--warm_start_steps", "2", "--eval_limit", "2", "--eval_n", "0"]
EVAL_BOUNDS = ["--tasks", "4", "--n", "2", "--max-turns", "2"]
SERVERS = (
    "vllm serve",
    "trl vllm-serve",
    "transformers serve",
    "python -m vllm.entrypoints.openai.api_server",
    "rllm-gym serve",  # OpenEnv; run by tests/envs/test_openenv.py
)
INSTALLS = ("pip install", "pip uninstall", "python3 -m venv", ". .venv/bin/activate", ". .venv-vllm/bin/activate")


def joined(lines: list[str]) -> list[str]:
    """Lines with their ``\\`` continuations joined, comments and blank lines dropped."""
    commands, current = [], ""
    for line in lines:
        text = line.strip()
        if not current and (not text or text.startswith("#")):
            continue
        current += " " + text.removesuffix("\\").strip()
        if not text.endswith("\\"):
            commands.append(current.strip())
            current = ""
    return commands


def readme_commands() -> list[tuple[str, str]]:
    """``(where, command)`` for each command of the README's bash blocks; ``a && b`` is two commands."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.DOTALL):
        for line in joined(block.splitlines()):
            code = shlex.split(line, comments=True)
            text = shlex.join(code)
            found += [("README.md", part.strip()) for part in text.split(" '&&' ")]
    return found


def header_commands() -> list[tuple[str, str]]:
    """``(where, command)`` for each command in the leading comment of each train/configs/*.yaml."""
    found = []
    for path in sorted((REPO / "train" / "configs").glob("*.yaml")):
        header = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            header.append(line[1:])
        starts = ("python", "accelerate", "rllm-gym", "trl", "CUDA_VISIBLE_DEVICES", "pip")
        lines, keep = [], False
        for line in header:  # a command line is indented and starts with a program; continuations follow it
            text = line.strip()
            if line.startswith("   ") and (text.startswith(starts) or (keep and lines[-1].endswith("\\"))):
                lines.append(text)
                keep = True
            else:
                keep = False
        found += [(path.name, shlex.join(shlex.split(line, comments=True))) for line in joined(lines)]
    return found


def kind(command: str) -> str:
    """How the test covers a command: run, accelerate, openai, vllm, server, install, pytest or benchmark."""
    words = shlex.split(command)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # CUDA_VISIBLE_DEVICES=1,2,3 accelerate ...
        words = words[1:]
    text = shlex.join(words)
    if text.startswith(INSTALLS):
        return "install"
    if text.startswith(SERVERS):
        return "server"
    if words[0] == "pytest":
        return "pytest"
    if text.startswith("accelerate launch"):
        return "accelerate"
    if text.startswith("python benchmarks/"):
        return "benchmark"
    if text.startswith("rllm-gym eval") and "--policy openai" in text:
        return "openai"
    if text.startswith("rllm-gym eval") and "--policy vllm" in text:
        return "vllm"  # run by the vLLM suite in its own venv (tests/vllm/test_exit.py), as the README says
    if text.startswith(("python -m rllm_gym.train.grpo", "rllm-gym train", "rllm-gym eval", "rllm-gym list")):
        return "run"
    if text.startswith("rllm-gym view"):
        return "run"
    if text.startswith("rllm-gym benchmarks"):
        return "run"
    return "unknown"


ALL = readme_commands() + header_commands()


def test_the_commands_are_found_and_each_is_covered():
    where = {source for source, _ in ALL}
    assert "README.md" in where and "demo_cpu.yaml" in where and "reasoning_gym_cpu.yaml" in where
    kinds = {command: kind(command) for _, command in ALL}
    assert [command for command, found in kinds.items() if found == "unknown"] == []
    assert sum(found == "run" for found in kinds.values()) >= 14  # the generalization YAML is retired


def bounded(command: str, folder: Path) -> list[str]:
    """The command as a program and arguments run here, with the bounds appended (and a /tmp/X path as folder/X)."""
    words = [
        str(folder / word.removeprefix("/tmp/")) if word.startswith("/tmp/") else word for word in shlex.split(command)
    ]
    if words[0] == "rllm-gym":
        words = [sys.executable, "-m", "rllm_gym.cli", *words[1:]]
    elif words[0] == "python":
        words = [sys.executable, *words[1:]]
    if "rllm_gym.train.grpo" in words or words[3:4] == ["train"]:
        return [*words, *TRAIN_BOUNDS]
    if words[3:4] == ["eval"]:
        return [*words, *EVAL_BOUNDS]
    return words


# About a minute on 2 cores (7 bounded trainer runs, 4 evals of the tiny model): slow, so it runs with the README's
# test command and in CI (.ci/run), not in a plain `pytest`.
@pytest.mark.slow
@pytest.mark.timeout(1200)  # its own limit: on 2 busy cores the commands together pass pyproject's global 300 s
def test_every_runnable_command_runs_as_written_in_the_documents_order(tmp_path, request):
    """Each document's commands run in order in a folder of their own (a config header's main-job command, run
    after the README's, would find the README's run there: they are one command written twice, not two runs).
    A server started in the background (``rllm-gym serve ... &``) serves the commands after it, on a free port."""
    servers, ports = contextlib.ExitStack(), {}  # ports: a background server's port as written -> its port here
    request.addfinalizer(servers.close)
    for source, command in ALL:
        if command.startswith("rllm-gym serve") and command.endswith(" '&'"):
            servers.enter_context(background_server(command, ports))
            continue
        if kind(command) != "run":
            continue
        for written, free in ports.items():
            command = command.replace(f"127.0.0.1:{written}", f"127.0.0.1:{free}")
        folder = tmp_path / source
        if not folder.exists():
            folder.mkdir()
            (folder / "train").symlink_to(REPO / "train")  # commands name train/configs/... from the repository root
        words = bounded(command, folder)
        result = subprocess.run(words, capture_output=True, text=True, env=ENV, timeout=600, cwd=folder)
        if "--reason error" in command:  # no episode ended in ERROR here: said so, status 0
            assert "ended with reason 'error'" in result.stderr, (source, command, result.stderr)
        assert result.returncode == 0, f"{source}: {command}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
        assert "Traceback" not in result.stderr, (source, command, result.stderr)
    readme = tmp_path / "README.md"
    assert (readme / "runs" / "demo_cpu" / "final").is_dir() and (readme / "episodes.jsonl").is_file()
    assert (readme / "runs" / "demo_50" / "final").is_dir()  # not refused: the example has a folder of its own


@contextlib.contextmanager
def background_server(command: str, ports: dict[str, str]) -> Iterator[None]:
    """``rllm-gym serve ... &`` started as written but on a free loopback port (recorded in ``ports``), until /health
    answers; stopped on leaving."""
    words = shlex.split(command)[:-1]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = str(probe.getsockname()[1])
    at = words.index("--port") + 1
    ports[words[at]], words[at] = free, free
    server = [sys.executable, "-m", "rllm_gym.cli", *words[1:]]
    process = subprocess.Popen(server, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(1200):
            assert process.poll() is None, f"{command} exited with {process.returncode}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{free}/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        yield
    finally:
        process.kill()
        process.wait()


def test_launched_and_served_commands_name_files_that_exist_and_parse():
    import typing

    from rllm_gym.cli import build_parser
    from rllm_gym.train.config import TrainConfig, trl_options
    from rllm_gym.train.config_file import read_config_file

    hints = {**typing.get_type_hints(trl_options()), **typing.get_type_hints(TrainConfig)}
    checked = 0
    for source, command in ALL:
        words = shlex.split(command)
        found = kind(command)
        if found == "accelerate":
            launcher = words[words.index("--config_file") + 1]
            assert (REPO / launcher).is_file(), (source, command)
            script = next(word for word in words if word.endswith(".py"))
            assert (REPO / script).is_file(), (source, command)
            config = words[words.index("--config") + 1]
            if config != "my_run.yaml":  # the README's placeholder for the reader's own config
                read_config_file(REPO / config, hints)  # keys and value types
            checked += 1
        elif found in ("openai", "vllm"):  # parsed here; vLLM's eval runs in the vLLM suite
            build_parser().parse_args(words[1:])
            checked += 1
        elif found == "benchmark":
            assert (REPO / words[1]).is_file(), (source, command)
    assert checked >= 8


def test_ci_runs_the_readmes_test_command_and_it_selects_the_slow_tests_too():
    """.ci/run runs the README's test command, and that command keeps the tests marked slow, which a plain ``pytest``
    (the ``-m 'not slow'`` in pyproject.toml's addopts) leaves out."""
    from _pytest.mark.expression import Expression

    [command] = [c for where, c in ALL if where == "README.md" and kind(c) == "pytest" and "tests/" not in c]
    ci_lines = (REPO / ".ci" / "run").read_text().splitlines()
    # As written: `python -m pytest` would put the checkout on sys.path and pass where the README's command fails.
    ci = [shlex.join(shlex.split(line)) for line in ci_lines if re.match(r"(python3? -m )?pytest\b", line)]
    assert command in ci, (command, ci)
    assert not [line for line in ci if not line.startswith("pytest")], ci
    words = shlex.split(command)
    selects = Expression.compile(words[words.index("-m") + 1]).evaluate
    assert selects(lambda mark, **kwargs: mark == "slow") and selects(lambda mark, **kwargs: False)
    assert not Expression.compile("not slow").evaluate(lambda mark, **kwargs: mark == "slow")  # a plain pytest
