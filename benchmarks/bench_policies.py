"""Benchmark of OpenAIPolicy's client side against a local server with a fixed artificial latency.

Two numbers matter for rollouts against `vllm serve` fleets: what each request costs on top of the server's own
time (request building, pooling, JSON parsing, retry bookkeeping), and whether N requests in flight really give
N / latency requests per second. The server is :mod:`rllm_gym.policies.stub_server` in its own process,
answering every request after exactly ``--latency`` seconds, so any gap is the client's (and loopback HTTP's)
doing.

    python benchmarks/bench_policies.py --quick                 # a few seconds
    python benchmarks/bench_policies.py --json results.json     # full run, results also as JSON
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time

import httpx

from rllm_gym.policies import OpenAIPolicy, SamplingParams

CHAT = [{"role": "user", "content": "What is 2 + 3?"}]
PARAMS = SamplingParams(temperature=0, max_tokens=16)


def start_server(latency_s: float) -> tuple[subprocess.Popen[str], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "rllm_gym.policies.stub_server", "--port", str(port), "--latency", str(latency_s)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    return server, server.stdout.readline().strip()


async def per_request_overhead(url: str, latency_s: float, n: int) -> dict[str, float]:
    """Sequential requests: wall time per request minus the server's latency, for raw httpx and for the policy."""
    async with httpx.AsyncClient() as client:
        body = {"model": "stub", "messages": CHAT, "max_tokens": 16, "temperature": 0}
        await client.post(url + "/chat/completions", json=body)  # warm the connection
        raw = []
        for _ in range(n):
            start = time.perf_counter()
            (await client.post(url + "/chat/completions", json=body)).json()
            raw.append(time.perf_counter() - start - latency_s)
    async with OpenAIPolicy("stub", url) as policy:
        await policy.generate(CHAT, PARAMS)
        ours = []
        for _ in range(n):
            start = time.perf_counter()
            await policy.generate(CHAT, PARAMS)
            ours.append(time.perf_counter() - start - latency_s)
    raw_ms, ours_ms = statistics.median(raw) * 1e3, statistics.median(ours) * 1e3
    return {"raw_httpx_overhead_ms": raw_ms, "policy_overhead_ms": ours_ms, "policy_extra_ms": ours_ms - raw_ms}


async def achieved_concurrency(url: str, latency_s: float, in_flight: int, rounds: int) -> dict[str, float]:
    """Requests/s with `in_flight` requests outstanding: the policy, raw httpx, and the ideal in_flight / latency.

    Raw httpx with the same limits tells what the loopback stack and the stub server can do at all, so the policy's
    own share of any shortfall is the gap between the two measured rates.
    """
    total = in_flight * rounds
    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    async with httpx.AsyncClient(limits=limits) as client:
        gate = asyncio.Semaphore(in_flight)
        body = {"model": "stub", "messages": CHAT, "max_tokens": 16, "temperature": 0}

        async def raw_request() -> None:
            async with gate:
                (await client.post(url + "/chat/completions", json=body)).json()

        await asyncio.gather(*(raw_request() for _ in range(in_flight)))  # open the connections
        start = time.perf_counter()
        await asyncio.gather(*(raw_request() for _ in range(total)))
        raw = total / (time.perf_counter() - start)
    async with OpenAIPolicy("stub", url, max_concurrency=in_flight) as policy:
        await asyncio.gather(*(policy.generate(CHAT, PARAMS) for _ in range(in_flight)))
        start = time.perf_counter()
        await asyncio.gather(*(policy.generate(CHAT, PARAMS) for _ in range(total)))
        achieved = total / (time.perf_counter() - start)
    ideal = in_flight / latency_s
    return {
        "in_flight": in_flight,
        "requests": total,
        "req_per_s": achieved,
        "raw_httpx_req_per_s": raw,
        "ideal_req_per_s": ideal,
        "efficiency": achieved / ideal,
        "retries": policy.retries,
    }


async def run(args: argparse.Namespace) -> dict[str, object]:
    server, url = start_server(args.latency)
    try:
        overhead = await per_request_overhead(url, args.latency, args.sequential)
        concurrency = [await achieved_concurrency(url, args.latency, n, args.rounds) for n in args.in_flight]
    finally:
        server.kill()
        server.wait()
    return {"latency_s": args.latency, "overhead": overhead, "concurrency": concurrency}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a bounded run of a few seconds")
    parser.add_argument("--latency", type=float, default=0.1, help="server latency per request, seconds")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--rounds", type=int, default=5, help="requests per in-flight slot")
    parser.add_argument("--sequential", type=int, default=50, help="requests for the overhead measurement")
    parser.add_argument("--json", metavar="PATH", help="also write the results to PATH")
    args = parser.parse_args()
    if args.quick:
        args.latency, args.in_flight, args.rounds, args.sequential = 0.05, [1, 8, 32], 3, 20
    results = asyncio.run(run(args))
    over = results["overhead"]
    print(f"server latency {args.latency * 1e3:.0f} ms")
    print(
        f"per-request overhead: raw httpx {over['raw_httpx_overhead_ms']:.2f} ms, "
        f"OpenAIPolicy {over['policy_overhead_ms']:.2f} ms ({over['policy_extra_ms']:+.2f} ms)"
    )
    print(f"{'in flight':>9} {'req/s':>9} {'raw httpx':>9} {'ideal':>9} {'efficiency':>10}")
    for row in results["concurrency"]:
        rates = f"{row['req_per_s']:>9.1f} {row['raw_httpx_req_per_s']:>9.1f} {row['ideal_req_per_s']:>9.1f}"
        print(f"{row['in_flight']:>9} {rates} {row['efficiency']:>10.0%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
