"""HFPolicy: a policy on transformers ``generate``, on CPU or GPU, batching the requests that arrive together.

This is the default backend (it runs the embedded tiny model when no model is named) and the CPU path of the
trainer. Concurrent ``generate`` calls go into a queue; a worker task gathers the requests that arrive within a few
milliseconds of each other, groups them by sampling parameters, pads them on the left and runs one ``generate`` per
group in a worker thread, so the event loop keeps serving envs meanwhile. Log-probabilities are those of the raw
model distribution (before temperature and top-k/top-p), as vLLM returns them by default, or with
``logprobs_mode="temperature"`` those of the distribution sampled from at the request's temperature (what TRL's loss
scores), gathered step by step (:class:`SampledLogprobs`): a batch's full logits are never kept.
``generate(on_token=...)`` streams a request's tokens as its row generates them (:class:`RowStreamer`,
transformers' streamer hook), for the gateway's ``stream``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Literal

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
)
from transformers.generation.streamers import BaseStreamer

from rllm_gym.policies.base import (
    BasePolicy,
    PolicyError,
    PolicyRequest,
    SamplingParams,
    build_model_output,
    merge_template_kwargs,
    on_loop,
)
from rllm_gym.policies.tokens import TokenHistory
from rllm_gym.types import ModelOutput

__all__ = ["BatchingPolicy", "HFPolicy", "RowStreamer", "SampledLogprobs"]


OnToken = Callable[[list[int]], None]


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future[ModelOutput]
    on_token: OnToken | None = None


class BatchingPolicy(BasePolicy):
    """The request queue shared by backends that generate a batch at a time (HFPolicy, the trainer's vLLM).

    Concurrent ``generate`` calls go into a queue; a worker task gathers the requests that arrive within
    ``batch_wait_s`` of the first (up to ``max_batch_size``), groups them by sampling parameters and runs
    :meth:`_generate_batch` once per group in a worker thread. Subclasses implement ``_generate_batch``.

    ``expected_requests``, when set, is a callable telling how many requests can still come (the trainer's rollout
    sets it to the number of episodes in flight): a batch is sent as soon as it holds that many, and otherwise once
    no request has joined it for ``batch_wait_s`` (the wait counts from the latest request, so requests still coming
    in one by one all make it in); :meth:`requests_changed` has the count read again when it falls. A full batch
    (``max_batch_size``) is always sent at once.

    ``generate_on_loop=True`` runs each batch on the event loop's own thread instead of a worker thread: the loop
    stalls while the model generates (env calls already in the env pool go on). The trainer's rollout does so, where
    every episode waits on the same batch anyway: in ``benchmarks/bench_grpo.py`` the loss and backward that follow
    a step's generation ran ~0.2 s slower per step when that generation had run in another thread.

    Token streaming (``generate(on_token=...)``): a subclass whose ``_generate_batch`` takes ``on_tokens`` (one
    callback or ``None`` per prompt, called from the generating thread with each row's new ids) streams; the queue
    relays each call to the requester's event loop. Batches without a streamed request are called without it.
    """

    def __init__(
        self,
        tokenizer: Any,
        template_kwargs: dict[str, Any],
        max_batch_size: int,
        batch_wait_s: float,
        token_history: TokenHistory = "sampled",
        generate_on_loop: bool = False,
    ):
        name = type(self).__name__
        if not isinstance(max_batch_size, int) or isinstance(max_batch_size, bool) or max_batch_size < 1:
            raise ValueError(f"{name}(max_batch_size=...) must be an int >= 1, got {max_batch_size!r}")
        if not isinstance(batch_wait_s, (int, float)) or isinstance(batch_wait_s, bool) or not 0 <= batch_wait_s < 60:
            raise ValueError(f"{name}(batch_wait_s=...) must be seconds in [0, 60), got {batch_wait_s!r}")
        super().__init__(tokenizer, chat_template_kwargs=template_kwargs, token_history=token_history)
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        if not isinstance(generate_on_loop, bool):
            raise ValueError(f"{name}(generate_on_loop=...) must be True or False, got {generate_on_loop!r}")
        self.generate_on_loop = generate_on_loop
        self.streams_tokens = "on_tokens" in inspect.signature(self._generate_batch).parameters
        self._queue: asyncio.Queue[_Request | None] | None = None  # None: a wake-up (requests_changed)
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.expected_requests: Callable[[], int] | None = None
        # Batches observed, for tests and metrics: the number of requests in each generate call.
        self.batch_sizes: list[int] = []

    async def _generate(self, request: PolicyRequest) -> ModelOutput:
        prompt_ids = self.prompt_token_ids(request)
        loop = asyncio.get_running_loop()
        queue = self._ensure_worker(loop)
        future: asyncio.Future[ModelOutput] = loop.create_future()
        on_token = request.on_token
        if on_token is not None and not self.generate_on_loop:  # called from the generating thread: hop to the loop
            on_token = on_loop(loop, on_token)
        queue.put_nowait(_Request(prompt_ids, request.params, future, on_token if self.streams_tokens else None))
        return await future

    def requests_changed(self) -> None:
        """Tell the batching worker that ``expected_requests()`` fell (an episode ended without asking again): a batch
        that now holds every request still to come goes out at once, not ``batch_wait_s`` later. Call it on the
        event loop that runs the requests."""
        if self._queue is not None and self._worker is not None and not self._worker.done():
            self._queue.put_nowait(None)

    async def aclose(self) -> None:
        """Stop the batching worker (it restarts on the next ``generate``)."""
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None

    def _ensure_worker(self, loop: asyncio.AbstractEventLoop) -> asyncio.Queue[_Request | None]:
        # One worker per event loop: a policy reused across asyncio.run() calls gets a fresh queue each time.
        if self._loop is not loop or self._worker is None or self._worker.done():
            self._loop = loop
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._run_worker(self._queue))
        assert self._queue is not None
        return self._queue

    async def _run_worker(self, queue: asyncio.Queue[_Request | None]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first = await queue.get()
            if first is None:  # a wake-up with nothing waiting
                continue
            batch = [first]
            deadline = loop.time() + self.batch_wait_s
            while len(batch) < self.max_batch_size:
                if queue.empty():
                    expected = self.expected_requests
                    remaining = deadline - loop.time()
                    if remaining <= 0 or (expected is not None and len(batch) >= expected()):
                        break
                    try:
                        item = await asyncio.wait_for(queue.get(), remaining)
                    except TimeoutError:
                        break
                else:
                    item = queue.get_nowait()
                if item is None:  # requests_changed(): check the count again
                    continue
                batch.append(item)
                if self.expected_requests is not None:
                    # While expected requests still arrive one by one (each renders its prompt on this loop first),
                    # the wait counts from the latest: counted from the first, it split a training step in two calls.
                    deadline = loop.time() + self.batch_wait_s
            groups: dict[SamplingParams, list[_Request]] = {}
            for request in batch:
                groups.setdefault(request.params, []).append(request)
            for params, requests in groups.items():
                live = [r for r in requests if not r.future.cancelled()]
                if not live:
                    continue
                try:
                    prompts = [r.prompt_ids for r in live]
                    streams = [r.on_token for r in live]
                    generate = self._generate_batch
                    if any(streams):
                        generate = functools.partial(generate, on_tokens=streams)
                    if self.generate_on_loop:
                        outputs = generate(prompts, params)
                    else:
                        outputs = await asyncio.to_thread(generate, prompts, params)
                except Exception as error:  # the whole batch failed: every caller gets the error
                    for request in live:
                        if not request.future.done():
                            request.future.set_exception(
                                PolicyError(f"{type(self).__name__} generate failed: {type(error).__name__}: {error}")
                            )
                    continue
                for request, output in zip(live, outputs, strict=True):
                    if not request.future.done():
                        request.future.set_result(output)

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[ModelOutput]:
        raise NotImplementedError


class HFPolicy(BatchingPolicy):
    """A policy on ``transformers`` ``generate``, batching concurrent requests.

    Args:
        model: a model folder or hub name, or a loaded ``PreTrainedModel``; ``None`` uses the embedded tiny model.
        tokenizer: a tokenizer folder or object; defaults to the model's.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, or ``"auto"`` (CUDA when available).
        dtype: torch dtype name for loading (``"auto"`` keeps the checkpoint's).
        enable_thinking: passed to the chat template when set (Qwen3-style templates); ``None`` keeps its default.
        token_history: ``"sampled"`` (default): an episode's next prompt is the previous call's prompt and
            completion ids followed by the new messages' tokens (:mod:`rllm_gym.policies.tokens`); ``"template"``:
            the chat template renders the whole chat each call (what it does to earlier turns included).
        max_batch_size: the most requests one ``generate`` call runs together.
        batch_wait_s: how long the queue waits after the first request for others to join its batch.
        generate_on_loop: run ``generate`` on the event loop's thread rather than a worker thread (see
            :class:`BatchingPolicy`).
        logprobs_mode: ``"raw"`` (default): the sampled tokens' log-probabilities under the model's own distribution,
            as vLLM's default ``raw_logprobs``; ``"temperature"``: under the logits divided by the request's
            temperature (greedy requests: raw), the distribution a sampled request draws from before top-k/top-p
            and the one TRL's GRPO loss scores (the asynchronous trainer's behaviour log-probabilities).

    Example::

        policy = HFPolicy()                       # the embedded tiny model on CPU
        out = await policy.generate([{"role": "user", "content": "hi"}], SamplingParams(temperature=0))
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | PreTrainedModel | None = None,
        *,
        tokenizer: Any = None,
        device: str = "cpu",
        dtype: str = "auto",
        enable_thinking: bool | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        max_batch_size: int = 32,
        batch_wait_s: float = 0.005,
        token_history: TokenHistory = "sampled",
        generate_on_loop: bool = False,
        logprobs_mode: Literal["raw", "temperature"] = "raw",
    ) -> None:
        if logprobs_mode not in ("raw", "temperature"):
            raise ValueError(f"HFPolicy(logprobs_mode=...) must be 'raw' or 'temperature', got {logprobs_mode!r}")
        self.logprobs_mode = logprobs_mode
        if model is None:
            from rllm_gym.tiny_model import default_model_path

            model = default_model_path()
        try:
            if device != "auto":
                torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise ValueError(
                f"HFPolicy(device=...) must be a torch device such as 'cpu', 'cuda', 'cuda:1', or 'auto', "
                f"got {device!r}"
            ) from error
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if isinstance(model, torch.nn.Module):  # a PreTrainedModel, or a wrapper of one such as a PEFT model
            self.model = model
            if tokenizer is None:
                raise ValueError("HFPolicy(model=<PreTrainedModel>) also needs tokenizer=<folder or tokenizer object>")
        else:
            self.model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
            tokenizer = tokenizer if tokenizer is not None else model
        self.model.to(device).eval()
        super().__init__(
            AutoTokenizer.from_pretrained(tokenizer) if isinstance(tokenizer, str | os.PathLike) else tokenizer,
            merge_template_kwargs(enable_thinking, chat_template_kwargs),
            max_batch_size,
            batch_wait_s,
            token_history,
            generate_on_loop,
        )
        self.device = torch.device(device)
        self.eos_token_ids = _eos_token_ids(self.model, self.tokenizer)
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else self.eos_token_ids[0]

    @torch.no_grad()
    def _generate_batch(
        self, prompts: list[list[int]], params: SamplingParams, on_tokens: list[OnToken | None] | None = None
    ) -> list[ModelOutput]:
        self.batch_sizes.append(len(prompts))
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[self.pad_token_id] * (width - len(p)) + p for p in prompts], device=self.device)
        attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        config = self._generation_config(params)
        temperature = params.temperature if self.logprobs_mode == "temperature" and not params.greedy else 1.0
        sampled = SampledLogprobs(temperature)
        # A seeded request samples from its own seed and leaves the global generator as it was; an unseeded one draws
        # from the global generator and advances it, so the next batch gets fresh noise (restoring it here made every
        # batch of the same shape sample with the same draws).
        seeded = params.seed is not None
        with (
            torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else [])
            if seeded
            else nullcontext()
        ):
            if seeded:
                torch.manual_seed(params.seed)
            sequences = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                logits_processor=LogitsProcessorList([sampled]),
                tokenizer=self.tokenizer if params.stop else None,
                streamer=None if on_tokens is None else RowStreamer(on_tokens, self.eos_token_ids),
            )
        tokens = sequences[:, width:]  # (B, T)
        token_logprobs = sampled.finish(tokens)  # (B, T)
        outputs = []
        for row, prompt in enumerate(prompts):
            ids, finish_reason, text = self._finish(tokens[row].tolist(), params)
            outputs.append(
                build_model_output(
                    text,
                    prompt_ids=prompt,
                    completion_ids=ids,
                    logprobs=token_logprobs[row, : len(ids)].tolist(),
                    finish_reason=finish_reason,
                )
            )
        return outputs

    def _generation_config(self, params: SamplingParams) -> GenerationConfig:
        sampling: dict[str, Any] = {"do_sample": False}
        if not params.greedy:
            # top_k=0 and top_p=1.0 switch the filters off explicitly, so a checkpoint's defaults do not leak in.
            sampling = {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p}
            sampling["top_k"] = params.top_k or 0
        return GenerationConfig(
            max_new_tokens=params.max_tokens,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            stop_strings=list(params.stop) or None,
            # A checkpoint's generation config fills in what is left unset; these processors would run before
            # SampledLogprobs and change the distribution SamplingParams describe (vLLM's, with the same params).
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            # Neither logits nor scores are kept: SampledLogprobs keeps one log-probability per token as it goes.
            return_dict_in_generate=False,
            output_logits=False,
            output_scores=False,
            **sampling,
        )

    def _finish(self, tokens: list[int], params: SamplingParams) -> tuple[list[int], str, str]:
        """Cut a generated row at its end: EOS (kept, as vLLM keeps it), a stop string, or the length limit."""
        for k, token in enumerate(tokens):
            if token in self.eos_token_ids:
                ids = tokens[: k + 1]
                return ids, "stop", self.tokenizer.decode(ids, skip_special_tokens=True)
            if params.stop:
                text = self.tokenizer.decode(tokens[: k + 1], skip_special_tokens=True)
                cut = min((i for i in (text.find(s) for s in params.stop) if i >= 0), default=-1)
                if cut >= 0:
                    return tokens[: k + 1], "stop", text[:cut]
        return tokens, "length", self.tokenizer.decode(tokens, skip_special_tokens=True)


