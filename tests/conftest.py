"""Fixtures shared across the suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from rllm_gym.tiny_model import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded tiny model, built once per test session into a temporary folder (no download)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"))
