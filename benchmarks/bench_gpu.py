"""GPU speed of rllm-gym's trainer with each generation backend, against TRL's plain GRPOTrainer with vLLM.

Generation tokens per second and seconds per GRPO step for our trainer (:class:`RLLMGRPOTrainer`: env, agent,
engine) generating with HFPolicy (``use_vllm: false``), with vLLM colocated in the training process and with a
`trl vllm-serve` server, each as a ratio to TRL's plain ``GRPOTrainer`` with colocated vLLM, all on the same model,
the same single-turn task (``rllm/Math-v0``'s offline problems, the same prompts as benchmarks/bench_grpo.py) and
settings: fp32 master weights with bf16 autocast (as train/configs/qwen_math_1gpu.yaml), micro-batches of
``micro_batch`` rollouts (gradient accumulation over the step's 128) and activation checkpointing. Each backend runs in
a process of its own (a fresh CUDA context and vLLM engine); the server runs on the last GPU and needs 2 GPUs (NCCL
cannot pair two processes on one GPU for the weight sync), else it is recorded as skipped. Generation seconds are
where each trainer generates: TRL's ``_generate``, and for ours the rollout's call (engine, env, agent, policy), which
runs before TRL's part of the batch building (our ``_generate`` only hands over rows collected earlier), both without
vLLM's weight sync (TRL's runs inside ``_generate``; it is recorded apart, ``weight_sync_seconds``); tokens are
TRL's ``completions/mean_length`` x rollouts. The first ``--warmup`` steps are dropped; figures are medians.

Memory (one 80 GB GPU; :func:`memory_estimate_gib`, recorded in the results): fp32 weights, gradients and AdamW
states take 16 bytes a parameter (0.5B: 7.4 GiB, 1.5B: 23.0 GiB), autocast's bf16 weight copies 2 more, the
colocated vLLM ``vllm_gpu_memory_utilization`` x 80 GB (22.4 GiB), a micro-batch's activations with checkpointing
(16 rollouts x 1,280 tokens; 1.5B: 3.7 GiB) and its completion logits (16 x 256 x 151,936 x 8 bytes: 4.6 GiB), plus
3 GiB of CUDA context: about 40 GiB for 0.5B and 60 GiB for 1.5B. The earlier settings (one micro-batch of all 128
rollouts, no checkpointing) come to about 290 and 550 GiB.

Without ``--model`` a random-weight model of Qwen2.5-0.5B's size is built
(:mod:`rllm_gym.qwen_random`): its replies run to ``max_completion_length``, so every backend generates the same
token count. Results go to ``benchmarks/results/gpu.json`` with the device name and the versions of torch, vLLM,
TRL and transformers.

    python benchmarks/bench_gpu.py                                  # random Qwen2.5-0.5B, about 10 minutes
    python benchmarks/bench_gpu.py --model /path/to/Qwen2.5-0.5B-Instruct --steps 10
    python benchmarks/bench_gpu.py --dry-run --json /tmp/gpu.json   # the plumbing on a CPU: tiny model, no vLLM

Without a CUDA GPU (and without ``--dry-run``) it says so and exits with status 2.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import argparse
import dataclasses
import json
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "gpu.json"
BASELINE = {"gpu": "trl_vllm", "dry": "trl"}
KINDS = {
    "gpu": ("trl_vllm", "hf", "colocate", "server"),
    "dry": ("trl", "hf"),  # on the CPU: TRL without vLLM, ours with HFPolicy
}
DESCRIPTIONS = {
    "trl_vllm": "TRL GRPOTrainer, vLLM colocate (baseline)",
    "trl": "TRL GRPOTrainer, transformers generate (baseline)",
    "hf": "ours, HFPolicy",
    "colocate": "ours, vLLM colocate",
    "server": "ours, vLLM server (trl vllm-serve)",
}
# `trl vllm-serve` without relying on the console script being on PATH (pip --target installs leave it out).
TRL_CLI = "import sys; from trl.cli import main; sys.exit(main())"
NO_CUDA = (
    "bench_gpu.py needs a CUDA GPU and torch.cuda.is_available() is False here; "
    "run it on a GPU machine, or pass --dry-run to check its plumbing on the CPU"
)


@dataclasses.dataclass
class Settings:
    prompts_per_step: int = 16
    num_generations: int = 8
    max_completion_length: int = 256
    max_prompt_length: int = 1024  # bounds vLLM's context (max_model_len = this + max_completion_length)
    micro_batch: int = 16  # rollouts per forward and backward; the step accumulates rollouts / micro_batch of them
    activation_checkpointing: bool = True
    learning_rate: float = 1e-6
    steps: int = 8
    warmup: int = 2
    vllm_gpu_memory_utilization: float = 0.3
    seed: int = 0


DRY_SETTINGS = Settings(
    prompts_per_step=2, num_generations=2, max_completion_length=8, micro_batch=2, steps=2, warmup=1
)
GIB = 2**30


def memory_estimate_gib(config: Any, settings: Settings, gpu_gb: float = 80.0) -> dict[str, Any]:
    """Peak memory of one training process on the GPU (vLLM colocated) for a model of ``config`` (a transformers
    config) under ``settings``, in GiB, term by term, and whether it fits ``gpu_gib`` with 5% to spare.

    Per parameter: fp32 weights, gradients and AdamW's two states (16 bytes) and the bf16 copies autocast keeps
    during a forward (2). Per token of a micro-batch (prompt and completion at their bounds) and layer: about
    24 x hidden + 8 x intermediate bytes of activations (bf16 projections, fp32 residual stream and norms); with
    activation checkpointing only each layer's bf16 input is kept, plus one layer recomputed. Per completion token:
    the vocabulary's logits, about 8 bytes each (bf16 logits, their temperature-scaled copy and their gradient).
    """
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        parameters = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    hidden, layers = config.hidden_size, config.num_hidden_layers
    tokens = settings.micro_batch * (settings.max_prompt_length + settings.max_completion_length)
    per_layer = tokens * (24 * hidden + 8 * config.intermediate_size)
    kept = tokens * hidden * 2 * layers + per_layer if settings.activation_checkpointing else per_layer * layers
    terms = {
        "weights_gradients_adamw_fp32": 16 * parameters / GIB,
        "bf16_weight_copies": 2 * parameters / GIB,
        "vllm_colocated": settings.vllm_gpu_memory_utilization * gpu_gb * 1e9 / GIB,
        "activations": kept / GIB,
        "logits": settings.micro_batch * settings.max_completion_length * config.vocab_size * 8 / GIB,
        "cuda_context": 3.0,
    }
    total = sum(terms.values())
    return {
        "parameters": parameters,
        **terms,
        "total": total,
        "gpu_gb": gpu_gb,
        "fits": total <= 0.95 * gpu_gb * 1e9 / GIB,
    }


# One backend, in its own process


def measure(kind: str, model_path: str, settings: Settings, server_url: str | None = None) -> dict[str, Any]:
    """Train ``settings.steps`` steps with backend ``kind``; per step: wall seconds, generation seconds, tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, str(HERE))
    import bench_grpo  # the CPU benchmark's prompts and reward, and the step timer and phase clocks it imports

    from rllm_gym.train.advantages import AdvantageConfig
    from rllm_gym.train.trainer import EnvSetup, EpisodeRollout, RLLMGRPOTrainer

    class Lengths(TrainerCallback):
        def __init__(self) -> None:
            self.mean_lengths: list[float] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                self.mean_lengths.append(float(logs["completions/mean_length"]))

    on_gpu = torch.cuda.is_available()
    tasks = bench_grpo.math_tasks(settings.prompts_per_step * settings.steps, settings.seed)
    ours_data, plain_data = bench_grpo.datasets(tasks)
    torch.manual_seed(settings.seed)
    # fp32 master weights, bf16 autocast on the GPU: AdamW's updates at lr 1e-6 would round away in bf16 weights.
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    use_vllm = kind in ("trl_vllm", "colocate", "server")
    output_dir = tempfile.mkdtemp(prefix=f"bench_gpu_{kind}_")
    fields = GRPOConfig.__dataclass_fields__
    rollouts = settings.prompts_per_step * settings.num_generations
    if rollouts % settings.micro_batch:
        raise ValueError(f"micro_batch ({settings.micro_batch}) must divide the step's {rollouts} rollouts")
    args = GRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=settings.micro_batch,
        gradient_accumulation_steps=rollouts // settings.micro_batch,  # one generation per step (TRL's default)
        num_generations=settings.num_generations,
        max_completion_length=settings.max_completion_length,
        learning_rate=settings.learning_rate,
        loss_type="dapo",
        beta=0.0,
        temperature=1.0,
        max_steps=settings.steps,
        logging_steps=1,
        seed=settings.seed,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=not on_gpu,
        bf16=on_gpu,
        use_vllm=use_vllm,
        vllm_mode="server" if kind == "server" else "colocate",
        vllm_server_base_url=server_url,
        vllm_gpu_memory_utilization=settings.vllm_gpu_memory_utilization,
        vllm_max_model_length=settings.max_prompt_length + settings.max_completion_length if use_vllm else None,
        # transformers 5 renamed gradient_checkpointing; the same setting for every backend.
        **{
            next(n for n in ("activation_checkpointing", "gradient_checkpointing") if n in fields): (
                settings.activation_checkpointing
            )
        },
    )
    timer, lengths = bench_grpo.StepTimer(kind), Lengths()
    common = dict(model=model, processing_class=tokenizer, args=args, callbacks=[timer, lengths])
    if kind in ("trl", "trl_vllm"):
        trainer = GRPOTrainer(**common, train_dataset=plain_data, reward_funcs=[bench_grpo.trl_math_reward])
    else:
        trainer = RLLMGRPOTrainer(
            **common,
            train_dataset=ours_data,
            rollout=EpisodeRollout([EnvSetup(bench_grpo.ENV_ID)], max_turns=1),
            advantage_config=AdvantageConfig(estimator="grpo", mode="broadcast"),
        )
    trainer.remove_callback(PrinterCallback)
    bench_grpo.instrument(trainer, "trl" if kind.startswith("trl") else "ours")
    trainer.train()
    return {
        "micro_batch": trainer.args.per_device_train_batch_size,
        "gradient_accumulation_steps": trainer.args.gradient_accumulation_steps,
        "step_seconds": timer.wall,
        # TRL syncs vLLM's weights inside _generate, ours before the rollout: generation is counted without it.
        "generate_seconds": [
            phases.get("generate", 0.0) - (phases.get("sync_weights", 0.0) if kind.startswith("trl") else 0.0)
            for phases in timer.phases
        ],
        "weight_sync_seconds": [phases.get("sync_weights", 0.0) for phases in timer.phases],
        "completion_tokens": [length * rollouts for length in lengths.mean_lengths],
    }


