"""Where a training rollout's LLM calls go, chosen once per trainer: :func:`generation_for`.

Four backends, one interface (:class:`Generation`): the trainer's own model through
:class:`~rllm_gym.policies.HFPolicy` (DeepSpeed ZeRO-3 parameters gathered for it), the trainer's vLLM through
:class:`~rllm_gym.train.vllm_colocate.TrainerVLLMPolicy` (colocate mode) or
:class:`~rllm_gym.train.vllm_server.ServerVLLMPolicy` (``trl vllm-serve``), or any policy a ``policy_factory(trainer)``
builds. Each call of :meth:`Generation.episodes` opens the backend's policy for that call only (weights gathered or
vLLM awake while the episodes run), runs the episodes and returns them with the backend's metrics of the call.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

from trl.models import unwrap_model_for_generation

from rllm_gym.policies.base import Policy, SamplingParams
from rllm_gym.policies.hf import HFPolicy
from rllm_gym.policies.tokens import TokenHistory
from rllm_gym.train.vllm_colocate import TrainerVLLMPolicy, awake_for_rollout
from rllm_gym.train.vllm_server import ServerVLLMPolicy
from rllm_gym.types import Episode

__all__ = ["Generation", "generation_for"]

# What a backend hands a policy to: the coroutine that runs a call's episodes with it.
RunEpisodes = Callable[[Any], Coroutine[Any, Any, list[Episode]]]
RunSync = Callable[[Coroutine[Any, Any, list[Episode]]], list[Episode]]


class Generation:
    """A trainer's generation backend: its sampling settings, process index and filler token, and :meth:`episodes`.

    This base class runs a policy built by ``policy_factory(trainer)`` at each call (tests, scripted policies)."""

    def __init__(
        self,
        trainer: Any,
        *,
        chat_template_kwargs: dict[str, Any],
        token_history: TokenHistory,
        policy_factory: Callable[[Any], Policy] | None = None,
    ):
        self.trainer = trainer
        self.chat_template_kwargs = chat_template_kwargs
        self.token_history = token_history
        self.policy_factory = policy_factory

    @property
    def process_index(self) -> int:
        return self.trainer.accelerator.process_index

    @property
    def run_seed(self) -> int:
        """The run's seed (``--seed``), from which every training episode's reset seed is derived."""
        return self.trainer.args.seed

    @property
    def filler_id(self) -> int:
        """The token of rows that hold nothing to train (padding)."""
        return self.trainer.processing_class.eos_token_id or 0

    def sampling_params(self) -> SamplingParams:
        """The trainer's sampling settings, read at each call (as TRL reads them)."""
        args = self.trainer.args
        return SamplingParams(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k or None,
            max_tokens=args.max_completion_length or 256,
        )

    def episodes(self, run: RunEpisodes, run_sync: RunSync, count: int) -> tuple[list[Episode], dict[str, float]]:
        """The episodes ``run(policy)`` gives (``count`` of them, run by ``run_sync``) and this call's metrics."""
        with self._policy(count) as policy:
            episodes = run_sync(self._wrap(policy, run(policy)))
        return episodes, self._metrics(policy)

    @contextmanager
    def _policy(self, count: int) -> Iterator[Any]:
        assert self.policy_factory is not None
        yield self.policy_factory(self.trainer)

    def _wrap(self, policy: Any, coroutine: Coroutine[Any, Any, list[Episode]]) -> Coroutine[Any, Any, list[Episode]]:
        return coroutine

    def _metrics(self, policy: Any) -> dict[str, float]:
        return {}


class _TrainerModel(Generation):
    """The trainer's own model, one ``generate`` call for every episode's turn (as TRL's own generation makes).

    Its HFPolicy is kept from call to call while the model object and the episode count stay the same, so that the
    rollout keeps its engines and their workflows too (see :class:`~rllm_gym.train.rollout.EpisodeRollout`)."""

    def __init__(self, trainer: Any, **kwargs: Any):
        super().__init__(trainer, **kwargs)
        self._kept: tuple[Any, int, HFPolicy] | None = None  # (model, count, its policy) of the latest call

    @contextmanager
    def _policy(self, count: int) -> Iterator[Any]:
        trainer = self.trainer
        model = trainer.model_wrapped  # read at each call: Accelerate wraps the model when training starts
        was_training = model.training
        with unwrap_model_for_generation(
            model, trainer.accelerator, gather_deepspeed3_params=trainer.args.ds3_gather_for_generation
        ) as unwrapped:
            yield self._hf_policy(unwrapped, count)
        model.train(was_training)

    def _hf_policy(self, model: Any, count: int) -> HFPolicy:
        """``model``'s policy for ``count`` episodes, in eval mode: the latest call's when it had the same two."""
        if self._kept is not None and self._kept[0] is model and self._kept[1] == count:
            model.eval()  # what building the policy does; the call before put the model back in training mode
            return self._kept[2]
        # A batch as large as the episodes, sent as soon as every episode in flight has asked (see EpisodeRollout),
        # or once none has asked for batch_wait_s (the rest are busy in their envs; a loaded machine stalls a
        # request 20 ms at times).
        policy = HFPolicy(
            model,
            tokenizer=self.trainer.processing_class,
            device=str(self.trainer.accelerator.device),
            chat_template_kwargs=self.chat_template_kwargs,
            token_history=self.token_history,
            max_batch_size=count,
            batch_wait_s=0.1,
            generate_on_loop=True,  # every episode waits on the batch; see BatchingPolicy
        )
        self._kept = (model, count, policy)
        return policy


class _Colocate(Generation):
    """The trainer's vLLM engine (colocate mode), awake for the call only."""

    @contextmanager
    def _policy(self, count: int) -> Iterator[Any]:
        policy = TrainerVLLMPolicy(
            self.trainer, chat_template_kwargs=self.chat_template_kwargs, token_history=self.token_history
        )
        with awake_for_rollout(self.trainer.vllm_generation, policy.device):
            yield policy

    def _metrics(self, policy: Any) -> dict[str, float]:
        return policy.metrics()


class _Server(Generation):
    """A ``trl vllm-serve`` process, every training process's requests in lockstep rounds (``policy.run``)."""

    @contextmanager
    def _policy(self, count: int) -> Iterator[Any]:
        yield ServerVLLMPolicy.from_trainer(
            self.trainer, chat_template_kwargs=self.chat_template_kwargs, token_history=self.token_history
        )

    def _wrap(self, policy: Any, coroutine: Coroutine[Any, Any, list[Episode]]) -> Coroutine[Any, Any, list[Episode]]:
        return policy.run(coroutine)

    def _metrics(self, policy: Any) -> dict[str, float]:
        return policy.metrics()


def generation_for(
    trainer: Any,
    *,
    chat_template_kwargs: dict[str, Any] | None = None,
    token_history: TokenHistory = "sampled",
    policy_factory: Callable[[Any], Policy] | None = None,
) -> Generation:
    """The backend a trainer generates with: ``policy_factory`` if given, else its vLLM (server or colocate) when
    it was built with ``use_vllm=True``, else its own model."""
    kwargs = dict(chat_template_kwargs=dict(chat_template_kwargs or {}), token_history=token_history)
    if policy_factory is not None:
        return Generation(trainer, policy_factory=policy_factory, **kwargs)
    if trainer.use_vllm:
        backend = _Server if trainer.args.vllm_mode == "server" else _Colocate
        return backend(trainer, **kwargs)
    return _TrainerModel(trainer, **kwargs)
