"""benchmarks/run_all.py and benchmarks/_table.py: the README's performance table is rendered from
benchmarks/results.json, never typed."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("run_all", ROOT / "benchmarks" / "run_all.py")
run_all = importlib.util.module_from_spec(spec)
sys.modules["run_all"] = run_all  # dataclasses look their module up by name
spec.loader.exec_module(run_all)
table = importlib.import_module("_table")  # run_all.py's renderers, on the path run_all.py put its folder on


def fabricated() -> dict:
    """Results in the shape each script writes with --json, with round numbers."""
    return {
        "machine": {
            "platform": "Linux-x86_64",
            "python": "3.11.7",
            "cpu_count": 2,
            "cpu_model": "Test CPU 9000",
            "torch": "2.13.0+cpu",
            "date": "2030-01-02T03:04:05+00:00",
            "load_average_start": 0.5,
            "load_average_end": 1.25,
        },
        "total_s": 90.4,
        "benchmarks": {
            "bench_envs": {
                "command": "bench_envs.py --quick",
                "wall_s": 1.0,
                "results": {
                    "n_steps": 20000,
                    "rows": [
                        {
                            "variant": "4x4 deterministic",
                            "gymnasium_us_per_step": 4.0,
                            "rllm_gym_us_per_step": 2.0,
                            "ratio": 0.5,
                        },
                        {
                            "variant": "4x4 slippery",
                            "gymnasium_us_per_step": 4.0,
                            "rllm_gym_us_per_step": 3.0,
                            "ratio": 0.75,
                        },
                    ],
                },
            },
            "bench_math_reward": {
                "command": "bench_math_reward.py --quick --n 2000",
                "wall_s": 7.0,
                "results": {
                    "n_answers": 2000,
                    "mix": "80% plain numbers, 20% LaTeX",
                    "ours_answers_per_s": 3200.4,
                    "math_verify_answers_per_s": 400.0,
                    "speedup": 8.001,
                    "identical_verdicts": True,
                    "mismatches": [],
                },
            },
            "bench_sandbox": {
                "command": "bench_sandbox.py --quick",
                "wall_s": 90.0,
                "results": {
                    "in_flight": [1, 4],
                    "programs": {
                        name: {
                            "code": "...",
                            "rows": [
                                {
                                    "in_flight": n,
                                    "isolated": {"per_s": 40.0 * n / k, "ms_per_run": 25.0 * k / n, "rss_mb": 13.4},
                                    "layers_off": {"per_s": 50.0 * n / k, "ms_per_run": 20.0 * k / n, "rss_mb": 13.0},
                                    "bare": {"per_s": 20.0 * n / k, "ms_per_run": 50.0 * k / n, "rss_mb": 41.0},
                                    "isolation_cost_ms": 5.0 * k / n,
                                    "isolated_vs_layers_off": 0.8,
                                    "layers_off_vs_bare": 2.5,
                                }
                                for n in (1, 4)
                            ],
                        }
                        for name, k in (("trivial", 1), ("cpu", 10))
                    },
                },
            },
            "bench_engine": {
                "command": "bench_engine.py --n 2048 --code 64 --tool 64",
                "wall_s": 5.0,
                "results": {
                    "frozenlake": [
                        {
                            "n_in_flight": 2048,
                            "latency_ms": 200.0,
                            "calls": 81920,
                            "achieved_calls_per_s": 9830.0,
                            "overall_calls_per_s": 9728.0,
                            "ideal_calls_per_s": 10240.0,
                            "fraction_of_ideal": 0.96,
                            "overall_fraction_of_ideal": 0.95,
                            "ideal_wall_s": 8.0,
                            "start_ms": 120.4,
                            "end_ms": 3.2,
                            "extra_ms": 421.1,
                            "gc_ms": 16.3,
                            "gc_collections": 17,
                            "engine_cpu_us_per_call": 40.2,
                        }
                    ],
                    "code": {
                        "env": "rllm/Code-v0",
                        "episodes": 64,
                        "wall_s": 2.04,
                        "episodes_per_s": 31.4,
                        "worst_loop_lag_ms": 20.4,
                        "p99_loop_lag_ms": 4.04,
                        "max_sandbox_in_flight": 4,
                        "load_average": 1.5,
                    },
                    "tool": {
                        "env": "rllm/Tool-v0",
                        "episodes": 64,
                        "wall_s": 3.0,
                        "episodes_per_s": 21.3,
                        "worst_loop_lag_ms": 30.6,
                        "p99_loop_lag_ms": 8.0,
                        "max_sandbox_in_flight": 4,
                        "load_average": 1.75,
                    },
                },
            },
            "bench_tools": {
                "command": "bench_tools.py --quick",
                "wall_s": 2.0,
                "results": {
                    "parsers": {
                        "hermes": {"replies_per_s": 150000.0},
                        "json": {"replies_per_s": 140000.0},
                        "openai": {"replies_per_s": 90000.0},
                    }
                },
            },
            "bench_interop": {
                "command": "bench_interop.py --quick",
                "wall_s": 30.0,
                "results": {
                    "env_step": {"served": {"p50_ms": 0.5, "n": 200}, "in_process": {"p50_ms": 0.002, "n": 2000}},
                    "tool_call": {"mcp": {"p50_ms": 5.0, "n": 200}, "builtin": {"p50_ms": 0.01, "n": 200}},
                },
            },
            "bench_gateway": {
                "command": "bench_gateway.py --quick",
                "wall_s": 40.0,
                "results": {
                    "sessions": 64,
                    "turns": 2,
                    "max_tokens": 16,
                    "direct_s": [1.0],
                    "gateway_s": [1.5],
                    "gateway_default_client_s": [4.0],
                    "gateway_raw_http_s": [1.2],
                    "ratio": 1.5,
                    "ratio_default_client": 4.0,
                    "ratio_raw_http": 1.2,
                },
            },
            "bench_policies": {
                "command": "bench_policies.py --quick",
                "wall_s": 4.0,
                "results": {
                    "latency_s": 0.05,
                    "server": "fast",
                    "servers": 1,
                    "overhead": {
                        "raw_aiohttp_overhead_ms": 1.0,
                        "raw_httpx_overhead_ms": 2.0,
                        "policy_overhead_ms": 1.05,
                        "policy_extra_ms": 0.05,
                    },
                    "concurrency": [
                        {
                            "in_flight": 1,
                            "trials": 5,
                            "req_per_s": 19.0,
                            "raw_aiohttp_req_per_s": 19.5,
                            "raw_httpx_req_per_s": 19.5,
                            "server_ceiling_req_per_s": 4000.0,
                            "ideal_req_per_s": 20.0,
                            "efficiency": 0.95,
                            "policy_vs_raw": 0.974,
                            "policy_vs_httpx": 0.974,
                        },
                        {
                            "in_flight": 256,
                            "trials": 5,
                            "req_per_s": 2880.0,
                            "raw_aiohttp_req_per_s": 3000.0,
                            "raw_httpx_req_per_s": 90.0,
                            "server_ceiling_req_per_s": 20000.0,
                            "ideal_req_per_s": 5120.0,
                            "efficiency": 0.5625,
                            "policy_vs_raw": 0.96,
                            "policy_vs_httpx": 32.0,
                        },
                    ],
                },
            },
            "bench_grpo": {
                "command": "bench_grpo.py --quick --rounds 2",
                "wall_s": 40.0,
                "results": {
                    "settings": {"prompts_per_step": 4, "num_generations": 4, "max_completion_length": 16},
                    "ours": {"median_s": 0.3, "n": 24},
                    "trl": {"median_s": 0.25, "n": 24},
                    "ratio": 1.2,
                },
            },
            "bench_async": {
                "command": "bench_async.py --quick",
                "wall_s": 300.0,
                "results": {
                    "main_steps": 10,
                    "latency_steps": 8,
                    "skip": 2,
                    "workloads": {
                        "main_job": {
                            "k0": {"steps_per_s": 1.0, "vs_k0": 1.0, "mean_reward": 0.25},
                            "k1": {"steps_per_s": 1.5, "vs_k0": 1.5, "mean_reward": 0.2},
                            "k2": {"steps_per_s": 2.0, "vs_k0": 2.0, "mean_reward": 0.125},
                        },
                        "latency_bound": {
                            "k0": {"steps_per_s": 0.5, "vs_k0": 1.0},
                            "k1": {"steps_per_s": 0.75, "vs_k0": 1.5},
                            "k2": {"steps_per_s": 1.0, "vs_k0": 2.0},
                        },
                    },
                },
            },
        },
    }


def test_render_names_script_ours_baseline_and_ratio_in_each_row():
    lines = run_all.render(fabricated()).splitlines()
    assert lines[0] == (
        "Run on 2030-01-02: Test CPU 9000, 2 CPUs, Python 3.11.7, torch 2.13.0+cpu, load average 0.50 at the start "
        "and 1.25 at the end, 90 s in all."
    )
    assert lines[2:4] == ["| what (script) | ours | baseline, same run | ratio |", "|---|---|---|---|"]
    rows = lines[4:]
    assert rows == [
        "| FrozenLake step, text in and out, 4x4 deterministic, 20,000 steps (`bench_envs.py --quick`) | 2.00 us "
        "| Gymnasium FrozenLake-v1, 4.00 us | 0.50x the time |",
        "| FrozenLake step, text in and out, 4x4 slippery, 20,000 steps (`bench_envs.py --quick`) | 3.00 us "
        "| Gymnasium FrozenLake-v1, 4.00 us | 0.75x the time |",
        "| math grading, 2,000 answers, 80% plain numbers, 20% LaTeX (`bench_math_reward.py --quick --n 2000`) "
        "| 3,200 answers/s | math-verify parse+verify directly, 400/s | 8.0x the throughput, identical verdicts |",
        "| sandbox, trivial program, 1 in flight: isolation layers on vs off, same runner "
        "(`bench_sandbox.py --quick`) | 40.0 runs/s, 25.0 ms a run, 13 MB peak RSS "
        "| layers off, 50.0/s, 20.0 ms a run | isolation costs +5.0 ms a run (0.80x the throughput) |",
        "| sandbox, trivial program, 4 in flight: isolation layers on vs off, same runner "
        "(`bench_sandbox.py --quick`) | 160.0 runs/s, 6.2 ms a run, 13 MB peak RSS "
        "| layers off, 200.0/s, 5.0 ms a run | isolation costs +1.2 ms a run (0.80x the throughput) |",
        "| sandbox runner (layers off) vs a cold `python -c` start, trivial program, 1 in flight: start-up savings, "
        "not isolation (`bench_sandbox.py --quick`) | 50.0 runs/s | bare `python -c`, 20.0/s, 41 MB peak RSS "
        "| 2.50x the throughput |",
        "| sandbox, cpu program, 1 in flight: isolation layers on vs off, same runner "
        "(`bench_sandbox.py --quick`) | 4.0 runs/s, 250.0 ms a run, 13 MB peak RSS "
        "| layers off, 5.0/s, 200.0 ms a run | isolation costs +50.0 ms a run (0.80x the throughput) |",
        "| sandbox, cpu program, 4 in flight: isolation layers on vs off, same runner "
        "(`bench_sandbox.py --quick`) | 16.0 runs/s, 62.5 ms a run, 13 MB peak RSS "
        "| layers off, 20.0/s, 50.0 ms a run | isolation costs +12.5 ms a run (0.80x the throughput) |",
        "| sandbox runner (layers off) vs a cold `python -c` start, cpu program, 1 in flight: start-up savings, "
        "not isolation (`bench_sandbox.py --quick`) | 5.0 runs/s | bare `python -c`, 2.0/s, 41 MB peak RSS "
        "| 2.50x the throughput |",
        "| engine, 2,048 FrozenLake episodes in flight, policy latency 200 ms, 40 calls each: steady state (middle "
        "half of the calls) and whole run (`bench_engine.py --n 2048 --code 64 --tool 64`) | 9,830 LLM calls/s "
        "steady, 9,728/s whole run; 421 ms over the ideal 8.0 s: 120 ms until the last episode's first call, 3 ms "
        "after the last reply, 16 ms of garbage collection (17 passes); 40 us engine CPU per call "
        "| ideal N/L = 10,240/s | 96% of ideal steady, 95% whole run |",
        "| engine, 64 Code-v0 episodes in flight, sandboxed, policy latency 0: event-loop lag (a 5 ms ticker) "
        "(`bench_engine.py --n 2048 --code 64 --tool 64`) | worst 20 ms, p99 4.0 ms, 31 episodes/s, at most 4 "
        "sandbox runs in flight (load average 1.5) | none | n/a |",
        "| engine, 64 Tool-v0 episodes in flight, sandboxed, policy latency 0: event-loop lag (a 5 ms ticker) "
        "(`bench_engine.py --n 2048 --code 64 --tool 64`) | worst 31 ms, p99 8.0 ms, 21 episodes/s, at most 4 "
        "sandbox runs in flight (load average 1.8) | none | n/a |",
        "| tool-call parsing, replies with 0-3 calls (`bench_tools.py --quick`) "
        "| Hermes 150,000, JSON block 140,000, OpenAI 90,000 replies/s | none | n/a |",
        "| FrozenLake step served by `rllm-gym serve` (OpenEnv, WebSocket session, server in another process), p50 of "
        "200 (`bench_interop.py --quick`) | 0.500 ms | the same env in process, 2.0 us | 250x |",
        "| MCP tool call, stdio server (official SDK), p50 of 200 (`bench_interop.py --quick`) | 5.00 ms | built-in "
        "calculator tool, 10.0 us | 500x |",
        "| OpenAIPolicy per-request overhead, one request at a time, 1 fast server at 50 ms: the policy vs its "
        "transport (aiohttp) used directly (`bench_policies.py --quick`) | 1.05 ms | raw aiohttp, 1.00 ms (raw httpx "
        "2.00 ms) | +0.05 ms |",
        "| OpenAIPolicy vs raw aiohttp (its transport used directly, same connection limit, same server; median of 5 "
        "turns each), 256 requests in flight, 1 fast server at 50 ms (`bench_policies.py --quick`) | 2,880 req/s "
        "| raw aiohttp 3,000/s (ideal N/L = 5,120/s; the server's own ceiling 20,000/s, from its CPU per request) "
        "| 96% of raw aiohttp |",
        "| OpenAIPolicy vs raw httpx (the policy's former transport, same connection limit, same server), 256 "
        "requests in flight, 1 fast server at 50 ms (`bench_policies.py --quick`) | 2,880 req/s | raw httpx 90/s "
        "| 32.0x the throughput |",
        "| agent programs through the gateway, 64 sessions in flight x 2 turns, 16 tokens a reply, tiny model, CPU: "
        "the `openai` client (TLS context built once), and plain aiohttp (`bench_gateway.py --quick`) | 1.50 s "
        "(aiohttp 1.20 s) | the same HFPolicy called directly, 1.00 s | 1.50x the time (aiohttp 1.20x; goal 1.1x) |",
        "| asynchronous GRPO, the main job (`demo_cpu.yaml`) bounded to 10 steps: max_staleness K vs the synchronous "
        "trainer (K=0), same seed, one after the other, first 2 steps untimed; mean reward over the steps "
        "(`bench_async.py --quick`) | K=1 1.500 steps/s, reward 0.200; K=2 2.000 steps/s, reward 0.125 | K=0, 1.000 "
        "steps/s, reward 0.250 | K=1 1.50x, K=2 2.00x (goal 1.3x) |",
        "| asynchronous GRPO, Code-v0, every reply run by the sandbox, 8 steps, tiny model: max_staleness K vs the "
        "synchronous trainer (K=0), same seed, one after the other, first 2 steps untimed (`bench_async.py --quick`) "
        "| K=1 0.750 steps/s; K=2 1.000 steps/s | K=0, 0.500 steps/s | K=1 1.50x, K=2 2.00x (goal 1.5x) |",
        "| GRPO step, single-turn Math-v0, 4 prompts x 4 generations, 16 tokens, tiny model, CPU "
        "(`bench_grpo.py --quick --rounds 2`) | 0.300 s (median of 24) | TRL's plain GRPOTrainer, 0.250 s "
        "| 1.20x the time |",
    ]
    assert all(row.count(" | ") == 3 for row in rows)  # four cells each: a pipe inside a cell would break the table


def test_render_flags_differing_verdicts_and_skips_absent_code_run():
    results = fabricated()
    math = results["benchmarks"]["bench_math_reward"]["results"]
    math["identical_verdicts"] = False
    math["mismatches"] = [{"ground_truth": "1", "reply": "2", "math_verify": True}] * 3
    del results["benchmarks"]["bench_engine"]["results"]["code"]
    table = run_all.render(results)
    assert "8.0x the throughput, verdicts DIFFER (3+) |" in table
    assert "Code-v0 episodes in flight" not in table and "Tool-v0 episodes in flight" in table


def test_render_names_missing_benchmarks():
    results = fabricated()
    del results["benchmarks"]["bench_grpo"], results["benchmarks"]["bench_tools"]
    message = "results have no entry for bench_tools, bench_grpo: rerun `python benchmarks/run_all.py`"
    with pytest.raises(ValueError, match=re.escape(message)):
        run_all.render(results)


def test_replace_table_swaps_only_the_marked_block():
    readme = "# T\n\n## Performance\n\nintro\n\n<!-- bench:start -->\n| old | table |\n<!-- bench:end -->\n\n## Next\n"
    assert run_all.replace_table(readme, "NEW") == (
        "# T\n\n## Performance\n\nintro\n\n<!-- bench:start -->\nNEW\n<!-- bench:end -->\n\n## Next\n"
    )
    with pytest.raises(ValueError, match=re.escape("README has no <!-- bench:start --> ... <!-- bench:end --> block")):
        run_all.replace_table("## Performance\n<!-- bench:start -->\n", "NEW")


def test_check_and_render_only_modes(tmp_path, capsys):
    results_path, readme_path = tmp_path / "results.json", tmp_path / "README.md"
    results_path.write_text(json.dumps(fabricated()))
    readme_path.write_text("intro\n<!-- bench:start -->\n| hand | typed |\n<!-- bench:end -->\nafter\n")
    paths = ["--results", str(results_path), "--readme", str(readme_path)]

    assert run_all.main(["--check", *paths]) == 1
    assert "-| hand | typed |" in capsys.readouterr().err
    assert run_all.main(["--render-only", *paths]) == 0
    text = readme_path.read_text()
    assert text.startswith("intro\n<!-- bench:start -->\nRun on 2030-01-02: Test CPU 9000")
    assert text.endswith("| 1.20x the time |\n<!-- bench:end -->\nafter\n")
    assert run_all.main(["--check", *paths]) == 0


def test_run_benchmark_returns_json_and_reports_failures(tmp_path):
    script = tmp_path / "bench_fake.py"
    script.write_text(
        "import json, sys\n"
        "args = sys.argv[1:]\n"
        "if '--fail' in args:\n"
        "    sys.exit('fake benchmark broke')\n"
        "if '--no-json' not in args:\n"
        "    open(args[args.index('--json') + 1], 'w').write(json.dumps({'args': args[:-2]}))\n"
        "print('table')\n"
    )
    results, stdout = run_all.run_benchmark(script, ("--quick",), timeout_s=60)
    assert results == {"args": ["--quick"]} and stdout == "table\n"
    with pytest.raises(run_all.BenchmarkError, match=re.escape("bench_fake.py exited with status 1:\nfake benchmark")):
        run_all.run_benchmark(script, ("--fail",), timeout_s=60)
    with pytest.raises(run_all.BenchmarkError, match=re.escape("bench_fake.py exited cleanly but wrote no JSON")):
        run_all.run_benchmark(script, ("--no-json",), timeout_s=60)


def test_every_benchmark_script_is_run_and_rendered():
    scripts = {path.stem for path in (ROOT / "benchmarks").glob("bench_*.py")} - set(run_all.GPU_ONLY)
    assert set(run_all.GPU_ONLY) <= {path.stem for path in (ROOT / "benchmarks").glob("bench_*.py")}
    assert {bench.name for bench in run_all.BENCHMARKS} == scripts
    assert set(table.RENDERERS) == {bench.results_key for bench in run_all.BENCHMARKS}
    assert len(run_all.BENCHMARKS) == len(table.RENDERERS)  # a script run twice has a key of its own each time


def test_readme_table_is_the_rendering_of_the_committed_results():
    assert run_all.main(["--check"]) == 0, "README differs: run `python benchmarks/run_all.py --render-only`"


def test_committed_results_describe_the_machine_and_every_run():
    results = json.loads(run_all.RESULTS.read_text())
    assert {"platform", "python", "cpu_count", "cpu_model", "torch", "date"} <= set(results["machine"])
    commands = {name: entry["command"] for name, entry in results["benchmarks"].items()}
    assert commands == {bench.results_key: bench.command for bench in run_all.BENCHMARKS}


def script(name: str):
    """A benchmark script loaded as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_main_job_sentence_is_the_rendering_of_the_kept_demo_summary():
    demo = script("demo_cpu")
    assert demo.main(["--check"]) == 0, "README differs: run `python benchmarks/demo_cpu.py --render-only`"
    kept = json.loads(demo.SUMMARY.read_text())
    sentence = demo.render(kept)
    assert [run["seed"] for run in kept["runs"]] == [0, 1, 2] and demo.CURVE.is_file()
    # The kept runs are the shipped config's, on the same held-out lakes, with the blind baseline computed on them.
    shipped = yaml.safe_load((ROOT / demo.CONFIG).read_text())
    for run in kept["runs"]:
        config = run["summary"]["config"]
        for key in ("tasks", "model_shape", "max_steps", "learning_rate", "prompts_per_step", "num_generations"):
            assert config[key] == shipped[key], (run["seed"], key)
        assert [Path(path).name for path in config["eval_tasks"]] == shipped["eval_tasks"]  # from any folder
        assert run["summary"]["heldout_blind_baseline"] == {demo.ENV_ID: kept["blind_baseline"]}
    assert kept["n_heldout"] == 64 and kept["blind_baseline"] == 29 / 64 and "solves 29/64" in sentence
    low, high = demo.heldout_range(kept)
    assert f"every seed within {low}/64 to {high}/64" in sentence
    slowest = max(run["summary"]["train_seconds"] for run in kept["runs"])
    assert f"at most {slowest:.0f} s)" in sentence


