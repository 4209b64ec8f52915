"""The embedded default model: a tiny Qwen2-style causal LM and its byte-level BPE tokenizer, built offline.

No machine that runs the tests reaches a model hub, so rllm-gym builds its own default model from code: a BPE
tokenizer trained (with the ``tokenizers`` library) on a small corpus that this module generates, a Qwen-style chat
template with thinking on/off and Hermes tool calls, and a randomly initialised ``Qwen2ForCausalLM`` (hidden size 64,
2 layers). The same seed gives byte-identical weights and tokenizer, and the result is a normal Hugging Face folder
that ``AutoModelForCausalLM.from_pretrained``, ``AutoTokenizer.from_pretrained`` and ``transformers serve`` load.
:func:`default_model_path` builds it once into the cache (``$RLLM_GYM_CACHE`` or ``~/.cache/rllm_gym``), safely
under concurrent callers; ``python -m rllm_gym.tiny_model PATH`` builds it into ``PATH``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
from pathlib import Path

__all__ = [
    "CHAT_TEMPLATE",
    "DEFAULT_SEED",
    "SHAPES",
    "SPECIAL_TOKENS",
    "TEXT_TOKENS",
    "build_tiny_model",
    "default_model_path",
    "tiny_corpus",
]

# Bump when the corpus, template, config or initialisation changes: cached folders are keyed by it.
TINY_MODEL_VERSION = 2  # 2: the tiny shape has 2 query heads and 1 KV head of 32, which vLLM's CPU attention accepts
DEFAULT_SEED = 0
VOCAB_SIZE = 1024
# The model's sizes by name: "tiny" is the default (0.14M parameters, fast enough for every test); "small" (0.55M) has
# the capacity to learn a skill that generalizes, such as reading any FrozenLake grid (train/configs/
# frozenlake_generalize_cpu.yaml: the tiny one stalls near 60% on held-out lakes there), and still builds in about a
# second.
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


def _build_tokenizer(seed: int):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

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
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )


def build_tiny_model(path: str | os.PathLike[str], seed: int = DEFAULT_SEED, shape: str = "tiny") -> Path:
    """Build the tiny model (of the :data:`SHAPES` entry ``shape``) and tokenizer into the folder ``path`` (created if
    missing) and return it.

    Same ``seed`` and ``shape``, same weights and tokenizer files. Takes about a second on a CPU, needs no network.
    """
    if shape not in SHAPES:
        raise ValueError(f"tiny model shape must be one of {sorted(SHAPES)}, got {shape!r}")
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer(seed)
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
    # A private RNG stream: building the model must not disturb the caller's torch seed, nor depend on it.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[eos_id, pad_id], pad_token_id=pad_id, do_sample=False, max_new_tokens=256
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _cache_root() -> Path:
    root = os.environ.get("RLLM_GYM_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "rllm_gym"


def default_model_path(seed: int = DEFAULT_SEED, shape: str = "tiny") -> Path:
    """The folder of the embedded default model (of :data:`SHAPES` entry ``shape``), built into the cache on first
    use.

    Concurrent callers (threads or processes) are safe: one builds under a file lock into a temporary folder that is
    renamed into place atomically, the others wait for the lock and then find the finished folder.
    """
    from filelock import FileLock

    root = _cache_root()
    if shape not in SHAPES:
        raise ValueError(f"tiny model shape must be one of {sorted(SHAPES)}, got {shape!r}")
    suffix = "" if shape == "tiny" else f"-{shape}"  # the default keeps its folder name (caches stay valid)
    target = root / f"tiny-qwen2-v{TINY_MODEL_VERSION}-seed{seed}{suffix}"
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
    parser.add_argument("path", help="output folder")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="model size (default: tiny)")
    args = parser.parse_args(argv)
    print(build_tiny_model(args.path, seed=args.seed, shape=args.shape))


if __name__ == "__main__":
    main()
