"""Multi-turn generation through TRL's vLLM server mode (``trl vllm-serve`` on GPUs of its own), in lockstep rounds.

TRL's server path (``VLLMGeneration.generate``) gathers the prompts of every training process, lets the main process
(the only one holding ``vllm_client``) call the server, broadcasts the completions and hands each process the slice
``process_index * len(prompts)`` onward: it assumes every process makes the same calls with the same number of
prompts. Multi-turn episodes break that (each process runs its own envs, with its own numbers of turns), so
:class:`ServerVLLMPolicy` talks to the same client in ROUNDS that every process joins whether or not it has
anything to send: each round gathers ``(prompts, done)`` from every process, the main process makes one server call
for all the prompts, broadcasts the result, and each process keeps its own part by the gathered lengths. Rounds go
on until every process's episodes are done. The cost: every process joins each round within ``max_wait_s`` (its
env steps run on meanwhile, so no process waits on another's env steps for longer, unless an env blocks the event
loop), a request that arrives while its process sits in a round waits for the next one, and rounds in which no
process has a prompt skip the server.

Running it (generation on GPU 0, training on GPUs 1-3; TRL pushes the training weights to the server over NCCL,
port ``vllm_group_port`` 51216, before each rollout)::

    CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model <model folder or hub id> --port 8000
    CUDA_VISIBLE_DEVICES=1,2,3 accelerate launch --config_file train/accelerate/multi_gpu.yaml --num_processes 3 \\
        train/grpo.py --config <config.yaml>   # the YAML sets use_vllm: true and vllm_mode: server

The trainer finds a server on its own machine at TRL's default address (port 8000); for a server elsewhere set
``vllm_server_base_url: http://<server host>:8000`` in the YAML.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from rllm_gym.engine.workflow import TerminationEvent
from rllm_gym.policies.base import BasePolicy, PolicyError, PolicyRequest, build_model_output
from rllm_gym.policies.tokens import TokenHistory
from rllm_gym.types import ModelOutput, TerminationReason

__all__ = ["ServerVLLMPolicy", "prompt_too_long", "sampled_logprobs"]

T = TypeVar("T")


@dataclass
class _Request:
    prompt_ids: list[int]
    future: asyncio.Future[ModelOutput]


@dataclass
class _RoundResult:
    """One round as this process sees it: its outputs (or the error every process got) and whether all are done."""

    outputs: list[ModelOutput] | None
    error: str | None
    all_done: bool
    total_requests: int


def sampled_logprobs(
    ids: list[int], logprobs: list[list[float | None]] | None, token_ids: list[list[int]] | None
) -> list[float]:
    """The sampled token's logprob at each position from vLLM's candidates, which are sorted by probability (the
    sampled token is among them, not always first); 0.0 where vLLM could not score one or sent no logprobs."""
    sampled = [0.0] * len(ids)
    for position, candidates in enumerate((logprobs or [])[: len(ids)]):
        pick = 0
        if token_ids is not None and ids[position] in token_ids[position]:
            pick = token_ids[position].index(ids[position])
        value = candidates[pick] if candidates else None
        sampled[position] = float(value) if value is not None else 0.0
    return sampled


def indexed_cuda_device(device: torch.device | str, current: Callable[[], int] | None = None) -> torch.device:
    """``device`` with its GPU index: accelerate names a lone GPU ``cuda`` (no ``accelerate launch``), which
    ``torch.cuda.set_device`` refuses; that is the calling thread's current GPU (``current``, by default
    ``torch.cuda.current_device``). Call it in the thread whose GPU is meant (the training's), not a worker's."""
    device = torch.device(device)
    if device.type != "cuda" or device.index is not None:
        return device
    return torch.device("cuda", (current or torch.cuda.current_device)())


def prompt_too_long(length: int, limit: int, context: str) -> TerminationEvent:
    """What ends the episode of a prompt that leaves vLLM no room for a reply token (``max_prompt_length_exceeded``).

    Raised from the policy's ``generate``, the engine ends that episode alone; sent, vLLM would refuse the whole
    batch or server call, and with it every other episode's turn."""
    return TerminationEvent(
        TerminationReason.MAX_PROMPT_LENGTH_EXCEEDED,
        f"prompt of {length} tokens does not fit {context}: at most {limit} leave room for a reply",
    )


def _seconds(owner: str, name: str, value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 60:
        raise ValueError(f"{owner}({name}=...) must be seconds in [0, 60), got {value!r}")
    return float(value)


class ServerVLLMPolicy(BasePolicy):
    """A policy on the vLLM server of TRL's ``vllm_mode="server"``, kept in step across training processes.

    Every ``generate`` must be awaited inside :meth:`run`, which drives the rounds (see the module docstring) and
    returns when the episodes of EVERY process are done. The server samples with the trainer's settings
    (``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty``, ``max_completion_length``,
    ``generation_kwargs``), as TRL's own server path does, so per-request sampling parameters are not used.
    A failed server call fails every request of that round on every process with a :class:`PolicyError`, and the
    requests that follow in the same :meth:`run` fail with the same cause without calling the server again.

    Args:
        generation: TRL's ``VLLMGeneration`` (``trainer.vllm_generation``) in server mode; only the main process
            uses its ``vllm_client``.
        accelerator: the trainer's ``Accelerator`` (``num_processes``, ``process_index``, ``is_main_process``).
        tokenizer: renders chat messages into prompt ids and decodes completions.
        eos_token_ids: ids that end a completion (``finish_reason`` ``"stop"``; otherwise ``"length"``).
        batch_wait_s: how long a process waits after its first queued request for others to join the round.
        max_wait_s: the longest a process waits before joining a round, even with nothing to send.
        chat_template_kwargs: extra arguments for ``apply_chat_template``.
        max_prompt_tokens: the longest prompt the server can take (its ``--max_model_len`` less one: vLLM refuses a
            prompt that leaves no room for a token, and the whole server call with it). A longer prompt is not sent:
            its request raises the engine's ``TerminationEvent``, so that episode alone ends with
            ``max_prompt_length_exceeded``. ``from_trainer`` takes it from ``vllm_max_model_length``.
        token_history: ``"sampled"`` (each prompt continues the previous call's tokens) or ``"template"``.

    Example::

        policy = ServerVLLMPolicy.from_trainer(trainer)
        episodes = asyncio.run(policy.run(engine.run_pairs(pairs)))
        trainer_metrics.update(policy.metrics())
    """

    def __init__(
        self,
        generation: Any,
        accelerator: Any,
        tokenizer: Any,
        eos_token_ids: Sequence[int],
        *,
        batch_wait_s: float = 0.02,
        max_wait_s: float = 0.05,
        chat_template_kwargs: dict[str, Any] | None = None,
        max_prompt_tokens: int | None = None,
        token_history: TokenHistory = "sampled",
    ) -> None:
        mode = getattr(generation, "mode", None)
        if mode != "server":
            raise ValueError(
                f"ServerVLLMPolicy needs TRL's vLLM server mode (GRPOConfig(use_vllm=True, vllm_mode='server')), got "
                f"vllm_mode {mode!r}; for vllm_mode='colocate' use rllm_gym.train.trainer.TrainerVLLMPolicy"
            )
        self.batch_wait_s = _seconds("ServerVLLMPolicy", "batch_wait_s", batch_wait_s)
        self.max_wait_s = _seconds("ServerVLLMPolicy", "max_wait_s", max_wait_s)
        super().__init__(tokenizer, chat_template_kwargs=chat_template_kwargs, token_history=token_history)
        self.generation = generation
        self.accelerator = accelerator
        self.eos_token_ids = {int(i) for i in eos_token_ids if i is not None}
        self._pending: list[_Request] = []
        self._first_at = 0.0
        self._arrived: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._driving = False
        self._error: str | None = None  # a server failure, sticky for the rest of the run
        # Per round: this process's requests (batch_sizes, as BatchingPolicy) and every process's (round_sizes).
        self.batch_sizes: list[int] = []
        self.round_sizes: list[int] = []
        self.server_calls = 0
        self.server_errors = 0
        self.max_prompt_tokens = max_prompt_tokens
        self.too_long = 0  # prompts not sent, for being too long

    @classmethod
    def from_trainer(cls, trainer: Any, **kwargs: Any) -> ServerVLLMPolicy:
        """The policy on a ``GRPOTrainer`` built with ``use_vllm=True, vllm_mode="server"``."""
        tokenizer = trainer.processing_class
        eos = [getattr(tokenizer, "eos_token_id", None), *trainer.eos_token_ids]
        context = getattr(trainer.args, "vllm_max_model_length", None)
        kwargs.setdefault("max_prompt_tokens", None if context is None else context - 1)
        return cls(trainer.vllm_generation, trainer.accelerator, tokenizer, eos, **kwargs)

    async def _generate(self, request: PolicyRequest) -> ModelOutput:
        loop = asyncio.get_running_loop()
        if not self._driving or loop is not self._loop:
            # Without the driver no round would ever carry this request, and the other processes would wait on it.
            raise RuntimeError(
                "ServerVLLMPolicy.generate() must be awaited inside `await policy.run(coroutine)` on the same event "
                "loop, which keeps the training processes in step"
            )
        prompt_ids = self.prompt_token_ids(request)  # token in, token out, as every policy (rllm_gym.policies.tokens)
        if self.max_prompt_tokens is not None and len(prompt_ids) > self.max_prompt_tokens:
            self.too_long += 1
            raise prompt_too_long(len(prompt_ids), self.max_prompt_tokens, "the server's vllm_max_model_length")
        future: asyncio.Future[ModelOutput] = loop.create_future()
        if not self._pending:
            self._first_at = loop.time()
        self._pending.append(_Request(list(prompt_ids), future))
        assert self._arrived is not None
        self._arrived.set()
        return await future

    async def run(self, coroutine: Awaitable[T]) -> T:
        """Run ``coroutine`` (the episodes) while taking part in rounds until every process is done; its result.

        If the coroutine raises, this process still joins rounds until the others are done, then re-raises, so no
        process is left waiting in a collective. Every process must call ``run`` once per rollout.
        """
        if self._driving:
            raise RuntimeError("ServerVLLMPolicy.run() is already running; run one rollout at a time")
        self._loop = asyncio.get_running_loop()
        self._arrived = asyncio.Event()
        self._pending = []
        self._error = None
        self._driving = True
        task = asyncio.ensure_future(coroutine)
        try:
            await self._drive(task)
        except BaseException:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        finally:
            self._driving = False
            self._fail_pending("the rollout ended before this request was sent")
        return task.result()

    async def aclose(self) -> None:
        """Nothing to stop (BatchingPolicy's interface): the driver lives only inside :meth:`run`."""

    def metrics(self) -> dict[str, float]:
        """Counters for the trainer's logs: rounds, rounds without any prompt, requests per round (all processes)."""
        rounds = len(self.round_sizes)
        busy = [n for n in self.round_sizes if n]
        return {
            "vllm_server/rounds": float(rounds),
            "vllm_server/empty_rounds": float(rounds - len(busy)),
            "vllm_server/requests_per_round": sum(busy) / len(busy) if busy else 0.0,
            "vllm_server/local_requests": float(sum(self.batch_sizes)),
            "vllm_server/server_calls": float(self.server_calls),
            "vllm_server/server_errors": float(self.server_errors),
            "vllm_server/prompts_too_long": float(self.too_long),
        }

    async def _drive(self, task: asyncio.Future[Any]) -> None:
        while True:
            await self._wait_for_round(task)
            batch = [r for r in self._pending if not r.future.cancelled()]
            self._pending = []
            assert self._arrived is not None
            self._arrived.clear()
            try:
                result = await asyncio.to_thread(self._round, [r.prompt_ids for r in batch], task.done())
            except Exception as error:  # a collective failed: the processes are out of step, nothing can go on
                message = f"lockstep round failed: {type(error).__name__}: {error}"
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(PolicyError(f"ServerVLLMPolicy {message}"))
                raise PolicyError(f"ServerVLLMPolicy {message}") from error
            self.batch_sizes.append(len(batch))
            self.round_sizes.append(result.total_requests)
            for index, request in enumerate(batch):
                if request.future.done():
                    continue
                if result.outputs is None:
                    request.future.set_exception(PolicyError(f"ServerVLLMPolicy generate failed: {result.error}"))
                else:
                    request.future.set_result(result.outputs[index])
            if result.all_done:
                return

    def _fail_pending(self, reason: str) -> None:
        # Requests queued by tasks that outlived the rollout: no round will carry them, so they must not hang.
        for request in self._pending:
            if not request.future.done():
                request.future.set_exception(PolicyError(f"ServerVLLMPolicy: {reason}"))
        self._pending = []

    async def _wait_for_round(self, task: asyncio.Future[Any]) -> None:
        """Until this process's queued requests have waited ``batch_wait_s``, its episodes ended, or ``max_wait_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        assert self._arrived is not None
        while not task.done():
            now = loop.time()
            if self._pending and now >= self._first_at + self.batch_wait_s:
                return
            if now >= deadline:
                return
            wake = deadline
            if self._pending:
                wake = min(wake, self._first_at + self.batch_wait_s)
            arrived = asyncio.ensure_future(self._arrived.wait())
            await asyncio.wait({task, arrived}, timeout=wake - now, return_when=asyncio.FIRST_COMPLETED)
            arrived.cancel()
            self._arrived.clear()

    def _round(self, prompts: list[list[int]], done: bool) -> _RoundResult:
        """One round, in a worker thread (the collectives block): gather, one server call, broadcast, own slice."""
        accelerator = self.accelerator
        many = accelerator.num_processes > 1
        if many:
            from accelerate.utils import gather_object

            device = getattr(accelerator, "device", None)
            if device is not None and device.type == "cuda":
                # The current CUDA device is per thread, and NCCL object collectives use it: without this, every
                # process's worker thread would put its objects on cuda:0.
                torch.cuda.set_device(device)
            gathered = gather_object([(prompts, done)])  # one (prompts, done) entry per process
        else:
            gathered = [(prompts, done)]
        flat = [p for process_prompts, _ in gathered for p in process_prompts]
        all_done = all(process_done for _, process_done in gathered) and not flat
        # Every process knows the same flat list and the same sticky error, so all count the same calls.
        call = bool(flat) and self._error is None
        payload: tuple[Any, ...] | None = None
        if accelerator.is_main_process:
            payload = self._call_server(flat) if call else ("ok", [], None, None)
        if many:
            from accelerate.utils import broadcast_object_list

            box = [payload]
            broadcast_object_list(box, from_process=0)
            payload = box[0]
        assert payload is not None
        self.server_calls += call
        if payload[0] == "error":
            self.server_errors += 1
            self._error = payload[1]
            return _RoundResult(None, self._error, all_done, len(flat))
        if self._error is not None:
            message = f"{self._error} (an earlier server call of this rollout failed; this request was not sent)"
            return _RoundResult(None, message, all_done, len(flat))
        _, completion_ids, logprobs, logprob_token_ids = payload
        start = sum(len(process_prompts) for process_prompts, _ in gathered[: accelerator.process_index])
        outputs = [
            self._output(
                prompt,
                completion_ids[start + k],
                logprobs[start + k] if logprobs is not None else None,
                logprob_token_ids[start + k] if logprob_token_ids is not None else None,
            )
            for k, prompt in enumerate(prompts)
        ]
        return _RoundResult(outputs, None, all_done, len(flat))

    def _call_server(self, prompts: list[list[int]]) -> tuple[Any, ...]:
        """On the main process: TRL's server call with TRL's sampling settings; an error as a picklable message."""
        generation = self.generation
        try:
            output = generation.vllm_client.generate(
                prompts=prompts,
                n=1,
                repetition_penalty=generation.repetition_penalty,
                temperature=generation.temperature,
                top_p=generation.top_p,
                top_k=generation.top_k,
                min_p=0.0 if generation.min_p is None else generation.min_p,
                max_tokens=generation.max_completion_length,
                logprobs=generation.logprobs,
                structured_outputs_regex=generation.structured_outputs_regex,
                generation_kwargs=generation.generation_kwargs,
            )
            completion_ids = output["completion_ids"]
            if len(completion_ids) != len(prompts):
                raise ValueError(f"the server returned {len(completion_ids)} completions for {len(prompts)} prompts")
        except Exception as error:  # every process must learn it, or they would fall out of step
            return ("error", f"{type(error).__name__}: {error}")
        return ("ok", completion_ids, output.get("logprobs"), output.get("logprob_token_ids"))

    def _output(
        self,
        prompt: list[int],
        ids: list[int],
        logprobs: list[list[float | None]] | None,
        token_ids: list[list[int]] | None,
    ) -> ModelOutput:
        sampled = sampled_logprobs(ids, logprobs, token_ids)
        finish_reason = "stop" if ids and ids[-1] in self.eos_token_ids else "length"
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return build_model_output(
            text, prompt_ids=prompt, completion_ids=ids, logprobs=sampled, finish_reason=finish_reason
        )
