"""End-to-end launches of train/grpo.py: one process, `accelerate launch` on 2 CPU processes, ZeRO-2 on CPU.

Each test runs the real command line in a subprocess (train/configs/test_tiny.yaml: 3 GRPO steps, a few seconds of
training) and checks what the run leaves in its output folder. Both processes of a 2-process run are seen in the
metrics: a step's batch holds every process's trajectories (TRL gathers them), twice a single process's count.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "train" / "configs" / "test_tiny.yaml"
ACCELERATE = REPO / "train" / "accelerate"


def tiny_config() -> dict:
    return yaml.safe_load(TINY.read_text())


def free_port() -> int:
    # Concurrent runs (other tests, other users of the machine) must not meet on one rendezvous port.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(command: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",  # 2 processes on 2 cores: no thread oversubscription
        "CUDA_VISIBLE_DEVICES": "",  # the CPU path even on a GPU machine
        "DS_ACCELERATOR": "cpu",
        "TOKENIZERS_PARALLELISM": "false",
    }
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result


def easy_tasks(folder: Path) -> list[str]:
    """CLI overrides for learnable episodes: 2x2 maps (the goal one move away) after a short format warm start.

    On the 4x4 maps of test_tiny.yaml two turns never reach the goal, every reward is 0 and so is every gradient;
    here rewards differ within groups, so the distributed runs really reduce nonzero gradients.
    """
    maps = [["SG", "FF"], ["SF", "GF"], ["SF", "FG"]]
    path = folder / "easy_maps.jsonl"
    path.write_text("".join(json.dumps({"id": f"easy{i}", "map": m}) + "\n" for i, m in enumerate(maps)))
    return ["--tasks", str(path), "--warm_start_steps", "20", "--max_turns", "3"]


def launch(config_file: str, output_dir: Path, timeout: float, *flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE / config_file)]
    command += ["--main_process_port", str(free_port()), str(REPO / "train" / "grpo.py")]
    command += ["--config", str(TINY), "--output_dir", str(output_dir), *easy_tasks(output_dir.parent), *flags]
    return run(command, timeout)


# What the libraries print at every launch that says nothing to the user (train/console.py and rllm_gym/log.py
# drop each): DDP's search for unused parameters, DeepSpeed's deprecated collective, its build notice, and its
# accelerator notice on a machine without CUDA.
LIBRARY_NOISE = (
    "find_unused_parameters",
    "all_gather_into_tensor",
    "built successfully",
    "Setting accelerator to CPU",
)


def check_quiet(result: subprocess.CompletedProcess) -> None:
    for noise in LIBRARY_NOISE:
        assert noise not in result.stdout + result.stderr, (noise, result.stdout[-2000:], result.stderr[-4000:])


def check_run(output_dir: Path, stdout: str, processes: int) -> list[dict]:
    config = tiny_config()
    summary = json.loads((output_dir / "summary.json").read_text())
    assert summary["config"]["max_steps"] == config["max_steps"]
    assert summary["config"]["output_dir"] == str(output_dir)
    assert summary["train_seconds"] > 0
    assert (output_dir / "final" / "model.safetensors").is_file()
    assert (output_dir / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    history = [record for record in records if "reward" in record]
    # One record per step, written by the main process only.
    assert [record["step"] for record in history] == list(range(1, config["max_steps"] + 1))
    # prompts_per_step counts over all processes: the gathered batch holds every process's trajectories.
    assert summary["num_processes"] == processes
    per_step = config["prompts_per_step"] * config["num_generations"]
    assert all(record["trajectories/total"] == per_step for record in history)
    assert all(0.0 <= record["reward"] <= 1.0 for record in history)
    # The console line of each step comes from the main process only.
    assert stdout.count("step     1  reward") == 1
    return history


def test_single_process_module_run(tmp_path):
    output_dir = tmp_path / "run"
    command = [sys.executable, "-m", "rllm_gym.train.grpo", "--config", str(TINY), "--output_dir", str(output_dir)]
    result = run(command, timeout=120)
    check_run(output_dir, result.stdout, processes=1)


@pytest.mark.slow
def test_accelerate_launch_two_cpu_processes(tmp_path):
    output_dir = tmp_path / "run"
    # With a held-out task and pass@2 evaluated every 2 steps: each process runs a share and the main one logs.
    evaluation = ["--eval_greedy", "true", "--eval_tasks", "1", "--eval_steps", "2", "--eval_n", "2"]
    result = launch("cpu_2.yaml", output_dir, 180, *evaluation)
    check_quiet(result)
    history = check_run(output_dir, result.stdout, processes=2)
    assert any(record["grad_norm"] > 0 for record in history), history
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    evaluated = [record for record in records if "eval_heldout/greedy" in record]
    assert [record["step"] for record in evaluated] == [0, 2, 3] and result.stdout.count("eval      2") == 1
    assert all({"eval_train/greedy", "eval_heldout/pass@1", "eval_heldout/pass@2"} <= set(r) for r in evaluated)
    summary = json.loads((output_dir / "summary.json").read_text())
    assert summary["split"]["envs"]["rllm/FrozenLake-v0"]["eval_tasks"] == 1
    # Each process saved its own RNG state in the checkpoint: both took part in training.
    checkpoint = output_dir / f"checkpoint-{tiny_config()['max_steps']}"
    assert sorted(path.name for path in checkpoint.glob("rng_state_*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]


@pytest.mark.slow
def test_accelerate_launch_deepspeed_zero2_on_cpu(tmp_path):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install 'rllm-gym[deepspeed]')")
    output_dir = tmp_path / "run"
    # The first DeepSpeed run on a machine JIT-compiles its CPU shared-memory comm op (about a minute, then cached
    # in ~/.cache/torch_extensions) unless it was built at install time (DS_BUILD_SHM_COMM=1), hence the timeout.
    result = launch("zero2_cpu.yaml", output_dir, timeout=300)
    check_quiet(result)
    history = check_run(output_dir, result.stdout, processes=2)
    assert any(record["grad_norm"] > 0 for record in history), history
    # A DeepSpeed checkpoint: the ZeRO-2 optimizer states are sharded, one file per process.
    step_dir = output_dir / f"checkpoint-{tiny_config()['max_steps']}" / f"global_step{tiny_config()['max_steps']}"
    shards = sorted(path.name for path in step_dir.glob("*optim_states.pt"))
    assert shards == ["zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]


@pytest.mark.slow
@pytest.mark.parametrize("config_file", ["cpu_2.yaml", "zero2_cpu.yaml"])
def test_launched_runs_train_resume_and_save_in_the_dtype_asked_for(config_file, tmp_path):
    from safetensors import safe_open

    if config_file.startswith("zero"):
        pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install 'rllm-gym[deepspeed]')")
    output_dir = tmp_path / "run"
    launch(config_file, output_dir, 300, "--dtype", "bf16", "--max_steps", "1", "--save_steps", "1")
    launch(
        config_file, output_dir, 300, "--dtype", "bf16", "--max_steps", "2", "--save_steps", "1", "--resume", "true"
    )
    for folder in ("checkpoint-1", "checkpoint-2", "final"):
        with safe_open(output_dir / folder / "model.safetensors", "pt") as weights:
            assert {weights.get_tensor(key).dtype for key in weights.keys()} == {torch.bfloat16}, folder  # noqa: SIM118
    history = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in history] == [1, 2]  # the second launch resumed at step 2


@pytest.mark.parametrize("name", sorted(path.name for path in ACCELERATE.glob("*.yaml")))
def test_accelerate_configs_load_and_document_their_command(name):
    from accelerate.commands.config.config_args import load_config_from_file

    path = ACCELERATE / name
    config = load_config_from_file(str(path))
    assert config.num_processes >= 1 and config.num_machines >= 1
    assert f"accelerate launch --config_file train/accelerate/{name}" in path.read_text()
    if config.num_machines > 1:
        assert config.main_process_ip and config.main_process_port
        assert "--machine_rank" in path.read_text()


@pytest.mark.slow
def test_a_taken_output_folder_under_accelerate_launch_is_said_once(tmp_path):
    """Every process exits with 2 before its imports; only the first says why (the launcher then reports the failed
    processes itself: that part is accelerate's and torch's)."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE / "cpu_2.yaml")]
    command += ["--main_process_port", str(free_port()), str(REPO / "train" / "grpo.py")]
    command += ["--config", str(TINY), "--output_dir", str(tmp_path / "run")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode != 0
    said = f"rllm-gym train: output_dir {tmp_path / 'run'} holds another run"
    assert (result.stdout + result.stderr).count(said) == 1, result.stderr
    assert "exitcode  : 2" in result.stderr  # each process's own status: a usage error


def test_deepspeeds_accelerator_notice_is_dropped_before_it_loads(run_python):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install 'rllm-gym[deepspeed]')")
    env = {key: value for key, value in os.environ.items() if key != "DS_ACCELERATOR"} | {"CUDA_VISIBLE_DEVICES": ""}
    load = "import deepspeed.accelerator as a; a.get_accelerator()"
    quiet = run_python(
        "-c", f"from rllm_gym.log import quiet_deepspeed_import; quiet_deepspeed_import(); {load}", env=env
    )
    assert quiet.returncode == 0, quiet.stderr
    assert "Setting accelerator to CPU" not in quiet.stdout + quiet.stderr
    plain = run_python("-c", load, env=env)
    assert "Setting accelerator to CPU" in plain.stdout + plain.stderr  # what the filter drops is really printed


