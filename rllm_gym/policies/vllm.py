"""VLLMPolicy: in-process vLLM (its async engine) with continuous batching across concurrent episodes.

vLLM is an optional, GPU-only dependency (``pip install 'rllm-gym[vllm]'``), imported only when a VLLMPolicy is
built. The vLLM-specific code is kept thin: the mapping from :class:`SamplingParams` to ``vllm.SamplingParams``
keyword arguments and from a ``vllm.RequestOutput`` to a :class:`ModelOutput` are pure functions, unit-tested with
stand-in objects on machines without vLLM. Prompts are sent as token ids (an episode's first rendered with the model's
chat template by transformers, each later one continuing the previous prompt and sampled ids), so the ids in the
ModelOutput are exactly the ones the engine saw.

vLLM's async engine belongs to the event loop it first runs on (its output handler is a task of that loop): driven
from a second loop it hangs. So the engine lives on a thread and loop of its own, and :meth:`VLLMPolicy.generate`
hands each request over to that loop: any number of event loops and threads can share one policy.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from typing import Any

from rllm_gym.policies.base import BasePolicy, PolicyError, PolicyRequest, SamplingParams, build_model_output
from rllm_gym.policies.tokens import TokenHistory
from rllm_gym.types import ModelOutput

__all__ = ["VLLMPolicy", "model_output_from_vllm", "vllm_sampling_kwargs"]


def vllm_sampling_kwargs(params: SamplingParams, *, logprobs: bool = True) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams`` that mean the same as ``params``.

    ``logprobs=0`` asks vLLM for the log-probability of each sampled token only (no alternatives).
    """
    kwargs: dict[str, Any] = {
        "n": 1,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": params.max_tokens,
        "skip_special_tokens": True,
    }
    if params.top_k is not None:
        kwargs["top_k"] = params.top_k
    if params.stop:
        kwargs["stop"] = list(params.stop)
    if params.seed is not None:
        kwargs["seed"] = params.seed
    if logprobs:
        kwargs["logprobs"] = 0
    return kwargs


def model_output_from_vllm(request_output: Any) -> ModelOutput:
    """The ModelOutput of a finished ``vllm.RequestOutput`` (its first completion).

    vLLM's completion text leaves out EOS and stop strings while ``token_ids`` keep the EOS token, the same
    convention as HFPolicy. Each ``logprobs`` entry maps token ids to objects with a ``.logprob``; the sampled
    token's value is taken.
    """
    if not request_output.outputs:
        raise PolicyError(f"vLLM returned no completion for request {request_output.request_id!r}")
    completion = request_output.outputs[0]
    completion_ids = list(completion.token_ids)
    logprobs: list[float] = []
    if completion.logprobs is not None:
        entries = zip(completion_ids, completion.logprobs, strict=True)
        logprobs = [float(entry[token].logprob) for token, entry in entries]
    return build_model_output(
        completion.text,
        prompt_ids=list(request_output.prompt_token_ids or []),
        completion_ids=completion_ids,
        logprobs=logprobs,
        finish_reason=completion.finish_reason,
    )


