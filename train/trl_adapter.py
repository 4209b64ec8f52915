"""The one file that uses private names of TRL, transformers and vLLM: everything the trainer needs from them beyond
their public API, each behind a check of the installed version, so that a TRL upgrade is an edit of this file.

:class:`GRPOAdapter` is TRL's ``GRPOTrainer`` narrowed to train on a :class:`~rllm_gym.train.batch.TrainingBatch`: a
subclass implements :meth:`GRPOAdapter.training_batch` (the step's rows, advantages, loss mask and metrics), and the
adapter hands the rows to TRL once (its ``rollout_func``), lets TRL build its tensors, old and reference
log-probabilities from them, then puts the batch's advantages and loss mask into TRL's batch and logs its metrics.

:data:`INTERNALS` names every private name used here, where it lives and what replaces it when it moved. Each use asks
:func:`available` first: with a TRL outside :data:`SUPPORTED_TRL`, or a name that is no longer where it was, it warns
once and takes TRL's own path (the speed-ups are skipped, the numerics stay TRL's). The one internal without such a
path, ``GRPOTrainer._generate_and_score_completions`` (where a step's batch is built), is checked when the trainer is
made and stops it with the supported range. tests/train/test_trl_adapter.py fails loudly when any of them moved.
"""

from __future__ import annotations

import copy
import functools
import inspect
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import trl
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from transformers import Trainer
from trl import GRPOTrainer

from rllm_gym.internals import Internal
from rllm_gym.train.batch import TrainingBatch
from rllm_gym.train.off_policy import OffPolicyCorrection
from rllm_gym.train.sequences import width_groups

__all__ = [
    "INTERNALS",
    "SUPPORTED_TRL",
    "SUPPORTED_VLLM",
    "GRPOAdapter",
    "available",
    "colocated_vllm_model",
    "completion_positions_only",
    "copy_without_hooks",
    "cpu_vllm_model",
    "mark_vllm_weights_asleep",
    "step_phase_methods",
    "vllm_weights_asleep",
]

# The TRL versions this adapter was tested with (pyproject.toml declares the same). TRL 1.15's fused LM head needs
# Triton (its chunked log-probability function is None without it), so on a CPU it cannot train at all.
SUPPORTED_TRL = SpecifierSet(">=1.16,<1.17")


def _trl_utils_has_use_triton() -> bool:
    from trl.trainer import utils as trl_utils

    return callable(getattr(trl_utils, "_use_triton", None))


def _has_parameters(owner: Any, method: str, names: tuple[str, ...]) -> Callable[[], bool]:
    def check() -> bool:
        function = getattr(owner, method, None)
        return function is not None and set(names) <= set(inspect.signature(function).parameters)

    return check


def _vllm_generation_has(name: str) -> Callable[[], bool]:
    def check() -> bool:
        from trl.generation.vllm_generation import VLLMGeneration

        source = inspect.getsource(VLLMGeneration)
        return name in source

    return check


# The vLLM versions whose in-process engine keeps its model at llm_engine.model_executor.driver_worker.model_runner
# .model (read in the source of 0.22, 0.25, 0.28 and 0.31; pyproject.toml's `vllm` extra allows the same range).
SUPPORTED_VLLM = SpecifierSet(">=0.22,<=0.31.0")


def _vllm_has_driver_worker() -> bool:
    """Whether the installed vLLM is in :data:`SUPPORTED_VLLM` and still builds that path: ``LLMEngine`` keeps its
    in-process executor as ``model_executor``, whose ``driver_worker`` (a worker wrapper) holds the ``model_runner``.
    False without vLLM."""
    try:
        import vllm
        from vllm.v1.engine.llm_engine import LLMEngine
        from vllm.v1.executor.uniproc_executor import UniProcExecutor
        from vllm.v1.worker.worker_base import WorkerBase
    except ImportError:
        return False
    if Version(vllm.__version__).public not in SUPPORTED_VLLM:  # public: without a build's local label (+cpu)
        return False
    return (
        "self.model_executor = " in inspect.getsource(LLMEngine.__init__)
        and "self.driver_worker = " in inspect.getsource(UniProcExecutor._init_executor)
        and "self.model_runner" in inspect.getsource(WorkerBase.__init__)
    )