@pytest.mark.slow
@pytest.mark.parametrize("config_file", ["cpu_2.yaml", "zero2_cpu.yaml", "zero3_cpu.yaml"])
def test_accelerate_launch_two_cpu_processes_each_with_a_generation_worker(config_file, tmp_path):
    if config_file.startswith("zero"):
        pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install 'rllm-gym[deepspeed]')")
    output_dir = tmp_path / "run"
    launch(config_file, output_dir, 600, "--max_staleness", "1", "--max_steps", "2", "--save_steps", "2")
    history = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in history] == [1, 2]
    # Step 2 was sampled by each process's worker while step 1 trained, with the weights before its update.
    assert [record["async/staleness_max"] for record in history] == [0, 1]
    assert all(record["async/dropped_rows"] == 0 and record["async/restarts"] == 0 for record in history)
    # Step 1 was sampled by the weights it trains: the worker's copy (ZeRO-3's shards gathered) is the trainer's.
    assert history[0]["async/mismatch"] < 1e-3
    per_step = tiny_config()["prompts_per_step"] * tiny_config()["num_generations"]
    assert all(record["trajectories/total"] == per_step for record in history)  # both processes' shares gathered
    checkpoint = output_dir / "checkpoint-2"
    assert sorted(path.name for path in checkpoint.glob("rng_state_*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]
    assert (checkpoint / "global_step2").is_dir() == config_file.startswith("zero")  # DeepSpeed's own checkpoint
