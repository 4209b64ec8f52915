"""Weight sync into a colocated vLLM engine on vLLM's CPU build, where TRL's own sync cannot load.

TRL's colocate sync (``VLLMGeneration.sync_weights``) calls ``model.load_weights([(name, param)])`` one parameter at
a time. On a CPU that fails with ``AttributeError: 'Parameter' object has no attribute 'weight_loader'``: after the
first load, vLLM's ``UnquantizedLinearMethod.process_weights_after_loading`` calls
``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`` (``vllm/model_executor/layers/linear.py``), which packs
each linear weight into the CPU GEMM kernel and leaves an empty ``layer.weight`` with no loader behind.

:func:`load_weights_on_cpu` takes another path through vLLM's own code: it gives each emptied linear layer a fresh
weight from its quant method's ``create_weights`` (with the layer's own loader, as at construction), loads every
tensor with ``model.load_weights`` (vLLM's name mapping: q/k/v into qkv_proj, gate/up into gate_up_proj), then packs
again by running ``process_weights_after_loading`` on every layer that has a quant method (the tied embedding's
packed copy for the output head too). It needs the whole set of weights at once, since a stacked layer is packed
only after all its parts are in, so :func:`sync_weights` replaces TRL's per-parameter loop on a CPU and leaves every
other device to TRL.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["load_weights_on_cpu", "on_cpu", "sync_weights"]


def on_cpu() -> bool:
    """Whether vLLM runs on its CPU backend here (False without vLLM)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cpu())


def load_weights_on_cpu(model: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load checkpoint-named ``weights`` (all of them) into a vLLM model already loaded and packed on a CPU."""
    from vllm.model_executor.layers.linear import WEIGHT_LOADER_V2_SUPPORTED, LinearBase
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    for layer in model.modules():
        if isinstance(layer, LinearBase) and layer.weight.numel() == 0:
            dtype = layer.weight.dtype
            del layer._parameters["weight"]
            # The loader LinearBase.__init__ gives create_weights, so that stacked and sharded loads work as at start.
            v2 = type(layer.quant_method).__name__ in WEIGHT_LOADER_V2_SUPPORTED
            layer.quant_method.create_weights(
                layer,
                layer.input_size_per_partition,
                layer.output_partition_sizes,
                layer.input_size,
                layer.output_size,
                dtype,
                weight_loader=layer.weight_loader_v2 if v2 else layer.weight_loader,
            )
    with torch.no_grad():
        model.load_weights(weights)
    for layer in model.modules():
        method = getattr(layer, "quant_method", None)
        if isinstance(method, QuantizeMethodBase):
            method.process_weights_after_loading(layer)


def sync_weights(generation: Any) -> None:
    """Push the training weights into TRL's vLLM (``trainer.vllm_generation``): TRL's own sync, except in colocate
    mode on a CPU, where the weights go through :func:`load_weights_on_cpu` in one pass."""
    if generation.mode != "colocate" or not on_cpu():
        generation.sync_weights()
        return
    if getattr(generation, "enable_sleep_mode", False):
        raise ValueError("vllm_enable_sleep_mode is not supported on vLLM's CPU backend: leave it off")
    from rllm_gym.train.trl_adapter import cpu_vllm_model

    model, weights = cpu_vllm_model(generation)
    load_weights_on_cpu(model, weights)
    generation.llm.reset_prefix_cache()
