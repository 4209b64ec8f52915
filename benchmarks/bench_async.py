"""Steps per second of the trainer with ``max_staleness`` K = 0, 1 and 2, side by side in one run (issue 46).

Two workloads, each trained for a bounded number of optimizer steps per K from the same weights and seed, one K after
the other in this process (the figures share the machine's load of the moment: on a shared machine, say so with them):

- ``main_job``: the README's main job (``train/configs/demo_cpu.yaml``) with its warm start, bounded to
  ``--main-steps`` steps, without evaluations (``grpo.main`` in-process), timed from its ``metrics.jsonl``
  (``elapsed_s`` at each logged step); its mean training reward over those steps is the learning per sample (every K
  trains the same number of episodes);
- ``latency_bound``: ``rllm/Code-v0`` with the embedded model for ``--latency-steps`` steps, every reply graded by the
  sandbox (:class:`FencedCodeAgent` sends the reply as a fenced Python block: the untrained model writes none, and
  Code-v0 would grade it without running anything), so each episode waits on a sandboxed test run; with the CPU
  seconds per step of the training process and of the processes below it (the worker, the sandbox's runs), whose
  sum over the cores is the fastest any K can step on this machine.

The first ``--skip`` steps of each run are left out (the worker process starts then). ``--rounds N`` runs every K
N times, interleaved (K = 0, 1, 2, then again), so that each round's ratios share the load of their moment: each K's
figure is then the median over the rounds, with every round's steps per second and ratio to that round's K = 0.
Prints a table of steps per second and the ratio to K = 0, and writes ``benchmarks/results/async.json`` (with the
machine, CPU count and load average).

    python benchmarks/bench_async.py --quick        # what run_all.py runs: 10 + 8 steps per K
    python benchmarks/bench_async.py                # 24 + 16 steps per K
    python benchmarks/bench_async.py --quick --k 0 1 --rounds 3   # K = 0 and 1 alternating, 3 times each
    python benchmarks/bench_async.py --quick --rounds 2 --trainer-threads fixed   # async_trainer_threads: fixed
"""

from __future__ import annotations

import os

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rllm_gym.agents.code import CodeAgent
from rllm_gym.train.config_checks import TRAINER_THREADS
from rllm_gym.types import ModelOutput

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "async.json"
CODE_ENV = "rllm/Code-v0"
ENV_CALLS = 32  # env calls at once on Code-v0, every K: the worker's default (WorkerSettings.env_calls)


class FencedCodeAgent(CodeAgent):
    """Code-v0's agent that sends every reply as a fenced Python block, so that the sandbox runs each one (the
    untrained model writes no fence: Code-v0 would grade its replies 0 without running anything)."""

    def parse_action(self, output: ModelOutput) -> str:
        return f"```python\n{super().parse_action(output)}\n```"


def steps_per_second(elapsed: list[float], skip: int) -> float:
    """Steps per second from the elapsed seconds at the end of each step, the first ``skip`` steps left out."""
    timed = elapsed[skip:]
    if len(timed) < 2:
        raise ValueError(f"need at least {skip + 2} steps to time, got {len(elapsed)}")
    return (len(timed) - 1) / (timed[-1] - timed[0])


def main_job(k: int, steps: int, seed: int, folder: Path, threads: str = "share") -> dict[str, list[float]]:
    """The main job bounded to ``steps`` steps with ``max_staleness`` ``k`` (and ``async_trainer_threads``
    ``threads``): the elapsed seconds and the mean reward at each step."""
    from rllm_gym.train.grpo import main

    output = folder / f"main_job_k{k}"
    main([
        "--config", str(ROOT / "train/configs/demo_cpu.yaml"), "--output_dir", str(output), "--max_steps", str(steps),
        "--eval_greedy", "false", "--eval_steps", "0", "--logging_steps", "1", "--save_steps", str(steps + 1),
        "--seed", str(seed), "--max_staleness", str(k), "--progress", "false", "--async_trainer_threads", threads,
    ])  # fmt: skip
    lines = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    logged = [line for line in lines if line.get("step", 0) >= 1 and "loss" in line]
    return {"elapsed_s": [line["elapsed_s"] for line in logged], "reward": [line["reward"] for line in logged]}


