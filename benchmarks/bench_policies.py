"""Benchmark of OpenAIPolicy's client side against a local server with a fixed artificial latency.

Two numbers matter for rollouts against `vllm serve` fleets: what each request costs on top of the server's own
time (request building, pooling, JSON parsing, retry bookkeeping), and whether N requests in flight really give
N / latency requests per second. The server is an asyncio HTTP server in its own process (or, with ``--server
stub``, :mod:`rllm_gym.policies.stub_server`), answering every request after exactly ``--latency`` seconds.

Each figure is compared on the same server and the same connection limit with:

- raw aiohttp, the policy's own transport used directly: the policy's overhead is the gap to it;
- raw httpx, the transport the policy used before (its pool scans every connection on every request);
- the server's ceiling, one core divided by the server process's CPU per request (over all the requests of the
  comparison), so a rate far below it is not the server's doing.

    python benchmarks/bench_policies.py --quick                 # about 40 seconds
    python benchmarks/bench_policies.py --json results.json     # full run, results also as JSON
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
import httpx
from _measure import write_json

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


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``); ``None`` where there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


Post = Callable[[str], Awaitable[object]]
HTTPX_ROUNDS = 3  # raw httpx manages ~100 requests/s at 256 in flight: it gets at most this many rounds


async def with_raw_clients(in_flight: int, use: Callable[[Post, Post], Awaitable[None]]) -> None:
    """Calls ``use(aiohttp_post, httpx_post)``: each posts the benchmark's chat body to a URL with a client of that
    library limited to ``in_flight`` connections, and parses the JSON reply."""
    body = {"model": "stub", "messages": CHAT, "max_tokens": 16, "temperature": 0}
    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    connector = aiohttp.TCPConnector(limit=in_flight, limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector) as session, httpx.AsyncClient(limits=limits) as client:

        async def aiohttp_post(url: str) -> object:
            async with session.post(url + "/chat/completions", json=body) as response:
                return json.loads(await response.read())

        async def httpx_post(url: str) -> object:
            return (await client.post(url + "/chat/completions", json=body)).json()

        await use(aiohttp_post, httpx_post)


async def per_request_overhead(url: str, latency_s: float, n: int) -> dict[str, float]:
    """Sequential requests: the median wall time per request minus the server's latency, for raw aiohttp, raw httpx
    and the policy."""

    async def overhead(post: Post) -> float:
        await post(url)  # warm the connection
        times = []
        for _ in range(n):
            start = time.perf_counter()
            await post(url)
            times.append(time.perf_counter() - start - latency_s)
        return statistics.median(times) * 1e3

    raw: dict[str, float] = {}

    async def both(aiohttp_post: Post, httpx_post: Post) -> None:
        raw["aiohttp"], raw["httpx"] = await overhead(aiohttp_post), await overhead(httpx_post)

    await with_raw_clients(1, both)
    async with OpenAIPolicy("stub", url) as policy:
        ours = await overhead(lambda _url: policy.generate(CHAT, PARAMS))
    return {
        "raw_aiohttp_overhead_ms": raw["aiohttp"],
        "raw_httpx_overhead_ms": raw["httpx"],
        "policy_overhead_ms": ours,
        "policy_extra_ms": ours - raw["aiohttp"],
    }


async def achieved_concurrency(
    urls: list[str], pids: list[int], latency_s: float, in_flight: int, rounds: int, trials: int
) -> dict[str, float | None]:
    """Requests/s with ``in_flight`` requests outstanding: the policy, raw aiohttp and raw httpx (same connection
    limit, same servers), the servers' ceiling (from their CPU per request), and the ideal
    in_flight / latency. The policy and raw aiohttp take turns for ``trials`` rounds (medians reported), so a drift
    of the machine's speed does not fall on one of them."""
    total = in_flight * rounds
    turn = itertools.count()

    async def rate(post: Post, requests: int = total) -> float:
        gate = asyncio.Semaphore(in_flight)

        async def request() -> None:
            async with gate:
                await post(urls[next(turn) % len(urls)])

        await asyncio.gather(*(request() for _ in range(in_flight)))  # open the connections
        start = time.perf_counter()
        await asyncio.gather(*(request() for _ in range(requests)))
        return requests / (time.perf_counter() - start)

    rates: dict[str, list[float]] = {"aiohttp": [], "httpx": [], "policy": []}
    retries: list[int] = []
    httpx_requests = in_flight * min(rounds, HTTPX_ROUNDS)

    async def compare(aiohttp_post: Post, httpx_post: Post) -> None:
        rates["httpx"].append(await rate(httpx_post, httpx_requests))
        async with OpenAIPolicy("stub", urls, max_concurrency=in_flight) as policy:
            for _ in range(trials):
                rates["aiohttp"].append(await rate(aiohttp_post))
                rates["policy"].append(await rate(lambda _url: policy.generate(CHAT, PARAMS)))
        retries.append(policy.retries)

    before = [cpu_seconds(pid) for pid in pids]
    await with_raw_clients(in_flight, compare)
    after = [cpu_seconds(pid) for pid in pids]
    achieved, raw = statistics.median(rates["policy"]), statistics.median(rates["aiohttp"])
    # The servers' CPU per request over every request of this comparison; each server process has a core of its own
    # at best, so n servers answer n / (CPU per request) a second.
    answered = 2 * trials * in_flight * (rounds + 1) + in_flight + httpx_requests
    cpu = None if None in before or None in after else sum(after) - sum(before)  # type: ignore[arg-type]
    ceiling = len(pids) * answered / cpu if cpu else None
    ideal = in_flight / latency_s
    return {
        "in_flight": in_flight,
        "requests": total,
        "trials": trials,
        "req_per_s": achieved,
        "raw_aiohttp_req_per_s": raw,
        "raw_httpx_req_per_s": rates["httpx"][0],
        "server_ceiling_req_per_s": ceiling,
        "ideal_req_per_s": ideal,
        "efficiency": achieved / ideal,
        "policy_vs_raw": achieved / raw,
        "policy_vs_httpx": achieved / rates["httpx"][0],
        "retries": retries[0],
    }


