"""Seconds per GRPO step of rllm-gym's trainer against TRL's plain GRPOTrainer, on the same single-turn math task.

Both trainers train the same tiny model (built offline into a temporary folder) from the same weights and seed, on the
same prompts (``rllm/Math-v0``'s offline generator, rendered by the env and the math agent; checked token for token),
with the same prompts per step, group size, completion length, learning rate and loss, on the CPU, without gradient
checkpointing. Ours is :class:`~rllm_gym.train.trainer.RLLMGRPOTrainer` (generation through the env, the agent, the
engine and :class:`~rllm_gym.policies.hf.HFPolicy`; our advantages); TRL's gets the same prompts as conversational
``prompt`` messages and a reward function grading the completion text as :func:`~rllm_gym.rewards.math.math_reward_fn`
does (the same default grader, on math-verify workers of its own, so neither trainer finds answers the other graded in
the workers' caches). The two run in one process, each in its own thread, taking turns one optimizer step at a time
(garbage collected between turns, untimed), so both see the same machine load; the steps go A, B, B, A, A, B, ... (each
goes first in every other pair) and rounds alternate who is A. Before step ``k`` both seed torch with ``seed + k``, so
they sample the same completions and grade the same answers (the math-verify calls are counted per trainer to show it).
The first ``--warmup`` steps of each run are dropped and the ratio is of the median seconds per step (issue 9's goal:
ours/TRL <= 1.15); also reported: each round's ratio and the paired ratio, the median over steps ``k`` of ours/TRL for
step ``k`` (the two ran one right after the other, so a load that changes during the run cancels out). A table splits
each step into phases (generation, model.generate, rewards, loss, backward). What-ifs: ``--hf-max-batch N`` (our
HFPolicy's cap on requests per generate call) and ``--no-math-verify``; ``--threads 1`` steadies timings on a CPU
shared with other jobs; ``--profile N`` cProfiles N steps of each, all threads.

    python benchmarks/bench_grpo.py --quick                  # about 15 s on 2 cores
    python benchmarks/bench_grpo.py --json grpo.json         # full run, about a minute
    python benchmarks/bench_grpo.py --quick --profile 4      # plus the top costs of each trainer

A second table times a multi-turn step (FrozenLake, several turns, the tiny model; ``--multi-turn-steps 0`` skips
it): our trainer with each call's prompt continuing the sampled tokens (``token_history="sampled"``, token in, token
out: one training row per trajectory) against the same trainer re-rendering the chat every call
(``token_history="template"``, as before issue 32: a row splits wherever the tokenizer re-spells a sampled reply),
interleaved step by step in the same run.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16

import argparse
import json
import platform
import pstats
import statistics
import tempfile
import threading
import time
from collections import Counter, defaultdict
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from unittest.mock import patch

import gymnasium as gym
import torch
import transformers
import trl
from _grpo_common import (
    PHASES,
    RUNNING,
    ProfileAfterWarmup,
    StepTimer,
    TrainerSettings,
    grpo_args,
    instrument,
    run_interleaved,
    summarize,
    timed,
    top_costs,
)
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.trainer_callback import PrinterCallback
from trl import GRPOTrainer

import rllm_gym.envs  # noqa: F401  (registers the env ids with gymnasium)
from rllm_gym.agents.math import MathAgent
from rllm_gym.data import MathTaskGenerator
from rllm_gym.policies.hf import HFPolicy
from rllm_gym.rewards.math import MathGrader, MathVerifyPool, shared_pool
from rllm_gym.tiny_model import build_tiny_model
from rllm_gym.train import batch as training_batch
from rllm_gym.train.advantages import AdvantageConfig
from rllm_gym.train.trainer import EnvSetup, EpisodeRollout, RLLMGRPOTrainer, encode_prompt

ENV_ID = "rllm/Math-v0"
GOAL = 1.15
NO_MATH_VERIFY = MathGrader(use_math_verify=False)
# TRL's reward function grades with math_reward_fn's grader on workers of its own: with one pool for both trainers,
# whichever graded an answer second found it in the workers' caches (sympy's, the parsed references) and got it in
# a tenth of the time, so the trainer that went first in a step paid for both.
TRL_GRADER = MathGrader(pool=MathVerifyPool(max_workers=shared_pool().max_workers))


@dataclass
class Settings(TrainerSettings):
    """What both trainers share; every field is the same for ours and TRL's."""

    steps: int = 15
    rounds: int = 2
    math_verify: bool = True  # False: both graders skip math-verify (a what-if that isolates the engine's cost)