def latency_bound(
    k: int, steps: int, seed: int, folder: Path, skip: int = 2, threads: str = "share"
) -> dict[str, Any]:
    """``steps`` steps on Code-v0 with the embedded model (``async_trainer_threads`` ``threads``), each reply run by
    the sandbox: the seconds at the end of each step, and the CPU seconds per step after the first ``skip`` of this
    process and of those below it (:func:`cpu_per_step`)."""
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
            self.cpu: list[tuple[float, float | None]] = []  # at each step's end: this process's, its children's

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.monotonic())
            self.cpu.append((time.process_time(), descendants_cpu_s(os.getpid())))

    model_dir = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = [{"prompt": encode_prompt(CODE_ENV, seed * 1000 + index)} for index in range(8 * steps)]
    args = GRPOConfig(
        output_dir=str(folder / f"latency_k{k}"), max_completion_length=16, learning_rate=1e-3, beta=0.0,
        report_to=[], use_cpu=True, bf16=False, save_strategy="no", disable_tqdm=True, logging_steps=1,
        per_device_train_batch_size=32, num_generations=4, max_steps=steps, seed=seed,
    )  # fmt: skip
    # The worker (spawned) imports this module by its name to build the agent: benchmarks/ is on its sys.path.
    setup = EnvSetup(CODE_ENV, agent=f"{Path(__file__).stem}:FencedCodeAgent", agent_args={"system_prompt": ""})
    # Every K runs as many env calls at once as the asynchronous worker does (its env pool and its sandbox), so the
    # ratio to K = 0 is the overlap's, not a wider pool's.
    rollout = EpisodeRollout([setup], max_turns=1, stop_on_truncation=False, env_workers=ENV_CALLS)
    clock = Clock()
    trainer = RLLMGRPOTrainer(
        model, args=args, processing_class=tokenizer, train_dataset=Dataset.from_list(rows), rollout=rollout,
        advantage_config=AdvantageConfig(), max_staleness=k, callbacks=[clock], async_trainer_threads=threads,
    )  # fmt: skip
    trainer.remove_callback(PrinterCallback)
    start = time.monotonic()
    try:
        trainer.train()
    finally:
        rollout.close()
    return {"elapsed_s": [end - start for end in clock.ends], **cpu_per_step(clock.cpu, skip)}


