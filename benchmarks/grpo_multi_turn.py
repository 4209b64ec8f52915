"""The multi-turn row of ``bench_grpo.py``: seconds per GRPO step on FrozenLake (several turns, the tiny model, CPU)
with each LLM call's prompt continuing the previous call's prompt and sampled tokens (``token_history="sampled"``,
token in, token out: a trajectory is one training row) against the same trainer re-rendering the whole chat every
call (``token_history="template"``, what the policies did before issue 32: a row splits wherever the tokenizer
re-spells a sampled reply or the length limit cut one). The two take turns step by step in one process (see
``_grpo_common.run_interleaved``), so both see the same machine load; the rows per trajectory and turns are TRL's
logged ``rollout/`` metrics. ``bench_grpo.py`` runs it after its single-turn table; alone:

    python benchmarks/grpo_multi_turn.py --steps 4 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from _grpo_common import StepTimer, TrainerSettings, grpo_args, instrument, run_interleaved, summarize
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.trainer_callback import PrinterCallback
from trl import GRPOTrainer

from rllm_gym.tiny_model import build_tiny_model
from rllm_gym.train.advantages import AdvantageConfig
from rllm_gym.train.trainer import EnvSetup, EpisodeRollout, RLLMGRPOTrainer, encode_prompt

MULTI_TURN_ENV = "rllm/FrozenLake-v0"


@dataclass
class MultiTurnSettings(TrainerSettings):
    """The multi-turn step: FrozenLake episodes of up to ``max_turns`` LLM calls; a reply cut by the length limit is
    stepped and the episode goes on (so most episodes take several turns with the tiny model)."""

    prompts_per_step: int = 4
    num_generations: int = 4
    max_completion_length: int = 12
    warmup: int = 1
    max_turns: int = 4


def build_multi_turn_trainer(
    kind: str,
    model_path: Path,
    settings: MultiTurnSettings,
    data: Dataset,
    output_dir: str,
    max_steps: int,
    timer: StepTimer,
) -> GRPOTrainer:
    """Our trainer on FrozenLake with ``token_history=kind`` (``"sampled"`` or ``"template"``)."""
    torch.manual_seed(settings.seed)
    rollout = EpisodeRollout(
        [EnvSetup(MULTI_TURN_ENV, agent_args={"observation_template": "{observation}"})],
        max_turns=settings.max_turns,
        stop_on_truncation=False,
        token_history=kind,
    )
    trainer = RLLMGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_path),
        processing_class=AutoTokenizer.from_pretrained(model_path),
        args=grpo_args(settings, output_dir, max_steps),
        train_dataset=data,
        callbacks=[timer],
        rollout=rollout,
        advantage_config=AdvantageConfig(estimator="grpo", mode="broadcast"),
    )
    trainer.remove_callback(PrinterCallback)
    instrument(trainer, "ours")
    return trainer


def measure(steps: int, rounds: int, seed: int) -> dict[str, Any]:
    """Seconds per multi-turn step with ``token_history="sampled"`` and ``"template"``, interleaved step by step in
    the same run (rounds alternate who starts), with the rows per trajectory and turns each trained."""
    settings = MultiTurnSettings(seed=seed)
    kinds = ["sampled", "template"]
    wall: dict[str, list[float]] = {kind: [] for kind in kinds}
    logs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    max_steps = settings.warmup + steps
    with tempfile.TemporaryDirectory(prefix="bench-grpo-multi-turn-") as model_dir:
        model_path = build_tiny_model(model_dir, seed=settings.seed)
        seeds = range(settings.prompts_per_step * max_steps)
        dataset = Dataset.from_list([{"prompt": encode_prompt(MULTI_TURN_ENV, task)} for task in seeds])
        for round_index in range(rounds):
            order = kinds if round_index % 2 == 0 else kinds[::-1]
            data = dict.fromkeys(order, dataset)
            timers, _ = run_interleaved(order, model_path, settings, data, max_steps, build_multi_turn_trainer)
            for kind, timer in timers.items():
                wall[kind] += timer.wall[settings.warmup :]
                logs[kind].append(timer.logs)
                print(
                    f"multi-turn round {round_index + 1} {kind:>8} s/step: " + " ".join(f"{x:.3f}" for x in timer.wall)
                )
    rows = {kind: summarize(values) for kind, values in wall.items()}

    def logged(kind: str, name: str) -> float:
        return statistics.mean(entry.get(name, float("nan")) for entry in logs[kind])

    return {
        "settings": {**asdict(settings), "steps": steps, "rounds": rounds, "env": MULTI_TURN_ENV},
        **rows,
        "ratio": rows["sampled"]["median_s"] / rows["template"]["median_s"],
        "rows_per_trajectory": {kind: logged(kind, "rollout/rows_per_trajectory") for kind in kinds},
        "prefix_mismatch": {kind: logged(kind, "rollout/prefix_mismatch") for kind in kinds},
        "turns": {kind: logged(kind, "rollout/turns") for kind in kinds},
    }


def print_report(result: dict[str, Any]) -> None:
    s = result["settings"]
    print(
        f"\nmulti-turn GRPO step: {s['env']}, up to {s['max_turns']} turns, {s['prompts_per_step']} prompts x "
        f"{s['num_generations']} generations, {s['max_completion_length']} tokens a reply, tiny model, CPU; "
        f"steps interleaved, {s['warmup']} warm-up step(s) dropped"
    )
    print(f"{'prompt tokens':<44}{'median s/step':>14}{'mean':>8}{'rows/traj':>11}{'turns':>7}{'steps':>7}")
    for kind, label in (
        ("sampled", "continued (token in, token out: ours)"),
        ("template", "re-rendered chat (before)"),
    ):
        row = result[kind]
        print(
            f"{label:<44}{row['median_s']:>14.3f}{row['mean_s']:>8.3f}{result['rows_per_trajectory'][kind]:>11.2f}"
            f"{result['turns'][kind]:>7.2f}{row['n']:>7}"
        )
    print(f"ratio continued/re-rendered: {result['ratio']:.3f}x wall (median)")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="timed steps of each trainer per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (they alternate which trainer starts)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    result = measure(args.steps, args.rounds, seed=0)
    print_report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
