from __future__ import annotations

import re
import threading

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from rllm_gym.tiny_model import SPECIAL_TOKENS, TEXT_TOKENS, build_tiny_model, default_model_path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def test_same_seed_same_files_other_seed_other_weights(built, tmp_path):
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "chat_template.jinja"):
        assert (again / name).read_bytes() == (built / name).read_bytes(), name
    assert (other / "model.safetensors").read_bytes() != (built / "model.safetensors").read_bytes()


def test_folder_loads_with_auto_classes(built):
    model = AutoModelForCausalLM.from_pretrained(built)
    tokenizer = AutoTokenizer.from_pretrained(built)
    assert model.config.model_type == "qwen2"
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (64, 2)
    # vLLM's CPU attention runs head dimensions 32 and 64 only (16 is refused at the first forward).
    assert model.config.hidden_size // model.config.num_attention_heads == 32
    assert model.config.num_key_value_heads == 1
    assert model.config.vocab_size == len(tokenizer) == 1024
    for token in SPECIAL_TOKENS + TEXT_TOKENS:
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    # Special tokens vanish from decoded text; the reasoning and tool-call markup stays, to be parsed.
    ids = tokenizer.encode("<think>x</think><tool_call>{}</tool_call><|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>x</think><tool_call>{}</tool_call>"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


def test_shapes_size_the_model_and_keep_folders_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("RLLM_GYM_CACHE", str(tmp_path))
    small = default_model_path(shape="small")
    assert small != default_model_path() and small.name.endswith("-small")
    config = AutoModelForCausalLM.from_pretrained(small).config
    assert (config.hidden_size, config.num_hidden_layers) == (128, 3)
    assert (small / "tokenizer.json").read_bytes() == (default_model_path() / "tokenizer.json").read_bytes()
    with pytest.raises(ValueError, match=re.escape("tiny model shape must be one of ['small', 'tiny'], got 'big'")):
        build_tiny_model(tmp_path / "big", shape="big")


def test_chat_template_thinking_and_tools(built):
    tokenizer = AutoTokenizer.from_pretrained(built)
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+3?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "add",
            "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"e": "2+3"}}}],
        },
        {"role": "tool", "content": "5"},
    ]
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    text = tokenizer.apply_chat_template(chat, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '{"type": "function", "function": {"name": "calc"' in text
    assert '<think>\nadd\n</think>\n\n<tool_call>\n{"name": "calc", "arguments": {"e": "2+3"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    off = tokenizer.apply_chat_template(chat[:2], tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_default_model_path_builds_once_for_concurrent_callers(tmp_path, monkeypatch):
    monkeypatch.setenv("RLLM_GYM_CACHE", str(tmp_path))
    paths = []
    threads = [threading.Thread(target=lambda: paths.append(default_model_path())) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(paths)) == 1 and len(paths) == 3
    path = paths[0]
    assert path.parent == tmp_path and (path / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [path.name]  # no staging folder left
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert default_model_path() == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