class VLLMPolicy(BasePolicy):
    """A policy on an in-process vLLM ``AsyncLLM`` engine.

    Args:
        model: a model folder or hub name; ``None`` uses the embedded tiny model.
        tokenizer: tokenizer folder for the chat template (defaults to the model's).
        enable_thinking: passed to the chat template when set.
        lora_path: a LoRA adapter folder applied to every request (``enable_lora`` is switched on for it).
        return_logprobs: ask for each sampled token's log-probability.
        token_history: ``"sampled"`` (an episode's next prompt continues the previous call's prompt and sampled ids,
            :mod:`rllm_gym.policies.tokens`) or ``"template"`` (the whole chat re-rendered each call).
        **engine_kwargs: more ``vllm.AsyncEngineArgs`` fields, e.g. ``gpu_memory_utilization=0.5``,
            ``max_model_len=4096``, ``tensor_parallel_size=2``.

    Example::

        policy = VLLMPolicy("Qwen/Qwen3-0.6B", enable_thinking=False, gpu_memory_utilization=0.6)
        outs = await asyncio.gather(*(policy.generate(chat, SamplingParams(temperature=1.0)) for chat in chats))
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        tokenizer: str | os.PathLike[str] | None = None,
        enable_thinking: bool | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        lora_path: str | os.PathLike[str] | None = None,
        return_logprobs: bool = True,
        token_history: TokenHistory = "sampled",
        **engine_kwargs: Any,
    ) -> None:
        try:
            import vllm
            from vllm.lora.request import LoRARequest
            from vllm.sampling_params import RequestOutputKind
        except ImportError as error:
            raise ImportError(
                "VLLMPolicy needs vLLM, a CUDA-only package: pip install 'rllm-gym[vllm]' on a GPU machine, "
                "or use HFPolicy (transformers) / OpenAIPolicy (a running server) instead"
            ) from error
        from transformers import AutoTokenizer

        if model is None:
            from rllm_gym.tiny_model import default_model_path

            model = default_model_path()
        model = str(model)
        super().__init__(
            AutoTokenizer.from_pretrained(str(tokenizer or model)),
            enable_thinking=enable_thinking,
            chat_template_kwargs=chat_template_kwargs,
            token_history=token_history,
        )
        self.return_logprobs = return_logprobs
        self._vllm = vllm
        self._final_only = RequestOutputKind.FINAL_ONLY
        self.lora_request = None
        if lora_path is not None:
            engine_kwargs.setdefault("enable_lora", True)
            self.lora_request = LoRARequest("rllm_gym_adapter", 1, str(lora_path))
        args = vllm.AsyncEngineArgs(model=model, tokenizer=str(tokenizer or model), **engine_kwargs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=_run_loop, args=(self._loop, _current_cuda_device()), name="vllm-policy-loop", daemon=True
        )
        self._thread.start()
        try:
            self.engine = self._on_engine_loop(_build_engine(args))  # built on the loop that will drive it
        except BaseException:
            self._stop_loop()
            raise

    def _on_engine_loop(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the engine's loop from a thread that is not that loop's, and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _generate(self, request: PolicyRequest) -> ModelOutput:
        prompt_ids = self.prompt_token_ids(request)
        if self._loop.is_closed():
            raise PolicyError("this VLLMPolicy was shut down: build a new one")
        # Cancelling the caller cancels the request on the engine's loop, which aborts it in vLLM.
        future = asyncio.run_coroutine_threadsafe(self._on_engine(prompt_ids, request.params), self._loop)
        return await asyncio.wrap_future(future)

    async def _on_engine(self, prompt_ids: list[int], params: SamplingParams) -> ModelOutput:
        vllm_params = self._vllm.SamplingParams(
            **vllm_sampling_kwargs(params, logprobs=self.return_logprobs), output_kind=self._final_only
        )
        prompt = self._vllm.TokensPrompt(prompt_token_ids=prompt_ids)
        final = None
        async for output in self.engine.generate(
            prompt, vllm_params, uuid.uuid4().hex, lora_request=self.lora_request
        ):
            final = output
        if final is None:
            raise PolicyError("vLLM finished the request without any output")
        return model_output_from_vllm(final)

    def shutdown(self) -> None:
        """Stop the engine and its loop's thread (idempotent)."""
        if self._loop.is_closed():
            return
        try:
            self._on_engine_loop(_shutdown(self.engine))
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def _run_loop(loop: asyncio.AbstractEventLoop, cuda_device: int | None) -> None:
    if cuda_device is not None:  # a new thread starts on GPU 0: keep the device of the process's rank
        import torch

        torch.cuda.set_device(cuda_device)
    asyncio.set_event_loop(loop)
    loop.run_forever()


def _current_cuda_device() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.current_device() if torch.cuda.is_available() else None


async def _build_engine(args: Any) -> Any:
    return _async_engine_class().from_engine_args(args)


async def _shutdown(engine: Any) -> None:
    engine.shutdown()


def _async_engine_class() -> Any:
    # vLLM >= 0.8 (V1 engine) names it AsyncLLM; older releases only export AsyncLLMEngine.
    try:
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError:
        from vllm import AsyncLLMEngine as AsyncLLM
    return AsyncLLM
