"""The GPU suite (``pytest tests/gpu -m gpu``; benchmarks/gpu/run_suite.sh installs the carried wheels first).

Every test here carries the ``gpu`` marker; without CUDA (or without vLLM / DeepSpeed for the tests that need them)
it is skipped with the reason, so CI stays green. Helpers live in helpers.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# A Qwen2.5-architecture model small enough to build in seconds: the real vocabulary and head layout, 2 layers.
SMALL_QWEN = dict(num_hidden_layers=2, hidden_size=256, intermediate_size=512, num_attention_heads=4)


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rllm_gym.qwen_random import build_random_qwen

    return build_random_qwen(tmp_path_factory.mktemp("qwen"), "Qwen2.5-0.5B", dtype="bfloat16", **SMALL_QWEN)
