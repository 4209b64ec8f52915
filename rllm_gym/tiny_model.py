"""The embedded default model: a tiny Qwen2-style causal LM and its byte-level BPE tokenizer, built offline.

No machine that runs the tests reaches a model hub, so rllm-gym builds its own default model: a byte-level BPE
tokenizer shipped as package data (``rllm_gym/tiny_tokenizer.json``, trained once with the ``tokenizers`` library on a
small corpus that this module generates), a Qwen-style chat template with thinking on/off and Hermes tool calls, and
a ``Qwen2ForCausalLM`` (hidden size 64, 2 layers) whose weights this module draws itself, from integers, instead of
relying on transformers' init. So the same seed and shape give the same weights and tokenizer on every machine and
supported library version (tests/test_tiny_model.py checks digests of both), and the result is a normal Hugging Face
folder that ``AutoModelForCausalLM.from_pretrained``, ``AutoTokenizer.from_pretrained`` and ``transformers serve``
load. :func:`default_model_path` builds it once into the cache (``$RLLM_GYM_CACHE`` or ``~/.cache/rllm_gym``), safely
under concurrent callers; ``python -m rllm_gym.tiny_model PATH`` builds it into ``PATH``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.resources
import json
import math
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "CHAT_TEMPLATE",
    "DEFAULT_SEED",
    "SHAPES",
    "SPECIAL_TOKENS",
    "TEXT_TOKENS",
    "build_tiny_model",
    "default_model_path",
    "model_digests",
    "tiny_corpus",
    "tiny_tokenizer",
    "tokenizer_digest",
    "train_tokenizer",
    "weights_digest",
]

# Bump when the build's code changes (fixed config fields, initialisation): cached folders are keyed by it, and by the
# seed, shape sizes, tokenizer and chat template themselves (see _recipe_key). 2: own init, shipped tokenizer, and the
# tiny shape's 2 query heads and 1 KV head of 32, which vLLM's CPU attention accepts.
TINY_MODEL_VERSION = 2
TOKENIZER_FILE = "tiny_tokenizer.json"  # in the rllm_gym package; written by train_tokenizer
DEFAULT_SEED = 0
VOCAB_SIZE = 1024
# The model's sizes by name: "tiny" is the default (0.14M parameters, fast enough for every test); "small" (0.55M) has
# the capacity to learn a skill that generalizes, such as reading any FrozenLake grid (the main job, train/configs/
# demo_cpu.yaml: the tiny one stays at the blind policy's level there), and still builds in about a second.
SHAPES = {
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        # Two query heads of 32 sharing one key/value head: vLLM's CPU attention refuses a head dimension of 16
        # ("Unsupported CPU attention configuration: head_dim=16") and takes 32 or 64, so the default model runs on
        # every backend we ship. One KV head keeps the 0.14M parameters of the former 4 x 16 shape (2 KV heads); in
        # the main job it learned more than 2 KV heads did (6/8 training lakes, 26/64 held out, against 4/8 and 23/64).
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        # A wide init makes greedy replies depend on the prompt; the usual 0.02 gives near-uniform logits and the
        # same newline for every prompt, which would make backend consistency checks vacuous.
        "initializer_range": 0.3,
    },
    "small": {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 3,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "initializer_range": 0.1,  # 0.3 over three wider layers saturates the logits: training starts stuck
    },
}

# Special tokens are dropped by ``decode(skip_special_tokens=True)``; the markup tokens below stay in decoded text
# (as in Qwen's tokenizers) so that reasoning and tool calls can be parsed out of a reply.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TEXT_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# Qwen3-style ChatML template: system prompt with a tool list, assistant turns with optional reasoning and
# Hermes tool calls, tool results grouped into one user turn, and `enable_thinking=False` prefilling an empty
# think block (the Qwen3 convention, which `transformers serve` and vLLM reasoning parsers understand).
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'"
    " 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within'"
    ' \' <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments":\''
    " ' <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.reasoning_content %}"
    "{{- '<think>\\n' + message.reasoning_content.strip('\\n') + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- if message.tool_calls %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{%- if loop.first and message.content %}{{- '\\n' }}{%- elif not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

_WORD_TEXT = (
    "the a an is are was to of and in on for with you your agent answer question step left right up down "
    "move goal hole frozen lake grid reward action observation think tool call result number sum product "
    "solve find compute what which how many because so therefore final boxed code function return print "
    "def if else true false yes no please let me check again first next then done"
)
_WORDS = _WORD_TEXT.split()


def tiny_corpus(seed: int = DEFAULT_SEED, n_lines: int = 3000) -> list[str]:
    """A deterministic text corpus for training the tokenizer: chat-formatted arithmetic, grid moves, tool calls."""
    rng = random.Random(seed)
    lines = []
    for i in range(n_lines):
        a, b = rng.randint(0, 999), rng.randint(0, 99)
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12)))
        kind = i % 4
        if kind == 0:
            lines.append(f"What is {a} + {b}? {words}. The answer is \\boxed{{{a + b}}}.")
        elif kind == 1:
            moves = " ".join(rng.choice(["Left", "Right", "Up", "Down"]) for _ in range(rng.randint(1, 6)))
            lines.append(f"<think>\n{words}\n</think>\n\n```{moves}```")
        elif kind == 2:
            lines.append(
                f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{a} * {b}"}}}}\n</tool_call>'
            )
        else:
            lines.append(f"def f(x):\n    return x * {b} + {a}  # {words}\nprint(f({a}))")
    return lines


def train_tokenizer(seed: int = DEFAULT_SEED):
    """Train the byte-level BPE tokenizer that ``rllm_gym/tiny_tokenizer.json`` ships (a ``tokenizers.Tokenizer``).

    Models are built from the shipped file, not from this: the trainer's result may change with the ``tokenizers``
    version. Maintainers regenerate the file with ``python -m rllm_gym.tiny_model --write-tokenizer
    rllm_gym/tiny_tokenizer.json`` after changing the corpus or the token lists (and update the digests in
    tests/test_tiny_model.py).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(TEXT_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(tiny_corpus(seed), trainer=trainer)
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in TEXT_TOKENS])
    return tokenizer


