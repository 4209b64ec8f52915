"""Random-weight models with a real Qwen architecture's published dimensions, built offline, for measuring on a GPU.

A GPU machine without a model hub can still time generation and training at a real model's size: this module
builds a ``Qwen2ForCausalLM`` with the dimensions of a published Qwen checkpoint (``QWEN_ARCHITECTURES``, taken
from each model's ``config.json`` on the hub) and random weights, plus the embedded tiny model's byte-level BPE
tokenizer and Qwen chat template (:mod:`rllm_gym.tiny_model`), its vocabulary padded with filler tokens to the
architecture's vocab size so that every id a random model samples decodes (as Qwen pads its own embedding matrix).
Speeds measured on it match the real model's for the same token counts; its replies are noise, so rewards are not
meaningful. The result is a normal Hugging Face folder (transformers, vLLM and ``trl vllm-serve`` load it).

    python -m rllm_gym.qwen_random /tmp/qwen2.5-0.5b-random                    # Qwen2.5-0.5B, bf16, ~1 GB
    python -m rllm_gym.qwen_random /tmp/q --arch Qwen2.5-1.5B
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from rllm_gym.tiny_model import DEFAULT_SEED

__all__ = ["QWEN_ARCHITECTURES", "build_random_qwen", "qwen_config"]

# From each model's config.json (Qwen/Qwen2.5-0.5B-Instruct, Qwen/Qwen2.5-1.5B-Instruct on the Hugging Face hub):
# the fields the two sizes share, then each size's own.
_QWEN25_SHARED: dict[str, Any] = dict(
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
QWEN_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "Qwen2.5-0.5B": dict(
        _QWEN25_SHARED, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14
    ),
    "Qwen2.5-1.5B": dict(
        _QWEN25_SHARED, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12
    ),
}
DTYPES = ("bfloat16", "float16", "float32")


def qwen_config(arch: str = "Qwen2.5-0.5B", **overrides: Any):
    """The ``Qwen2Config`` of ``arch`` (a key of ``QWEN_ARCHITECTURES``), with ``overrides`` (e.g. fewer layers).

    Allocates no weights: ``Qwen2ForCausalLM(qwen_config())`` on the meta device counts parameters for free.
    """
    from transformers import Qwen2Config

    if arch not in QWEN_ARCHITECTURES:
        raise ValueError(f"arch {arch!r} is not a known Qwen architecture; choose from {sorted(QWEN_ARCHITECTURES)}")
    values = {**QWEN_ARCHITECTURES[arch], **overrides}
    rope_theta = values.pop("rope_theta")
    # transformers 5 keeps rope_theta in rope_parameters; older versions took it as a keyword of its own.
    config = Qwen2Config(rope_parameters={"rope_type": "default", "rope_theta": rope_theta}, **values)
    if getattr(config, "rope_parameters", None) is None:
        config.rope_theta = rope_theta
    return config


def _padded_tokenizer(vocab_size: int):
    """The tiny model's tokenizer with filler tokens ``" Zz<n>"`` added up to ``vocab_size`` ids.

    The fillers are plain vocabulary entries that no merge produces: encoding text never yields them (so prompts
    tokenize as with the tiny model), while decoding any sampled id gives text.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from rllm_gym.tiny_model import tiny_tokenizer

    base = tiny_tokenizer()
    state = json.loads(base.backend_tokenizer.to_str())
    vocab: dict[str, int] = state["model"]["vocab"]
    # The markup tokens added after training (<think>, <tool_call>, ...) keep the last ids, as in the tiny model:
    # tokenizer classes that rebuild the added tokens on load number them after the vocabulary.
    appended = [token for token in state["added_tokens"] if token["id"] >= len(vocab)]
    if vocab_size < len(vocab) + len(appended):
        raise ValueError(
            f"vocab_size must be >= {len(vocab) + len(appended)} (the tiny tokenizer's), got {vocab_size}"
        )
    n = 0
    while len(vocab) < vocab_size - len(appended):
        token = f"ĠZz{n}"  # "Ġ" is the byte-level alphabet's space: decodes to " Zz<n>"
        n += 1
        if token not in vocab:
            vocab[token] = len(vocab)
    for offset, token in enumerate(appended):
        token["id"] = len(vocab) + offset
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(state)),
        eos_token=base.eos_token,
        pad_token=base.pad_token,
        unk_token=None,
        bos_token=None,
        chat_template=base.chat_template,
        model_max_length=base.model_max_length,
        clean_up_tokenization_spaces=False,
    )


def build_random_qwen(
    path: str | os.PathLike[str],
    arch: str = "Qwen2.5-0.5B",
    *,
    seed: int = DEFAULT_SEED,
    dtype: str = "bfloat16",
    **overrides: Any,
) -> Path:
    """Build a random-weight model of ``arch`` (with ``overrides``) and its tokenizer into ``path``; return it.

    ``overrides`` change config fields, e.g. ``num_hidden_layers=2, vocab_size=2048`` for a small test copy. The
    weights are drawn from the architecture's usual initialisation (std 0.02) in a private RNG stream; the full
    Qwen2.5-0.5B takes about a minute and 1 GB (bf16) on a CPU.
    """
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    config = qwen_config(arch, **overrides)
    tokenizer = _padded_tokenizer(config.vocab_size)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config.eos_token_id, config.pad_token_id, config.bos_token_id = eos_id, pad_id, None
    config.dtype = dtype
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(getattr(torch, dtype))  # allocate in the target dtype: half the memory of fp32
        try:
            model = Qwen2ForCausalLM(config)
        finally:
            torch.set_default_dtype(previous)
    model.generation_config = GenerationConfig(
        eos_token_id=[eos_id, pad_id], pad_token_id=pad_id, do_sample=False, max_new_tokens=256
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build a random-weight Qwen-architecture model into a folder.")
    parser.add_argument("path", help="output folder")
    parser.add_argument("--arch", default="Qwen2.5-0.5B", choices=sorted(QWEN_ARCHITECTURES))
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than the architecture (a quick copy)")
    args = parser.parse_args(argv)
    overrides = {} if args.layers is None else {"num_hidden_layers": args.layers}
    print(build_random_qwen(args.path, args.arch, seed=args.seed, dtype=args.dtype, **overrides))


if __name__ == "__main__":
    main()