def summarize(run: dict[str, Any], warmup: int) -> dict[str, Any]:
    steps, generate = run["step_seconds"][warmup:], run["generate_seconds"][warmup:]
    tokens = run["completion_tokens"][warmup:]
    return {
        "step_median_s": statistics.median(steps),
        "generate_median_s": statistics.median(generate),
        "generation_tokens_per_s": sum(tokens) / sum(generate) if sum(generate) > 0 else None,
        "steps_timed": len(steps),
        **run,
    }


# The orchestration: one process per backend, a server for server mode


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model_path: str, settings: Settings, gpu: int) -> tuple[subprocess.Popen, str]:
    """`trl vllm-serve` on GPU ``gpu``; returns once its /health/ answers (or raises with the server's log)."""
    port, log = free_port(), Path(tempfile.mkstemp(prefix="vllm_serve_", suffix=".log")[1])
    command = [sys.executable, "-c", TRL_CLI, "vllm-serve", "--model", model_path, "--port", str(port)]
    command += ["--gpu_memory_utilization", "0.5", "--max_model_len", str(1024 + settings.max_completion_length)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
    with log.open("w") as stdout:  # the child keeps its own copy of the file descriptor
        server = subprocess.Popen(command, env=env, stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"trl vllm-serve exited with {server.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health/", timeout=2):
                return server, url
        except OSError:
            time.sleep(2)
    stop(server)
    raise RuntimeError(f"trl vllm-serve did not answer in 600 s:\n{log.read_text()[-4000:]}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def run_isolated(kind: str, model_path: str, settings: Settings, gpu: int, server_url: str | None) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "run.json"
        command = [sys.executable, __file__, "--worker", kind, "--model", model_path, "--out", str(out)]
        command += ["--settings", json.dumps(dataclasses.asdict(settings))]
        command += ["--server-url", server_url] if server_url else []
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu), "PYTHONUNBUFFERED": "1"}
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            return {"error": f"exit status {result.returncode}", "log_tail": (result.stdout + result.stderr)[-4000:]}
        return json.loads(out.read_text())