def _shipped_tokenizer_text() -> str:
    return importlib.resources.files("rllm_gym").joinpath(TOKENIZER_FILE).read_text(encoding="utf-8")


def tiny_tokenizer():
    """The embedded model's tokenizer (a ``PreTrainedTokenizerFast``), loaded from the shipped vocabulary and merges
    with the chat template and special tokens of this module."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(_shipped_tokenizer_text())
    added = [token.content for _, token in sorted(backend.get_added_tokens_decoder().items())]
    if added != [*SPECIAL_TOKENS, *TEXT_TOKENS]:
        raise RuntimeError(
            f"rllm_gym/{TOKENIZER_FILE} adds the tokens {added}, this module declares "
            f"{[*SPECIAL_TOKENS, *TEXT_TOKENS]}: regenerate the file with `python -m rllm_gym.tiny_model "
            f"--write-tokenizer rllm_gym/{TOKENIZER_FILE}`"
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )


def _standard_normal(seed: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Draws of mean 0 and std 1 for the parameter ``name``, the same bits on every platform and library version.

    Each draw is the sum of 12 uniforms minus 6 (the Irwin-Hall approximation of a normal: bell-shaped, bounded by
    +-6) and each uniform is ``(k + 0.5) / 2**24`` for the top 24 bits ``k`` of a raw PCG64 word. Only integer sums
    and power-of-two scaling are involved: torch's ``normal_`` (Box-Muller through log and cos) gives other last bits
    under another CPU's vector kernels, and its generator or transformers' init order may change between versions.
    The stream is keyed by the parameter's name, so parameters do not depend on each other's sizes or order.
    """
    n = math.prod(shape)
    name_key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    words = np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(name_key,))).random_raw(12 * n)
    sums = (words >> np.uint64(40)).reshape(n, 12).sum(axis=1)  # 12 x 24 bits: exact in uint64
    # sum((k_i + 0.5) / 2**24) - 6 = (sum(k_i) + 6 - 6 * 2**24) / 2**24: integers below 2**53, exact in float64.
    return ((sums.astype(np.float64) + (6 - 6 * 2**24)) / 2**24).reshape(shape)


