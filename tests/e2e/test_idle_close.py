"""A client that leaves a streamed answer once it has its response closes its connection
before the stream's end; the gateway must close its side at once, not hold the socket in
CLOSE-WAIT until the keep-alive timeout (75 s: a busy gateway would run out of descriptors
first). Served the way `tollhouse serve` serves (proxy.runtime.serve.run_hypercorn)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import httpx
import orjson

from proxy.runtime.app import create_app
from proxy.runtime.serve import run_hypercorn
from tests import db_backends
from tests.e2e.conftest import stack_config
from tests.e2e.upstreams import stateful_sse_app
from tests.helpers import DEADLINE_S, until
from tests.servers import bound_socket, serve

HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream",
           "mcp-protocol-version": "2025-11-25"}


def _sockets(port: int, state: str) -> int:
    """This process's TCP sockets in `state` on the gateway's own port."""
    out = subprocess.run(["ss", "-tanpH", "state", state, f"( sport = :{port} )"],
                         capture_output=True, text=True, check=True).stdout
    return sum(1 for line in out.splitlines() if f"pid={os.getpid()}," in line)


async def test_a_client_gone_after_its_streamed_answer_leaves_no_socket_behind(
        tmp_path: Path) -> None:
    app, _probe = stateful_sse_app()
    async with serve(app, graceful_timeout=1) as upstream_url:
        gateway = create_app(stack_config(upstream_url, db_backends.url()))
        sock, base = bound_socket()
        port = sock.getsockname()[1]
        stop = asyncio.Event()
        served = asyncio.create_task(run_hypercorn(gateway, [f"fd://{sock.detach()}"], 1.0,
                                                    stop))
        try:
            url = f"{base}/mcp/up"
            async with httpx.AsyncClient(timeout=DEADLINE_S) as client:
                init = await client.post(url, headers=HEADERS, content=orjson.dumps({
                    "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                        "protocolVersion": "2025-11-25", "capabilities": {},
                        "clientInfo": {"name": "t", "version": "1"}}}))
                headers = {**HEADERS, "mcp-session-id": init.headers["mcp-session-id"]}
                await client.post(url, headers=headers,
                                  content=b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
            for i in range(5):  # each on its own connection, left as soon as the answer is in
                async with httpx.AsyncClient(timeout=DEADLINE_S) as early:
                    body = orjson.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                                         "params": {"name": "echo", "arguments": {"text": "x"}}})
                    async with early.stream("POST", url, headers=headers, content=body) as r:
                        assert r.headers["content-type"].startswith("text/event-stream")
                        async for line in r.aiter_lines():
                            if line.startswith("data:") and orjson.loads(line[5:]).get("id") == i:
                                break  # the answer: the client goes, the stream not ended
            await until(lambda: _sockets(port, "close-wait") == 0,
                        what="the gateway to close the connections its clients closed")
        finally:
            stop.set()
            await asyncio.wait_for(served, DEADLINE_S)
