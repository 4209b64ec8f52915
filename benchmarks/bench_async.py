"""Steps per second of the trainer with ``max_staleness`` K = 0, 1 and 2, side by side in one run (issue 46).

Two workloads, each trained for ``--steps`` optimizer steps per K from the same weights and seed, one K after the
other in this process (the figures share the machine's load of the moment: on a shared machine, say so with them):

- ``main_job``: the README's main job (``train/configs/demo_cpu.yaml``) with its warm start, bounded to ``--steps``
  steps, without evaluations (``python -m rllm_gym.train.grpo`` in-process through ``grpo.main``), timed from its
  ``metrics.jsonl`` (``elapsed_s`` at each logged step);
- ``latency_bound``: the same lakes with the embedded model, each env step taking ``--env-latency`` seconds more
  (``bench/SlowLake-v0``, registered here: a stand-in for a sandboxed test run or a tool call, whose latency the
  untrained model would not trigger in Code-v0 or Tool-v0, as it writes no code block and calls no tool).

The first ``--skip`` steps of each run are left out (the worker process starts then). Prints a table of steps per
second and the ratio to K = 0, and writes ``benchmarks/results/async.json`` (with the machine and CPU count).

    python benchmarks/async_grpo.py --steps 12              # about 20 minutes on 2 idle cores
"""

from __future__ import annotations

import os

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

from rllm_gym.envs.frozenlake import FrozenLakeEnv

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "async.json"
SLOW_ENV = "bench/SlowLake-v0"
ENV_LATENCY_S = 0.05


class SlowLake(FrozenLakeEnv):
    """FrozenLake whose every step takes ``latency_s`` more, as an env that runs tests or tools would."""

    def __init__(self, latency_s: float = ENV_LATENCY_S, **kwargs: Any):
        super().__init__(**kwargs)
        self.latency_s = latency_s

    def step(self, action: str):
        time.sleep(self.latency_s)
        return super().step(action)


# At import, not under __main__: the generation worker (spawned) imports this script again and must know the id.
gym.register(id=SLOW_ENV, entry_point=SlowLake)


def steps_per_second(elapsed: list[float], skip: int) -> float:
    """Steps per second from the elapsed seconds at the end of each step, the first ``skip`` steps left out."""
    timed = elapsed[skip:]
    if len(timed) < 2:
        raise ValueError(f"need at least {skip + 2} steps to time, got {len(elapsed)}")
    return (len(timed) - 1) / (timed[-1] - timed[0])


def main_job(k: int, steps: int, seed: int, folder: Path) -> list[float]:
    """The main job bounded to ``steps`` steps with ``max_staleness`` ``k``: the elapsed seconds at each step."""
    from rllm_gym.train.grpo import main

    output = folder / f"main_job_k{k}"
    main([
        "--config", str(ROOT / "train/configs/demo_cpu.yaml"), "--output_dir", str(output), "--max_steps", str(steps),
        "--eval_greedy", "false", "--eval_steps", "0", "--logging_steps", "1", "--save_steps", str(steps + 1),
        "--seed", str(seed), "--max_staleness", str(k), "--progress", "false",
    ])  # fmt: skip
    lines = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    return [line["elapsed_s"] for line in lines if line.get("step", 0) >= 1 and "loss" in line]


def latency_bound(k: int, steps: int, seed: int, folder: Path, latency_s: float) -> list[float]:
    """``steps`` steps on :class:`SlowLake` with the embedded model: the seconds at the end of each step."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig

    from rllm_gym.tiny_model import default_model_path
    from rllm_gym.train.advantages import AdvantageConfig
    from rllm_gym.train.trainer import EnvSetup, EpisodeRollout, RLLMGRPOTrainer, encode_prompt

    class Clock(TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.monotonic())

    model_dir = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = [{"prompt": encode_prompt(SLOW_ENV, seed * 1000 + index)} for index in range(8 * steps)]
    args = GRPOConfig(
        output_dir=str(folder / f"latency_k{k}"), max_completion_length=4, learning_rate=1e-3, beta=0.0,
        report_to=[], use_cpu=True, bf16=False, save_strategy="no", disable_tqdm=True, logging_steps=1,
        per_device_train_batch_size=32, num_generations=4, max_steps=steps, seed=seed,
    )  # fmt: skip
    setup = EnvSetup(SLOW_ENV, agent="rllm_gym.agents.frozenlake:FrozenLakeAgent", env_args={"latency_s": latency_s})
    rollout = EpisodeRollout([setup], max_turns=4, stop_on_truncation=False)
    clock = Clock()
    trainer = RLLMGRPOTrainer(
        model, args=args, processing_class=tokenizer, train_dataset=Dataset.from_list(rows), rollout=rollout,
        advantage_config=AdvantageConfig(), max_staleness=k, callbacks=[clock],
    )  # fmt: skip
    trainer.remove_callback(PrinterCallback)
    start = time.monotonic()
    trainer.train()
    rollout.close()
    return [end - start for end in clock.ends]


def run(arguments: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "steps": arguments.steps, "skip": arguments.skip, "seed": arguments.seed,
        "env_latency_s": arguments.env_latency, "machine": platform.platform(), "cpus": os.cpu_count(),
        "workloads": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench_async_") as folder:
        workloads = {
            "main_job": lambda k: main_job(k, arguments.steps, arguments.seed, Path(folder)),
            "latency_bound": lambda k: latency_bound(
                k, arguments.steps, arguments.seed, Path(folder), arguments.env_latency
            ),
        }
        for name in arguments.workloads:
            figures = {}
            for k in arguments.k:
                elapsed = workloads[name](k)
                figures[f"k{k}"] = {"steps_per_s": steps_per_second(elapsed, arguments.skip), "elapsed_s": elapsed}
            base = figures.get("k0", {}).get("steps_per_s")
            for figure in figures.values():
                figure["vs_k0"] = figure["steps_per_s"] / base if base else None
            results["workloads"][name] = figures
    return results


def table(results: dict[str, Any]) -> str:
    lines = [f"{'workload':<15} {'K':>2} {'steps/s':>9} {'vs K=0':>7}"]
    for name, figures in results["workloads"].items():
        for key, figure in figures.items():
            ratio = f"{figure['vs_k0']:.2f}x" if figure["vs_k0"] else "-"
            lines.append(f"{name:<15} {key[1:]:>2} {figure['steps_per_s']:>9.3f} {ratio:>7}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per run")
    parser.add_argument("--skip", type=int, default=2, help="first steps left out of the timing")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--k", type=int, nargs="+", default=[0, 1, 2], help="max_staleness values (0 first)")
    parser.add_argument("--env-latency", type=float, default=ENV_LATENCY_S, help="seconds added to each env step")
    parser.add_argument("--workloads", nargs="+", default=["main_job", "latency_bound"])
    parser.add_argument("--json", type=Path, default=RESULTS, help="where the results go")
    arguments = parser.parse_args(argv)
    results = run(arguments)
    print(table(results))
    arguments.json.parent.mkdir(parents=True, exist_ok=True)
    arguments.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {arguments.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