def _init_weights(model: Any, seed: int) -> None:
    """Set every parameter of the Qwen2 ``model`` by this module's rules, whatever transformers' init drew before:
    linear and embedding weights ``initializer_range * _standard_normal`` (the padding token's embedding row zero, as
    ``nn.Embedding(padding_idx=...)`` has it), biases zero, RMSNorm weights one. A tied output layer shares the
    embedding (it is initialised once, under the embedding's name); a parameter no rule knows is an error."""
    import torch
    from torch import nn

    std = model.config.initializer_range
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):  # tied parameters are listed once, under their first name
            owner_name, _, kind = name.rpartition(".")
            owner = modules[owner_name]
            shape = tuple(param.shape)
            if kind == "weight" and isinstance(owner, nn.Linear | nn.Embedding):
                values = _standard_normal(seed, name, shape) * std
                if isinstance(owner, nn.Embedding) and owner.padding_idx is not None:
                    values[owner.padding_idx] = 0.0
            elif kind == "bias" and isinstance(owner, nn.Linear):
                values = np.zeros(shape)
            elif kind == "weight" and type(owner).__name__.endswith("RMSNorm"):
                values = np.ones(shape)
            else:
                raise RuntimeError(
                    f"no initialisation rule for {name} ({type(owner).__name__}): add one to "
                    "rllm_gym/tiny_model.py's _init_weights and bump TINY_MODEL_VERSION"
                )
            param.copy_(torch.from_numpy(values.astype(np.float32)))


