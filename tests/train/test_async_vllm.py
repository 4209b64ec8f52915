"""The parts of asynchronous GRPO on vLLM (train/async_vllm.py) that run without vLLM: the engine's settings and
refusals, the trainer's wiring, and a worker whose engine cannot start. The engine itself is tested against real vLLM
in tests/vllm/test_async_vllm.py."""

from __future__ import annotations

import importlib.util
import re

import pytest
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from rllm_gym.train.advantages import AdvantageConfig
from rllm_gym.train.async_generation import GeneratorDied
from rllm_gym.train.async_vllm import EngineSettings, VLLMGenerator, engine_settings
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
    adapter = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(ValueError, match=re.escape("not supported with a LoRA adapter yet")):
        engine_settings(grpo_args(tmp_path), adapter)
    engine = EngineSettings(str(tiny_model_dir), "float32", max_model_len=512, gpu_memory_utilization=0.5, seed=7)
    on_gpu = engine.llm_kwargs(on_cpu=False)
    assert on_gpu["gpu_memory_utilization"] == 0.5 and on_gpu["logprobs_mode"] == "processed_logprobs"
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
