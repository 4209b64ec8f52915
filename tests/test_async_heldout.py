"""benchmarks/async_heldout.py's bookkeeping, without running the main job: how runs are kept and merged, and how
K >= 1 is compared with K = 0's seed-to-seed range, the main job's own K taken from the runs demo_cpu.py kept."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def heldout_script():
    spec = importlib.util.spec_from_file_location("async_heldout", ROOT / "benchmarks" / "async_heldout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(staleness: int, seed: int, heldout: float, mode: str = "clip") -> dict:
    return {"max_staleness": staleness, "seed": seed, "async_is_mode": mode, "heldout_after": heldout, "commit": "abc"}


def demo_summary(path: Path, heldout: list[float], staleness: int = 2, mode: str = "clip") -> Path:
    """A demo_cpu_summary.json holding what compare() reads: per seed the held-out success after training and the
    run's K and correction."""
    config = {"max_staleness": staleness, "async_is_mode": mode}
    runs = [
        {"seed": seed, "summary": {"heldout_after": {"rllm/FrozenLake-v0": value}, "config": config}}
        for seed, value in enumerate(heldout)
    ]
    path.write_text(
        json.dumps({"measured_by": "`python benchmarks/demo_cpu.py`", "machine": {"date": "D"}, "runs": runs})
    )
    return path


def test_each_k_is_within_k0s_range_only_when_every_seed_is(tmp_path, monkeypatch):
    script = heldout_script()
    monkeypatch.setattr(script, "SUMMARY", demo_summary(tmp_path / "demo.json", [0.50, 0.80, 0.75]))
    k0 = [run(0, 0, 0.60), run(0, 1, 0.70), run(0, 2, 0.65)]
    stale = [run(2, 0, 0.1), run(2, 0, 0.9, "truncate")]  # K=2 clip is the main job's: its kept run is superseded
    table = script.compare([*k0, run(1, 0, 0.62), run(1, 1, 0.69), *stale])
    assert table["K=0"]["heldout_after"] == [0.60, 0.70, 0.65] and "within_k0_range" not in table["K=0"]
    assert table["K=1 clip"] == {
        "seeds": [0, 1], "heldout_after": [0.62, 0.69], "mean": pytest.approx(0.655),
        "within_k0_range": True, "at_or_above_k0_min": True,
    }  # fmt: skip
    assert table["K=2 clip"]["heldout_after"] == [0.50, 0.80, 0.75]  # the main job's own runs
    assert table["K=2 clip"]["within_k0_range"] is False
    assert table["K=2 clip"]["at_or_above_k0_min"] is False
    assert table["K=2 truncate"]["heldout_after"] == [0.9]  # each correction compared on its own
    assert table["K=2 clip source"] == "benchmarks/results/demo.json, `python benchmarks/demo_cpu.py` on D"


def test_the_main_jobs_own_k_is_never_run_here_but_taken_from_its_kept_runs(capsys):
    script = heldout_script()
    assert script.MAIN == 2 and script.STALENESS == (0, 1)
    with pytest.raises(SystemExit):
        script.main(["--staleness", "1", "2"])
    assert "--staleness 2 with --modes clip is the main job itself" in capsys.readouterr().err


def test_the_kept_demo_seeds_are_the_main_jobs_row_and_named():
    script = heldout_script()
    demo = json.loads((ROOT / "benchmarks" / "results" / "demo_cpu_summary.json").read_text())
    kept = [entry["summary"]["heldout_after"]["rllm/FrozenLake-v0"] for entry in demo["runs"]]
    table = script.compare([run(0, 0, min(kept) - 0.01), run(0, 1, min(kept) - 0.02)])
    assert table["K=2 clip"]["heldout_after"] == kept
    assert table["K=2 clip source"].startswith(
        "benchmarks/results/demo_cpu_summary.json, `python benchmarks/demo_cpu.py` on "
    )
    assert table["K=2 clip"]["within_k0_range"] is False  # above K=0's best is outside the range, not below it
    assert table["K=2 clip"]["at_or_above_k0_min"] is True
    assert "K=2 clip source: benchmarks/results/demo_cpu_summary.json" in script.report({"comparison": table})


def test_a_finished_run_is_merged_into_the_kept_file_replacing_the_same_k_seed_and_correction(tmp_path, monkeypatch):
    script = heldout_script()
    monkeypatch.setattr(script, "RESULTS", tmp_path / "results" / "async_heldout.json")
    script.RESULTS.parent.mkdir()
    older = {key: value for key, value in run(1, 0, 0.1).items() if key != "async_is_mode"}  # kept before the field
    script.RESULTS.write_text(json.dumps({"runs": [older]}))
    lock = threading.Lock()
    script.keep(run(1, 0, 0.5), lock)
    script.keep(run(0, 1, 0.6), lock)
    script.keep(run(1, 0, 0.7), lock)  # run again: replaces the first
    kept = json.loads(script.RESULTS.read_text())
    assert [(entry["max_staleness"], entry["seed"], entry["heldout_after"]) for entry in kept["runs"]] == [
        (0, 1, 0.6),
        (1, 0, 0.7),
        (1, 0, 0.1),  # truncate's, the default of then: kept beside clip's
    ]
    assert kept["comparison"]["K=1 clip"]["heldout_after"] == [0.7]
    assert kept["comparison"]["K=1 truncate"]["heldout_after"] == [0.1]


def test_a_bad_jobs_count_is_named(capsys):
    with pytest.raises(SystemExit):
        heldout_script().main(["--jobs", "0"])
    assert re.search(r"--jobs must be >= 1, got 0", capsys.readouterr().err)


def test_the_trace_keeps_each_training_steps_collapse_signs_and_skips_evaluations():
    script = heldout_script()
    records = [
        {"step": 0, "eval_heldout/greedy": 0.0},
        {"step": 5, "loss": 0.1, "reward": 0.25, "entropy": 0.123456, "entropy_coef": 0.0, "async/mismatch": 0.2},
        {
            "step": 10,
            "loss": 0.0,
            "reward": 0.0,
            "entropy": 0.5,
            "rollout/termination/max_response_length_exceeded": 1.0,
        },
    ]
    assert script.trace(records) == [
        {"step": 5, "reward": 0.25, "entropy": 0.1235, "entropy_coef": 0.0, "mismatch": 0.2},
        {"step": 10, "reward": 0.0, "entropy": 0.5, "too_long": 1.0},
    ]


def test_the_commit_is_dirty_by_code_but_not_by_the_results_the_script_writes(tmp_path, monkeypatch):
    script = heldout_script()
    monkeypatch.setattr(script, "ROOT", tmp_path)
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "async_heldout.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    clean = script.commit()
    assert re.fullmatch(r"[0-9a-f]{12}", clean)
    (tmp_path / "benchmarks" / "results" / "async_heldout.json").write_text('{"runs": []}')  # a run kept
    assert script.commit() == clean
    (tmp_path / "code.py").write_text("x = 2\n")
    assert script.commit() == f"{clean}-dirty"
