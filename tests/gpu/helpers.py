"""The GPU suite's helpers: skips that say what is missing, a trainer launcher, a `trl vllm-serve` process.

Loaded by each test module with :func:`load` (the suite runs with ``--import-mode=importlib``, where test folders
are no packages).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "train" / "configs" / "qwen_math_1gpu.yaml"
ACCELERATE = REPO / "train" / "accelerate"
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0

# `trl vllm-serve` without relying on the console script being on PATH (pip --target installs leave it out).
TRL_CLI = "import sys; from trl.cli import main; sys.exit(main())"
requires_cuda = pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")


def requires(module: str, extra: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None,
        reason=f"needs {module} (pip install 'rllm-gym[{extra}]', or the wheels of benchmarks/gpu/wheels.py)",
    )


def requires_gpus(n: int) -> pytest.MarkDecorator:
    return pytest.mark.skipif(n > GPUS, reason=f"needs {n} CUDA GPUs, {GPUS} visible")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def small_run(model: Path, output_dir: Path, *extra: str) -> list[str]:
    """train/grpo.py flags: qwen_math_1gpu.yaml's GPU settings (fp32 weights, bf16 autocast, gradient accumulation;
    vLLM per test) on learnable episodes, 4 steps of 8 prompts x 4 rollouts.

    A random-weight model never solves a math problem: every reward would be 0, every advantage and gradient too,
    and no weight would change. So the env is FrozenLake on 2x2 maps (the goal one or two moves away) after a short
    format warm start, where random valid moves win some episodes and rewards differ within groups (on the CPU a run
    saw groups of 2 all fail for 3 steps in a row: hence groups of 4 and 32 episodes a step).
    """
    maps = [["SG", "FF"], ["SF", "GF"], ["SF", "FG"]]
    tasks = output_dir.parent / "easy_maps.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"easy{i}", "map": m}) + "\n" for i, m in enumerate(maps)))
    flags = ["--config", str(CONFIG), "--model", str(model), "--output_dir", str(output_dir)]
    flags += ["--env", "rllm/FrozenLake-v0", "--tasks", str(tasks), "--max_turns", "3", "--warm_start_steps", "20"]
    flags += ["--max_steps", "4", "--prompts_per_step", "8", "--num_generations", "4", "--max_completion_length", "8"]
    flags += ["--save_steps", "1", "--logging_steps", "1", "--learning_rate", "3e-4", "--warmup_ratio", "0"]
    flags += ["--vllm_max_model_length", "1024", "--vllm_gpu_memory_utilization", "0.2", "--use_vllm", "false"]
    return [*flags, *extra]  # later flags win


def updated_by_rl(output_dir: Path, history: list[dict]) -> list[str]:
    """Tensors that an RL step changed: between the checkpoints around the last step with a nonzero gradient (the
    warm start changes weights too, so the model before training is no reference)."""
    assert history and all("grad_norm" in record for record in history), history  # a missing metric fails
    steps = [record["step"] for record in history if record["grad_norm"] > 0 and record["step"] > 1]
    assert steps, f"no step after the first had a nonzero gradient: {history}"
    return changed_tensors(output_dir / f"checkpoint-{steps[-1] - 1}", output_dir / f"checkpoint-{steps[-1]}")


def launch(accelerate_config: str, flags: list[str], processes: int, env: dict | None = None, timeout: float = 900):
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ACCELERATE / accelerate_config),
    ]
    command += ["--num_processes", str(processes), "--main_process_port", str(free_port())]
    return run([*command, str(REPO / "train" / "grpo.py"), *flags], env=env, timeout=timeout)


def run(command: list[str], env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1", **(env or {})}
    result = subprocess.run(command, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-8000:]}"
    return result


def metrics(output_dir: Path) -> list[dict]:
    """The run's training-step records (evaluation records, which lack a reward, left out)."""
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return [record for record in records if "reward" in record]


def changed_tensors(before: Path, after: Path) -> list[str]:
    """Names of the tensors that differ between two model folders' safetensors files."""
    from safetensors.torch import load_file

    old = {k: v for f in sorted(before.glob("*.safetensors")) for k, v in load_file(f).items()}
    new = {k: v for f in sorted(after.glob("*.safetensors")) for k, v in load_file(f).items()}
    assert set(new) <= set(old) | {"lm_head.weight"}, sorted(set(new) - set(old))
    return [name for name in old if name in new and not torch.equal(old[name].float(), new[name].float())]


class VLLMServer:
    """`trl vllm-serve` in a subprocess (its own process group) on the GPUs in ``devices``."""

    def __init__(self, model: Path, devices: str, log: Path) -> None:
        self.port, self.log = free_port(), log
        command = [sys.executable, "-c", TRL_CLI, "vllm-serve", "--model", str(model), "--port", str(self.port)]
        command += ["--gpu_memory_utilization", "0.3", "--max_model_len", "1024", "--enforce_eager", "true"]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": devices}
        with log.open("w") as stdout:  # the child keeps its own copy of the file descriptor
            self.process = subprocess.Popen(
                command, env=env, stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"trl vllm-serve exited:\n{self.log.read_text()[-6000:]}"
            try:
                with urllib.request.urlopen(f"{self.url}/health/", timeout=2):
                    return
            except OSError:
                time.sleep(2)
        raise AssertionError(f"trl vllm-serve did not answer in {timeout} s:\n{self.log.read_text()[-6000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
