"""`rllm-gym eval --policy vllm` on the embedded model, in a process of its own: it runs episodes through real vLLM
and exits without noise (vLLM's ``AsyncLLM.__del__`` used to print a TypeError during interpreter teardown; the CLI
never calls ``shutdown``, so this is the policy's exit hook at work)."""

from __future__ import annotations

import json
import subprocess
import sys

# What stderr must not hold at exit. vLLM's own start-up warnings (missing tcmalloc, Triton) are not noise at exit.
NOISE = ("Traceback", "Exception ignored", "TypeError", "leaked", "Error")


def test_eval_with_vllm_runs_and_exits_quietly(vllm_model_dir, tmp_path):
    out = tmp_path / "episodes.jsonl"
    command = [sys.executable, "-m", "rllm_gym.cli", "eval", "--policy", "vllm", "--model", str(vllm_model_dir)]
    command += ["--tasks", "2", "--n", "2", "--max-turns", "2", "--max-tokens", "8", "--out", str(out), "--json"]
    command += ["--no-progress"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if any(word in line for word in NOISE)]
    assert not lines, "\n".join(lines)
    episodes = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(episodes) == 4
    step = episodes[0]["trajectories"][0]["steps"][0]
    assert step["response_ids"] and len(step["logprobs"]) == len(step["response_ids"])
