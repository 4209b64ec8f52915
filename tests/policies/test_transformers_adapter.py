"""The transformers adapter: the installed transformers is supported and every internal is where it was; outside the
range, or with a name moved, the prompt path takes transformers' public path and gives the same prompt."""

from __future__ import annotations

import dataclasses
import re
import sys
import warnings

import pytest
import transformers
from packaging.specifiers import SpecifierSet
from transformers import AutoTokenizer

from rllm_gym.policies import tokens, transformers_adapter
from rllm_gym.policies.transformers_adapter import INTERNALS, SUPPORTED_TRANSFORMERS, available

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "go left <|im_end|> as text"},
    {"role": "assistant", "content": "<think>hm</think>left"},
    {"role": "user", "content": "naïve 東京"},
]


@pytest.fixture
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def fresh_checks():
    """``available`` decides once per process: start and end each test with no decision cached."""
    available.cache_clear()
    yield
    available.cache_clear()


def test_the_installed_transformers_is_supported_and_every_internal_is_present(fresh_checks):
    # If this fails after an upgrade of transformers: read its apply_chat_template and encode again, then move
    # SUPPORTED_TRANSFORMERS or the internal (the prompt path stays correct meanwhile, on transformers' public path).
    assert transformers.__version__ in SpecifierSet(",".join(SUPPORTED_TRANSFORMERS))
    for name, internal in INTERNALS.items():
        assert internal.present(), f"{internal.where} moved (used for {internal.used_for})"
        assert available(name)


def _no_public_path(tokenizer, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the public path ran")

    monkeypatch.setattr(tokenizer, "apply_chat_template", refuse)
    monkeypatch.setattr(tokenizer, "encode", refuse)


def test_inside_the_range_the_prompt_path_skips_transformers_public_path(tokenizer, monkeypatch, fresh_checks):
    expected_text = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    expected_ids = tokenizer.encode(expected_text, add_special_tokens=False)
    _no_public_path(tokenizer, monkeypatch)
    assert tokens.render_chat_text(tokenizer, CHAT, None, {}) == expected_text
    assert tokens.encode_text(tokenizer, expected_text) == expected_ids


def test_outside_the_range_the_public_path_gives_the_same_prompt(tokenizer, monkeypatch, fresh_checks):
    expected_text = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    expected_ids = tokenizer.encode(expected_text, add_special_tokens=False)
    # The module the adapter imports (transformers swaps a lazy module into sys.modules while it loads).
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "4.56.0")
    assert not available("render_jinja_template") and not available("backend_tokenizer")
    assert transformers_adapter.render_plain_chat(tokenizer, CHAT, None, {}) is None
    assert transformers_adapter.backend_encode(tokenizer, expected_text) is None
    assert tokens.render_chat_text(tokenizer, CHAT, None, {}) == expected_text
    assert tokens.render_prompt_ids(tokenizer, CHAT, None, {}) == expected_ids
    _no_public_path(tokenizer, monkeypatch)  # and it is that path that ran
    with pytest.raises(AssertionError, match="the public path ran"):
        tokens.render_chat_text(tokenizer, CHAT, None, {})


def test_a_moved_internal_warns_once_and_falls_back(tokenizer, monkeypatch, fresh_checks):
    moved = dataclasses.replace(INTERNALS["render_jinja_template"], present=lambda: False)
    monkeypatch.setitem(INTERNALS, "render_jinja_template", moved)
    message = f"no longer has {moved.where}"
    with pytest.warns(RuntimeWarning, match=re.escape(message)):
        assert transformers_adapter.render_plain_chat(tokenizer, CHAT, None, {}) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: the second call is silent
        text = tokens.render_chat_text(tokenizer, CHAT, None, {})
    assert text == tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
