"""The trainer on GPUs, driven as a user drives it: train/grpo.py in a subprocess with qwen_math_1gpu.yaml's GPU
settings, 4 steps of a small random-weight Qwen2.5-architecture model on learnable episodes (helpers.small_run).
vLLM colocate (fp32 master weights, bf16 autocast), server mode with `trl vllm-serve` and two training processes,
DeepSpeed ZeRO-2 and ZeRO-3, checkpoint, resume and reload; each checks that an RL step changed the weights."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("gpu_helpers", Path(__file__).with_name("helpers.py"))
gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu)

pytestmark = [pytest.mark.gpu, gpu.requires_cuda]


def check_trained(output_dir: Path, steps: int = 4, processes: int = 1) -> list[dict]:
    summary = json.loads((output_dir / "summary.json").read_text())
    assert summary["num_processes"] == processes
    history = gpu.metrics(output_dir)
    assert [record["step"] for record in history] == list(range(1, steps + 1))
    assert all(record["trajectories/total"] == 8 * 4 for record in history)  # prompts_per_step x num_generations
    assert gpu.updated_by_rl(output_dir, history), "an RL step with a nonzero gradient changed no weight"
    return history


def check_colocated_vllm_generated(history: list[dict]) -> None:
    """Every step's episodes went through the colocated vLLM engine (a missing metric fails: generation would have
    gone elsewhere), and no prompt was too long for it."""
    for record in history:
        assert record["vllm_colocate/generate_calls"] >= 1, record
        assert record["vllm_colocate/requests"] >= 8 * 4, record  # every episode's turns, at least one each
        assert record["vllm_colocate/prompts_too_long"] == 0, record


@gpu.requires("vllm", "vllm")
def test_vllm_colocate_grpo_steps_with_bf16_autocast(qwen_dir, tmp_path):
    output_dir = tmp_path / "run"
    flags = gpu.small_run(qwen_dir, output_dir, "--use_vllm", "true", "--vllm_mode", "colocate")
    gpu.launch("single_gpu.yaml", flags, processes=1)
    check_colocated_vllm_generated(check_trained(output_dir))
    config = json.loads((output_dir / "final" / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "float32"  # the fp32 master weights (bf16 autocast)


@gpu.requires("vllm", "vllm")
def test_vllm_colocate_with_sleep_mode(qwen_dir, tmp_path):
    # The engine is awake for each rollout (weights synced once), asleep for the training step.
    output_dir = tmp_path / "run"
    flags = gpu.small_run(qwen_dir, output_dir, "--use_vllm", "true", "--vllm_mode", "colocate")
    gpu.launch("single_gpu.yaml", [*flags, "--vllm_enable_sleep_mode", "true"], processes=1)
    check_colocated_vllm_generated(check_trained(output_dir))


@gpu.requires("vllm", "vllm")
@gpu.requires_gpus(3)
def test_vllm_server_mode_with_two_training_processes(qwen_dir, tmp_path):
    server = gpu.VLLMServer(qwen_dir, devices=str(gpu.GPUS - 1), log=tmp_path / "server.log")
    try:
        server.wait()
        output_dir = tmp_path / "run"
        flags = gpu.small_run(qwen_dir, output_dir, "--use_vllm", "true", "--vllm_mode", "server")
        flags += ["--vllm_server_base_url", server.url]
        gpu.launch("multi_gpu.yaml", flags, processes=2, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    finally:
        server.stop()
    history = check_trained(output_dir, processes=2)
    assert all(record["vllm_server/server_calls"] >= 1 for record in history)  # a missing metric fails


@gpu.requires("deepspeed", "deepspeed")
@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_deepspeed_steps(stage, qwen_dir, tmp_path):
    output_dir = tmp_path / "run"
    processes = min(gpu.GPUS, 2)
    gpu.launch(f"{stage}.yaml", gpu.small_run(qwen_dir, output_dir, "--gradient_accumulation_steps", "1"), processes)
    check_trained(output_dir, processes=processes)
    step_dir = output_dir / "checkpoint-4" / "global_step4"
    assert len(list(step_dir.glob("*optim_states.pt"))) == processes  # one ZeRO shard per process


def test_checkpoint_resume_and_reload(qwen_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    output_dir = tmp_path / "run"
    gpu.launch("single_gpu.yaml", gpu.small_run(qwen_dir, output_dir), processes=1)
    check_trained(output_dir)
    resumed = gpu.small_run(qwen_dir, output_dir, "--resume", "true", "--max_steps", "6")
    gpu.launch("single_gpu.yaml", resumed, processes=1)
    history = gpu.metrics(output_dir)
    assert [record["step"] for record in history] == [1, 2, 3, 4, 5, 6]  # continued from checkpoint-4
    assert any(record["grad_norm"] > 0 for record in history[4:]), history  # the resumed steps trained
    assert gpu.updated_by_rl(output_dir, history)
    # The final model reloads in the dtype it was trained in (fp32 master weights), with the saved weights.
    model = AutoModelForCausalLM.from_pretrained(output_dir / "final", dtype="auto").to("cuda")
    assert model.dtype == torch.float32
    reloaded_dir = tmp_path / "reloaded"
    model.save_pretrained(reloaded_dir)
    assert gpu.changed_tensors(output_dir / "final", reloaded_dir) == []