def _scores_before_advantages() -> bool:
    """Whether TRL's loss scores the rows (``_get_per_token_logps_and_entropies``) before it reads the advantages."""
    source = inspect.getsource(GRPOTrainer._compute_loss)
    scored, read = source.find("self._get_per_token_logps_and_entropies("), source.find('inputs["advantages"]')
    return 0 <= scored < read and "self._compute_loss(model, inputs)" in inspect.getsource(GRPOTrainer.compute_loss)


# The key of the behaviour log-probabilities in TRL's step inputs (max_staleness >= 1): split and shuffled with the
# rest, weighed in compute_loss.
BEHAVIOUR_KEY = "rllm_behaviour_logprobs"

# The forward-hook tables of a torch module (private, no public way to empty them).
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks")
# What DeepSpeed ZeRO-3 (0.19) adds to each module of the model it trains: its parameter table (a dict class that
# gathers on access, the original kept in _original_parameters), backward functions defined locally and methods
# bound to the module (neither pickles), and ``ds_*`` bookkeeping. Only names present are touched.
_DEEPSPEED_MODULE_STATE = (
    "_original_parameters",
    "_external_params",
    "all_parameters",
    "pre_bwd_fn",
    "post_bwd_fn",
    "applied_pre_backward_ref_cnt",
    "to_empty",
)


INTERNALS: dict[str, Internal] = {
    "_generate_and_score_completions": Internal(
        "trl.GRPOTrainer",
        "the step's batch: TRL builds its tensors from the TrainingBatch's rows, ours replace its advantages",
        "none: training stops with the supported TRL range",
        _has_parameters(GRPOTrainer, "_generate_and_score_completions", ("inputs",)),
    ),
    "_get_per_token_logps_and_entropies": Internal(
        "trl.GRPOTrainer",
        "scoring rows in groups of similar width (train/sequences.py's width_groups)",
        "TRL scores every row padded to the widest",
        _has_parameters(
            GRPOTrainer,
            "_get_per_token_logps_and_entropies",
            ("model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy"),
        ),
    ),
    "_compute_loss": Internal(
        "trl.GRPOTrainer",
        "the off-policy importance weights from the loss's own forward (it scores before it reads the advantages)",
        "a forward of their own before the loss, in each asynchronous step",
        _scores_before_advantages,
    ),
    "old_per_token_logps": Internal(
        "trl.GRPOTrainer._compute_loss (a key of its inputs)",
        "async_is_mode clip: the behaviour log-probabilities as the old ones of GRPO's clipped ratio",
        "none: async_is_mode clip is refused with the supported TRL range (truncate and mask still run)",
        lambda: 'inputs.get("old_per_token_logps")' in inspect.getsource(GRPOTrainer._compute_loss),
    ),
    "_use_triton": Internal(
        "trl.trainer.utils",
        "the fused LM head scoring completion positions only, off CUDA too",
        "TRL's own choice of rows (every position off CUDA/XPU)",
        _trl_utils_has_use_triton,
    ),
    "_metrics": Internal(
        "trl.GRPOTrainer (instance)",
        "the batch's metrics in TRL's per-step log lines",
        "the batch's metrics are not logged",
        lambda: "self._metrics" in inspect.getsource(GRPOTrainer.__init__),
    ),
    "_last_loaded_step": Internal(
        "trl.GRPOTrainer (instance)",
        "syncing vLLM's weights once per step, before the rollout",
        "the weights are synced before every rollout",
        lambda: "self._last_loaded_step" in inspect.getsource(GRPOTrainer),
    ),
    "_issue_warnings_after_load": Internal(
        "transformers.Trainer",
        "no missing-key warning for tied weights on resume",
        "transformers' own warning",
        _has_parameters(Trainer, "_issue_warnings_after_load", ("load_result",)),
    ),
    "_llm_weights_sleeping": Internal(
        "trl.generation.vllm_generation.VLLMGeneration",
        "one weight sync per rollout in colocate sleep mode",
        "the weights are synced before every rollout",
        _vllm_generation_has("_llm_weights_sleeping"),
    ),
    "_iter_named_params": Internal(
        "trl.generation.vllm_generation.VLLMGeneration",
        "the gathered, checkpoint-named weights for vLLM's CPU build",
        "none on vLLM's CPU build: TRL's own sync fails there",
        _vllm_generation_has("def _iter_named_params"),
    ),
    "_forward_hooks": Internal(
        "torch.nn.Module (instance)",
        "the generation worker's copy of the model without the training's forward hooks (max_staleness >= 1)",
        "none: a model with hooks that cannot be pickled stops asynchronous generation",
        lambda: all(isinstance(getattr(torch.nn.Linear(1, 1), name, None), dict) for name in _HOOK_DICTS),
    ),
    "driver_worker": Internal(
        "vllm.LLM.llm_engine.model_executor",
        "the model of a colocated vLLM engine on vLLM's CPU build, reached as TRL's own sync reaches it",
        "vLLM's public LLM.apply_model (in-process engines only, as TRL's colocate mode runs them)",
        _vllm_has_driver_worker,
    ),
}

