"""Training with TRL's own vLLM integration on vLLM's CPU build (README, "vLLM on a CPU").

- ``colocate``: TRL starts ``vllm.LLM`` in the training process; its weight sync (``model.load_weights`` one
  parameter at a time, ``trl/generation/vllm_generation.py`` ``sync_weights``) cannot load on a CPU, where vLLM's
  ``UnquantizedLinearMethod.process_weights_after_loading`` (``vllm/model_executor/layers/linear.py``) packs each
  linear weight into the CPU GEMM kernel and leaves an empty ``layer.weight`` without a ``weight_loader``.
  ``rllm_gym.train.vllm_cpu`` loads through another path of vLLM's own, and the trainer uses it there: tested here
  on a real engine against transformers, and by training.
- ``server``: ``trl vllm-serve`` execs ``python -m vllm.entrypoints.cli.main serve``, whose ``main`` asks
  ``importlib.metadata.version("vllm")``; the CPU build's distribution is named ``vllm-cpu``, so it stops before
  serving. (Its weight push would also need NCCL: ``--weight-transfer-config {"backend": "nccl"}``.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def llm(vllm_model_dir):
    """A vLLM engine in this process (as TRL's colocate mode runs it), float32 like the trainer."""
    import vllm

    from rllm_gym.policies.vllm import CPU_KV_CACHE_BYTES

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the model in this process, reachable as TRL reaches it
        engine = vllm.LLM(
            model=str(vllm_model_dir), dtype="float32", enforce_eager=True, kv_cache_memory_bytes=CPU_KV_CACHE_BYTES
        )
    yield engine
    del engine


def _max_logprob_gap(llm, reference) -> float:
    import vllm

    prompt = [5, 6, 7, 8, 9, 10]
    params = vllm.SamplingParams(max_tokens=12, min_tokens=12, temperature=1.0, seed=1, logprobs=0)
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0]
    ids = torch.tensor([prompt + list(out.token_ids)])
    with torch.no_grad():
        logits = reference(ids).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
    got = torch.tensor([entry[token].logprob for token, entry in zip(out.token_ids, out.logprobs, strict=True)])
    return float((expected - got).abs().max())


def test_pyproject_allows_the_vllm_range_the_adapter_checks():
    import tomllib

    from packaging.specifiers import SpecifierSet

    from rllm_gym.train.trl_adapter import SUPPORTED_VLLM

    (requirement,) = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    assert SpecifierSet(requirement.removeprefix("vllm")) == SUPPORTED_VLLM


def test_the_adapter_reaches_the_colocated_model_where_vllm_keeps_it(llm, monkeypatch):
    import vllm

    from rllm_gym.train import trl_adapter

    internal = trl_adapter.INTERNALS["driver_worker"]
    # Fails when a vLLM upgrade moved the engine's model: update train/trl_adapter.py (INTERNALS says what for).
    assert internal.present(), f"vLLM {vllm.__version__} moved {internal.where}.driver_worker (or left SUPPORTED_VLLM)"
    (public,) = llm.apply_model(lambda model: model)  # vLLM's public path: the same object in an in-process engine
    trl_adapter._driver_worker_usable.cache_clear()
    assert trl_adapter.colocated_vllm_model(llm) is public
    for moved in (
        {"present": lambda: False},  # the name moved: the public path, with one warning
        None,  # a vLLM outside the supported range: the same
    ):
        trl_adapter._driver_worker_usable.cache_clear()
        with monkeypatch.context() as patch:
            if moved:
                patch.setitem(trl_adapter.INTERNALS, "driver_worker", dataclasses.replace(internal, **moved))
            else:
                patch.setattr(vllm, "__version__", "0.99.0")
                assert not internal.present()
            fallback = re.escape("falling back to: vLLM's public LLM.apply_model")
            with pytest.warns(RuntimeWarning, match=fallback) as got:
                assert trl_adapter.colocated_vllm_model(llm) is public
                assert trl_adapter.colocated_vllm_model(llm) is public
            assert len([w for w in got if issubclass(w.category, RuntimeWarning)]) == 1
    trl_adapter._driver_worker_usable.cache_clear()


def test_weights_load_into_a_packed_cpu_engine_the_trainers_way_fails_ours_works(llm, vllm_model_dir):
    from rllm_gym.train.trl_adapter import colocated_vllm_model
    from rllm_gym.train.vllm_cpu import load_weights_on_cpu, on_cpu

    assert on_cpu()
    model = colocated_vllm_model(llm)
    trained = AutoModelForCausalLM.from_pretrained(vllm_model_dir, dtype=torch.float32).eval()
    assert _max_logprob_gap(llm, trained) < 1e-3
    # What TRL's sync does, one parameter at a time: refused by the packed linear layers.
    linear = "model.layers.0.self_attn.q_proj.weight"
    with pytest.raises(AttributeError, match="'Parameter' object has no attribute 'weight_loader'"):
        model.load_weights([(linear, trained.get_parameter(linear).data)])
    for _ in range(2):  # two syncs in a row, as in training: the second finds its own re-packed layers
        with torch.no_grad():
            for param in trained.parameters():
                param.add_(torch.randn_like(param) * 0.05)
        gap_before = _max_logprob_gap(llm, trained)
        load_weights_on_cpu(model, ((name, param.data) for name, param in trained.named_parameters()))
        llm.reset_prefix_cache()
        assert gap_before > 0.01 and _max_logprob_gap(llm, trained) < 1e-3  # the engine now has the new weights


def test_colocate_training_runs_on_a_cpu(tmp_path):
    command = [sys.executable, "-m", "rllm_gym.train.grpo", "--config", str(ROOT / "train/configs/test_tiny.yaml")]
    command += ["--use_vllm", "true", "--vllm_mode", "colocate", "--max_steps", "2", "--debug", "true"]
    # A short warm start changes the weights before the first sync, so a sync that did not load would show.
    command += ["--warm_start_steps", "10", "--warm_start_replies", '["up", "down", "left", "right"]']
    command += ["--output_dir", str(tmp_path / "run")]
    # TRL asks for vllm_gpu_memory_utilization (0.3 of the host's memory on a CPU); a fixed KV cache replaces it.
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=500, env=env, cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [record for record in records if "sampling/sampling_logp_difference/mean" in record]
    assert [record["step"] for record in steps] == [1, 2]
    # vLLM's logprobs against the trainer's on the same tokens, after the sync of the warm-started weights.
    assert all(record["sampling/sampling_logp_difference/mean"] < 0.1 for record in steps), steps


def test_trl_vllm_serve_stops_before_serving_on_the_cpu_build(vllm_model_dir):
    trl = shutil.which("trl", path=str(Path(sys.executable).parent))
    assert trl, "the trl console script is missing from this venv"
    done = subprocess.run(
        [trl, "vllm-serve", "--model", str(vllm_model_dir)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    assert "No package metadata was found for vllm" in done.stderr, done.stderr[-3000:]
    assert "vllm/entrypoints/cli/main.py" in done.stderr