async def run(args: argparse.Namespace) -> dict[str, object]:
    servers = [start_server(args.latency, args.server) for _ in range(args.servers)]
    urls, pids = [url for _, url in servers], [server.pid for server, _ in servers]
    try:
        overhead = await per_request_overhead(urls[0], args.latency, args.sequential)
        concurrency = [
            await achieved_concurrency(urls, pids, args.latency, n, args.rounds, args.trials) for n in args.in_flight
        ]
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
    parser.add_argument("--quick", action="store_true", help="a bounded run of about 40 seconds")
    parser.add_argument("--latency", type=float, default=0.1, help="server latency per request, seconds")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 8, 32, 64, 256])
    parser.add_argument("--servers", type=int, default=1, help="server processes the requests are spread over")
    parser.add_argument("--server", choices=("fast", "stub"), default="fast", help="asyncio server or the stub server")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)  # run as the fast server
    parser.add_argument("--rounds", type=int, default=5, help="requests per in-flight slot")
    parser.add_argument("--trials", type=int, default=3, help="turns of the policy and raw aiohttp (medians)")
    parser.add_argument("--sequential", type=int, default=50, help="requests for the overhead measurement")
    parser.add_argument("--json", metavar="PATH", help="also write the results to PATH")
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve_fast(args.serve, args.latency))
        return
    if args.quick:
        args.latency, args.in_flight, args.rounds, args.sequential, args.trials = 0.05, [1, 32, 256], 10, 20, 5
    results = asyncio.run(run(args))
    over = results["overhead"]
    print(f"{args.servers} {args.server} server(s), latency {args.latency * 1e3:.0f} ms")
    print(
        f"per-request overhead: raw aiohttp {over['raw_aiohttp_overhead_ms']:.2f} ms, raw httpx "
        f"{over['raw_httpx_overhead_ms']:.2f} ms, OpenAIPolicy {over['policy_overhead_ms']:.2f} ms "
        f"({over['policy_extra_ms']:+.2f} ms on aiohttp)"
    )
    print(f"{'in flight':>9} {'req/s':>8} {'aiohttp':>8} {'httpx':>8} {'server':>8} {'ideal':>8} {'of raw':>7}")
    for row in results["concurrency"]:
        ceiling = row["server_ceiling_req_per_s"]
        print(
            f"{row['in_flight']:>9} {row['req_per_s']:>8.0f} {row['raw_aiohttp_req_per_s']:>8.0f} "
            f"{row['raw_httpx_req_per_s']:>8.0f} {ceiling or float('nan'):>8.0f} {row['ideal_req_per_s']:>8.0f} "
            f"{row['policy_vs_raw']:>7.0%}"
        )
    write_json(args.json, results)


if __name__ == "__main__":
    main()
