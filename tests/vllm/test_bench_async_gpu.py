"""benchmarks/bench_async_gpu.py's plumbing (``--dry-run``) on vLLM's CPU build: K = 0 with TRL's colocated engine and
K = 1 with the worker's own engine train, are timed, and K = 1 trains no row older than one version."""

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_async_gpu", ROOT / "benchmarks" / "bench_async_gpu.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_async_gpu"] = bench
_spec.loader.exec_module(bench)


def test_the_dry_run_times_k0_and_k1_on_vllm(tmp_path):
    results = tmp_path / "async.json"
    arguments = ["--dry-run", "--k", "0", "1", "--steps", "4", "--json", str(results), "--logs", str(tmp_path)]
    status = bench.main(arguments)
    assert status == 0, (tmp_path / "k1.log").read_text()[-3000:]
    measured = json.loads(results.read_text())
    k0, k1 = measured["runs"]["k0"], measured["runs"]["k1"]
    assert k0["steps_per_s"] > 0 and k1["ratio_to_k0"] == k1["steps_per_s"] / k0["steps_per_s"]
    assert k1["async/staleness_max"] <= 1 and k1["async/dropped_rows"] == 0
    assert "async/staleness_max" not in k0 and measured["versions"]["trl"]
