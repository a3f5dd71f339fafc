"""The gateway's own cost per call, in process: no sockets, no Hypercorn, no load generator.

Builds the app for a one-upstream config (auth `none`, SQLite audit in a temporary
directory), answers upstream calls from an in-memory httpx transport, and drives the ASGI app
directly with `tools/call` POSTs, one after another. Prints the best (lowest) microseconds per
call over several rounds: the least noisy figure on a shared machine, and one that two builds
can be compared by (run each with its own checkout first on sys.path, alternately).

    .venv/bin/python bench/inprocess.py [--calls 3000] [--rounds 5]
    cd /path/to/other/checkout && /work/main/.venv/bin/python /work/main/bench/inprocess.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.getcwd())  # the checkout to measure: the one this is run from

import httpx  # noqa: E402

from proxy.app import create_app  # noqa: E402
from proxy.config import from_dict  # noqa: E402

CALL = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "echo", "arguments": {"text": "hi"}}}).encode()
RESULT = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {
    "content": [{"type": "text", "text": "hi"}]}}).encode()
HEADERS = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
           (b"accept", b"application/json, text/event-stream"),
           (b"mcp-protocol-version", b"2025-11-25"), (b"content-length", str(len(CALL)).encode())]


class Resolver:
    async def resolve(self, host: str, port: int) -> list[str]:
        return ["192.0.2.10"]


def upstream(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, content=RESULT, headers={"content-type": "application/json"})


async def one_call(app: Any) -> int:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/mcp/bench", "raw_path": b"/mcp/bench",
             "query_string": b"", "headers": HEADERS, "client": ("127.0.0.1", 40000),
             "server": ("127.0.0.1", 8080), "root_path": ""}
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": CALL, "more_body": False}
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = from_dict({"auth": {"mode": "none"}, "database": {"url": f"sqlite:///{tmp}/b.db"},
                         "upstreams": [{"name": "bench", "url": "http://upstream.test/mcp"}]},
                        env={})
        app = create_app(cfg, upstream_transport=httpx.MockTransport(upstream),
                         resolver=Resolver())
        async with app.test_app():
            assert await one_call(app) == 200
            best = float("inf")
            for _ in range(args.rounds):
                began = time.perf_counter()
                for _ in range(args.calls):
                    await one_call(app)
                best = min(best, (time.perf_counter() - began) / args.calls)
    print(f"{os.getcwd()}: {best * 1e6:.1f} us per call (best of {args.rounds} x {args.calls})")


if __name__ == "__main__":
    asyncio.run(main())
