"""benchmarks/bench_async_gpu.py on a CPU: its refusal without a GPU, the timing, and a failed K recorded with its
reason while the next K still runs (the real run on vLLM's CPU build: tests/vllm/test_bench_async_gpu.py)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_async_gpu", ROOT / "benchmarks" / "bench_async_gpu.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_async_gpu"] = bench
_spec.loader.exec_module(bench)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a CUDA GPU")
def test_without_a_gpu_it_says_so_and_exits_2(capsys):
    assert bench.main(["--json", "unused.json"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_steps_per_second_leaves_out_the_first_steps():
    assert bench.steps_per_second([10.0, 11.0, 13.0, 15.0], skip=1) == pytest.approx(2 / 4)
    with pytest.raises(ValueError, match="need at least 3 steps"):
        bench.steps_per_second([10.0, 11.0], skip=1)


def test_a_k_whose_run_fails_is_recorded_with_its_log_and_the_next_k_still_runs(tmp_path, capsys):
    results = tmp_path / "async.json"
    status = bench.main(["--dry-run", "--model", str(tmp_path / "no-model"), "--k", "0", "1", "--json", str(results)])
    assert status == 1
    runs = json.loads(results.read_text())["runs"]
    assert set(runs) == {"k0", "k1"}
    for record in runs.values():
        assert record["error"] == "exit status 2, 0 steps logged" and "steps_per_s" not in record
        assert any("no-model" in line for line in record["log_tail"])  # the training's own reason
    assert "k1: FAILED" in capsys.readouterr().out