def _check_request(seed: int, shape: str) -> None:
    if shape not in SHAPES:
        raise ValueError(f"tiny model shape must be one of {sorted(SHAPES)}, got {shape!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"tiny model seed must be a non-negative integer, got {seed!r}")


def build_tiny_model(path: str | os.PathLike[str], seed: int = DEFAULT_SEED, shape: str = "tiny") -> Path:
    """Build the tiny model (of the :data:`SHAPES` entry ``shape``) and tokenizer into the folder ``path`` (created if
    missing) and return it.

    Same ``seed`` and ``shape``, same weights and tokenizer on every machine and supported library version (see
    :func:`weights_digest`); the tokenizer is the shipped one whatever the seed. Takes about a second on a CPU, needs
    no network.
    """
    _check_request(seed, shape)
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer()
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        **SHAPES[shape],
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )
    # transformers' own init draws from the global RNG (then _init_weights replaces all of it): fork it, so that
    # building the model leaves the caller's torch seed as it was.
    with torch.random.fork_rng(devices=[]):
        model = Qwen2ForCausalLM(config)
    _init_weights(model, seed)
    model.generation_config = GenerationConfig(
        eos_token_id=[eos_id, pad_id], pad_token_id=pad_id, do_sample=False, max_new_tokens=256
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def weights_digest(path: str | os.PathLike[str]) -> str:
    """sha256 of the weights in the folder ``path``: each tensor's name, dtype, shape and bytes, by name.

    Independent of how the file was written (safetensors' header and metadata may differ between versions).
    """
    from safetensors import safe_open

    digest = hashlib.sha256()
    with safe_open(str(Path(path) / "model.safetensors"), framework="numpy") as weights:
        for name in sorted(weights.keys()):
            array = np.ascontiguousarray(weights.get_tensor(name))
            digest.update(f"{name} {array.dtype.str} {list(array.shape)}\n".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


def tokenizer_digest(path: str | os.PathLike[str]) -> str:
    """sha256 of the tokenizer in the folder ``path``: its vocabulary, merges and added tokens (id, text, special).

    Independent of how tokenizer.json was written (older versions write a merge as ``"a b"``, newer as a pair).
    """
    state = json.loads((Path(path) / "tokenizer.json").read_text(encoding="utf-8"))
    merges = [merge.split(" ", 1) if isinstance(merge, str) else list(merge) for merge in state["model"]["merges"]]
    added = sorted((token["id"], token["content"], token["special"]) for token in state["added_tokens"])
    canonical = json.dumps([sorted(state["model"]["vocab"].items()), merges, added], ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def model_digests(seed: int = DEFAULT_SEED) -> dict[str, dict[str, str]]:
    """``{shape: {"weights": ..., "tokenizer": ...}}`` for every :data:`SHAPES` entry, each built in a temporary
    folder: the values tests/test_tiny_model.py records (``python -m rllm_gym.tiny_model --print-digests``)."""
    digests = {}
    with tempfile.TemporaryDirectory() as folder:
        for shape in SHAPES:
            path = build_tiny_model(Path(folder) / shape, seed=seed, shape=shape)
            digests[shape] = {"weights": weights_digest(path), "tokenizer": tokenizer_digest(path)}
    return digests


def _cache_root() -> Path:
    root = os.environ.get("RLLM_GYM_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "rllm_gym"


def _recipe_key(seed: int, shape: str) -> str:
    """A short hash of what the build is made of, for the cache folder's name: a cached folder is reused only for the
    same shape sizes, tokenizer and chat template (TINY_MODEL_VERSION stands for the build's code)."""
    recipe = {
        "version": TINY_MODEL_VERSION,
        "seed": seed,
        "shape": SHAPES[shape],
        "chat_template": CHAT_TEMPLATE,
        "tokenizer": hashlib.sha256(_shipped_tokenizer_text().encode()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def default_model_path(seed: int = DEFAULT_SEED, shape: str = "tiny") -> Path:
    """The folder of the embedded default model (of :data:`SHAPES` entry ``shape``), built into the cache on first
    use.

    The folder's name holds a hash of the build's recipe (:data:`TINY_MODEL_VERSION`, seed, the shape's sizes,
    tokenizer, chat template), so a folder cached by other code is never reused. Concurrent callers (threads or
    processes) are safe: one builds under a file lock into a temporary folder that is renamed into place atomically,
    the others wait for the lock and then find the finished folder.
    """
    from filelock import FileLock

    _check_request(seed, shape)
    root = _cache_root()
    target = root / f"tiny-qwen2-v{TINY_MODEL_VERSION}-{shape}-seed{seed}-{_recipe_key(seed, shape)}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "config.json").is_file():
            return target
        staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=root))
        try:
            build_tiny_model(staging, seed=seed, shape=shape)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build rllm-gym's tiny default model into a folder.")
    parser.add_argument("path", nargs="?", help="output folder")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="model size (default: tiny)")
    parser.add_argument(
        "--print-digests",
        action="store_true",
        help="print the weights and tokenizer digests of every shape (for tests/test_tiny_model.py) instead",
    )
    parser.add_argument(
        "--write-tokenizer",
        metavar="FILE",
        help=f"train the tokenizer with the installed `tokenizers` and write it to FILE (rllm_gym/{TOKENIZER_FILE} "
        "is the shipped one) instead",
    )
    args = parser.parse_args(argv)
    if args.print_digests:
        print(json.dumps(model_digests(args.seed), indent=4))
    elif args.write_tokenizer:
        Path(args.write_tokenizer).write_text(train_tokenizer(args.seed).to_str(pretty=True) + "\n", encoding="utf-8")
        print(args.write_tokenizer)
    elif args.path:
        print(build_tiny_model(args.path, seed=args.seed, shape=args.shape))
    else:
        parser.error("give the folder to build into, or --print-digests, or --write-tokenizer FILE")


if __name__ == "__main__":
    main()
