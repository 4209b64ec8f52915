"""Asynchronous generation (``max_staleness: K >= 1``): the episodes of the next ``K`` steps run in a worker process
while a step trains.

:class:`AsyncGenerator` starts one worker process (``torch.multiprocessing``, spawn) next to ``K + 1`` copies of the
trainer's model in shared memory (:class:`SharedWeights`). After each optimizer step the trainer copies its weights in
place (:meth:`AsyncGenerator.publish`, no file round trip) into a copy no step in flight is pinned to, with the new
version number (the trainer's ``global_step``). Each step handed to the worker is pinned to the newest version then:
with the look-ahead below, step ``t`` is sampled by version ``t - K`` (by ``t`` at a run's or an epoch's first steps,
see below), however fast or slow the worker is. Every batch of the step, every turn of its episodes included, is
sampled by that copy and recorded in each Step's ``ModelOutput.policy_version``, with its behaviour
log-probabilities. So a publish never waits for a generation, and what a run samples does not depend on the worker's
timing: an async run, like a synchronous one, is the same on every rerun of its seed on the same machine. (Loading
the newest weights before each batch instead gave fresher rows, but which version sampled a row followed the
worker's timing, and a seed's figures moved from one run to the next.) The worker runs the trainer's own
:class:`~rllm_gym.train.rollout.EpisodeRollout` (same envs, agents, engine, reset seeds and episode ids as the
synchronous trainer) and sends each step's :class:`~rllm_gym.train.rollout.RolloutBatch` back through a pipe. The
trainer's side of a worker (requests, results, the shared copies, restarts, stopping) is :class:`GeneratorProcess`,
which the vLLM generator (train/async_vllm.py) shares; :func:`run_worker` is the body of either worker process.

The CPU worker runs up to ``K + 1`` steps' rollouts at once (``WorkerSettings.rollouts``; train/async_worker.py),
each in a thread of its own with its own copy of the rollout: their LLM batches take turns on the cores (the oldest
step's first, each on its own version's copy), while their env calls overlap, so a step's episodes no longer wait on
the previous step's env latency. Each step numbers its call by its request, so episode ids and reset seeds are those
of one step at a time, and each samples from a random stream of its own (seeded by the run's seed, the process and
the call): what a step samples does not depend on which steps ran beside it.

Which prompts come next: :class:`LookAhead` draws the trainer's batches from its epoch iterator ``K`` steps early and
hands each step's prompts to the generator as it draws them (TRL's dataloader and sampler stay TRL's, checkpoints
included). At an epoch boundary the look-ahead stops at the epoch's last batch: the next epoch's order exists only
once the trainer starts it, so its first steps are generated then (their staleness starts again from 0). A resume
regenerates what was in flight: nothing of it is in a checkpoint, and the look-ahead draws the resumed epoch's
batches again, pinned to the weights it resumes from (a resumed run is not bit for bit one never stopped).

Several training processes (``accelerate launch``, DeepSpeed) each start a worker of their own, for their own share
of the step's prompts (as each generates its own share synchronously), holding their own whole copy of the weights
(under ZeRO-3 the trainer gathers the shards for each publish: ``RLLMGRPOTrainer.whole_weights``): every rank holds
the same weights after a step, and nothing of the episodes crosses processes but what the trainer gathers. A worker
per rank rather than one for all: generation scales with the ranks (as synchronous generation does), no rank waits
on another's generator, and no episodes or prompts travel between processes outside TRL's own gathers.

Every wait has a bound: the trainer polls the worker's results and its liveness each second. A worker that crashed
(killed, out of memory: no traceback) is restarted once with the same shared weights and fresh queues, and the
steps it had in flight are generated again (numbered and pinned as before, so they come out the same),
counted in ``restarts``; one that crashes again before the next step's episodes arrive stops the run with its exit
code. A worker whose rollout raised stops the run with the traceback (it would fail again), and one that sends nothing
for ``timeout_s`` stops it too. The worker ignores Ctrl-C (the trainer's own handler finishes the step and saves a
checkpoint); :meth:`AsyncGenerator.close` asks it to stop, joins it, and terminates it if it does not.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import torch

from rllm_gym.engine.common import usable_cpus
from rllm_gym.engine.seeds import episode_seed
from rllm_gym.policies.base import SamplingParams
from rllm_gym.policies.hf import HFPolicy
from rllm_gym.policies.tokens import TokenHistory
from rllm_gym.train.async_worker import Turns, run_worker, sandbox_runs
from rllm_gym.train.generation import Generation
from rllm_gym.train.look_ahead import LookAhead
from rllm_gym.train.rollout import EpisodeRollout, RolloutBatch
from rllm_gym.train.trl_adapter import copy_without_hooks
from rllm_gym.types import ModelOutput

__all__ = [
    "AsyncGenerator",
    "GeneratorDied",
    "GeneratorProcess",
    "LaneCall",
    "LookAhead",
    "SharedWeights",
    "WorkerGeneration",
    "WorkerLink",
    "WorkerSettings",
    "run_worker",
    "sandbox_runs",
]


class GeneratorDied(RuntimeError):
    """The generation worker stopped (an exception, a crash, or no answer in time); the message says why."""


@dataclass(frozen=True)
class WorkerSettings:
    """What the worker's generation needs of the trainer: the sampling settings, the run's seed (reset seeds derive
    from it), the filler token of padding rows, the policies' chat settings, the torch threads it may use, the
    training process it generates for (episode ids and reset seeds name it), and ``env_calls``: the env calls it runs
    at once (its env thread pool, where the rollout sets none of its own, and its process's sandbox runs, where
    ``RLLM_GYM_SANDBOX_MAX_PARALLEL`` is unset, as many as fit in half the machine's memory: :func:`sandbox_runs`),
    ``rollouts``: the steps' rollouts it runs at once (the trainer gives ``max_staleness + 1``, every step it
    may have been handed; each further one runs where its backend can give a second policy on the same weights:
    :meth:`WorkerGeneration.another`, the CPU worker's), and ``cores``: the CPU cores the training process and its
    worker share (``None``: every one this process may run on; the trainer gives each of its processes its share).

    ``env_calls`` is larger than the trainer's own default (:func:`~rllm_gym.engine.common.default_env_workers`):
    the worker's env calls overlap the trainer's step, and those of a latency-bound env (Code-v0's sandboxed tests)
    are mostly waits on process start and teardown. With 4 at once (the default on 2 cores) a Code-v0 step's 32
    episodes took ~1.0 s of sandbox runs, with 16 ~0.75 s and 32 ~0.65 s (loaded 2-core machine); how the episodes
    of a seed come out does not depend on it (an LLM batch goes out once every running episode has asked)."""

    sampling: SamplingParams
    run_seed: int
    filler_id: int
    chat_template_kwargs: dict[str, Any]
    token_history: TokenHistory
    threads: int = 1
    process_index: int = 0
    env_calls: int = 32
    rollouts: int = 1
    cores: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.env_calls, bool) or not isinstance(self.env_calls, int) or not 1 <= self.env_calls <= 256:
            raise ValueError(f"WorkerSettings env_calls must be an int in [1, 256], got {self.env_calls!r}")
        if isinstance(self.rollouts, bool) or not isinstance(self.rollouts, int) or self.rollouts < 1:
            raise ValueError(f"WorkerSettings rollouts must be an int >= 1, got {self.rollouts!r}")
        cores = self.cores
        if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
            raise ValueError(f"WorkerSettings cores must be None or an int >= 1, got {self.cores!r}")


class SharedWeights:
    """The copies of the weights the trainer shares with a worker (``copies``, each in shared memory) and the version
    each holds (``held``, a shared array: -1 while a copy is being written). :meth:`of` gives the copy of a version;
    the trainer writes a new version only into a copy no step in flight was pinned to
    (:meth:`GeneratorProcess.publish`), so a copy is never written while it samples."""

    def __init__(self, copies: list[Any], held: Any):
        self.copies, self.held = copies, held

    def of(self, version: int) -> Any:
        """The copy that holds ``version``; a RuntimeError where none does (a step pinned to a version the trainer
        overwrote: a bug, never a silent sample by other weights)."""
        for weights, held in zip(self.copies, self.held, strict=True):
            if held == version:
                return weights
        raise RuntimeError(f"the weights of version {version} are no longer held (held: {list(self.held)})")

    def newest(self) -> int:
        """The newest version held."""
        return max(self.held)


@dataclass
class LaneCall:
    """The rollout call a policy's batches belong to: its ``number`` (their turn on the cores, the oldest call first),
    the ``version`` of the weights it was pinned to, and its ``sampler``, the random stream they draw from (see
    :meth:`seed`)."""

    number: int = 0
    version: int = 0
    sampler: torch.Generator = field(default_factory=torch.Generator)

    def seed(self, number: int, run_seed: int, process_index: int) -> None:
        """Start call ``number``: its stream seeded by the run's seed, the process and the call, so that what a call
        samples does not depend on the calls that ran beside it."""
        self.number = number
        self.sampler.manual_seed(episode_seed(run_seed, "worker sampling", (number, process_index)))

    def next_batch(self) -> None:
        """Move the stream on to the call's next batch: reseeded by a draw from it (the batch drew from the process's
        generator, set from this stream inside a fork that restores it, so the stream itself has not moved)."""
        self.sampler.manual_seed(int(torch.randint(2**62, (1,), generator=self.sampler)))


class VersionedHFPolicy(HFPolicy):
    """HFPolicy on the trainer's shared weights (:class:`SharedWeights`): each batch of ``call`` (a
    :class:`LaneCall`) is sampled by the copy of the version the call was pinned to, waits for the call's turn on the
    cores (``turns``, shared by the worker's concurrent rollouts) and draws from the call's stream (the process's own
    random state is left as it was); its outputs are stamped with that version. The worker builds it with
    ``logprobs_mode="temperature"``: the behaviour log-probabilities are those the loss scores."""

    def __init__(self, weights: SharedWeights, call: LaneCall, turns: Turns, **kwargs: Any):
        super().__init__(weights.copies[0], **kwargs)
        self._weights, self._call, self._turns = weights, call, turns

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[ModelOutput]:
        call = self._call
        with self._turns.turn(call.number):
            self.model = self._weights.of(call.version)
            with torch.random.fork_rng(devices=[]):
                torch.set_rng_state(call.sampler.get_state())
                outputs = super()._generate_batch(prompts, params)
            call.next_batch()
        return [output.model_copy(update={"policy_version": call.version}) for output in outputs]


class WorkerGeneration(Generation):
    """A worker process's generation backend: the trainer's settings as values (:class:`WorkerSettings`); subclasses
    give the policy (``_policy``), kept from call to call while the episode count stays the same, as the trainer's
    own backend keeps it."""

    def __init__(self, settings: WorkerSettings):
        super().__init__(
            None, chat_template_kwargs=settings.chat_template_kwargs, token_history=settings.token_history
        )
        self.settings = settings

    @property
    def process_index(self) -> int:
        return self.settings.process_index

    @property
    def run_seed(self) -> int:
        return self.settings.run_seed

    @property
    def filler_id(self) -> int:
        return self.settings.filler_id

    def sampling_params(self) -> SamplingParams:
        return self.settings.sampling

    def failure(self) -> str | None:
        """Why the backend failed during the last call (then the worker stops the run with it), or None."""
        return None

    def begin_call(self, number: int, version: int) -> None:
        """Called before each rollout call with its number and the version of the weights it is pinned to (the
        newest the trainer had published when it handed the step over): every batch of the call samples with it."""

    def end_call(self, number: int) -> None:
        """Called after each rollout call with its number (nothing here)."""

    concurrent = False  # whether another() gives backends for rollouts at once (then each runs in a thread of its own)

    def another(self) -> WorkerGeneration | None:
        """A second backend on the same weights, for one more rollout at once; None (this one): one at a time."""
        return None


class _WorkerGeneration(WorkerGeneration):
    """The CPU worker's backend: its policy on the trainer's shared weights, each call on the copy it was pinned to."""

    def __init__(self, settings: WorkerSettings, weights: SharedWeights, tokenizer: Any, turns: Turns | None = None):
        super().__init__(settings)
        self.weights, self.tokenizer = weights, tokenizer
        self.turns = Turns() if turns is None else turns  # one batch at a time on the cores, for every rollout
        self.call = LaneCall()
        self._kept: tuple[int, VersionedHFPolicy] | None = None

    def begin_call(self, number: int, version: int) -> None:
        self.call.seed(number, self.settings.run_seed, self.settings.process_index)
        self.call.version = version

    def end_call(self, number: int) -> None:
        self.turns.done(number)

    concurrent = True

    def another(self) -> _WorkerGeneration:
        return _WorkerGeneration(self.settings, self.weights, self.tokenizer, self.turns)

    @contextmanager
    def _policy(self, count: int) -> Iterator[Any]:
        if self._kept is None or self._kept[0] != count:
            policy = VersionedHFPolicy(
                self.weights, self.call, self.turns, tokenizer=self.tokenizer, device="cpu",
                chat_template_kwargs=self.chat_template_kwargs, token_history=self.token_history,
                max_batch_size=count, batch_wait_s=0.1, generate_on_loop=True, logprobs_mode="temperature",
            )  # fmt: skip
            self._kept = (count, policy)
        yield self._kept[1]


@dataclass
class WorkerLink:
    """What a worker process is given of its generator: the rollout it runs, the tokenizer, the settings, the shared
    copies of the weights and the version each holds (``weights``, a :class:`SharedWeights`), the requests queue, the
    results pipe's writing end, the trainer's process id (a worker whose trainer is gone stops) and the call number of
    ticket 0 (``first_call``: the request with ticket ``t`` numbers its episodes as call ``first_call + t``)."""

    rollout: EpisodeRollout
    tokenizer: Any
    settings: WorkerSettings
    weights: SharedWeights
    requests: Any
    results: Any
    parent: int
    first_call: int = 0
    busy: Any = None  # a shared int: the requests the worker runs now (it writes, the trainer reads)


def _work(link: WorkerLink) -> None:
    """The CPU worker process: its policy on the trainer's shared copies of the weights."""
    run_worker(link, lambda: _WorkerGeneration(link.settings, link.weights, link.tokenizer))


class GeneratorProcess:
    """A generation worker process and the trainer's side of it: requests in, results out in submission order, and
    ``versions`` copies of ``model``'s weights in shared memory (:class:`SharedWeights`). Subclasses make a shared
    copy (:meth:`_share`), give the worker function (:meth:`_worker`) and copy new weights into a copy
    (:meth:`_copy_weights`).

    :meth:`submit` hands the worker a step's prompts, pinned to the newest version published, :meth:`result` waits
    (bounded) for that step's :class:`~rllm_gym.train.rollout.RolloutBatch`, :meth:`publish` hands it new weights,
    :meth:`close` stops it. ``restarts`` counts the workers started again after a crash (never, where
    ``restart_on_crash`` is False).

    Each step is sampled by the version it was pinned to, whenever the worker gets to it, so what a run's steps
    sample does not depend on the worker's timing. ``versions`` bounds the versions steps in flight may be pinned to:
    a publish writes a copy no step in flight is pinned to, and refuses where there is none. The trainer, ``K`` steps
    ahead, gives ``K + 1``: when it publishes version ``v`` the steps in flight were handed over at versions
    ``v - K`` to ``v - 1``.

    The worker's torch threads (``settings.threads``) come out of this process's while it runs a step; with
    ``share_threads`` (the default) and ``model`` on the CPU, this process takes them back while the worker waits for
    one (:meth:`share_cores`, before each module's forward and backward), else it keeps to what the worker leaves."""

    name = "generator"  # how messages name the generator, and its worker
    label = "generation worker"
    backend = "model"  # what the worker starts, in messages
    restart_on_crash = True
    close_timeout_s = 10.0

    def __init__(
        self,
        rollout: EpisodeRollout,
        model: torch.nn.Module,
        tokenizer: Any,
        settings: WorkerSettings,
        *,
        version: int = 0,
        versions: int = 1,
        timeout_s: float = 1800.0,
        share_threads: bool = True,
    ):
        if isinstance(versions, bool) or not isinstance(versions, int) or versions < 1:
            raise ValueError(f"{type(self).__name__} versions must be an int >= 1, got {versions!r}")
        self._context = torch.multiprocessing.get_context("spawn")
        held = self._context.Array("q", [version] + [-1] * (versions - 1), lock=False)
        self.weights = SharedWeights([self._share(model) for _ in range(versions)], held)
        self.timeout_s = timeout_s
        self.restarts = 0
        self._rollout, self._tokenizer, self._settings = rollout, tokenizer, settings
        self._first_call = rollout.calls  # the worker numbers its calls from here, one per ticket
        self._pending: deque[tuple[int, list[Any], int]] = deque()  # (ticket, prompts, version)
        self._tickets = 0
        self._taken = 0  # results taken: a second crash before the next one stops the run
        self._restarted_after: int | None = None
        self._busy = self._context.Value("i", 1, lock=False)
        self._start()
        # The worker's threads come out of this process's while it runs a step: torch's CPU threads spin while they
        # wait for work, and a trainer that kept all of them beside a busy worker ran each step 5-10x slower on 2
        # cores (benchmarks/bench_async.py). While the worker waits for a step (it is ahead: the trainer is the
        # slower), the trainer takes them back: a model on the CPU checks before each module's forward and backward
        # (hooks, removed by close(), which restores the threads). On the main job that took K = 2 from 0.91x to
        # 1.11x K = 0's steps per second (2 cores, bench_async.py --quick --rounds 2, README).
        self._threads = torch.get_num_threads()
        cores = settings.cores if settings.cores is not None else usable_cpus()
        self._shared_threads = max(1, min(self._threads, cores - settings.threads))
        self._threads_now = self._shared_threads
        torch.set_num_threads(self._shared_threads)
        on_cpu = all(parameter.device.type == "cpu" for parameter in model.parameters())
        share = share_threads and on_cpu and self._shared_threads < self._threads
        self._hooks = self._follow(model) if share else []

    def _follow(self, model: torch.nn.Module) -> list[Any]:
        """Hooks on each module of ``model`` that set this process's torch threads before its forward and before
        its backward (:meth:`share_cores`)."""

        def backward(_: torch.Tensor) -> None:
            self.share_cores()

        def forward(_module: torch.nn.Module, _args: Any, output: Any) -> None:
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(backward)

        hooks = []
        for module in model.modules():
            hooks.append(module.register_forward_pre_hook(lambda *_: self.share_cores()))
            hooks.append(module.register_forward_hook(forward))
        return hooks

    def share_cores(self) -> None:
        """This process's torch threads for now: all it had while the worker waits for requests, the rest beside
        the worker's while it runs one."""
        threads = self._shared_threads if self.running else self._threads
        if threads != self._threads_now:
            torch.set_num_threads(threads)
            self._threads_now = threads

    def _share(self, model: torch.nn.Module) -> Any:
        """A copy of ``model``'s weights in shared memory, for the worker."""
        raise NotImplementedError

    def _worker(self) -> tuple[Callable[..., None], tuple[Any, ...]]:
        """The worker function and its arguments after the :class:`WorkerLink`."""
        raise NotImplementedError

    def _copy_weights(self, model: torch.nn.Module, weights: Any) -> None:
        """Copy ``model``'s parameters into ``weights``, one of the shared copies."""
        raise NotImplementedError

    def _start(self) -> None:
        """A new worker process with new queues (a crashed worker may have died halfway through a message), on the
        same shared weights."""
        context = self._context
        # Results come through a pipe whose writing end only the worker holds: a worker that dies halfway through an
        # answer leaves the trainer an end of file, where a queue's reader would wait for the rest for ever.
        self._requests = context.Queue()
        self._results, writer = context.Pipe(duplex=False)
        self._busy.value = 1  # starting (and a dead worker may have left it at any count)
        link = WorkerLink(self._rollout, self._tokenizer, self._settings, self.weights, self._requests, writer,
                          os.getpid(), self._first_call, self._busy)  # fmt: skip
        target, args = self._worker()
        self.process = context.Process(target=target, args=(link, *args), name="rllm-gym-generator", daemon=True)
        self.process.start()
        writer.close()  # the worker has its own copy of it now

    def _restart(self) -> None:
        """Replace a dead worker (once between two results, else :class:`GeneratorDied`) and submit the steps in
        flight to the new one again, numbered as they were. A worker that said why it stopped stops the run with
        that; one that may not be restarted stops it with its exit code."""
        code = self.process.exitcode
        with suppress(EOFError, OSError):
            while self._results.poll():  # its last words: a failure stops the run, answers are generated again
                answered, _, error = self._results.recv()
                if error is not None:
                    raise self._failed(answered, error)
        if not self.restart_on_crash:
            raise GeneratorDied(f"the {self.label} exited with code {code}")
        if self._restarted_after == self._taken:
            raise GeneratorDied(
                f"the {self.label} exited with code {code}, again after a restart within the same step"
            )
        self.restarts += 1
        self._restarted_after = self._taken
        self._close_channels()
        self._start()
        for request in self._pending:
            self._requests.put(request)

    @property
    def version(self) -> int:
        """The version of the newest weights published."""
        return self.weights.newest()

    @property
    def running(self) -> int:
        """Steps the worker is generating now (1 while it starts)."""
        return self._busy.value

    @property
    def pending(self) -> int:
        """Steps submitted whose results were not taken yet."""
        return len(self._pending)

    @torch.no_grad()
    def publish(self, model: torch.nn.Module, version: int) -> None:
        """Copy ``model``'s parameters as ``version`` into the oldest shared copy that no step in flight is pinned
        to (the worker never reads it meanwhile: nothing waits on a generation); a RuntimeError where every copy is
        (more steps in flight at distinct versions than ``versions`` allows)."""
        held = self.weights.held
        pinned = {pin for _, _, pin in self._pending}
        free = [index for index, kept in enumerate(held) if kept not in pinned]
        if not free:
            raise RuntimeError(
                f"the {self.name} holds {len(held)} versions of the weights and steps in flight are pinned to each of "
                f"them ({sorted(pinned)}): version {version} has no copy to go to (give it more versions)"
            )
        index = min(free, key=lambda i: held[i])
        held[index] = -1  # no version while it is written
        self._copy_weights(model, self.weights.copies[index])
        held[index] = version

    def submit(self, prompts: list[Any]) -> None:
        """Start generating the episodes of a step's ``prompts`` (after every step submitted before), sampled by the
        newest weights published now."""
        if not self.process.is_alive():
            self._restart()
        request = (self._tickets, list(prompts), self.version)
        self._requests.put(request)
        self._pending.append(request)
        self._tickets += 1

    def result(self, prompts: list[Any]) -> RolloutBatch:
        """The :class:`RolloutBatch` of the oldest submitted step, which must be ``prompts``; waits for it at most
        ``timeout_s``, checking each second that the worker is alive (restarted once if not, see the module's
        docstring; :class:`GeneratorDied` if that fails too)."""
        if not self._pending or self._pending[0][1] != list(prompts):
            raise RuntimeError(
                f"the trainer asked for the episodes of prompts the {self.name} was not given next "
                f"({self.pending} steps pending): the look-ahead lost track of TRL's batches"
            )
        ticket = self._pending[0][0]
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                answer = self._results.recv() if self._results.poll(1.0) else None
            except (EOFError, OSError):  # the worker is gone (perhaps halfway through this answer)
                self.process.join(5.0)
                answer = None
            if answer is None:
                if not self.process.is_alive():
                    self._restart()
                    deadline = time.monotonic() + self.timeout_s
                elif time.monotonic() > deadline:
                    raise GeneratorDied(
                        f"the {self.label} sent no episodes for {self.timeout_s:.0f} s (hung env or {self.backend}?)"
                    ) from None
                continue
            answered, batch, error = answer
            if error is not None:
                raise self._failed(answered, error)
            if answered != ticket:
                raise GeneratorDied(f"the {self.label} answered step {answered} where {ticket} was due")
            self._pending.popleft()
            self._taken += 1
            return batch

    def _failed(self, answered: int | None, error: str) -> GeneratorDied:
        """The error of a worker that answered ``error`` (to no ticket: its backend could not start)."""
        what = f"could not start its {self.backend}" if answered is None else "failed"
        return GeneratorDied(f"the {self.label} {what}:\n{error}")

    def _close_channels(self) -> None:
        self._requests.close()
        self._requests.cancel_join_thread()
        self._results.close()

    def close(self, timeout_s: float | None = None) -> None:
        """Stop the worker: asked first (answers not taken yet are dropped), terminated if it has not stopped within
        ``timeout_s`` (default ``close_timeout_s``); the channels closed, the trainer's torch threads restored."""
        timeout_s = self.close_timeout_s if timeout_s is None else timeout_s
        if self.process.is_alive():
            with suppress(OSError, ValueError):
                self._requests.put(None)
            self._results.close()  # a worker sending an answer nobody will read stops sending
            self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout_s)
        self._close_channels()
        self._pending.clear()
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        torch.set_num_threads(self._threads)


class AsyncGenerator(GeneratorProcess):
    """A CPU generation worker process and ``versions`` shared-memory copies of ``model`` (see the module's
    docstring), which :meth:`publish` overwrites in place; the worker samples each step with the copy of the version
    it was pinned to."""

    def _share(self, model: torch.nn.Module) -> torch.nn.Module:
        shared = copy_without_hooks(model).requires_grad_(False).eval()
        return shared.share_memory()

    def _worker(self) -> tuple[Callable[..., None], tuple[Any, ...]]:
        return _work, ()

    def _copy_weights(self, model: torch.nn.Module, weights: torch.nn.Module) -> None:
        source = dict(model.named_parameters())
        for name, parameter in weights.named_parameters():
            parameter.copy_(source[name])

    @property
    def model(self) -> torch.nn.Module:
        """The shared copy of the newest version published."""
        return self.weights.of(self.version)
