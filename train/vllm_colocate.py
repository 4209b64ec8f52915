"""Generation through the trainer's own vLLM engine (TRL's ``use_vllm`` in colocate mode) for rllm-gym's episodes.

:class:`TrainerVLLMPolicy` batches the requests of the episodes in flight into TRL's ``VLLMGeneration.generate``;
:func:`awake_for_rollout` keeps the engine awake (TRL's sleep mode) and the weight sync ordered before generation for
one rollout. :class:`~rllm_gym.train.trainer.EpisodeRollout` uses both when the trainer has ``use_vllm=True``
and ``vllm_mode="colocate"``; server mode is :mod:`rllm_gym.train.vllm_server`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from trl import GRPOTrainer

from rllm_gym.policies.base import PolicyRequest, SamplingParams, build_model_output
from rllm_gym.policies.hf import BatchingPolicy
from rllm_gym.policies.tokens import TokenHistory
from rllm_gym.train.trl_adapter import mark_vllm_weights_asleep, vllm_weights_asleep
from rllm_gym.train.vllm_server import indexed_cuda_device, prompt_too_long, sampled_logprobs
from rllm_gym.types import ModelOutput

__all__ = ["TrainerVLLMPolicy", "awake_for_rollout", "vllm_context_length"]


class TrainerVLLMPolicy(BatchingPolicy):
    """Generation through the trainer's own vLLM engine (TRL's ``use_vllm`` in colocate mode, tensor parallel 1).

    The requests of the episodes in flight are batched into one ``trainer.vllm_generation.generate`` call; TRL syncs
    the training weights into vLLM before each rollout. vLLM samples with the trainer's settings (``temperature``,
    ``top_p``, ``top_k``, ``max_completion_length``), so per-request sampling parameters are not used. Server mode
    goes through :class:`~rllm_gym.train.vllm_server.ServerVLLMPolicy` (processes in lockstep rounds); colocated
    tensor parallelism gathers the prompts of a TP group in every call, which episodes of different lengths cannot
    keep in step, so it is rejected with a clear error.

    Generation runs in a worker thread; it first makes the process's CUDA device (``trainer.accelerator.device``)
    current there, as the CUDA device is per thread (else every process's vLLM would work on cuda:0). A prompt that
    leaves vLLM no room for a token (longer than :attr:`max_prompt_tokens`, ``max_model_len`` less one) is not sent,
    as vLLM would refuse the whole batch for it: its request raises the engine's
    :class:`~rllm_gym.engine.TerminationEvent`, so that episode alone ends with ``max_prompt_length_exceeded``.
    """

    def __init__(
        self,
        trainer: GRPOTrainer,
        *,
        chat_template_kwargs: dict[str, Any] | None = None,
        max_batch_size: int = 1024,
        batch_wait_s: float = 0.02,
        token_history: TokenHistory = "sampled",
    ):
        generation = trainer.vllm_generation
        if generation.mode != "colocate" or generation.tensor_parallel_size != 1:
            raise ValueError(
                f"TrainerVLLMPolicy needs vllm_mode='colocate' with vllm_tensor_parallel_size=1, got mode "
                f"{generation.mode!r} and tensor parallel {generation.tensor_parallel_size}; for a model that needs "
                f"several GPUs, serve it with `trl vllm-serve` and train with vllm_mode='server'"
            )
        template_kwargs = dict(chat_template_kwargs or {})
        super().__init__(trainer.processing_class, template_kwargs, max_batch_size, batch_wait_s, token_history)
        self.generation = generation
        self.device = indexed_cuda_device(trainer.accelerator.device)  # resolved here, in the training's thread
        self.eos_token_ids = {trainer.processing_class.eos_token_id, *trainer.eos_token_ids}
        context = vllm_context_length(generation)
        self.max_prompt_tokens: int | None = None if context is None else context - 1
        self.too_long = 0  # prompts not sent, for being too long

    def prompt_token_ids(self, request: PolicyRequest) -> list[int]:
        """The request's prompt ids; a prompt too long for vLLM ends its episode here, before it joins a batch."""
        ids = super().prompt_token_ids(request)
        if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            self.too_long += 1
            raise prompt_too_long(len(ids), self.max_prompt_tokens, "the colocated vLLM's max_model_len")
        return ids

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[ModelOutput]:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.batch_sizes.append(len(prompts))
        _, completion_ids, logprobs, token_ids = self.generation.generate(prompts, None, 1)
        outputs = []
        for row, (prompt, ids) in enumerate(zip(prompts, completion_ids, strict=True)):
            sampled = sampled_logprobs(ids, logprobs[row] if logprobs else None, token_ids[row] if token_ids else None)
            finish_reason = "stop" if ids and ids[-1] in self.eos_token_ids else "length"
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            outputs.append(
                build_model_output(
                    text, prompt_ids=prompt, completion_ids=ids, logprobs=sampled, finish_reason=finish_reason
                )
            )
        return outputs

    def metrics(self) -> dict[str, float]:
        """For the trainer's logs: vLLM generate calls, requests sent, prompts too long to send."""
        return {
            "vllm_colocate/generate_calls": float(len(self.batch_sizes)),
            "vllm_colocate/requests": float(sum(self.batch_sizes)),
            "vllm_colocate/prompts_too_long": float(self.too_long),
        }


def vllm_context_length(generation: Any) -> int | None:
    """The trainer's vLLM engine's ``max_model_len`` (prompt and reply tokens), or TRL's ``vllm_max_model_length``
    where there is no engine to ask; None when neither is known."""
    try:
        return int(generation.llm.llm_engine.model_config.max_model_len)
    except AttributeError:
        length = getattr(generation, "max_model_length", None)
        return None if length is None else int(length)


@contextmanager
def awake_for_rollout(generation: Any, device: torch.device) -> Iterator[None]:
    """vLLM colocate for one rollout: awake throughout when TRL's sleep mode is on, then asleep for training; the
    training weights' sync finished on the GPU before any generation starts.

    TRL's ``VLLMGeneration.generate`` puts the engine to sleep (level 2: weights discarded) after every call and
    re-syncs the weights at the next one. A rollout makes one call per turn: that re-synced the whole model every
    turn, and under ZeRO-3, where a sync gathers parameters collectively, processes with different numbers of turns
    waited on each other's gathers. Here the weights are synced once (if asleep), at the start of the rollout, which
    every process reaches together; the KV cache is woken, TRL's per-call sleep is off until the rollout ends, and
    the engine sleeps once after it. Generation runs in a worker thread: ``torch.cuda.synchronize`` first finishes
    the sync's copies (queued on this thread's stream) before any generate call is queued there.
    """
    sleeps = getattr(generation, "enable_sleep_mode", False)
    if sleeps and vllm_weights_asleep(generation):
        generation.sync_weights()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if not sleeps:
        yield
        return
    generation.llm.wake_up(tags=["kv_cache"])
    generation.enable_sleep_mode = False
    try:
        yield
    finally:
        generation.enable_sleep_mode = True
        generation.llm.sleep(level=2)
        mark_vllm_weights_asleep(generation)
