"""Asynchronous GRPO on vLLM (train/async_vllm.py): a vLLM engine of its own in a worker process, the trainer's
weights published into it after each optimizer step, on vLLM's CPU build."""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest.mock import patch

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from rllm_gym.train.advantages import AdvantageConfig
from rllm_gym.train.async_generation import GeneratorDied
from rllm_gym.train.async_vllm import EngineSettings, VLLMGenerator
from rllm_gym.train.trainer import RLLMGRPOTrainer, encode_prompt
from tests.conftest import QUIET_ENV
from tests.train.test_async_generation import LAKE, group_ends, lake_rollout
from tests.train.test_async_generation import settings as worker_settings
from tests.train.test_launch import launch, tiny_config

ROOT = Path(__file__).resolve().parents[2]


def perturbed(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)


def steps_of(batch):
    return [step for episode in batch.episodes for step in episode.trajectories[0].steps]


def largest_logprob_gap(steps, model) -> float:
    """The largest gap between the logprobs vLLM sampled each reply token with and ``model``'s (transformers)."""
    gap = 0.0
    for step in steps:
        output = step.model_output
        ids = torch.tensor([output.prompt_ids + output.completion_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(output.prompt_ids) - 1 : -1]  # (C, V)
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(output.completion_ids)[:, None])[:, 0]
        gap = max(gap, float((expected - torch.tensor(output.logprobs)).abs().max()))
    return gap


