"""The one module of :class:`~rllm_gym.policies.vllm.VLLMPolicy` that uses vLLM's internal names, each behind a
version check.

VLLMPolicy builds one ``vllm.SamplingParams`` per distinct sampling settings and hands the same object to every
request that uses them. vLLM's input processor deep-copies the params it is given for each request
(``SamplingParams.clone()``), a tenth of the CPU of the policy's engine thread in a profile of 128 FrozenLake
episodes (``benchmarks/bench_vllm.py``). vLLM's own flag ``skip_clone`` (documented as internal: "safe to reuse
without cloning") makes ``clone()`` a shallow copy instead. That is safe for the policy's params on the vLLM releases
read for it (:data:`SUPPORTED_VLLM`): what vLLM changes per request on its copy is either assigned (``max_tokens``,
``stop_token_ids``, the EOS id: the shared object keeps its own values) or added to the set of all stop token ids,
which the copy shares with the original and which then gains the model's EOS ids, the same ones on every request.
``bad_words``, the one field vLLM rebuilds a shared list for, is never set by the policy.

Outside the supported range, or where the name moved (:data:`INTERNALS`), :func:`shared_params_kwargs` returns
nothing and vLLM deep-copies the params as usual (a warning, once, when a supported release no longer has the name).
``tests/vllm/test_policy.py`` (real vLLM) fails loudly when the installed vLLM is outside the range or the name moved.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

from rllm_gym.internals import Internal

__all__ = ["INTERNALS", "SUPPORTED_VLLM", "available", "shared_params_kwargs"]

# vLLM releases whose SamplingParams.clone() and input processor were read for the rule above (0.31.0: clone() in
# vllm/sampling_params.py, InputProcessor.process_inputs in vllm/v1/engine/input_processor.py).
SUPPORTED_VLLM = (">=0.31", "<0.32")


def _skip_clone_present(vllm: Any) -> bool:
    fields = getattr(vllm.SamplingParams, "__struct_fields__", ())  # a msgspec Struct's declared fields
    return "skip_clone" in fields and callable(getattr(vllm.SamplingParams, "clone", None))


def _installed_has(check: Any) -> bool:
    """``check`` on the installed vLLM; False where there is none."""
    try:
        import vllm
    except ImportError:
        return False
    return check(vllm)


INTERNALS: dict[str, Internal] = {
    "skip_clone": Internal(
        "vllm.SamplingParams.skip_clone (read by SamplingParams.clone(): a shallow copy instead of a deep copy)",
        "one vllm.SamplingParams shared by every request of the same settings without vLLM's deep copy per request "
        "(a tenth of the CPU of the policy's engine thread)",
        "vllm.SamplingParams without the flag: vLLM deep-copies it per request",
        lambda: _installed_has(_skip_clone_present),
    ),
}
_PRESENT = {"skip_clone": _skip_clone_present}


def _version_supported(version: Any) -> bool:
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return Version(str(version)) in SpecifierSet(",".join(SUPPORTED_VLLM))
    except InvalidVersion:
        return False


@functools.cache
def _decided(name: str, version: str, present: bool) -> bool:
    if not _version_supported(version):
        return False  # another release: its public path, unread shortcuts are not taken
    if not present:
        internal = INTERNALS[name]
        warnings.warn(
            f"vLLM {version} no longer has {internal.where}, used for {internal.used_for}; falling back to "
            f"{internal.fallback} (update rllm_gym/policies/vllm_adapter.py)",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True


def available(vllm: Any, name: str) -> bool:
    """Whether the internal ``name`` (:data:`INTERNALS`) may be used with the ``vllm`` module given: its version is in
    :data:`SUPPORTED_VLLM` and the name is still where it was (else a warning, once per release)."""
    version = getattr(vllm, "__version__", None)
    if version is None or not _version_supported(version):
        return False
    return _decided(name, str(version), _PRESENT[name](vllm))


def shared_params_kwargs(vllm: Any) -> dict[str, Any]:
    """Extra keyword arguments for a ``vllm.SamplingParams`` that many requests share: ``skip_clone=True`` where
    :func:`available` says yes, else none (vLLM then deep-copies the params per request)."""
    return {"skip_clone": True} if available(vllm, "skip_clone") else {}
