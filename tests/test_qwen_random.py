from __future__ import annotations

import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

from rllm_gym.qwen_random import QWEN_ARCHITECTURES, build_random_qwen, qwen_config

SMALL = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=2048)


def test_full_qwen25_05b_has_the_published_dimensions_and_size():
    config = qwen_config("Qwen2.5-0.5B")
    dims = (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads)
    assert dims == (896, 24, 14, 2)
    assert (config.intermediate_size, config.vocab_size, config.tie_word_embeddings) == (4864, 151936, True)
    assert config.rope_parameters["rope_theta"] == 1e6
    with torch.device("meta"):  # no weights allocated
        model = Qwen2ForCausalLM(config)
    # The model card's "0.49B parameters (0.36B non-embedding)".
    total = sum(p.numel() for p in model.parameters())
    assert total == 494_032_768
    assert round((total - 151936 * 896) / 1e9, 2) == 0.36


def test_scaled_down_copy_builds_loads_and_generates(tmp_path):
    folder = build_random_qwen(tmp_path / "q", "Qwen2.5-0.5B", seed=3, **SMALL)
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert model.dtype == torch.bfloat16  # the default dtype is the one GPU runs use
    assert model.config.model_type == "qwen2" and model.config.num_key_value_heads == 2
    assert len(tokenizer) == model.config.vocab_size == 2048  # every sampled id decodes
    assert tokenizer.eos_token == "<|im_end|>" and model.config.eos_token_id == tokenizer.eos_token_id
    # Text tokenizes as with the tiny model: the filler ids are never produced by encoding.
    ids = tokenizer("What is 12 + 30? \\boxed{42}")["input_ids"]
    assert max(ids) < 1024
    assert tokenizer.decode([2000]).startswith(" Zz")
    assert tokenizer.convert_tokens_to_ids("</tool_response>") == 2047  # the markup tokens keep the last ids
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+3?"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == prompt["input_ids"].shape[1] + 4  # random weights rarely emit EOS early


def test_same_seed_same_weights(tmp_path):
    a = build_random_qwen(tmp_path / "a", seed=1, dtype="float32", **SMALL)
    b = build_random_qwen(tmp_path / "b", seed=1, dtype="float32", **SMALL)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_unknown_architecture_and_dtype_name_the_choices(tmp_path):
    with pytest.raises(ValueError, match=re.escape(f"choose from {sorted(QWEN_ARCHITECTURES)}")):
        qwen_config("Qwen9-7B")
    with pytest.raises(ValueError, match=re.escape("dtype must be one of ['bfloat16', 'float16', 'float32']")):
        build_random_qwen(tmp_path / "x", dtype="int8", **SMALL)
