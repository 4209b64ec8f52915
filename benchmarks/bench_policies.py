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
import itertools
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


REPLY = json.dumps(
    {
        "id": "fast",
        "object": "chat.completion",
        "model": "stub",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "5"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13},
    }
).encode()


async def serve_fast(port: int, latency_s: float) -> None:
    """A keep-alive HTTP/1.1 server on asyncio streams that answers every POST with one canned chat completion after
    ``latency_s``: thousands of requests per second, where the threaded stub server (a thread per connection) fell to
    tens at 256 connections and became what the benchmark measured."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(REPLY)

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                headers = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in headers.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                await asyncio.sleep(latency_s)
                writer.write(head + REPLY)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", port, backlog=1024)
    print(f"http://127.0.0.1:{port}/v1", flush=True)
    async with server:
        await server.serve_forever()


def start_server(latency_s: float, kind: str = "fast") -> tuple[subprocess.Popen[str], str]:
    """A server process on a free port: ``fast`` (:func:`serve_fast`) or ``stub`` (rllm_gym.policies.stub_server)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    if kind == "fast":
        command = [sys.executable, __file__, "--serve", str(port), "--latency", str(latency_s)]
    else:
        command = [sys.executable, "-m", "rllm_gym.policies.stub_server", "--port", str(port)]
        command += ["--latency", str(latency_s)]
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


async def achieved_concurrency(urls: list[str], latency_s: float, in_flight: int, rounds: int) -> dict[str, float]:
    """Requests/s with `in_flight` requests outstanding: the policy, raw httpx (the servers' ceiling), and the ideal
    in_flight / latency."""
    total = in_flight * rounds
    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    async with httpx.AsyncClient(limits=limits) as client:
        gate = asyncio.Semaphore(in_flight)
        body = {"model": "stub", "messages": CHAT, "max_tokens": 16, "temperature": 0}
        turn = itertools.count()

        async def raw_request() -> None:
            async with gate:
                url = urls[next(turn) % len(urls)]
                (await client.post(url + "/chat/completions", json=body)).json()

        await asyncio.gather(*(raw_request() for _ in range(in_flight)))  # open the connections
        start = time.perf_counter()
        await asyncio.gather(*(raw_request() for _ in range(total)))
        raw = total / (time.perf_counter() - start)
    async with OpenAIPolicy("stub", urls, max_concurrency=in_flight) as policy:
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
        "policy_vs_raw": achieved / raw,
        "retries": policy.retries,
    }


async def run(args: argparse.Namespace) -> dict[str, object]:
    servers = [start_server(args.latency, args.server) for _ in range(args.servers)]
    urls = [url for _, url in servers]
    try:
        overhead = await per_request_overhead(urls[0], args.latency, args.sequential)
        concurrency = [await achieved_concurrency(urls, args.latency, n, args.rounds) for n in args.in_flight]
    finally:
        for server, _ in servers:
            server.kill()
            server.wait()
    return {
        "latency_s": args.latency,
        "server": args.server,
        "servers": args.servers,
        "overhead": overhead,
        "concurrency": concurrency,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a bounded run of a few seconds")
    parser.add_argument("--latency", type=float, default=0.1, help="server latency per request, seconds")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 8, 32, 64, 256])
    parser.add_argument("--servers", type=int, default=1, help="server processes the requests are spread over")
    parser.add_argument("--server", choices=("fast", "stub"), default="fast", help="asyncio server or the stub server")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)  # run as the fast server
    parser.add_argument("--rounds", type=int, default=5, help="requests per in-flight slot")
    parser.add_argument("--sequential", type=int, default=50, help="requests for the overhead measurement")
    parser.add_argument("--json", metavar="PATH", help="also write the results to PATH")
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve_fast(args.serve, args.latency))
        return
    if args.quick:
        args.latency, args.in_flight, args.rounds, args.sequential = 0.05, [1, 32, 256], 3, 20
    results = asyncio.run(run(args))
    over = results["overhead"]
    print(f"{args.servers} {args.server} server(s), latency {args.latency * 1e3:.0f} ms")
    print(
        f"per-request overhead: raw httpx {over['raw_httpx_overhead_ms']:.2f} ms, "
        f"OpenAIPolicy {over['policy_overhead_ms']:.2f} ms ({over['policy_extra_ms']:+.2f} ms)"
    )
    print(f"{'in flight':>9} {'req/s':>9} {'raw httpx':>9} {'ideal':>9} {'of ideal':>8} {'of raw':>7}")
    for row in results["concurrency"]:
        rates = f"{row['req_per_s']:>9.1f} {row['raw_httpx_req_per_s']:>9.1f} {row['ideal_req_per_s']:>9.1f}"
        print(f"{row['in_flight']:>9} {rates} {row['efficiency']:>8.0%} {row['policy_vs_raw']:>7.0%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