class SampledLogprobs(LogitsProcessor):
    """Collects the log-probability of each sampled token during ``generate``, never all the logits of a batch.

    Called at every generation step with that step's logits (the raw model logits when no other logits processor
    runs before it; temperature and top-k/top-p come after custom processors), it keeps that step's log-softmax,
    ``(B, V)``, only until the next step, whose ``input_ids`` end with the token sampled from it: one ``(B,)``
    log-probability is kept per step, so what it holds is ``O(B x T)`` plus one step's ``(B, V)``, where stacking
    ``output_logits`` held ``(B, T, V)``. :meth:`finish` takes the last step's token from the finished sequences.
    With ``temperature`` other than 1 the log-softmax is of the logits divided by it.
    """

    def __init__(self, temperature: float = 1.0) -> None:
        self.temperature = temperature
        self.steps: list[torch.Tensor] = []  # one (B,) tensor per generated token
        self._last: torch.Tensor | None = None  # (B, V): the latest step's log-softmax, until its token is known

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._take(input_ids[:, -1])  # the token sampled from the previous step's distribution
        logits = scores.float()
        self._last = torch.log_softmax(logits if self.temperature == 1.0 else logits / self.temperature, dim=-1)
        return scores

    def _take(self, tokens: torch.Tensor) -> None:
        if self._last is not None:
            self.steps.append(self._last.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))  # (B,)
            self._last = None

    def finish(self, tokens: torch.Tensor) -> torch.Tensor:
        """The ``(B, T)`` log-probabilities of the generated ``tokens`` ``(B, T)``."""
        if len(self.steps) < tokens.size(1):
            self._take(tokens[:, len(self.steps)])
        if not self.steps:
            return tokens.new_zeros(tokens.shape, dtype=torch.float32)
        return torch.stack(self.steps, dim=1)


class RowStreamer(BaseStreamer):
    """Hands each row's newly generated token to that row's callback (``None``: the row is not streamed), during
    ``generate``. transformers calls :meth:`put` with the prompt ids ``(B, T)`` first, then with each step's sampled
    ids ``(B,)``; a row's tokens after its EOS (padding while other rows go on) are not handed over."""

    def __init__(self, callbacks: list[OnToken | None], eos_token_ids: list[int]) -> None:
        self.callbacks = callbacks
        self.eos_token_ids = frozenset(eos_token_ids)
        self.ended = [callback is None for callback in callbacks]

    def put(self, value: torch.Tensor) -> None:
        if value.dim() != 1:  # the prompt
            return
        for row, token in enumerate(value.tolist()):
            if not self.ended[row]:
                self.ended[row] = token in self.eos_token_ids
                self.callbacks[row]([token])

    def end(self) -> None:
        pass


def _eos_token_ids(model: PreTrainedModel, tokenizer: Any) -> list[int]:
    eos = model.generation_config.eos_token_id
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("HFPolicy needs an EOS token: set generation_config.eos_token_id or tokenizer.eos_token")
    return ids
