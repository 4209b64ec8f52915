"""``rllm-gym eval`` says why episodes failed: the summary counts termination reasons and groups the errors, an eval
whose every episode errored exits 1 with the reason, and an unreachable server is named in seconds."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "CUDA_VISIBLE_DEVICES": ""}
BAD_MAP = "task['map'] may only use the letters S (start, exactly one)"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "rllm_gym.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)


def write_tasks(path, maps):
    path.write_text("".join(json.dumps({"id": f"lake{i}", "map": rows}) + "\n" for i, rows in enumerate(maps)))
    return path


def eval_args(model, data):
    return ["eval", "--model", str(model), "--data", str(data), "--n", "2", "--max-turns", "2", "--max-tokens", "4"]


def test_an_eval_whose_episodes_all_errored_exits_1_with_the_error(tiny_model_dir, tmp_path):
    data = write_tasks(tmp_path / "tasks.jsonl", [["SXG"], ["SXG"]])
    result = run_cli(*eval_args(tiny_model_dir, data), "--json")
    assert result.returncode == 1, result.stderr
    summary = json.loads(result.stdout)
    assert summary["termination_reasons"] == {"error": 4}
    [group] = summary["errors"]
    assert group["type"] == "ValueError" and BAD_MAP in group["message"]
    assert group["count"] == 4 and group["example"] in {"lake0:0", "lake0:1", "lake1:0", "lake1:1"}
    assert "rllm-gym eval: all 4 episodes ended in ERROR, so there is no score:" in result.stderr
    assert f"4 x ValueError: {BAD_MAP}" in result.stderr
    assert "Traceback" not in result.stderr
    # The engine's log names the first failure as it happens (a warning, shown at the default level).
    assert "WARNING rllm_gym.engine.engine: episode lake" in result.stderr


def test_a_partly_failed_eval_exits_0_and_its_table_lists_the_errors(tiny_model_dir, tmp_path):
    data = write_tasks(tmp_path / "tasks.jsonl", [["SFG"], ["SXG"]])
    result = run_cli(*eval_args(tiny_model_dir, data), "--log-level", "error")
    assert result.returncode == 0, result.stderr
    assert "termination_reasons" in result.stdout and "error 2" in result.stdout
    assert "errors behind the ERROR episodes" in result.stdout
    assert "2 x ValueError: task['map'] may only use" in result.stdout and "(e.g. episode lake1:" in result.stdout
    assert "rllm_gym.engine" not in result.stderr  # --log-level error hides the engine's warnings


def test_an_unreachable_server_is_named_with_the_connection_error(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    result = run_cli("eval", "--policy", "openai", "--model", "m", "--base-url", url, "--tasks", "1")
    assert result.returncode == 1
    assert f"rllm-gym eval: cannot reach the OpenAI-compatible server at {url}: ConnectError:" in result.stderr
    assert "Traceback" not in result.stderr


def test_log_level_is_a_flag_of_every_command_and_is_checked():
    result = run_cli("view", "--log-level", "loud", "x.jsonl")
    assert result.returncode == 2
    assert "argument --log-level: invalid choice: 'loud'" in result.stderr