# Data: the same tasks, as our encoded prompts and as TRL's conversational prompts


def math_tasks(n: int, seed: int) -> list[dict[str, Any]]:
    generator = MathTaskGenerator(seed=seed)
    return [generator[i] for i in range(n)]


def agent_messages(task: dict[str, Any]) -> list[dict[str, str]]:
    """The chat our engine sends for ``task``: the env's first observation, formatted by the math agent."""
    env = gym.make(ENV_ID)
    observation, info = env.reset(options={"task": task})
    env.close()
    agent = MathAgent()
    agent.update_from_env(observation, 0.0, False, info)
    return [dict(message) for message in agent.chat_completions]


def datasets(tasks: list[dict[str, Any]]) -> tuple[Dataset, Dataset]:
    ours = Dataset.from_list([{"prompt": encode_prompt(ENV_ID, task)} for task in tasks])
    plain = Dataset.from_list(
        [{"prompt": agent_messages(task), "ground_truth": str(task["ground_truth"])} for task in tasks]
    )
    return ours, plain


def trl_math_reward(completions: list[Any], ground_truth: list[str], **kwargs: Any) -> list[float]:
    """TRL reward function equivalent to the env's: math_reward_fn's grader on the completion's text (its own
    math-verify workers, see ``TRL_GRADER``)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [TRL_GRADER({"ground_truth": gt}, text).reward for text, gt in zip(texts, ground_truth, strict=True)]


def trl_math_reward_no_math_verify(completions: list[Any], ground_truth: list[str], **kwargs: Any) -> list[float]:
    """``--no-math-verify``: the grader without its math-verify path, as the env is then set up."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [NO_MATH_VERIFY({"ground_truth": gt}, text).reward for text, gt in zip(texts, ground_truth, strict=True)]


