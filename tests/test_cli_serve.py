"""``rllm-gym serve``: every mistake (a wrong or multi-agent id, bad env arguments, a port in use, an address not of
this machine) is one line on stderr, before it says that it serves."""

from __future__ import annotations

import socket

import pytest

pytestmark = pytest.mark.slow  # each run imports OpenEnv (gradio included): ~5-10 s on 2 cores


def test_every_mistake_is_one_line_naming_it(run_python) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        cases = {
            ("rllm/FrozenLake-v0", "--port", port): f"cannot listen on 127.0.0.1:{port}",
            ("rllm/FrozenLake-v0", "--host", "192.0.2.1"): "--host must be an address of this machine",
            ("rllm/FrozenLake-v0", "--env-kwargs", '{"size": 0}'): "FrozenLake size must be an int",
            ("rllm/SolverJudge-v0",): "is multi-agent",
            ("rllm/Frozenlake-v0",): "Did you mean 'rllm/FrozenLake-v0'",
        }
        for args, message in cases.items():
            result = run_python("-m", "rllm_gym.cli", "serve", *args)
            assert result.returncode == 1 and result.stdout == "", (args, result.stdout)  # never said it serves
            (line,) = result.stderr.strip().splitlines()
            assert line.startswith("rllm-gym serve: ") and message in line, (args, line)
