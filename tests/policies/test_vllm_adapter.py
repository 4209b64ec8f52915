"""The vLLM adapter's version check, with stand-in vllm modules (the real one: tests/vllm/test_policy.py)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

from rllm_gym.policies import vllm_adapter
from rllm_gym.policies.vllm_adapter import INTERNALS, available, shared_params_kwargs


class _Params:
    __struct_fields__ = ("n", "temperature", "skip_clone")

    def clone(self):
        return self


class _OldParams:
    __struct_fields__ = ("n", "temperature")

    def clone(self):
        return self


@pytest.fixture(autouse=True)
def fresh_checks():
    vllm_adapter._decided.cache_clear()
    yield
    vllm_adapter._decided.cache_clear()


def _vllm(version, params=_Params):
    return SimpleNamespace(__version__=version, SamplingParams=params)


def test_a_supported_vllm_with_the_flag_shares_params_without_a_deep_copy():
    assert shared_params_kwargs(_vllm("0.31.0")) == {"skip_clone": True}
    assert shared_params_kwargs(_vllm("0.31.0+cpu")) == {"skip_clone": True}
    assert available(_vllm("0.31.0"), "skip_clone")


@pytest.mark.parametrize("version", ["0.30.0", "0.32.0", "1.0.0", "not a version", None])
def test_a_release_nobody_read_gets_vllms_own_deep_copy(version):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unread release is not a reason to warn
        assert shared_params_kwargs(_vllm(version)) == {}


def test_a_supported_release_without_the_flag_warns_once_and_falls_back():
    with pytest.warns(RuntimeWarning, match=r"no longer has vllm.SamplingParams.skip_clone.*vllm_adapter.py"):
        assert shared_params_kwargs(_vllm("0.31.1", _OldParams)) == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert shared_params_kwargs(_vllm("0.31.1", _OldParams)) == {}


def test_every_internal_names_its_fallback_and_is_false_without_vllm():
    for name, internal in INTERNALS.items():
        assert internal.where and internal.used_for and internal.fallback, name
        assert isinstance(internal.present(), bool), name
