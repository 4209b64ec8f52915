import dataclasses

import pytest

from rllm_gym.internals import Internal
from rllm_gym.policies import transformers_adapter, vllm_adapter
from rllm_gym.train import trl_adapter


@pytest.mark.parametrize("adapter", [trl_adapter, transformers_adapter, vllm_adapter])
def test_every_internal_an_adapter_uses_says_where_what_for_and_its_fallback(adapter):
    assert adapter.INTERNALS
    for name, internal in adapter.INTERNALS.items():
        assert isinstance(internal, Internal), name
        assert internal.where and internal.used_for and internal.fallback, name
        assert isinstance(internal.present(), bool), name  # the check runs against the installed release


def test_an_internal_is_frozen():
    internal = Internal("pkg.mod", "what for", "the public path", lambda: True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        internal.where = "elsewhere"