def test_the_demo_sentence_gives_the_median_and_range_over_seeds():
    demo = script("demo_cpu")

    def run(seed, before, after, train, wall):
        summary = {
            "config": {"eval_limit": 64},
            "heldout_before": {demo.ENV_ID: before / 64},
            "heldout_after": {demo.ENV_ID: after / 64},
            "greedy_after": {demo.ENV_ID: after / 64},
            "train_seconds": train,
        }
        return {"seed": seed, "wall_s": wall, "summary": summary, "machine": {"load_average_start": 0.2}}

    kept = {
        "measured_by": "`python benchmarks/demo_cpu.py`",
        "n_heldout": 64,
        "blind_baseline": 29 / 64,
        "blind_moves": ["right", "down"],
        "machine": {"date": "2026-11-25T14:00:00+00:00", "cpu_count": 2},
        "runs": [run(0, 0, 50, 200.0, 260.0), run(1, 0, 41, 210.0, 275.5), run(2, 1, 45, 190.0, 250.0)],
    }
    sentence = demo.render(kept)
    assert "0/64 (median; 0/64 to 1/64) before training and 45/64 (median; 41/64 to 50/64) after" in sentence
    assert "every seed within 41/64 to 50/64" in sentence and "solves 29/64" in sentence
    assert "200 s of training (median; at most 210 s), 4:20 for the whole command (median; at most 4:36)" in sentence
    assert demo.heldout_range(kept) == (41, 50) and demo.median_seed(kept) == 2
    assert "(CI runs `--seed 2` again and fails below 39/64 or at the blind baseline)" in sentence  # the 0.60 target
    kept["runs"][1]["summary"]["heldout_after"][demo.ENV_ID] = 30 / 64  # a seed below the target: the claim drops
    assert "fails below 30/64 or at the blind baseline" in demo.render(kept)
    kept["runs"][1]["summary"]["heldout_after"][demo.ENV_ID] = 41 / 64
    assert "shared" not in sentence
    kept["runs"][1]["machine"]["load_average_start"] = 2.02  # what the previous seed's own run leaves on 2 cores
    assert "shared" not in demo.render(kept)
    kept["runs"][1]["machine"]["load_average_start"] = 7.4  # a busy machine: its seconds say so
    assert demo.render(kept).endswith("(load average up to 7 at a run's start): the seconds are inflated.")


