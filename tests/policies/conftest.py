"""Shared fixtures for the policy tests: the tiny model folder and a real `transformers serve` process on it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def served_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """`transformers serve` on the tiny model, on a free loopback port; yields its base URL."""
    port = free_port()
    hf_home = tmp_path_factory.mktemp("hf_home")
    # Offline, with its own HF cache dir (its /v1/models needs one), one torch thread so it shares the CPUs politely.
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(tiny_model_dir)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    log = (hf_home / "serve.log").open("w")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"transformers serve exited: {(hf_home / 'serve.log').read_text()[-2000:]}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("transformers serve did not start within 90 s")
            time.sleep(0.25)
        yield url + "/v1"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