def warm_math_verify() -> None:
    """Start every math-verify worker of both pools (ours, shared, and TRL's) now: starting one (a sympy import,
    seconds on a loaded machine) inside a timed step would charge whichever trainer first graded a symbolic-looking
    answer."""
    pools = [shared_pool(), TRL_GRADER.pool]
    threads = [
        threading.Thread(target=pool.verify, args=("1", "1", 60.0)) for pool in pools for _ in range(pool.max_workers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


class Probes:
    """Counters patched into the library while active: our HFPolicy's generate-call sizes and seconds, math-verify
    calls per trainer, compute_advantages' seconds; with ``hf_max_batch`` (a what-if) HFPolicy's request cap."""

    def __init__(self, hf_max_batch: int | None = None) -> None:
        self.hf_max_batch = hf_max_batch
        self.batch_sizes: list[int] = []
        self.verify_calls: Counter[str] = Counter()
        self.verify_seconds: dict[str, float] = defaultdict(float)
        self._patches = ExitStack()

    def __enter__(self) -> Probes:
        generate = timed("model_generate", HFPolicy._generate_batch)
        verify, init = MathVerifyPool.verify, HFPolicy.__init__

        def generate_batch(policy: HFPolicy, prompts: list[list[int]], params: Any) -> Any:
            self.batch_sizes.append(len(prompts))
            return generate(policy, prompts, params)

        def counted_verify(pool: MathVerifyPool, *args: Any) -> tuple[bool, str]:
            start = time.perf_counter()
            try:
                return verify(pool, *args)
            finally:
                kind = RUNNING["kind"] or "other"
                self.verify_calls[kind] += 1
                self.verify_seconds[kind] += time.perf_counter() - start

        def capped_init(policy: HFPolicy, *args: Any, **kwargs: Any) -> None:
            init(policy, *args, **{**kwargs, "max_batch_size": self.hf_max_batch})

        patches = [
            patch.object(HFPolicy, "_generate_batch", generate_batch),
            patch.object(MathVerifyPool, "verify", counted_verify),
            patch.object(training_batch, "compute_advantages", timed("advantages", training_batch.compute_advantages)),
        ]
        if self.hf_max_batch is not None:
            patches.append(patch.object(HFPolicy, "__init__", capped_init))
        for item in patches:
            self._patches.enter_context(item)
        return self

    def __exit__(self, *exc: object) -> None:
        self._patches.close()
        self._patches = ExitStack()


def build_trainer(
    kind: str, model_path: Path, settings: Settings, data: Dataset, output_dir: str, max_steps: int, timer: StepTimer
) -> GRPOTrainer:
    torch.manual_seed(settings.seed)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    args = grpo_args(settings, output_dir, max_steps)
    common = dict(model=model, processing_class=tokenizer, args=args, train_dataset=data, callbacks=[timer])
    if kind == "ours":
        env_args = {} if settings.math_verify else {"reward_config": {"use_math_verify": False}}
        trainer = RLLMGRPOTrainer(
            **common,
            rollout=EpisodeRollout([EnvSetup(ENV_ID, env_args=env_args)], max_turns=1),
            advantage_config=AdvantageConfig(estimator="grpo", mode="broadcast"),
        )
    else:
        reward = trl_math_reward if settings.math_verify else trl_math_reward_no_math_verify
        trainer = GRPOTrainer(**common, reward_funcs=[reward])
    trainer.remove_callback(PrinterCallback)
    instrument(trainer, kind)
    return trainer


def profile_steps(kind: str, model_path: Path, settings: Settings, data: Dataset, steps: int) -> pstats.Stats:
    """cProfile ``steps`` steps of one trainer alone, after ``settings.warmup`` unprofiled steps."""
    profile = ProfileAfterWarmup(settings.warmup)
    with tempfile.TemporaryDirectory(prefix=f"bench-grpo-profile-{kind}-") as output_dir:
        trainer = build_trainer(kind, model_path, settings, data, output_dir, settings.warmup + steps, StepTimer(kind))
        trainer.add_callback(profile)
        trainer.train()
    return profile.stats()


def trl_prompt_ids(model_path: Path, plain: Dataset) -> set[tuple[int, ...]]:
    """The prompt tokens TRL's trainer sees: its dataset's messages through the chat template."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return {
        tuple(
            tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)
        )
        for row in plain
    }


def check_same_prompts(trainer: RLLMGRPOTrainer, expected: set[tuple[int, ...]]) -> None:
    """Our rollout's last prompts must be prompts TRL's trainer sees too, token for token (same work per step)."""
    ours = {tuple(sequence.prompt_ids) for sequence in trainer.collected[-1].sequences if sequence.source >= 0}
    if not ours or not ours <= expected:
        raise RuntimeError("our trainer's prompt tokens differ from TRL's: the comparison would not be like for like")


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Settings]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few steps of a small batch, well under a minute")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="also cProfile N steps of each trainer")
    parser.add_argument("--profile-lines", type=int, default=30, help="rows of each profile table to print")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument(
        "--hf-max-batch",
        type=int,
        default=None,
        metavar="N",
        help="what-if: cap our HFPolicy's requests per generate call at N instead of its default (32)",
    )
    parser.add_argument(
        "--no-math-verify",
        dest="math_verify",
        action="store_false",
        default=None,
        help="what-if: both graders skip math-verify (exact and numeric paths only), isolating the engine's own cost",
    )
    parser.add_argument(
        "--multi-turn-steps",
        type=int,
        default=None,
        metavar="N",
        help="timed steps of each multi-turn trainer (token in, token out vs the re-rendered chat); 0 skips it "
        "(default 4, --quick 2)",
    )
    for name, value in asdict(Settings()).items():
        if not isinstance(value, bool):
            parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=None, help=f"default {value}")
    args = parser.parse_args(argv)
    settings = Settings()
    if args.quick:
        settings = Settings(
            prompts_per_step=4, num_generations=4, max_completion_length=16, warmup=1, steps=12, rounds=1
        )
    for name in asdict(settings):
        if getattr(args, name) is not None:
            setattr(settings, name, getattr(args, name))
    if args.multi_turn_steps is None:
        args.multi_turn_steps = 2 if args.quick else 4
    return args, settings


def measure(args: argparse.Namespace, settings: Settings) -> tuple[dict[str, Any], dict[str, pstats.Stats]]:
    """Run the rounds (and the profiles); returns the results and the profiles."""
    wall: dict[str, list[float]] = {"ours": [], "trl": []}
    cpu: dict[str, list[float]] = {"ours": [], "trl": []}
    phases: dict[str, list[dict[str, float]]] = {"ours": [], "trl": []}
    lengths: dict[str, list[float]] = {"ours": [], "trl": []}
    round_ratios: list[float] = []
    profiles: dict[str, pstats.Stats] = {}
    probes = Probes(args.hf_max_batch)
    with tempfile.TemporaryDirectory(prefix="bench-grpo-model-") as model_dir:
        model_path = build_tiny_model(model_dir, seed=settings.seed)
        max_steps = settings.warmup + settings.steps
        tasks = math_tasks(settings.prompts_per_step * (max_steps + args.profile), settings.seed)
        ours_data, plain_data = datasets(tasks)
        data = {"ours": ours_data, "trl": plain_data}
        expected_prompts = trl_prompt_ids(model_path, plain_data)
        warm_math_verify()
        for round_index in range(settings.rounds):
            kinds = ["ours", "trl"] if round_index % 2 == 0 else ["trl", "ours"]
            with probes:
                timers, trainers = run_interleaved(kinds, model_path, settings, data, max_steps, build_trainer)
            check_same_prompts(trainers["ours"], expected_prompts)
            round_ratios.append(
                statistics.median(timers["ours"].wall[settings.warmup :])
                / statistics.median(timers["trl"].wall[settings.warmup :])
            )
            for kind, timer in timers.items():
                wall[kind] += timer.wall[settings.warmup :]
                cpu[kind] += timer.cpu[settings.warmup :]
                phases[kind] += timer.phases[settings.warmup :]
                lengths[kind].append(timer.logs.get("completions/mean_length", float("nan")))
                print(f"round {round_index + 1} {kind:>4} s/step: " + " ".join(f"{x:.3f}" for x in timer.wall))
        if args.profile:
            for kind in ("ours", "trl"):
                with Probes(args.hf_max_batch):
                    profiles[kind] = profile_steps(kind, model_path, settings, data[kind], args.profile)
    rows = {kind: summarize(values) for kind, values in wall.items()}
    cpu_rows = {kind: summarize(values) for kind, values in cpu.items()}
    result = {
        "settings": asdict(settings),
        "quick": args.quick,
        "hf_max_batch": args.hf_max_batch,
        "prompt_tokens": round(statistics.mean(len(ids) for ids in expected_prompts)),
        "ours": rows["ours"],
        "trl": rows["trl"],
        "ours_cpu": cpu_rows["ours"],
        "trl_cpu": cpu_rows["trl"],
        "ratio": rows["ours"]["median_s"] / rows["trl"]["median_s"],
        "cpu_ratio": cpu_rows["ours"]["median_s"] / cpu_rows["trl"]["median_s"],
        "paired_ratio": statistics.median(ours / plain for ours, plain in zip(wall["ours"], wall["trl"], strict=True)),
        "round_ratios": round_ratios,
        "goal": GOAL,
        "step_seconds": wall,
        "phases_median_s": {
            kind: {phase: statistics.median(step.get(phase, 0.0) for step in steps) for phase in PHASES}
            for kind, steps in phases.items()
        },
        "mean_completion_tokens": {kind: statistics.mean(values) for kind, values in lengths.items()},
        "ours_generate_calls_per_step": len(probes.batch_sizes) / (settings.rounds * max_steps),
        "ours_generate_batch_sizes": dict(sorted(Counter(probes.batch_sizes).items())),
        "math_verify_calls": dict(probes.verify_calls),
        "math_verify_seconds": dict(probes.verify_seconds),
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "machine": {
            "python": platform.python_version(),
            "torch_threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
        },
    }
    result["meets_goal"] = result["ratio"] <= GOAL
    return result, profiles


def print_report(result: dict[str, Any], profiles: dict[str, pstats.Stats], profile_lines: int) -> None:
    settings = result["settings"]
    print(
        f"\nGRPO step: {settings['prompts_per_step']} prompts x {settings['num_generations']} generations, "
        f"{settings['max_completion_length']} completion tokens, ~{result['prompt_tokens']} prompt tokens, tiny "
        f"model, CPU, {result['machine']['torch_threads']} torch threads; steps interleaved, "
        f"{settings['warmup']} warm-up step(s) dropped"
        + (f"; what-if --hf-max-batch {result['hf_max_batch']}" if result["hf_max_batch"] else "")
        + ("" if settings["math_verify"] else "; what-if --no-math-verify")
    )
    print(f"{'trainer':<26}{'median s/step':>14}{'mean':>8}{'min':>8}{'CPU s/step':>12}{'steps':>7}")
    for kind, label in (("ours", "RLLMGRPOTrainer (ours)"), ("trl", "GRPOTrainer (TRL plain)")):
        row, cpu = result[kind], result[f"{kind}_cpu"]
        print(
            f"{label:<26}{row['median_s']:>14.3f}{row['mean_s']:>8.3f}{row['min_s']:>8.3f}"
            f"{cpu['median_s']:>12.3f}{row['n']:>7}"
        )
    verdict = "meets" if result["meets_goal"] else "MISSES"
    print(
        f"ratio ours/TRL: {result['ratio']:.3f}x wall (median), {result['cpu_ratio']:.3f}x CPU -- "
        f"{verdict} the goal <= {GOAL}x"
    )
    print(
        f"paired (median over steps of ours/TRL on the same step): {result['paired_ratio']:.3f}x; each round: "
        + ", ".join(f"{ratio:.3f}x" for ratio in result["round_ratios"])
        + " (rounds alternate who goes first)"
    )
    print(f"\nwhere a step's time goes (median seconds per step){'':>8}{'ours':>8}{'TRL':>8}{'ours-TRL':>10}")
    for phase, label in PHASES.items():
        ours_s, trl_s = result["phases_median_s"]["ours"][phase], result["phases_median_s"]["trl"][phase]
        print(f"{label:<66}{ours_s:>8.3f}{trl_s:>8.3f}{ours_s - trl_s:>+10.3f}")
    print(
        f"our HFPolicy: {result['ours_generate_calls_per_step']:.2f} generate calls per step (TRL: 1), "
        f"batch sizes {result['ours_generate_batch_sizes']}"
    )
    print(
        "math-verify calls (all steps): "
        + ", ".join(
            f"{kind} {result['math_verify_calls'].get(kind, 0)} ({result['math_verify_seconds'].get(kind, 0.0):.2f} s)"
            for kind in ("ours", "trl")
        )
        + "; mean completion tokens: "
        + ", ".join(f"{kind} {value:.1f}" for kind, value in result["mean_completion_tokens"].items())
    )
    for kind, stats in profiles.items():
        for sort in ("cumulative", "tottime"):
            print(f"\n== cProfile of steps of {kind} after the warm-up, all threads, by {sort} ==")
            print(top_costs(stats, sort, profile_lines))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args, settings = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    result, profiles = measure(args, settings)
    print_report(result, profiles, args.profile_lines)
    if args.multi_turn_steps:
        import grpo_multi_turn  # the multi-turn row, a module of its own (this one is long enough)

        rounds = 1 if args.quick else 2
        result["multi_turn"] = grpo_multi_turn.measure(args.multi_turn_steps, rounds, settings.seed)
        grpo_multi_turn.print_report(result["multi_turn"])
    print(f"total {time.perf_counter() - started:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