def test_bench_grpo_times_our_generation_in_the_rollout(tiny_model_dir, monkeypatch, generate_seconds):
    """Each trainer's "generate" phase holds every model.generate call of its steps (ours runs them in the rollout,
    before TRL's _generate, which then only hands back rows: timing that read ~0 s) and fits within the step."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # its shared part, _grpo_common.py, lies next to it
    bench_spec = importlib.util.spec_from_file_location("bench_grpo", ROOT / "benchmarks" / "bench_grpo.py")
    bench = importlib.util.module_from_spec(bench_spec)
    monkeypatch.setitem(sys.modules, "bench_grpo", bench)
    bench_spec.loader.exec_module(bench)
    seconds = generate_seconds(lambda: bench.RUNNING["kind"])  # the trainer holding the baton
    settings = bench.Settings(prompts_per_step=2, num_generations=2, max_completion_length=8, warmup=0, steps=2)
    tasks = bench.math_tasks(settings.prompts_per_step * settings.steps, settings.seed)
    data = dict(zip(["ours", "trl"], bench.datasets(tasks), strict=True))
    timers, trainers = bench.run_interleaved(["ours", "trl"], tiny_model_dir, settings, data, 2, bench.build_trainer)
    for kind, timer in timers.items():
        generation = sum(phases.get("generate", 0.0) for phases in timer.phases)
        assert 0 < seconds[kind] <= generation <= sum(timer.wall), (kind, seconds[kind], generation)
    # Ours: the last step's generation is its rollout, as the rollout clocks itself (from its plan to its rows).
    last, rollout = timers["ours"].phases[-1]["generate"], trainers["ours"].collected[-1].seconds
    assert rollout <= last <= 1.2 * rollout + 0.02, (last, rollout)


def test_render_adds_the_multi_turn_grpo_row_when_it_was_run():
    results = fabricated()
    results["benchmarks"]["bench_grpo"]["results"]["multi_turn"] = {
        "settings": {"max_turns": 4, "prompts_per_step": 4, "num_generations": 4, "max_completion_length": 12},
        "sampled": {"median_s": 1.5, "n": 8},
        "template": {"median_s": 3.0, "n": 8},
        "ratio": 0.5,
        "rows_per_trajectory": {"sampled": 1.0, "template": 3.5},
        "turns": {"sampled": 3.8, "template": 3.9},
    }
    row = run_all.render(results).splitlines()[-1]
    assert row == (
        "| GRPO step, multi-turn FrozenLake (up to 4 turns, 3.8 on average), 4 prompts x 4 generations, 12 tokens a "
        "reply, tiny model, CPU: prompts continue the sampled tokens (`bench_grpo.py --quick --rounds 2`) | 1.500 s "
        "(median of 8), 1.00 rows per trajectory | the chat re-rendered each call (before), 3.000 s, 3.50 rows per "
        "trajectory | 0.50x the time |"
    )


def test_the_gateway_rows_keep_the_short_reply_figure_and_add_the_long_one_beside_it():
    gateway_rows = table.gateway_rows
    results = {
        "sessions": 64,
        "turns": 2,
        "max_tokens": 16,
        **{"direct_s": [1.0], "gateway_s": [1.5], "gateway_raw_http_s": [1.2], "ratio": 1.5, "ratio_raw_http": 1.2},
    }
    assert len(gateway_rows(results, "bench_gateway.py --quick")) == 1  # results from before the long workload
    long = {"long_max_tokens": 128, "long_mean_reply_tokens": 97.5, "long_direct_s": [4.0], "long_gateway_s": [4.2]}
    short, long_row = gateway_rows({**results, **long, "long_ratio": 1.05}, "bench_gateway.py --quick")
    assert "1.50x the time" in short[3]
    assert "up to 128 tokens (97.5 on average)" in long_row[0] and long_row[1:] == (
        "4.20 s",
        "the same HFPolicy called directly, 4.00 s",
        "1.05x the time (goal 1.1x)",
    )


def test_the_gateway_on_vllm_gets_a_row_per_reply_length_beside_the_hf_rows():
    results = {"sessions": 64, "turns": 2, "max_tokens": 16, "mean_reply_tokens": 16.0, "same_tokens": 1.0}
    results |= {"direct_s": [1.0, 2.0, 1.2], "gateway_s": [1.5, 1.4, 9.0], "ratio": 1.25}
    long = {"long_max_tokens": 128, "long_mean_reply_tokens": 97.5, "long_same_tokens": 0.984}
    long |= {"long_direct_s": [4.0], "long_gateway_s": [4.2], "long_ratio": 1.05}
    command = "bench_gateway.py --policy vllm --max-tokens 16"
    short, long_row = table.gateway_vllm_rows({**results, **long}, command)
    assert "VLLMPolicy" in short[0] and "up to 16 tokens (16.0 on average)" in short[0] and command in short[0]
    assert short[1:] == (
        "1.50 s",  # medians over the rounds
        "the same VLLMPolicy called directly, 1.20 s; same greedy tokens in 100% of the calls",
        "1.25x the time (goal 1.1x)",
    )
    assert "up to 128 tokens (97.5 on average)" in long_row[0] and long_row[2:] == (
        "the same VLLMPolicy called directly, 4.00 s; same greedy tokens in 98% of the calls",
        "1.05x the time (goal 1.1x)",
    )
    alone = table.gateway_vllm_rows({**results, "separate_run": {"date": "2030-01-02", "load_average": 3.5}}, command)
    assert len(alone) == 1 and "run alone on 2030-01-02, load average 3.50" in alone[0][0]
    raw = table.gateway_vllm_rows({**results, "gateway_raw_http_s": [1.1], "ratio_raw_http": 1.1}, command)[0]
    assert "plain aiohttp" in raw[0] and raw[1] == "1.50 s (aiohttp 1.10 s)"
    assert raw[3] == "1.25x the time (aiohttp 1.10x; goal 1.1x)"
    vllm_entries = [bench for bench in run_all.BENCHMARKS if bench.name == "bench_gateway"]
    assert [(bench.results_key, bench.needs_vllm) for bench in vllm_entries] == [
        ("bench_gateway", False),
        ("bench_gateway_vllm", True),
    ]


def test_the_gateways_own_cost_is_measured_with_the_clients_in_another_process(tiny_model_dir):
    from transformers import AutoTokenizer

    cost = script("_gateway_cost")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    figures = asyncio.run(cost.gateway_cost(tokenizer, sessions=2, turns=2, rounds=1, max_tokens=8))
    assert set(figures) == {"gateway", "bare_aiohttp", "policy_direct"}
    assert all(isinstance(ms, float) and ms >= 0 for ms in figures.values())
    assert gc.isenabled()  # switched off only while it measures


def test_a_benchmark_that_needs_longer_gets_its_own_limit(monkeypatch):
    limits = []

    def run(script, args, timeout_s, python):
        limits.append(timeout_s)
        return {}, ""

    monkeypatch.setattr(run_all, "run_benchmark", run)
    benchmarks = (run_all.Benchmark("fast", ()), run_all.Benchmark("slow", (), min_timeout_s=1200.0))
    run_all.run_all(benchmarks, timeout_s=600.0)
    assert limits == [600.0, 1200.0]
    assert [bench.min_timeout_s for bench in run_all.BENCHMARKS if bench.min_timeout_s] == [1200.0]  # bench_async


def test_async_rows_say_when_they_were_measured_outside_run_all():
    results = fabricated()
    async_results = results["benchmarks"]["bench_async"]["results"]
    async_results["separate_run"] = {"date": "2030-01-03", "load_average": 7.25}
    rows = [row for row in run_all.render(results).splitlines() if "asynchronous GRPO" in row]
    assert len(rows) == 2
    assert all("(`bench_async.py --quick; measured outside run_all on 2030-01-03, load average up to 7.2`)" in row
               for row in rows)  # fmt: skip


def test_the_code_v0_async_row_gives_every_k_the_workers_env_calls():
    from rllm_gym.train.async_generation import WorkerSettings

    default = {field.name: field.default for field in dataclasses.fields(WorkerSettings)}["env_calls"]
    assert default == script("bench_async").ENV_CALLS  # K = 0 runs as many env calls at once as the worker
    results = fabricated()
    results["benchmarks"]["bench_async"]["results"]["env_calls"] = 32
    rows = [row for row in run_all.render(results).splitlines() if "asynchronous GRPO, Code-v0" in row]
    assert len(rows) == 1 and "tiny model, 32 env calls at once for every K:" in rows[0]


def test_bench_async_rounds_give_each_k_the_median_and_each_rounds_ratio_to_its_own_k0():
    bench = script("bench_async")
    summary = bench.summarize([{0: 1.0, 1: 1.5}, {0: 2.0, 1: 2.0}, {0: 4.0, 1: 2.0}])
    assert summary[0]["steps_per_s"] == 2.0 and summary[1]["steps_per_s"] == 2.0
    assert summary[1]["rounds_steps_per_s"] == [1.5, 2.0, 2.0]
    assert summary[1]["rounds_vs_k0"] == [1.5, 1.0, 0.5]  # not the medians' ratio (1.0) each time
    assert summary[1]["vs_k0"] == 1.0 and summary[0]["vs_k0"] == 1.0
    results = {"workloads": {"main_job": {f"k{k}": figure for k, figure in summary.items()}}}
    assert "rounds 1.50x 1.00x 0.50x" in bench.table(results).splitlines()[2]
    with pytest.raises(SystemExit):
        bench.main(["--rounds", "0"])


def test_bench_async_counts_the_cpu_of_the_processes_below_it_per_timed_step():
    import subprocess

    bench = script("bench_async")
    assert bench.cpu_per_step([(1.0, 5.0), (2.0, 6.0), (4.0, 10.0), (6.0, 14.0)], skip=1) == {
        "trainer_cpu_s": 2.0,
        "children_cpu_s": 4.0,
    }
    assert bench.cpu_per_step([(1.0, None), (2.0, None), (3.0, None)], skip=0) == {"trainer_cpu_s": 1.0}
    assert bench.cpu_per_step([(1.0, 2.0)], skip=0) == {}
    before = bench.descendants_cpu_s(os.getpid())
    busy = "import sys; sum(range(30_000_000)); print('done', flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", busy], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "done\n"
        assert bench.descendants_cpu_s(os.getpid()) > before  # the child's burnt CPU, while it runs
    finally:
        child.communicate("")