def run_kind(kind: str, model_path: str, settings: Settings, dry_run: bool) -> dict[str, Any]:
    if dry_run:
        return measure(kind, model_path, settings)
    if kind != "server":
        return run_isolated(kind, model_path, settings, gpu=0, server_url=None)
    import torch

    if torch.cuda.device_count() < 2:
        return {"skipped": f"server mode needs 2 GPUs (server and trainer), {torch.cuda.device_count()} visible"}
    server_gpu = torch.cuda.device_count() - 1
    server, url = start_server(model_path, settings, server_gpu)
    try:
        return run_isolated(kind, model_path, settings, gpu=0, server_url=url)
    finally:
        stop(server)


def versions() -> dict[str, str | None]:
    found = {}
    for name in ("torch", "vllm", "trl", "transformers", "accelerate", "deepspeed"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({platform.processor() or 'cpu'})"


def gpu_memory_gb() -> float:
    """The GPU's memory in GB (10^9 bytes, as vLLM's share is taken of it); 80 without one (the target card)."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory / 1e9 if torch.cuda.is_available() else 80.0


def bench(args: argparse.Namespace) -> dict[str, Any]:
    mode = "dry" if args.dry_run else "gpu"
    settings = DRY_SETTINGS if args.dry_run else Settings()
    overrides = {
        "steps": args.steps,
        "warmup": args.warmup,
        "max_completion_length": args.max_completion_length,
        "micro_batch": args.micro_batch,
    }
    settings = dataclasses.replace(settings, **{k: v for k, v in overrides.items() if v is not None})
    if settings.steps <= settings.warmup:
        raise SystemExit(f"--steps ({settings.steps}) must exceed --warmup ({settings.warmup})")
    with tempfile.TemporaryDirectory() as folder:
        model_path = args.model
        if model_path is None and args.dry_run:
            from rllm_gym.tiny_model import build_tiny_model

            model_path = str(build_tiny_model(Path(folder) / "tiny"))
        elif model_path is None:
            from rllm_gym.qwen_random import build_random_qwen

            model_path = str(build_random_qwen(Path(folder) / "qwen", args.arch))
        from transformers import AutoConfig

        memory = memory_estimate_gib(AutoConfig.from_pretrained(model_path), settings, gpu_memory_gb())
        if not memory["fits"]:
            print(f"[bench_gpu] warning: estimated {memory['total']:.1f} GiB exceeds the GPU's", file=sys.stderr)
        runs = {}
        for kind in args.kinds or KINDS[mode]:
            print(f"[bench_gpu] {DESCRIPTIONS[kind]} ...", file=sys.stderr, flush=True)
            run = run_kind(kind, model_path, settings, args.dry_run)
            runs[kind] = summarize(run, settings.warmup) if "step_seconds" in run else run
    baseline = runs.get(BASELINE[mode], {})
    for run in runs.values():
        if "step_median_s" in run and "step_median_s" in baseline:
            run["step_ratio_to_baseline"] = run["step_median_s"] / baseline["step_median_s"]
            ours, theirs = run["generation_tokens_per_s"], baseline["generation_tokens_per_s"]
            run["generation_ratio_to_baseline"] = ours / theirs if ours and theirs else None
    return {
        "device": device_name(),
        "versions": versions(),
        "mode": mode,
        "model": args.model or ("tiny (built offline)" if args.dry_run else f"{args.arch}, random weights"),
        "baseline": BASELINE[mode],
        "settings": dataclasses.asdict(settings),
        "memory_estimate_gib": memory,
        "results": runs,
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"{result['device']}  model: {result['model']}  versions: {result['versions']}")
    memory = result["memory_estimate_gib"]
    print(f"memory estimate: {memory['total']:.1f} GiB of {memory['gpu_gb']:.0f} GB (memory_estimate_gib)")
    print(f"{'backend':44} {'s/step':>8} {'ratio':>7} {'gen tok/s':>10} {'ratio':>7}")
    for kind, run in result["results"].items():
        if "step_median_s" not in run:
            print(f"{DESCRIPTIONS[kind]:44} {run.get('skipped') or run.get('error')}")
            continue
        tokens = run["generation_tokens_per_s"]
        step_ratio, gen_ratio = run.get("step_ratio_to_baseline"), run.get("generation_ratio_to_baseline")
        print(
            f"{DESCRIPTIONS[kind]:44} {run['step_median_s']:8.3f} {step_ratio or float('nan'):7.2f} "
            f"{tokens or float('nan'):10.0f} {gen_ratio or float('nan'):7.2f}"
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model folder (default: a random-weight model of --arch; tiny on --dry-run)")
    parser.add_argument("--arch", default="Qwen2.5-0.5B", help="architecture of the random-weight model")
    parser.add_argument("--kinds", nargs="+", choices=sorted(DESCRIPTIONS), help="backends to run (default: all)")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--max-completion-length", type=int, default=None)
    parser.add_argument("--micro-batch", type=int, default=None, help="rollouts per forward/backward (default 16)")
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"where to save the results (default: {RESULTS})")
    parser.add_argument("--dry-run", action="store_true", help="CPU plumbing check: tiny model, TRL and HFPolicy")
    parser.add_argument("--worker", choices=sorted(DESCRIPTIONS), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--server-url", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:  # one backend in this process, for the orchestrating process
        run = measure(args.worker, args.model, Settings(**json.loads(args.settings)), args.server_url)
        args.out.write_text(json.dumps(run))
        return 0
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print(NO_CUDA, file=sys.stderr)
        return 2
    result = bench(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print_table(result)
    print(f"saved {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
