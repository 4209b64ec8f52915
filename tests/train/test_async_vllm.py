"""The parts of asynchronous GRPO on vLLM (train/async_vllm.py) that run without vLLM: the engine's settings and
refusals, the trainer's wiring, and a worker whose engine cannot start. The engine itself is tested against real vLLM
in tests/vllm/test_async_vllm.py."""

from __future__ import annotations

import copy
import importlib.util
import re

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from rllm_gym.train.advantages import AdvantageConfig
from rllm_gym.train.async_generation import GeneratorDied
from rllm_gym.train.async_vllm import EngineSettings, VLLMGenerator, engine_settings, engine_weights, visible_device
from rllm_gym.train.trainer import RLLMGRPOTrainer, encode_prompt
from tests.train.test_async_generation import LAKE, lake_rollout
from tests.train.test_async_generation import settings as worker_settings

NO_VLLM = importlib.util.find_spec("vllm") is None


def grpo_args(tmp_path, **overrides) -> GRPOConfig:
    fields = dict(output_dir=str(tmp_path), use_cpu=True, report_to=[], per_device_train_batch_size=8,
                  num_generations=4, max_completion_length=4, use_vllm=True, seed=7)  # fmt: skip
    return GRPOConfig(**(fields | overrides))


def test_the_engine_takes_the_trainers_dtype_and_vllm_settings_and_refuses_what_it_cant_run(tiny_model_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    server = grpo_args(tmp_path, vllm_mode="server")
    with pytest.raises(ValueError, match=re.escape("not vllm_mode='server': use vllm_mode='colocate'")):
        engine_settings(server, model)
    engine = EngineSettings(str(tiny_model_dir), "float32", max_model_len=512, gpu_memory_utilization=0.5, seed=7)
    on_gpu = engine.llm_kwargs(on_cpu=False)
    assert on_gpu["gpu_memory_utilization"] == 0.5 and on_gpu["logprobs_mode"] == "processed_logprobs"
    assert "dtype" not in on_gpu and on_gpu["max_num_batched_tokens"] == 4096  # as TRL's colocated engine
    on_cpu = engine.llm_kwargs(on_cpu=True)  # the CPU build's defaults; the trainer's dtype, not bfloat16
    assert "gpu_memory_utilization" not in on_cpu and on_cpu["dtype"] == "float32" and on_cpu["enforce_eager"]
    if NO_VLLM:
        with pytest.raises(ImportError, match=re.escape("use_vllm needs vLLM")):
            engine_settings(grpo_args(tmp_path), AutoModelForCausalLM.from_pretrained(tiny_model_dir))


def trainer_with_vllm(tiny_model_dir, args) -> RLLMGRPOTrainer:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    dataset = Dataset.from_list([{"prompt": encode_prompt(LAKE, 0)}] * 4)
    return RLLMGRPOTrainer(model, args=args, processing_class=tokenizer, train_dataset=dataset, rollout=lake_rollout(),
                           advantage_config=AdvantageConfig(), max_staleness=1)  # fmt: skip


def test_the_trainer_refuses_server_mode_before_it_starts_any_engine(tiny_model_dir, tmp_path):
    args = grpo_args(tmp_path, vllm_mode="server")  # no server runs: TRL's client would wait for one
    with pytest.raises(ValueError, match=re.escape("runs a vLLM engine of its own next to the trainer")):
        trainer_with_vllm(tiny_model_dir, args)
    assert args.use_vllm  # the caller's config is left as it was


@pytest.mark.skipif(not NO_VLLM, reason="vLLM is installed here: tests/vllm/test_async_vllm.py starts a real engine")
def test_a_worker_whose_engine_cannot_start_stops_the_wait_with_its_traceback(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = EngineSettings(str(tiny_model_dir), "float32")
    generator = VLLMGenerator(lake_rollout(), model, tokenizer, worker_settings(tokenizer), engine, timeout_s=300)
    prompts = [encode_prompt(LAKE, 0)] * 2
    try:
        generator.submit(prompts)
        with pytest.raises(GeneratorDied, match=r"could not start its engine:\n(.|\n)*No module named 'vllm'"):
            generator.result(prompts)
    finally:
        generator.close()
    assert generator.process.exitcode == 0


@pytest.mark.parametrize("variant", [{}, {"use_dora": True}, {"modules_to_save": ["norm"]}], ids=str)
def test_a_lora_models_engine_weights_are_the_merged_models_and_the_trained_one_is_left_alone(tiny_model_dir, variant):
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    original = {name: parameter.detach().clone() for name, parameter in base.named_parameters()}
    names = list(original)  # what vLLM's load_weights maps
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", **variant))
    with torch.no_grad():  # trained adapters (LoRA's B starts at zero: the merge would change nothing)
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn_like(parameter) * 0.3)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    weights = dict(engine_weights(model))
    expected = dict(copy.deepcopy(model).merge_and_unload().named_parameters())
    assert list(weights) == names and set(expected) == set(names)
    assert all(torch.equal(weights[name], expected[name]) for name in names)
    assert not all(torch.equal(weights[name], original[name]) for name in names)  # the adapter's changes are in
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())  # bit for bit


@pytest.mark.parametrize("adapted", [{"modules_to_save": ["lm_head"]}, {"target_modules": ["embed_tokens"]}], ids=str)
def test_a_lora_adapter_on_tied_embeddings_is_refused_with_the_reason(tiny_model_dir, adapted):
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert base.config.tie_word_embeddings
    model = get_peft_model(base, LoraConfig(r=4, **({"target_modules": ["q_proj"]} | adapted)))
    with pytest.raises(ValueError, match=re.escape("leave both out of target_modules and modules_to_save")):
        dict(engine_weights(model))


def test_each_training_processs_engine_is_seeded_apart_and_sees_only_its_gpu(monkeypatch):
    assert visible_device(1, None) == "1" and visible_device(0, "") == "0"  # unset: every GPU, by index
    assert visible_device(1, "3,5") == "5" and visible_device(0, " GPU-ab12 , GPU-cd34") == "GPU-ab12"
    with pytest.raises(ValueError, match=re.escape("GPU 2 of CUDA_VISIBLE_DEVICES='3,5' does not exist")):
        visible_device(2, "3,5")

    class Args:  # what engine_settings reads of a GRPOConfig, as the second process of a launch on GPUs has it
        vllm_mode, vllm_max_model_length, vllm_gpu_memory_utilization, seed = "colocate", None, 0.3, 7
        device, process_index = torch.device("cuda", 1), 1

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())  # vLLM's presence is not the point here
    model = torch.nn.Linear(2, 2)
    model.name_or_path = "some/model"
    settings = engine_settings(Args(), model)
    assert (settings.cuda_device, settings.seed, settings.model) == (1, 8, "some/model")
    Args.device, Args.process_index = torch.device("cpu"), 0
    assert (engine_settings(Args(), model).cuda_device, engine_settings(Args(), model).seed) == (None, 7)
