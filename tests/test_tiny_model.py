from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import tokenizers
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rllm_gym import tiny_model
from rllm_gym.tiny_model import (
    SHAPES,
    SPECIAL_TOKENS,
    TEXT_TOKENS,
    build_tiny_model,
    default_model_path,
    tokenizer_digest,
    train_tokenizer,
    weights_digest,
)

ROOT = Path(__file__).resolve().parents[1]
# The embedded model of seed 0, by shape: sha256 of its tensors (by name) and of its tokenizer's vocabulary, merges and
# added tokens. The same on every machine and supported library version; a deliberate change (a shape's sizes, the
# init, the shipped tokenizer) updates them with the output of `python -m rllm_gym.tiny_model --print-digests`.
TOKENIZER_DIGEST = "aad19a7e4e6f23de7a8a58023a83fc742ac850dc74dce0b5966e1a928701f8c9"
EXPECTED_DIGESTS = {
    "tiny": {
        "weights": "3a70b1fd0b308e72a69d0aad9ee4bbf26ddabc98b226048aaab0b7c4e34802dc",
        "tokenizer": TOKENIZER_DIGEST,
    },
    "small": {
        "weights": "67efcd26f0bf25f894c055d52bc7d9be95ad9c1e3708495a094285a9248b9fab",
        "tokenizer": TOKENIZER_DIGEST,
    },
}
UPDATE = (
    "if the change is deliberate, paste the output of `python -m rllm_gym.tiny_model --print-digests` into "
    "EXPECTED_DIGESTS"
)


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
    assert small != default_model_path() and "-small-" in small.name
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


def digests_of(path):
    return {"weights": weights_digest(path), "tokenizer": tokenizer_digest(path)}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_weights_and_tokenizer_match_the_recorded_digests(shape, tmp_path):
    assert shape in EXPECTED_DIGESTS, f"no digests recorded for the shape {shape!r}: {UPDATE}"
    got = digests_of(build_tiny_model(tmp_path, seed=0, shape=shape))
    assert got == EXPECTED_DIGESTS[shape], f"the {shape!r} model changed: {UPDATE}"


def test_print_digests_prints_what_the_test_records(capsys):
    tiny_model.main(["--print-digests"])
    assert json.loads(capsys.readouterr().out) == EXPECTED_DIGESTS


def test_build_uses_neither_transformers_init_nor_the_tokenizer_trainer(tmp_path, monkeypatch):
    """Another transformers version may draw its init in another order, with other functions, another tokenizers
    version may train another vocabulary: with every torch draw and the BPE trainer broken, the build is the same."""

    def broken(*args, **kwargs):
        raise AssertionError("the build must not train the tokenizer")

    def constant(self, *args, **kwargs):
        with torch.no_grad():
            return self.fill_(7.0)

    for name in ("normal_", "uniform_", "random_", "bernoulli_"):
        monkeypatch.setattr(torch.Tensor, name, constant)
    monkeypatch.setattr(tokenizers.trainers, "BpeTrainer", broken)
    before = torch.random.get_rng_state()
    built = build_tiny_model(tmp_path, seed=0)
    assert digests_of(built) == EXPECTED_DIGESTS["tiny"]
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's torch stream is untouched


def test_other_cpu_kernels_build_the_same_model(built):
    """torch's normal_ gives other last bits under its scalar kernels than under AVX2/AVX-512 ones: the weights do
    not come from it, so a machine without those instructions builds the same bytes."""
    code = "import sys; from rllm_gym.tiny_model import build_tiny_model, weights_digest; " + (
        "print(weights_digest(build_tiny_model(sys.argv[1], seed=0)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(built.parent / "scalar")],
        env={**os.environ, "ATEN_CPU_CAPABILITY": "default"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == weights_digest(built) == EXPECTED_DIGESTS["tiny"]["weights"]


def test_init_follows_the_documented_rules(built):
    model = AutoModelForCausalLM.from_pretrained(built)
    std = SHAPES["tiny"]["initializer_range"]
    embedding = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight.data_ptr() == embedding.data_ptr()  # tied: one matrix
    assert not embedding[model.config.pad_token_id].any()  # the padding row is zero
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            assert torch.equal(param, torch.ones_like(param)), name
        elif name.endswith(".bias"):
            assert not param.any(), name
        else:  # Irwin-Hall(12) - 6, times the shape's initializer_range: mean 0, that std, bounded by 6 std
            assert abs(param.mean().item()) < 0.05 * std and abs(param.std().item() / std - 1) < 0.05, name
            assert param.abs().max().item() <= 6 * std, name
    # Each parameter has a stream of its own: two matrices of one shape are not copies of each other.
    layers = model.model.layers
    assert not torch.equal(layers[0].self_attn.q_proj.weight, layers[1].self_attn.q_proj.weight)


def test_seed_and_shape_are_checked(tmp_path):
    with pytest.raises(ValueError, match=re.escape("tiny model seed must be a non-negative integer, got -1")):
        build_tiny_model(tmp_path, seed=-1)
    with pytest.raises(ValueError, match=re.escape("tiny model shape must be one of ['small', 'tiny'], got 'big'")):
        default_model_path(shape="big")


def test_a_stale_cached_folder_is_not_reused(tmp_path, monkeypatch):
    """A folder cached by other code (an older build of the same version number, or before a shape's sizes changed)
    is never served: the folder's name holds a hash of what the build is made of."""
    monkeypatch.setenv("RLLM_GYM_CACHE", str(tmp_path))
    for stale in ("tiny-qwen2-v1-seed0", "tiny-qwen2-v1-seed0-small"):
        (tmp_path / stale).mkdir()
        (tmp_path / stale / "config.json").write_text("{}")
    path = default_model_path()
    assert path.name not in {"tiny-qwen2-v1-seed0", "tiny-qwen2-v1-seed0-small"}
    assert digests_of(path) == EXPECTED_DIGESTS["tiny"]
    monkeypatch.setitem(SHAPES, "tiny", {**SHAPES["tiny"], "initializer_range": 0.2})
    resized = default_model_path()
    assert resized != path and AutoModelForCausalLM.from_pretrained(resized).config.initializer_range == 0.2


def test_shipped_tokenizer_must_declare_the_module_tokens(monkeypatch):
    monkeypatch.setattr(tiny_model, "TEXT_TOKENS", (*TEXT_TOKENS, "<extra>"))
    with pytest.raises(RuntimeError, match=re.escape("regenerate the file with `python -m rllm_gym.tiny_model")):
        tiny_model.tiny_tokenizer()


def pinned_version(package: str) -> str:
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name, _, version = line.split("#")[0].strip().partition("==")
        if name.lower() == package:
            return version
    raise AssertionError(f"constraints.txt pins no {package}")


@pytest.mark.skipif(
    tokenizers.__version__ != pinned_version("tokenizers"),
    reason=f"the shipped tokenizer was trained with tokenizers=={pinned_version('tokenizers')} (constraints.txt)",
)
def test_shipped_tokenizer_is_what_the_trainer_gives_with_the_pinned_version(tmp_path):
    """The shipped file is reproducible: under the pinned tokenizers version, training on the module's corpus gives
    it back (a change to the corpus or the token lists must come with a regenerated file)."""
    tiny_model.main(["--write-tokenizer", str(tmp_path / "tokenizer.json")])
    assert tokenizer_digest(tmp_path) == TOKENIZER_DIGEST
    assert json.loads(train_tokenizer().to_str()) == json.loads(
        (ROOT / "rllm_gym" / "tiny_tokenizer.json").read_text()
    )
