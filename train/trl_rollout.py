"""TRL's GRPOTrainer with generation through rllm-gym's envs, agents and engine, and our advantages in its loss.

:class:`EpisodeRollout` runs the episodes of TRL's prompt slots: each slot is a task (the prompt string is the task as
JSON, see :func:`encode_prompt`) and trains one trajectory of one episode run by
:class:`~rllm_gym.engine.AgentExecutionEngine`. A multi-turn trajectory is one token sequence by construction: every
policy builds each call's prompt from the previous call's prompt and sampled ids plus the new messages' tokens
(token in, token out, :mod:`rllm_gym.policies.tokens`), so the row is the first step's prompt, then each reply
(``env_mask`` 1, trained) followed by the tokens of the next observation (``env_mask`` 0, never trained), exactly
the tokens the model saw and sampled. A row splits only where the chat did not continue: the agent dropped earlier
turns by design (``max_history_turns``), the policy re-renders the whole chat (``token_history="template"``, e.g.
to let Qwen3's template drop earlier ``<think>`` blocks), or a server rendered chat text. Then a new training row
starts with that step's full prompt (masked) and its reply trained, so no turn is ever dropped, and every row
carries its trajectory's advantages (groups and statistics stay one entry per trajectory).
``rollout/prefix_mismatch`` is the share of trajectories split so, ``rollout/rows_per_trajectory`` the rows per
trajectory (1.0 when none is) and ``rollout/text_rendered`` the share of LLM calls a server rendered from text.

:class:`RLLMGRPOTrainer` narrows TRL's ``_generate_and_score_completions``: it runs the episodes first, repeats TRL's
inputs once per row (padded with untrained rows to a size every process shares, ``rollout/padding_rows``), lets TRL
build the batch from them (its ``rollout_func`` hands over the rows), then gathers the episodes of every process,
computes :func:`~rllm_gym.train.advantages.compute_advantages` over the groups ``{task_id}:{trajectory.name}`` (so
roles are compared only with themselves), and replaces TRL's advantages with ours, per row (``broadcast``) or per
token (``per_step``); masked trajectories get ``env_mask`` 0 throughout. Tested
with TRL 1.16 (the ``rollout_func`` hook is experimental there, hence the pinned range in pyproject.toml).
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import TrainerCallback
from trl import GRPOTrainer
from trl.models import unwrap_model_for_generation

from rllm_gym.engine import EnvThreadPool, engine_for
from rllm_gym.engine.common import default_env_workers
from rllm_gym.engine.report import ErrorTally, all_errored, describe_errors
from rllm_gym.policies.base import Policy, SamplingParams
from rllm_gym.policies.hf import BatchingPolicy, HFPolicy
from rllm_gym.policies.tokens import TokenHistory, check_token_history
from rllm_gym.registry import env_ids
from rllm_gym.train.advantages import AdvantageConfig, compute_advantages
from rllm_gym.train.sequences import (
    TrainingSequence,
    decode_prompt,
    encode_prompt,
    placeholder_sequence,
    trajectory_to_sequences,
)
from rllm_gym.train.vllm_colocate import TrainerVLLMPolicy, awake_for_rollout
from rllm_gym.train.vllm_server import ServerVLLMPolicy
from rllm_gym.types import Episode, Trajectory

__all__ = [
    "EnvSetup",
    "EpisodeRollout",
    "RLLMGRPOTrainer",
    "TrainerVLLMPolicy",
    "TrainingSequence",
    "TrainingStopped",
    "decode_prompt",
    "encode_prompt",
    "placeholder_sequence",
    "trajectory_to_sequences",
]


class TrainingStopped(RuntimeError):
    """Training cannot go on (e.g. every episode of several steps in a row ended in ERROR); the message says why."""


@dataclass
class EnvSetup:
    """How episodes of one env are run in training: the agent (default: the env's registered one) and arguments."""

    env_id: str
    agent: str | None = None
    agent_args: dict[str, Any] = field(default_factory=dict)
    env_args: dict[str, Any] = field(default_factory=dict)


class EpisodeRollout:
    """Runs the episodes of TRL's prompt slots through our engine; answers with their training rows (TRL's form).

    A call gives one row or more per prompt (see the module docstring); :class:`RLLMGRPOTrainer` lays TRL's batch out
    row by row. ``last_episodes`` and ``last_slots`` follow the prompts, ``last_sequences`` the rows (each names its
    prompt in ``source``). ``chat_template_kwargs`` (e.g. ``{"enable_thinking": False}``) and ``token_history``
    (``"sampled"``, token in, token out; or ``"template"``, the chat re-rendered each call, rows split where the
    template rewrites history) go to every policy it builds.

    Prompt slots that name the same env and task share episodes: the ``k``-th slot of ``(env, task, slot s)`` in a
    call trains trajectory ``s`` of the ``k``-th episode of ``(env, task)``. For a single-agent env that is one
    episode per slot; for a multi-agent env (``rllm/SolverJudge-v0``: slot 0 and 1 the solvers, slot 2 the judge)
    the slots of a task that reach the same call train the trajectories of the same episodes, so K roles cost one
    set of episodes, not K (``train/grpo.py`` keeps a task's slots next to each other in the data for that).

    Generation uses the trainer's own model through :class:`~rllm_gym.policies.HFPolicy` (DeepSpeed ZeRO-3 parameters
    gathered for it), or the trainer's vLLM through :class:`TrainerVLLMPolicy` (colocate mode) or
    :class:`~rllm_gym.train.vllm_server.ServerVLLMPolicy` (``trl vllm-serve``) when the trainer was built with
    ``use_vllm=True``; ``policy_factory(trainer)`` substitutes any other policy. One event loop and one env thread
    pool serve every call (their threads are reused from step to step; a pool left with a hung env call is replaced).
    """

    def __init__(
        self,
        envs: list[EnvSetup],
        *,
        max_steps: int = 8,
        n_parallel: int = 256,
        gamma: float = 1.0,
        timeout_s: float | None = None,
        stop_on_truncation: bool = True,
        policy_factory: Callable[[GRPOTrainer], Policy] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        token_history: TokenHistory = "sampled",
    ):
        if not envs:
            raise ValueError("EpisodeRollout needs at least one EnvSetup")
        self.envs = {setup.env_id: setup for setup in envs}
        self.max_steps = max_steps
        self.n_parallel = n_parallel
        self.gamma = gamma
        self.timeout_s = timeout_s
        self.stop_on_truncation = stop_on_truncation
        self.policy_factory = policy_factory
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.token_history = check_token_history(token_history, "EpisodeRollout")
        self.calls = 0
        self.last_episodes: list[Episode] = []  # aligned with the last call's prompts (shared episodes repeat)
        self.last_slots: list[int] = []
        self.last_rewards: list[float] = []
        self.last_sequences: list[TrainingSequence] = []  # the rows: one or more per prompt, then padding
        self.filler_id = 0
        self.last_metrics: dict[str, float] = {}  # the generation backend's, e.g. vLLM server rounds
        self.last_seconds = 0.0  # wall time of the last call
        self._runner: asyncio.Runner | None = None
        self._pool: EnvThreadPool | None = None

    def sampling_params(self, trainer: GRPOTrainer) -> SamplingParams:
        args = trainer.args
        return SamplingParams(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k or None,
            max_tokens=args.max_completion_length or 256,
        )

    def close(self) -> None:
        """Close the event loop and the env thread pool the calls run on (a later call opens new ones)."""
        if self._runner is not None:
            self._runner.close()
            self._runner = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _run_sync(self, coroutine: Any) -> Any:
        if self._runner is None:
            self._runner = asyncio.Runner()
            weakref.finalize(self, self._runner.close)
        if self._pool is None or self._pool.busy:  # busy between calls: a hung env call holds a thread
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = EnvThreadPool(max_workers=default_env_workers(), thread_name_prefix="rllm-gym-train-env")
        return self._runner.run(coroutine)

    def __call__(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
        decoded = [decode_prompt(prompt) for prompt in prompts]
        unknown = sorted({env_id for env_id, _, _ in decoded} - set(self.envs))
        if unknown:
            raise ValueError(f"prompts name envs {unknown} that this rollout was not set up for: {sorted(self.envs)}")
        # One episode per (env, task, k): the k-th slot of each trajectory index of a task shares it. Episode ids are
        # the task's id, then the process, the call and the episode's number.
        process = trainer.accelerator.process_index
        occurrences: Counter[tuple[str, str, int]] = Counter()
        plan: dict[tuple[str, str, int], tuple[str, Any, str]] = {}
        keys = []
        for env_id, task, slot in decoded:
            canonical = json.dumps(task, sort_keys=True)
            key = (env_id, canonical, occurrences[env_id, canonical, slot])
            occurrences[env_id, canonical, slot] += 1
            if key not in plan:
                task_id = str(task["id"]) if isinstance(task, dict) and task.get("id") else f"seed-{task}"
                plan[key] = (env_id, task, f"{task_id}:p{process}s{self.calls}e{len(plan)}")
            keys.append(key)
        self.calls += 1
        start = time.monotonic()
        sampling = self.sampling_params(trainer)
        runs = list(plan.values())
        if self.policy_factory is not None:
            episodes = self._run_sync(self._run(runs, self.policy_factory(trainer), sampling))
        elif trainer.use_vllm and trainer.args.vllm_mode == "server":
            policy = ServerVLLMPolicy.from_trainer(
                trainer, chat_template_kwargs=self.chat_template_kwargs, token_history=self.token_history
            )
            episodes = self._run_sync(policy.run(self._run(runs, policy, sampling)))
            self.last_metrics = policy.metrics()
        elif trainer.use_vllm:
            policy = TrainerVLLMPolicy(
                trainer, chat_template_kwargs=self.chat_template_kwargs, token_history=self.token_history
            )
            with awake_for_rollout(trainer.vllm_generation, policy.device):
                episodes = self._run_sync(self._run(runs, policy, sampling))
            self.last_metrics = policy.metrics()
        else:
            model = trainer.model_wrapped
            was_training = model.training
            with unwrap_model_for_generation(
                model, trainer.accelerator, gather_deepspeed3_params=trainer.args.ds3_gather_for_generation
            ) as unwrapped:
                # One generate call for every episode's turn, as TRL's own generation makes: a batch as large as the
                # episodes, sent as soon as every episode in flight has asked (see _run), or once none has asked for
                # batch_wait_s (the rest are busy in their envs; a loaded machine stalls a request 20 ms at times).
                policy = HFPolicy(
                    unwrapped,
                    tokenizer=trainer.processing_class,
                    device=str(trainer.accelerator.device),
                    chat_template_kwargs=self.chat_template_kwargs,
                    token_history=self.token_history,
                    max_batch_size=len(runs),
                    batch_wait_s=0.1,
                    generate_on_loop=True,  # every episode waits on the batch; see BatchingPolicy
                )
                episodes = self._run_sync(self._run(runs, policy, sampling))
            model.train(was_training)
        by_key = dict(zip(plan, episodes, strict=True))
        row_episodes = [by_key[key] for key in keys]
        slots = [slot for _, _, slot in decoded]
        trajectories = [
            ep.trajectories[slot] if slot < len(ep.trajectories) else Trajectory()
            for ep, slot in zip(row_episodes, slots, strict=True)
        ]
        self.filler_id = trainer.processing_class.eos_token_id or 0
        self.last_sequences = [
            row
            for source, trajectory in enumerate(trajectories)
            for row in trajectory_to_sequences(trajectory, self.filler_id, source)
        ]
        self.last_episodes, self.last_slots = row_episodes, slots
        self.last_rewards = [float(t.reward or 0.0) for t in trajectories]
        self.last_seconds = time.monotonic() - start
        return self.rows()

    def pad_rows(self, count: int) -> None:
        """Add placeholder rows (nothing trained) to the last call's until there are ``count``."""
        missing = count - len(self.last_sequences)
        self.last_sequences += [placeholder_sequence(self.filler_id) for _ in range(missing)]

    def rows(self) -> dict[str, Any]:
        """TRL's rollout output for the last call's rows (``trajectory_reward`` feeds TRL's logs only)."""
        sequences = self.last_sequences
        return {
            "prompt_ids": [s.prompt_ids for s in sequences],
            "completion_ids": [s.completion_ids for s in sequences],
            "logprobs": [s.logprobs for s in sequences],
            "env_mask": [s.env_mask for s in sequences],
            "trajectory_reward": [self.last_rewards[s.source] if s.source >= 0 else 0.0 for s in sequences],
        }

    async def _run(self, runs: list[tuple[str, Any, str]], policy: Any, sampling: SamplingParams) -> list[Episode]:
        """The episodes of ``runs`` (env id, task, episode id), in order, every env's engine on this one loop."""
        active = len(runs)
        if isinstance(policy, BatchingPolicy):
            # A batch goes out once every episode still running has asked, rather than after batch_wait_s.
            policy.expected_requests = lambda: active

        async def run_env(env_id: str, items: list[tuple[int, Any, str]]) -> list[tuple[int, Episode]]:
            nonlocal active
            setup = self.envs[env_id]
            # Multi-agent episodes have no per-reply truncation rule (every agent must get its turn).
            single_agent = env_id not in env_ids(multi_agent=True)
            options = {"stop_on_truncation": self.stop_on_truncation} if single_agent else {}
            engine = engine_for(
                env_id,
                policy,
                agent=setup.agent,
                agent_args=setup.agent_args,
                env_args=setup.env_args,
                n_parallel=self.n_parallel,
                max_steps=self.max_steps,
                sampling_params=sampling,
                gamma=self.gamma,
                timeout_s=self.timeout_s,
                executor=self._pool,
                **options,
            )
            finished = {}
            async for episode in engine.stream_pairs([(task, uid) for _, task, uid in items]):
                finished[episode.id] = episode
                active -= 1
                if isinstance(policy, BatchingPolicy):
                    policy.requests_changed()  # a batch waiting on this episode goes now
            return [(position, finished[uid]) for position, _, uid in items]

        by_env: dict[str, list[tuple[int, Any, str]]] = defaultdict(list)
        for position, (env_id, task, uid) in enumerate(runs):
            by_env[env_id].append((position, task, uid))
        ordered: list[Episode | None] = [None] * len(runs)
        try:
            for pairs in await asyncio.gather(*(run_env(env_id, items) for env_id, items in by_env.items())):
                for position, episode in pairs:
                    episode.metadata["env"] = runs[position][0]
                    ordered[position] = episode
        finally:
            if isinstance(policy, BatchingPolicy):
                policy.expected_requests = None
                await policy.aclose()
        return ordered  # type: ignore[return-value]


class _LogAtStart(TrainerCallback):
    """Logs the evaluation before training at step 0, after the ``report_to`` loggers have started."""

    def __init__(self, trainer: RLLMGRPOTrainer, metrics: dict[str, float]):
        self.trainer, self.metrics = trainer, metrics

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            self.trainer.log_evaluation(self.metrics)


def episode_reward(prompts: list[Any], completions: list[Any], trajectory_reward: list[float], **kwargs: Any):
    """TRL reward function: the trajectory reward the env gave (our advantages replace TRL's; this feeds its logs)."""
    return list(trajectory_reward)


def _training_view(episode: Episode, slot: int) -> Episode:
    """The episode as advantage computation needs it: id, termination reason and the trained trajectory's rewards."""
    trajectory = episode.trajectories[slot] if slot < len(episode.trajectories) else Trajectory()
    steps = [step.model_copy(update={"chat_completions": [], "model_output": None}) for step in trajectory.steps]
    trimmed = trajectory.model_copy(update={"steps": steps, "task": None})
    metadata = {"env": episode.metadata.get("env")}
    if "error" in episode.metadata:  # type and message only: the traceback stays in the process that ran it
        metadata["error"] = {key: episode.metadata["error"].get(key) for key in ("type", "message")}
    return Episode(
        id=episode.id,
        termination_reason=episode.termination_reason,
        is_correct=episode.is_correct,
        trajectories=[trimmed],
        metadata=metadata,
    )


class RLLMGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose completions come from :class:`EpisodeRollout` and whose loss uses our advantages.

    It counts the run's episodes per termination reason (``terminations``) and its distinct errors (``errors``), and
    raises :class:`TrainingStopped` once ``max_error_steps`` steps in a row had only ERROR episodes (0 = never).

    ``evaluation`` (a :class:`rllm_gym.train.evaluation.Evaluator`) is what :meth:`evaluate` runs whenever the
    trainer's control asks for it (train/evaluation.py's ``EvalSchedule``); its metrics go through ``log`` to the
    callbacks and ``report_to`` loggers, and the last ones stay in ``last_evaluation``. ``evaluation_before``, the
    metrics taken before training, are logged at step 0 once those loggers are up.
    """

    def __init__(
        self,
        *args: Any,
        rollout: EpisodeRollout,
        advantage_config: AdvantageConfig,
        max_error_steps: int = 0,
        evaluation: Any = None,
        evaluation_before: dict[str, float] | None = None,
        **kwargs: Any,
    ):
        kwargs.setdefault("reward_funcs", [episode_reward])
        super().__init__(*args, rollout_func=self._collected_rows, **kwargs)
        self.rollout = rollout
        self.advantage_config = advantage_config
        self.max_error_steps = max_error_steps
        self.terminations: Counter[str] = Counter()
        self.errors = ErrorTally()
        self.error_streak = 0  # steps in a row whose episodes all ended in ERROR
        self.evaluation = evaluation
        self.last_evaluation: dict[str, float] | None = None
        if evaluation_before:
            self.add_callback(_LogAtStart(self, evaluation_before))

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """Run :attr:`evaluation` on the model being trained (ZeRO-3 shards gathered once for all of it) and log it."""
        if self.evaluation is None:
            return {}
        with unwrap_model_for_generation(self.model_wrapped, self.accelerator) as model:
            metrics = self.evaluation(
                model,
                f"eval at step {self.state.global_step}",
                rank=self.accelerator.process_index,
                world=self.accelerator.num_processes,
                show=self.is_world_process_zero(),
            )
        self.last_evaluation = {"step": self.state.global_step, **metrics}
        self.log_evaluation(metrics)
        # As transformers' own evaluate: the callbacks hear of it, and the request is cleared (or the end of the epoch,
        # which checks it again, would evaluate the same weights a second time).
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def log_evaluation(self, metrics: dict[str, float]) -> None:
        """Log evaluation metrics on their own: in eval mode, GRPOTrainer.log leaves the training metrics of the steps
        since the last logging step where they are, for that step's line."""
        training = self.model.training
        self.model.eval()
        try:
            self.log(dict(metrics))
        finally:
            self.model.train(training)

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: train/grpo.py writes a filled-in card into each model folder (train/model_record.py)."""

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """Warn about the missing keys of a resumed checkpoint that were really not loaded. A tied weight (the
        embedded model's lm_head is its embedding) is saved once, under the name it shares, so every resume "missed"
        it although loading the shared tensor loaded it too: that warning looked like a corrupt checkpoint."""
        state = self.model.state_dict(keep_vars=True)
        missing = set(load_result.missing_keys)
        loaded = {tensor.data_ptr() for name, tensor in state.items() if name not in missing}
        kept = [name for name in load_result.missing_keys if name not in state or state[name].data_ptr() not in loaded]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=kept))

    def _count_episodes(self, episodes: list[Episode]) -> None:
        """Add a step's episodes (every process's, each once) to the run's counts; stop on too many failed steps."""
        unique = list({episode.id: episode for episode in episodes}.values())
        self.terminations.update(e.termination_reason.value if e.termination_reason else "unknown" for e in unique)
        self.errors.add(unique)
        self.error_streak = self.error_streak + 1 if all_errored(unique) else 0
        if self.max_error_steps and self.error_streak >= self.max_error_steps:
            step_errors = ErrorTally()
            step_errors.add(unique)
            raise TrainingStopped(
                f"training stopped at step {self.state.global_step + 1}: every episode of the last "
                f"{self.error_streak} steps ended in ERROR (max_error_steps={self.max_error_steps}):\n"
                f"{describe_errors(step_errors.groups())}"
            )

    def _collected_rows(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
        """TRL's ``rollout_func``: the rows :meth:`_generate_and_score_completions` collected (one prompt per row)."""
        rows = self.rollout.rows()
        if len(rows["prompt_ids"]) != len(prompts):
            raise RuntimeError(f"{len(prompts)} prompts for {len(rows['prompt_ids'])} collected rows")
        return rows

    def _row_count(self, count: int) -> int:
        """Rows every process trains: the most any process has, then up to a batch TRL can group and split whole
        (a multiple of ``num_generations`` over all processes, of ``steps_per_generation`` on each)."""
        from accelerate.utils import gather_object

        rows = max(gather_object([count]))
        group = self.num_generations if self.model.training else self.num_generations_eval
        world = self.accelerator.num_processes
        while rows % self.args.steps_per_generation or (rows * world) % group:
            rows += 1
        return rows

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        from accelerate.utils import gather_object

        # The episodes run first, so that TRL's batch can hold a row per training sample (a trajectory whose template
        # rewrote its history has several, see trajectory_to_sequences): TRL's inputs are repeated per row, padded
        # with untrained rows to a size every process shares. TRL syncs vLLM's weights in _generate, after the
        # rollout: here that would be too late, so it is done before.
        if self.use_vllm and self.state.global_step != self._last_loaded_step:
            from rllm_gym.train.vllm_cpu import sync_weights  # TRL's sync, or on vLLM's CPU build one that can load

            sync_weights(self.vllm_generation)
            self._last_loaded_step = self.state.global_step
        rollout = self.rollout
        rollout([example["prompt"] for example in inputs], self)
        rollout.pad_rows(self._row_count(len(rollout.last_sequences)))
        sequences = rollout.last_sequences
        output = super()._generate_and_score_completions([dict(inputs[max(s.source, 0)]) for s in sequences])
        mode = "train" if self.model.training else "eval"
        local = [_training_view(e, s) for e, s in zip(rollout.last_episodes, rollout.last_slots, strict=True)]
        everyone = gather_object(local)
        self._count_episodes(everyone)
        result = compute_advantages(everyone, self.advantage_config)

        device = output["completion_ids"].device
        width = output["completion_ids"].size(1)
        per_token = torch.zeros(len(sequences), width, device=device)  # (rows, T)
        per_row = torch.zeros(len(sequences), device=device)  # (rows,)
        mask = output.get("tool_mask")
        if mask is None:
            mask = output["completion_mask"].clone()
        for row, sequence in enumerate(sequences):
            if sequence.source < 0 or not sequence.spans:
                mask[row] = 0
                continue
            entry = result.by_uid[local[sequence.source].trajectories[0].uid]
            steps = range(sequence.first_step, sequence.first_step + len(sequence.spans))
            for (start, end), step in zip(sequence.spans, steps, strict=True):
                per_token[row, start:end] = entry.advantages[step]
                if not entry.mask[step]:
                    mask[row, start:end] = 0
            per_row[row] = entry.advantages[sequence.first_step]  # broadcast: every step has the trajectory's
        output["advantages"] = per_row if self.advantage_config.mode == "broadcast" else per_token
        output["tool_mask"] = mask
        loss_mask = output["completion_mask"] * mask
        output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        split = {s.source for s in sequences if s.prefix_mismatch}
        episodes = {e.id: e for e in rollout.last_episodes}.values()  # slots of one multi-agent episode share it
        calls = [s.model_output for e in episodes for t in e.trajectories for s in t.steps]
        counts = gather_object(
            [
                (
                    len(split),
                    sum(s.source >= 0 for s in sequences),
                    len(sequences),
                    sum(sum(s.env_mask) for s in sequences),
                    sum(o is not None and o.text_rendered for o in calls),
                    len(calls),
                )
            ]
        )
        split_trajectories, trained_rows, rows, tokens, text_rendered, all_calls = (
            sum(column) for column in zip(*counts, strict=True)
        )
        n = max(len(everyone), 1)
        metrics = {
            "rollout/prefix_mismatch": split_trajectories / n,
            "rollout/text_rendered": text_rendered / max(all_calls, 1),
            "rollout/rows_per_trajectory": trained_rows / n,
            "rollout/padding_rows": (rows - trained_rows) / max(rows, 1),
            "rollout/model_tokens_per_s": tokens / max(rollout.last_seconds, 1e-9),
        }
        self._log_rollout(mode, everyone, {**result.metrics, **metrics})
        return output

    def _log_rollout(self, mode: str, episodes: list[Episode], metrics: dict[str, float]) -> None:
        """Per step: advantage stats, turns, pass rate, reward per role and env, termination reasons, speed."""
        for name, value in {**metrics, **self.rollout.last_metrics}.items():
            self._metrics[mode][name].append(value)
        self._metrics[mode]["rollout/pass_rate"].append(sum(e.is_correct for e in episodes) / max(len(episodes), 1))
        n = max(len(episodes), 1)
        self._metrics[mode]["rollout/turns"].append(sum(len(e.trajectories[0].steps) for e in episodes) / n)
        by_role: dict[str, list[float]] = defaultdict(list)
        for episode in episodes:
            for trajectory in episode.trajectories:
                by_role[trajectory.name].append(float(trajectory.reward or 0.0))
        by_env: dict[str, list[float]] = defaultdict(list)
        for episode in episodes:
            by_env[str(episode.metadata.get("env"))].extend(float(t.reward or 0.0) for t in episode.trajectories)
        for prefix, groups in (("role", by_role), ("env", by_env)):
            for name, rewards in groups.items():
                self._metrics[mode][f"train/reward/{prefix}/{name}"].append(sum(rewards) / len(rewards))
        reasons = Counter(e.termination_reason.value if e.termination_reason else "unknown" for e in episodes)
        for reason, count in reasons.items():
            self._metrics[mode][f"rollout/termination/{reason}"].append(count / n)