def test_the_engine_samples_with_each_published_version_and_a_killed_one_stops_the_wait(vllm_model_dir):
    model = AutoModelForCausalLM.from_pretrained(vllm_model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(vllm_model_dir)
    perturbed(model, 0)  # the trainer's weights are not the folder's (a warm start, a resume): the engine takes these
    prompts = [encode_prompt(LAKE, seed) for seed in (0, 0, 1, 1)]
    engine = EngineSettings(str(vllm_model_dir), "float32", max_model_len=512)
    generator = VLLMGenerator(lake_rollout(), model, tokenizer, worker_settings(tokenizer), engine, version=3,
                              timeout_s=400)  # fmt: skip
    try:
        generator.submit(prompts)
        first = steps_of(generator.result(prompts))
        assert len(first) > len(prompts)  # multi-turn episodes
        assert {step.model_output.policy_version for step in first} == {3}
        assert largest_logprob_gap(first, model) < 1e-3  # behaviour logprobs of exactly the published weights
        old = copy.deepcopy(model)
        perturbed(model, 1)  # an optimizer step
        generator.publish(model, 4)
        generator.submit(prompts)
        second = steps_of(generator.result(prompts))
        assert {step.model_output.policy_version for step in second} == {4}
        assert largest_logprob_gap(second, model) < 1e-3 < largest_logprob_gap(second, old)
        with pytest.raises(RuntimeError, match="prompts the vLLM generator was not given next"):
            generator.result(prompts)
        os.kill(generator.process.pid, signal.SIGKILL)
        generator.process.join(30)
        with pytest.raises(GeneratorDied, match=re.escape("the vLLM generation worker exited with code -9")):
            generator.submit(prompts)
    finally:
        generator.close()
    assert not generator.process.is_alive()


def test_a_lora_runs_engine_samples_with_the_merged_weights_of_each_published_version(vllm_model_dir):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(vllm_model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")).eval()
    tokenizer = AutoTokenizer.from_pretrained(vllm_model_dir)
    adapters = [parameter for parameter in model.parameters() if parameter.requires_grad]
    prompts = [encode_prompt(LAKE, seed) for seed in (0, 1)]
    engine = EngineSettings(str(vllm_model_dir), "float32", max_model_len=512)
    generator = VLLMGenerator(lake_rollout(), model, tokenizer, worker_settings(tokenizer), engine, timeout_s=400)
    try:
        old = copy.deepcopy(model).merge_and_unload()
        with torch.no_grad():  # an optimizer step on the adapters only (LoRA's B starts at zero)
            for parameter in adapters:
                parameter.add_(torch.randn_like(parameter) * 0.3)
        generator.publish(model, 1)
        generator.submit(prompts)
        steps = steps_of(generator.result(prompts))
        assert {step.model_output.policy_version for step in steps} == {1}
        merged = copy.deepcopy(model).merge_and_unload()
        assert largest_logprob_gap(steps, merged) < 1e-3 < largest_logprob_gap(steps, old)
    finally:
        generator.close()


def test_the_engine_loads_the_pinned_version_before_a_batch_and_keeps_a_failure(vllm_model_dir, monkeypatch):
    import multiprocessing

    from vllm.exceptions import VLLMValidationError

    from rllm_gym.policies.base import SamplingParams
    from rllm_gym.train.async_generation import SharedWeights
    from rllm_gym.train.async_vllm import _Engine
    from rllm_gym.train.trl_adapter import colocated_vllm_model

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # as the worker runs it: the model in this process
    model = AutoModelForCausalLM.from_pretrained(vllm_model_dir, dtype=torch.float32)
    copies = [{name: parameter.detach().clone() for name, parameter in model.named_parameters()} for _ in range(2)]
    held = multiprocessing.Array("q", [0, -1], lock=False)
    settings = EngineSettings(str(vllm_model_dir), "float32", max_model_len=128)
    engine = _Engine(settings, SharedWeights(copies, held))
    assert engine.pinned == 0  # the newest held, until a step pins another
    name = "model.embed_tokens.weight"  # not repacked by the CPU backend: comparable as it is
    engine_weight = colocated_vllm_model(engine.llm).get_parameter(name)
    with torch.no_grad():
        copies[1][name].add_(0.5)  # what VLLMGenerator.publish does to a free copy, then its version
    held[1] = 1
    assert not torch.equal(engine_weight, copies[1][name])
    engine.pinned = 1  # a step handed over at version 1 (begin_call)
    outputs = engine.generate([[5, 6, 7]] * 2, SamplingParams(max_tokens=3))
    assert [output.policy_version for output in outputs] == [1, 1] and engine.loaded == 1
    assert torch.equal(colocated_vllm_model(engine.llm).get_parameter(name), copies[1][name])
    engine.pinned = 0
    assert [output.policy_version for output in engine.generate([[5, 6, 7]], SamplingParams(max_tokens=3))] == [0]
    assert torch.equal(colocated_vllm_model(engine.llm).get_parameter(name), copies[0][name])
    engine.pinned = 2  # a version no copy holds: never sampled by other weights
    with pytest.raises(RuntimeError, match=re.escape("the weights of version 2 are no longer held")):
        engine.generate([[5, 6, 7]], SamplingParams(max_tokens=3))
    engine.pinned = 0
    vocabulary = int(engine.llm.llm_engine.model_config.get_vocab_size())
    with pytest.raises(VLLMValidationError, match="out of vocabulary"):  # vLLM refuses the batch
        engine.generate([[vocabulary + 10]], SamplingParams(max_tokens=3))
    assert engine.failure.startswith("its engine failed on a batch of 1 prompts:\nTraceback")


def test_an_engine_that_cannot_start_stops_the_wait_with_its_traceback(vllm_model_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(vllm_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(vllm_model_dir)
    engine = EngineSettings(str(tmp_path), "float32")  # a folder without a model
    generator = VLLMGenerator(lake_rollout(), model, tokenizer, worker_settings(tokenizer), engine, timeout_s=400)
    prompts = [encode_prompt(LAKE, 0)] * 2
    try:
        generator.submit(prompts)
        reason = r"the vLLM generation worker could not start its engine:\nTraceback"
        with pytest.raises(GeneratorDied, match=reason):
            generator.result(prompts)
    finally:
        generator.close()
    assert generator.process.exitcode == 0  # it stopped on its own after sending the reason


@pytest.mark.parametrize("lora", [False, True], ids=["whole", "lora"])
def test_k1_with_use_vllm_trains_on_rows_the_published_weights_sampled(vllm_model_dir, tmp_path, lora):
    from peft import LoraConfig

    model = AutoModelForCausalLM.from_pretrained(vllm_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(vllm_model_dir)
    rows = [{"prompt": encode_prompt(LAKE, seed)} for seed in range(6)]
    args = GRPOConfig(
        output_dir=str(tmp_path), max_completion_length=4, learning_rate=1e-2, beta=0.0, report_to=[], use_cpu=True,
        bf16=False, save_strategy="no", disable_tqdm=True, logging_steps=1, per_device_train_batch_size=8,
        num_generations=4, max_steps=3, seed=0, use_vllm=True, vllm_mode="colocate", vllm_max_model_length=512,
    )  # fmt: skip
    trainer = RLLMGRPOTrainer(
        model, args=args, processing_class=tokenizer, train_dataset=Dataset.from_list(rows), rollout=lake_rollout(),
        advantage_config=AdvantageConfig(), max_staleness=1,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear") if lora else None,
    )  # fmt: skip
    assert args.use_vllm and not trainer.use_vllm  # TRL's lock-step engine is not started; the caller's args unchanged
    assert trainer.vllm_engine is not None and trainer.vllm_engine.dtype == "float32"
    batches = []
    result = VLLMGenerator.result

    def recorded(generator, prompts):
        batches.append(result(generator, prompts))
        return batches[-1]

    with patch.object(VLLMGenerator, "result", recorded):
        trainer.train()
    assert trainer.generator is None  # stopped with the training
    versions = [{step.model_output.policy_version for step in steps_of(batch)} for batch in batches]
    # Steps 0 and 1 were handed over before any optimizer step, step 2 as step 1 began, after version 1 was published.
    assert versions == [{0}, {0}, {1}]
    logged = [entry for entry in trainer.state.log_history if "async/staleness_max" in entry]
    assert len(logged) == 3 and logged[0]["async/staleness_max"] == 0
    assert all(entry["async/staleness_max"] <= 1 and entry["async/dropped_rows"] == 0 for entry in logged)
    assert all(0 <= entry["async/is_clipped"] <= 1 and entry["async/mismatch"] >= 0 for entry in logged)


def test_the_command_line_runs_k1_with_use_vllm_stops_on_ctrl_c_and_resumes_at_its_version(tmp_path):
    output_dir = tmp_path / "run"
    command = [sys.executable, "-m", "rllm_gym.train.grpo", "--config", str(ROOT / "train/configs/test_tiny.yaml")]
    command += ["--use_vllm", "true", "--max_staleness", "1", "--save_steps", "1000", "--output_dir", str(output_dir)]
    # Its own process group, which the terminal's Ctrl-C reaches as a whole: the trainer and its vLLM worker.
    process = subprocess.Popen(
        [*command, "--max_steps", "200"], env=QUIET_ENV, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    metrics = output_dir / "metrics.jsonl"
    deadline = time.monotonic() + 500
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert process.poll() is None and time.monotonic() < deadline, "training did not get going"
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert group_ends(process.pid, within_s=60)  # the vLLM worker stopped too
    stopped_at = max(int(path.name.removeprefix("checkpoint-")) for path in output_dir.glob("checkpoint-*"))
    resumed = subprocess.run(
        [*command, "--max_steps", str(stopped_at + 1), "--resume", "true"], env=QUIET_ENV, cwd=tmp_path,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = {record["step"]: record for record in records if "async/staleness_max" in record}
    assert sorted(steps) == list(range(1, stopped_at + 2))
    assert steps[1]["async/staleness_max"] == 0 and all(r["async/staleness_max"] <= 1 for r in steps.values())
    assert all(record["async/dropped_rows"] == 0 for record in steps.values())
    # The resumed engine starts at the checkpoint's version: its first step's rows are fresh, none dropped as stale.
    assert steps[stopped_at + 1]["async/staleness_max"] == 0


@pytest.mark.parametrize("config_file", ["cpu_2.yaml", "zero2_cpu.yaml", "zero3_cpu.yaml"])
def test_accelerate_launch_runs_a_vllm_engine_of_its_own_in_each_training_process(config_file, tmp_path):
    if config_file.startswith("zero"):
        pytest.importorskip("deepspeed", reason="DeepSpeed is not installed in the vLLM venv (.ci/run installs it)")
    output_dir = tmp_path / "run"
    flags = ("--use_vllm", "true", "--max_staleness", "1", "--max_steps", "3", "--save_steps", "3")
    result = launch(config_file, output_dir, 600, *flags)
    assert "leaked semaphore" not in result.stderr  # vLLM's progress bar's lock, left by an engine worker's exit
    history = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in history] == [1, 2, 3]
    # Later steps were sampled by the weights before their update, or by theirs when the update came first (a
    # loaded machine): which is timing, the bound is not.
    staleness = [record["async/staleness_max"] for record in history]
    assert staleness[0] == 0 and max(staleness) <= 1
    assert all(record["async/dropped_rows"] == 0 for record in history)
    # Step 1 was sampled by the weights it trains: each engine got its process's (ZeRO-3's shards gathered).
    assert history[0]["async/mismatch"] < 1e-3
    per_step = tiny_config()["prompts_per_step"] * tiny_config()["num_generations"]
    assert all(record["trajectories/total"] == per_step for record in history)  # both processes' shares gathered
    checkpoint = output_dir / "checkpoint-3"
    assert sorted(path.name for path in checkpoint.glob("rng_state_*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]