# (name, TRL version) -> the answer of available(): each check runs (and warns) once per process and TRL version.
_answers: dict[tuple[str, str], bool] = {}


def available(name: str) -> bool:
    """Whether the adapter may use the private ``name`` (:data:`INTERNALS`): the installed TRL is in the supported
    range and the name is where it was. Otherwise one warning (per name and process) and False."""
    key = (name, trl.__version__)
    if key not in _answers:
        internal = INTERNALS[name]
        version = Version(trl.__version__)
        reason = None
        if version not in SUPPORTED_TRL:
            reason = f"TRL {version} is outside the range rllm-gym's adapter supports ({SUPPORTED_TRL})"
        elif not internal.present():
            reason = f"TRL {version} no longer has {internal.where}.{name}"
        if reason is not None:
            warnings.warn(
                f"{reason}: used for {internal.used_for}; falling back to: {internal.fallback} "
                "(update train/trl_adapter.py)",
                RuntimeWarning,
                stacklevel=3,
            )
        _answers[key] = reason is None
    return _answers[key]


@contextmanager
def completion_positions_only() -> Iterator[None]:
    """While inside, TRL's fused LM head (``trl.trainer.utils.add_fused_lm_head``) computes the log-probabilities and
    entropies of the scored positions only (labels not -100: the completion), as it does where its Triton kernel runs.

    TRL 1.16 couples the two: off CUDA/XPU it runs its PyTorch kernel over every position of every row, prompt and
    padding included, then zeroes what is not scored. Our rows are long prompts with replies of a few tokens (the main
    job: ~46 prompt tokens, 2 reply tokens), so that was most of the LM head's forward and backward on a CPU: ~0.4 s of
    a ~1.6 s step. The kernel itself still takes its own device check (the PyTorch one here); only the choice of rows
    changes, and every scored position gets the same value up to the rounding of a smaller matrix product (tested).
    Restored on exit. Process-wide while inside, which the trainer's single-threaded loss computation allows."""
    if not available("_use_triton"):
        yield
        return
    from trl.trainer import utils as trl_utils

    original = trl_utils._use_triton
    trl_utils._use_triton = lambda device: True  # read by the fused forward only, to pick the compact rows
    try:
        yield
    finally:
        trl_utils._use_triton = original


def vllm_weights_asleep(generation: Any) -> bool:
    """Whether TRL's colocated vLLM has discarded its weights (sleep level 2) since the last sync; True when that can
    no longer be told (a sync too many is only slower)."""
    if not available("_llm_weights_sleeping"):
        return True
    return bool(getattr(generation, "_llm_weights_sleeping", False))


def mark_vllm_weights_asleep(generation: Any) -> None:
    """Tell TRL's colocated vLLM that its weights were discarded, so its next call syncs them again."""
    if available("_llm_weights_sleeping"):
        generation._llm_weights_sleeping = True


def cpu_vllm_model(generation: Any) -> tuple[torch.nn.Module, Iterator[tuple[str, torch.Tensor]]]:
    """The model inside TRL's colocated vLLM engine and TRL's iterator over the training weights (gathered under
    DeepSpeed or FSDP, PEFT merged, named as vLLM expects), for vLLM's CPU build."""
    if not available("_iter_named_params"):
        raise RuntimeError(
            f"TRL {trl.__version__} moved VLLMGeneration._iter_named_params, which colocated vLLM on a CPU needs: "
            f"use a TRL in {SUPPORTED_TRL}"
        )
    return colocated_vllm_model(generation.llm), generation._iter_named_params()