def descendants_cpu_s(pid: int) -> float | None:
    """CPU seconds so far of every process below ``pid`` (the generation worker, the sandbox's fork server and its
    runs; a run's seconds count once its parent reaped it), from ``/proc``; None where there is none."""
    proc = Path("/proc")
    if not (proc / str(pid) / "stat").exists():
        return None
    children: dict[int, list[tuple[int, float]]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in proc.iterdir():
        if not entry.name.isdigit():  # self, thread-self, and what is not a process
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # gone
            continue
        own_and_reaped = sum(int(value) for value in fields[11:15]) / tick  # utime, stime, cutime, cstime
        children.setdefault(int(fields[1]), []).append((int(entry.name), own_and_reaped))
    total, below = 0.0, [pid]
    while below:
        for child, seconds in children.get(below.pop(), []):
            total += seconds
            below.append(child)
    return total


def cpu_per_step(marks: list[tuple[float, float | None]], skip: int) -> dict[str, float]:
    """The mean CPU seconds per timed step of the training process (``trainer_cpu_s``: generation and env calls
    too, with K = 0) and of the processes below it (``children_cpu_s``: the worker, sandbox runs), from their totals
    at each step's end (``marks``), the first ``skip`` steps left out."""
    timed = marks[skip:]
    if len(timed) < 2:
        return {}
    steps = len(timed) - 1
    figures = {"trainer_cpu_s": (timed[-1][0] - timed[0][0]) / steps}
    if timed[0][1] is not None and timed[-1][1] is not None:
        figures["children_cpu_s"] = (timed[-1][1] - timed[0][1]) / steps
    return figures


def summarize(rounds: list[dict[int, float]]) -> dict[int, dict[str, Any]]:
    """Each K's steps per second over interleaved ``rounds`` (one ``{K: steps/s}`` each): the median, every round's
    figure, and the ratios to K = 0 (the medians', and each round's to the same round's K = 0)."""
    summary: dict[int, dict[str, Any]] = {}
    for k in rounds[0]:
        figures = [measured[k] for measured in rounds]
        base = [measured.get(0) for measured in rounds]
        summary[k] = {
            "steps_per_s": statistics.median(figures),
            "rounds_steps_per_s": figures,
            "rounds_vs_k0": [figure / b if b else None for figure, b in zip(figures, base, strict=True)],
        }
    base_median = summary.get(0, {}).get("steps_per_s")
    for figure in summary.values():
        figure["vs_k0"] = figure["steps_per_s"] / base_median if base_median else None
    return summary


def run(arguments: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "main_steps": arguments.main_steps, "latency_steps": arguments.latency_steps, "skip": arguments.skip,
        "seed": arguments.seed, "rounds": arguments.rounds, "trainer_threads": arguments.trainer_threads,
        "machine": platform.platform(), "cpus": os.cpu_count(),
        "load_average_start": round(os.getloadavg()[0], 2), "workloads": {},
    }  # fmt: skip
    # The trainer's own sandbox (K = 0 grades in this process) runs as many at once as the worker's.
    os.environ["RLLM_GYM_SANDBOX_MAX_PARALLEL"] = str(ENV_CALLS)
    results["env_calls"] = ENV_CALLS
    with tempfile.TemporaryDirectory(prefix="bench_async_") as folder:
        workloads = {
            "main_job": lambda k, out: main_job(
                k, arguments.main_steps, arguments.seed, out, arguments.trainer_threads
            ),
            "latency_bound": lambda k, out: latency_bound(
                k, arguments.latency_steps, arguments.seed, out, arguments.skip, arguments.trainer_threads
            ),
        }
        for name in arguments.workloads:
            rounds: list[dict[int, float]] = []
            first: dict[int, dict[str, Any]] = {}  # the first round's per-step figures
            for index in range(arguments.rounds):
                out = Path(folder) / f"{name}_round{index}"
                out.mkdir()
                measured_round = {}
                for k in arguments.k:
                    measured = workloads[name](k, out)
                    measured_round[k] = steps_per_second(measured["elapsed_s"], arguments.skip)
                    first.setdefault(k, measured)
                rounds.append(measured_round)
            figures = {}
            for k, summary in summarize(rounds).items():
                figure = {**summary, **first[k]}
                if "reward" in first[k]:  # every K trains as many episodes: the reward at equal samples
                    figure["mean_reward"] = statistics.fmean(first[k]["reward"])
                figures[f"k{k}"] = figure
            results["workloads"][name] = figures
    results["load_average_end"] = round(os.getloadavg()[0], 2)
    return results


def table(results: dict[str, Any]) -> str:
    lines = [f"{'workload':<15} {'K':>2} {'steps/s':>9} {'vs K=0':>7} {'reward':>7}"]
    for name, figures in results["workloads"].items():
        for key, figure in figures.items():
            ratio = f"{figure['vs_k0']:.2f}x" if figure["vs_k0"] else "-"
            reward = f"{figure['mean_reward']:.3f}" if "mean_reward" in figure else "-"
            line = f"{name:<15} {key[1:]:>2} {figure['steps_per_s']:>9.3f} {ratio:>7} {reward:>7}"
            if "trainer_cpu_s" in figure:  # what a 2-core ceiling follows from
                below = figure.get("children_cpu_s")
                line += f"  cpu/step {figure['trainer_cpu_s']:.2f} s" + (f" + {below:.2f} s below" if below else "")
            if len(figure.get("rounds_vs_k0", [])) > 1:  # each round's ratio to its own K = 0
                line += "  rounds " + " ".join(f"{r:.2f}x" if r else "-" for r in figure["rounds_vs_k0"])
            lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 main-job and 8 latency-bound steps per K")
    parser.add_argument("--main-steps", type=int, help="optimizer steps of each main-job run (default 24, quick 10)")
    parser.add_argument("--latency-steps", type=int, help="optimizer steps of each Code-v0 run (default 16, quick 8)")
    parser.add_argument("--skip", type=int, default=2, help="first steps left out of the timing")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--k", type=int, nargs="+", default=[0, 1, 2], help="max_staleness values (0 first)")
    parser.add_argument("--workloads", nargs="+", default=["main_job", "latency_bound"])
    parser.add_argument("--rounds", type=int, default=1, help="runs of every K, interleaved (medians reported)")
    parser.add_argument("--trainer-threads", choices=TRAINER_THREADS, default="share",
                        help="async_trainer_threads of the K >= 1 runs (default share)")  # fmt: skip
    parser.add_argument("--json", type=Path, default=RESULTS, help="where the results go")
    arguments = parser.parse_args(argv)
    if arguments.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {arguments.rounds}")
    if arguments.main_steps is None:
        arguments.main_steps = 10 if arguments.quick else 24
    if arguments.latency_steps is None:
        arguments.latency_steps = 8 if arguments.quick else 16
    results = run(arguments)
    print(table(results))
    arguments.json.parent.mkdir(parents=True, exist_ok=True)
    arguments.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {arguments.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
