"""A virtual endpoint's cost against a plain one, in process (bench/inprocess.py's harness):
`tools/list` and `tools/call` on a three-member endpoint and on one of its members' own
endpoint, the upstreams answered from memory, rounds alternating. Prints the best microseconds
per call of each and the ratios.

    .venv/bin/python bench/virtual.py [--calls 2000] [--rounds 5]
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

import httpx

from bench.inprocess import Resolver, one_call
from proxy.config import from_dict
from proxy.runtime.app import create_app

TOOLS = [{"name": f"tool{i}", "inputSchema": {"type": "object"}} for i in range(10)]


def upstream(request: httpx.Request) -> httpx.Response:
    msg = json.loads(request.content)
    method, rid = msg.get("method"), msg.get("id")
    if rid is None:
        return httpx.Response(202)
    result: dict[str, Any] = {"content": [{"type": "text", "text": "hi"}]}
    if method == "initialize":
        result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                  "serverInfo": {"name": "up", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    return httpx.Response(200, headers={"content-type": "application/json", "mcp-session-id": "s"},
                          content=json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}))


def body(method: str, tool: str | None = None) -> bytes:
    params: dict[str, Any] = {} if tool is None else {"name": tool, "arguments": {"text": "hi"}}
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()


CASES = {"tools/list plain": ("/mcp/m1", body("tools/list")),
         "tools/list virtual": ("/mcp/team", body("tools/list")),
         "tools/call plain": ("/mcp/m1", body("tools/call", "tool1")),
         "tools/call virtual": ("/mcp/team", body("tools/call", "m1__tool1"))}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = from_dict({
            "auth": {"mode": "none"}, "database": {"url": f"sqlite:///{tmp}/b.db"},
            "upstreams": [{"name": f"m{i}", "url": f"http://m{i}.test/mcp", "era": "legacy"}
                          for i in (1, 2, 3)],
            "endpoints": [{"name": "team", "members": ["m1", "m2", "m3"]}]}, env={})
        app = create_app(cfg, upstream_transport=httpx.MockTransport(upstream),
                         resolver=Resolver())
        best = dict.fromkeys(CASES, float("inf"))
        async with app.test_app():
            for path, payload in CASES.values():  # warm: sessions held, names learned
                out: list[bytes] = []
                await one_call(app, body=payload, path=path, out=out)
                if b'"result"' not in b"".join(out):
                    raise SystemExit(f"{path}: not a result: {b''.join(out)[:300]!r}")
            for _ in range(args.rounds):
                for case, (path, payload) in CASES.items():
                    began = time.perf_counter()
                    for _ in range(args.calls):
                        await one_call(app, body=payload, path=path)
                    best[case] = min(best[case], (time.perf_counter() - began) / args.calls)
    for case, seconds in best.items():
        print(f"{case:20} {seconds * 1e6:8.1f} us per call (best of {args.rounds} x {args.calls})")
    for method in ("tools/list", "tools/call"):
        ratio = best[f"{method} virtual"] / best[f"{method} plain"]
        print(f"{method}: virtual / plain = {ratio:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