def colocated_vllm_model(llm: Any) -> torch.nn.Module:
    """The model inside an in-process ``vllm.LLM`` (TRL's colocate mode): where TRL's own sync reaches it, or, when
    vLLM moved it (:data:`SUPPORTED_VLLM`), through vLLM's public ``LLM.apply_model``, which hands back the model
    object itself only when the engine runs in this process."""
    if _driver_worker_usable():
        return llm.llm_engine.model_executor.driver_worker.model_runner.model
    (model,) = llm.apply_model(lambda model: model)
    return model


@functools.cache
def _driver_worker_usable() -> bool:
    """:data:`INTERNALS`' ``driver_worker`` check, asked once per process; its answer depends on the vLLM installed
    (not TRL's, which :func:`available` checks), so it warns on its own when the name moved."""
    if INTERNALS["driver_worker"].present():
        return True
    import vllm

    internal = INTERNALS["driver_worker"]
    warnings.warn(
        f"vLLM {vllm.__version__} is outside {SUPPORTED_VLLM} or no longer has {internal.where}.driver_worker: used "
        f"for {internal.used_for}; falling back to: {internal.fallback} (update train/trl_adapter.py)",
        RuntimeWarning,
        stacklevel=3,
    )
    return False


def copy_without_hooks(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``model`` without forward hooks, for the generation worker: TRL and PEFT hook the input
    embeddings to make them require gradients (a training matter), with local functions that cannot be sent to
    another process. Each parameter is copied as a plain one, its data only: a DeepSpeed ZeRO-3 parameter (gathered)
    carries its partitioning state, which does not belong in the copy."""
    plain = {id(p): torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad) for p in model.parameters()}
    copied = copy.deepcopy(model, plain)
    if available("_forward_hooks"):
        for module in copied.modules():
            for name in _HOOK_DICTS:
                getattr(module, name).clear()
    for module in copied.modules():
        state = vars(module)
        if "_original_parameters" in state:
            module._parameters = {name: state["_parameters"][name] for name in list(state["_parameters"].keys())}
        for name in [name for name in state if name.startswith("ds_") or name in _DEEPSPEED_MODULE_STATE]:
            del state[name]
    return copied


def step_phase_methods(generates_itself: bool) -> dict[str, str]:
    """TRL's trainer methods that a step's phases run in (method name -> phase), for benchmarks/ to time: the batch
    and the rewards, and for TRL's own trainer (``generates_itself``) its generation too."""
    methods = {"_generate_and_score_completions": "generate_and_score", "_calculate_rewards": "rewards"}
    if generates_itself:
        methods |= {"_generate": "generate", "_generate_single_turn": "model_generate"}
    return methods


def _outside_a_step(prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
    """TRL's ``rollout_func`` between steps: rows exist only inside ``_generate_and_score_completions``."""
    raise RuntimeError("the trainer's rows exist only inside a step (GRPOAdapter.training_batch, then TRL)")


class GRPOAdapter(GRPOTrainer):
    """TRL's GRPOTrainer that trains on the :class:`TrainingBatch` :meth:`training_batch` returns at each step."""

    def __init__(self, *args: Any, **kwargs: Any):
        if Version(trl.__version__) not in SUPPORTED_TRL or not INTERNALS["_generate_and_score_completions"].present():
            raise RuntimeError(
                f"rllm-gym's trainer supports TRL {SUPPORTED_TRL}, found TRL {trl.__version__}: "
                f'pip install "trl{SUPPORTED_TRL}"'
            )
        super().__init__(*args, rollout_func=_outside_a_step, **kwargs)
        self.off_policy: OffPolicyCorrection | None = None  # set by asynchronous training (max_staleness >= 1)

    def training_batch(self, prompts: list[Any]) -> TrainingBatch:
        """The step's batch for this process's TRL ``prompts``; each row names its prompt in ``source``."""
        raise NotImplementedError

    def log_step_metrics(self, metrics: dict[str, float]) -> None:
        """``metrics`` into TRL's log line of the current step (averaged with the other calls of the step)."""
        if not available("_metrics"):
            return
        mode = "train" if self.model.training else "eval"
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)

    def sync_vllm_weights(self, sync: Callable[[Any], None]) -> None:
        """``sync(trainer.vllm_generation)`` once per optimizer step (every call when TRL's step marker moved)."""
        if not available("_last_loaded_step"):
            sync(self.vllm_generation)
        elif self.state.global_step != self._last_loaded_step:
            sync(self.vllm_generation)
            self._last_loaded_step = self.state.global_step  # TRL's _generate then leaves the weights as they are

    @contextmanager
    def _rows_for_trl(self, batch: TrainingBatch) -> Iterator[None]:
        """TRL's ``rollout_func`` answers with ``batch``'s rows for the block: TRL calls the function it holds from
        inside ``_generate`` (with the trainer, not our batch), so the batch is bound to it for this one call."""

        def rows(prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
            if len(prompts) != len(batch.rows):
                raise RuntimeError(f"{len(prompts)} prompts for {len(batch.rows)} collected rows")
            return batch.trl_output()

        self.rollout_func = rows
        try:
            yield
        finally:
            self.rollout_func = _outside_a_step

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.training_batch([example["prompt"] for example in inputs])
        with self._rows_for_trl(batch):
            output = super()._generate_and_score_completions([dict(inputs[max(r.source, 0)]) for r in batch.rows])
        completion_ids = output["completion_ids"]
        if tuple(completion_ids.shape) != batch.completion_ids.shape:
            raise RuntimeError(
                f"TRL built completions of shape {tuple(completion_ids.shape)} from rows the TrainingBatch pads to "
                f"{batch.completion_ids.shape}: TRL's padding changed, update train/batch.py's PaddingFacts"
            )
        device = completion_ids.device
        output["advantages"] = torch.as_tensor(batch.loss_advantages, device=device)
        mask = output.get("tool_mask")  # TRL's env_mask, less truncated completions when it masks those
        loss_mask = torch.as_tensor(batch.loss_mask, device=device)
        output["tool_mask"] = loss_mask if mask is None else mask * loss_mask
        trained_tokens = (output["completion_mask"] * output["tool_mask"]).sum()
        output["num_items_in_batch"] = self.accelerator.gather(trained_tokens).sum()
        metrics = batch.metrics
        if self.off_policy is not None:
            behaviour = torch.as_tensor(batch.behaviour_logprobs, device=device, dtype=torch.float32)  # (B, C)
            if self.off_policy.in_the_loss:  # GRPO's ratio against the sampling policy (train/off_policy.py)
                trained = output["completion_mask"] * output["tool_mask"]  # (B, C)
                output["old_per_token_logps"] = self.off_policy.old_logps(behaviour, trained)
            if available("_compute_loss"):  # weighed by the loss's own forward (compute_loss), split with its rows
                output[BEHAVIOUR_KEY] = behaviour
            else:
                output["advantages"], corrected = self._off_policy_advantages(output, behaviour)
                metrics = {**metrics, **corrected}
        self.log_step_metrics(metrics)
        return output

    @torch.no_grad()
    def _off_policy_advantages(
        self, inputs: dict[str, Any], behaviour: torch.Tensor, trained: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The advantages weighted by :attr:`off_policy`'s importance weights (the ``trained`` log-probabilities,
        from a forward of their own if not given, against the ``behaviour`` ones the batch carries), and its metrics.
        TRL 1.16 applies such weights in its loss only with vLLM; folded into the advantages they make the same loss
        for every loss type the config allows (see train/off_policy.py)."""
        assert self.off_policy is not None
        completion_ids = inputs["completion_ids"]
        if trained is None:
            input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)  # (B, P + C)
            attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)  # (B, P + C)
            trained, _, _ = self._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, completion_ids.size(1), self.args.per_device_train_batch_size
            )  # (B, C)
        mask = inputs["completion_mask"] * inputs["tool_mask"]  # (B, C) the tokens the loss trains
        return self.off_policy.weigh_advantages(inputs["advantages"], trained, behaviour.to(trained.dtype), mask)

    def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        """TRL's loss. With the off-policy correction, the importance weights come from the loss's own forward
        (its log-probabilities under the step's weights, detached: the values a forward of their own gives, one
        forward fewer per step; ``num_iterations`` is 1 there): the first scoring weighs the micro-batch's
        advantages before TRL's loss reads them (:data:`INTERNALS`' ``_compute_loss`` checks that order)."""
        if BEHAVIOUR_KEY not in inputs:
            return super().compute_loss(model, inputs, *args, **kwargs)
        inputs = dict(inputs)  # TRL's copy of the micro-batch keeps its own advantages
        behaviour = inputs.pop(BEHAVIOUR_KEY)
        score, weighed = self._get_per_token_logps_and_entropies, []

        def scored_and_weighed(*arguments: Any, **options: Any) -> Any:
            logps, entropies, aux_loss = score(*arguments, **options)
            if not weighed:  # the loss's forward; any later scoring leaves the advantages as they are
                inputs["advantages"], metrics = self._off_policy_advantages(inputs, behaviour, logps.detach())
                weighed.append(metrics)
                self.log_step_metrics(metrics)
            return logps, entropies, aux_loss

        self._get_per_token_logps_and_entropies = scored_and_weighed  # for this call only (an instance attribute)
        try:
            return super().compute_loss(model, inputs, *args, **kwargs)
        finally:
            del self._get_per_token_logps_and_entropies

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **multimodal: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """TRL's, with its fused LM head scoring only the completion positions on every device (see
        :func:`completion_positions_only`), run on groups of rows of similar length, each cut to its own widest row.

        TRL pads every prompt on the left to the batch's longest: one long prompt (a reply the env could not parse
        brings its error message into the next one) made every row of a main-job step ~108 tokens wide instead of ~48,
        and the step twice as slow. Rows are grouped by their width without the left padding
        (:func:`~rllm_gym.train.sequences.width_groups`) and put back in order; each row's values are the same up to
        rounding (its positions shift, and rotary attention depends only on their differences). Rows with images
        are scored as TRL scores them; with several processes the rows are one group, cut to their common padding
        only: every process must run the same number of forwards there (DDP syncs buffers, DeepSpeed ZeRO-3 and FSDP
        gather parameters, collectively at each one), and each process's rows group differently.
        """
        own = super()._get_per_token_logps_and_entropies
        arguments = (logits_to_keep, batch_size, compute_entropy, compute_aux_loss)
        if not available("_get_per_token_logps_and_entropies"):
            return own(model, input_ids, attention_mask, *arguments, **multimodal)

        def score(rows: torch.Tensor | slice, width: int) -> tuple[torch.Tensor, torch.Tensor | None, Any]:
            width = min(max(width, logits_to_keep + 1), input_ids.size(1))  # the last prompt token scores the first
            return own(model, input_ids[rows, -width:], attention_mask[rows, -width:], *arguments, **multimodal)

        with completion_positions_only():
            if any(value is not None for value in multimodal.values()):
                return score(slice(None), input_ids.size(1))
            widths = (input_ids.size(1) - (attention_mask.cumsum(dim=1) == 0).sum(dim=1)).tolist()  # (B,) no left pad
            groups = width_groups(widths) if self.accelerator.num_processes == 1 else []
            if len(groups) <= 1:
                return score(slice(None), max(widths, default=0))
            device = input_ids.device
            scored = [score(torch.tensor(rows, device=device), max(widths[row] for row in rows)) for rows in groups]
            order = torch.tensor([row for rows in groups for row in rows], device=device).argsort()  # (B,) as before
            logps = torch.cat([logps for logps, _, _ in scored])[order]  # (B, T)
            entropies = torch.cat([entropies for _, entropies, _ in scored])[order] if compute_entropy else None
            aux_loss = torch.stack([aux for _, _, aux in scored]).mean() if compute_aux_loss else None
            return logps, entropies, aux_loss

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """Warn about the missing keys of a resumed checkpoint that were really not loaded. A tied weight (the
        embedded model's lm_head is its embedding) is saved once, under the name it shares, so every resume "missed"
        it although loading the shared tensor loaded it too: that warning looked like a corrupt checkpoint."""
        if not available("_issue_warnings_after_load"):
            return super()._issue_warnings_after_load(load_result)
        state = self.model.state_dict(keep_vars=True)
        missing = set(load_result.missing_keys)
        loaded = {tensor.data_ptr() for name, tensor in state.items() if name not in missing}
        kept = [name for name in load_result.missing_keys if name not in state or state[name].data_ptr() not in loaded]
        return super()._issue_warnings_after_load(load_result._replace(missing_keys=kept))
