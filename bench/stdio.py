"""tools/call through a stdio upstream against the same server over Streamable HTTP.

The server is tests/stdio/server.py (the official Python SDK): once as the gateway's child
process (`transport = "stdio"`), once as its own process on a loopback port (SSE answers, the
SDK's default, and JSON answers), both behind one in-process gateway on Hypercorn. Each target
gets one legacy session, a warm-up, then `--calls` echo calls at each concurrency, interleaved
over `--rounds`; the table gives medians of calls/s and of the median latency, and each HTTP
target as a ratio of stdio. Not a test: figures go in bench/README.md.

    .venv/bin/python bench/stdio.py [--calls 2000] [--concurrency 1,16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proxy.config import from_dict
from proxy.runtime.app import create_app
from tests.servers import serve

SERVER = str(ROOT / "tests" / "stdio" / "server.py")
HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "b", "version": "1"}}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_listening(port: int, deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.05)


async def session(client: httpx.AsyncClient, url: str) -> dict[str, str]:
    opened = await client.post(url, content=orjson.dumps(INIT), headers=HEADERS)
    opened.raise_for_status()
    headers = {**HEADERS, "mcp-session-id": opened.headers["mcp-session-id"],
               "mcp-protocol-version": "2025-11-25"}
    await client.post(url, headers=headers, content=orjson.dumps(
        {"jsonrpc": "2.0", "method": "notifications/initialized"}))
    return headers


async def run(client: httpx.AsyncClient, url: str, headers: dict[str, str], calls: int,
              concurrency: int) -> tuple[float, float]:
    latencies: list[float] = []
    next_id = iter(range(1, 10**9))

    async def worker(n: int) -> None:
        for _ in range(n):
            body = orjson.dumps({"jsonrpc": "2.0", "id": next(next_id), "method": "tools/call",
                                 "params": {"name": "echo", "arguments": {"text": "hi"}}})
            started = time.perf_counter()
            response = await client.post(url, content=body, headers=headers)
            assert b'"hi"' in response.content, response.content[:200]
            latencies.append(time.perf_counter() - started)

    began = time.perf_counter()
    await asyncio.gather(*(worker(calls // concurrency) for _ in range(concurrency)))
    elapsed = time.perf_counter() - began
    return len(latencies) / elapsed, statistics.median(latencies) * 1000


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    ports = {"http-sse": free_port(), "http-json": free_port()}
    # the two servers start once, before anything is timed: a blocking Popen is fine here
    procs = [subprocess.Popen(  # noqa: ASYNC220
                 [sys.executable, SERVER, "http", str(ports["http-sse"])],
                 stderr=subprocess.DEVNULL),
             subprocess.Popen(  # noqa: ASYNC220
                 [sys.executable, SERVER, "http", str(ports["http-json"]), "json"],
                 stderr=subprocess.DEVNULL)]
    try:
        for port in ports.values():
            await wait_listening(port)
        with tempfile.TemporaryDirectory() as tmp:
            cfg = from_dict({"database": {"url": f"sqlite:///{tmp}/b.db"}, "upstreams": [
                {"name": "stdio", "transport": "stdio", "command": sys.executable,
                 "args": [SERVER]},
                *({"name": name, "url": f"http://127.0.0.1:{port}/mcp"}
                  for name, port in ports.items())]}, env={})
            app = create_app(cfg)
            async with serve(app) as base, httpx.AsyncClient(
                    timeout=60, limits=httpx.Limits(max_connections=256)) as client:
                targets = ["stdio", *ports]
                sessions = {t: await session(client, f"{base}/mcp/{t}") for t in targets}
                for t in targets:  # warm-up
                    await run(client, f"{base}/mcp/{t}", sessions[t], 200, 4)
                results: dict[tuple[str, int], list[tuple[float, float]]] = {}
                for _ in range(args.rounds):
                    for c in levels:
                        for t in targets:
                            results.setdefault((t, c), []).append(
                                await run(client, f"{base}/mcp/{t}", sessions[t], args.calls, c))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
    print(f"tools/call echo, {args.calls} calls x {args.rounds} rounds, medians "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)\n")
    print("| target | concurrency | calls/s | median ms | calls/s vs stdio |")
    print("|---|---:|---:|---:|---:|")
    for c in levels:
        base_rate = statistics.median(r for r, _ in results[("stdio", c)])
        for t in targets:
            rate = statistics.median(r for r, _ in results[(t, c)])
            latency = statistics.median(m for _, m in results[(t, c)])
            print(f"| {t} | {c} | {rate:,.0f} | {latency:.2f} | {rate / base_rate:.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
