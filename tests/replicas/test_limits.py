"""Item 3: limits are exact across replicas. A burst of B admits exactly B of 1,000 concurrent
calls split between two replicas, and N parallel wrong credentials across both get at most
`max_failures` answers that are not "locked"."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.conftest import MCP_HEADERS
from tests.e2e.upstreams import stateless_json_app
from tests.helpers import jwt_auth, token
from tests.replicas.harness import Cluster, open_cluster
from tests.servers import serve

BURST = 25
CALLS = 1000
MAX_FAILURES = 5
GUESSES = 60
PER_REPLICA_CONNECTIONS = 150  # all calls are issued at once; this many on the wire to each
POOL_CONNECTIONS = 15  # ... over pools of this many (`split`)

LIMIT = {"name": "burst", "key": "principal", "methods": ["tools/call"], "rate": "1/h",
         "burst": BURST}


def call(i: int) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                         "params": {"name": "echo", "arguments": {"text": f"call {i}"}}})


async def open_session(client: httpx.AsyncClient, endpoint: str) -> dict[str, str]:
    """A 2025-11-25 session opened through `endpoint`; the headers that continue it."""
    init = await client.post(endpoint, headers=MCP_HEADERS, content=orjson.dumps({
        "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "burst", "version": "1"}}}))
    assert init.status_code == 200, init.text
    headers = {**MCP_HEADERS, "Mcp-Session-Id": init.headers["mcp-session-id"]}
    note = await client.post(endpoint, headers=headers,
                             content=b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    assert note.status_code == 202
    return headers


async def split(cluster: Cluster, count: int, send: Any) -> list[httpx.Response]:
    """`send(client, endpoint, i)` for i in range(count), all at once, alternating between
    the replicas (each straight to its port), `PER_REPLICA_CONNECTIONS` on the wire to each.
    Those connections are spread over small pools, and the calls beyond a pool's
    connections wait their turn on a semaphore, not in the pool: httpcore looks at every
    queued request against every connection of its pool each time one frees up, which cost
    this test's client ~11 ms of CPU a call (20 s for the 1,000) with one pool of 150 a
    replica, and the 1,000 took 30 s."""
    pools = PER_REPLICA_CONNECTIONS // POOL_CONNECTIONS
    limits = httpx.Limits(max_connections=POOL_CONNECTIONS)
    clients = [[httpx.AsyncClient(timeout=60, limits=limits, verify=False)  # (plain HTTP: no
                 for _ in range(pools)]                        # CA bundle loaded per pool)
               for _ in cluster.replicas]
    turns = [[asyncio.Semaphore(POOL_CONNECTIONS) for _ in range(pools)]
             for _ in cluster.replicas]

    async def one(i: int) -> httpx.Response:
        at, pool = i % len(cluster.replicas), i // len(cluster.replicas) % pools
        async with turns[at][pool]:
            return await send(clients[at][pool], cluster.replicas[at].endpoint, i)

    try:
        return list(await asyncio.gather(*(one(i) for i in range(count))))
    finally:
        await asyncio.gather(*(c.aclose() for per in clients for c in per))


async def test_a_burst_admits_exactly_its_size_across_replicas(tmp_path: Path) -> None:
    app, probe = stateless_json_app()
    async with serve(app, graceful_timeout=1) as url, \
            open_cluster(tmp_path, url, era="legacy", config={"rate_limits": [LIMIT]}) as cluster:
        async with httpx.AsyncClient(timeout=10) as client:
            headers = await open_session(client, cluster.endpoint)

            # one call on each replica first, so both are known to charge the one bucket
            # (which replica wins a slot in the burst below is the scheduler's business)
            first = [await client.post(r.endpoint, headers=headers, content=call(-1 - n))
                     for n, r in enumerate(cluster.replicas)]
        assert [r.status_code for r in first] == [200, 200], [r.text for r in first]

        async def send(client: httpx.AsyncClient, endpoint: str, i: int) -> httpx.Response:
            return await client.post(endpoint, headers=headers, content=call(i))

        answers = await split(cluster, CALLS - 2, send)
        keys = await cluster.keys()
    admitted = [r for r in answers if r.status_code == 200]
    limited = [r for r in answers if r.status_code == 429]
    assert len(admitted) == BURST - 2  # 2 + (BURST - 2) of the 1,000: exactly the burst
    assert Counter(r.status_code for r in answers) == {200: BURST - 2,
                                                        429: CALLS - BURST}, \
        {r.text for r in answers if r.status_code not in (200, 429)}
    for response in admitted:
        body = response.json()
        assert body["result"]["content"][0]["text"] == f"call {body['id']}"
    for response in limited:
        assert int(response.headers["retry-after"]) > 0
        assert response.json()["error"] == {"code": -32000, "message": "Too many requests"}
    # only the admitted reached the upstream
    assert len(probe.tool_calls("echo")) == BURST
    (bucket,) = [k for k in keys if k.startswith("rl:")]
    assert keys[bucket] > 0  # the bucket expires by itself


async def test_parallel_wrong_credentials_across_replicas_lock_after_max_failures(
        tmp_path: Path) -> None:
    app, _probe = stateless_json_app()
    lockout = {"max_failures": MAX_FAILURES, "window_s": 60, "lockout_s": 120}
    async with serve(app, graceful_timeout=1) as url, \
            open_cluster(tmp_path, url, era="legacy",
                         config={"auth": jwt_auth(lockout=lockout)}) as cluster:
        bad = token("not-the-secret-0123456789abcdef0123456789")
        wire = {**MCP_HEADERS, "Authorization": f"Bearer {bad}"}

        async def guess(client: httpx.AsyncClient, endpoint: str, i: int) -> httpx.Response:
            return await client.post(endpoint, headers=wire, content=call(i))

        answers = await split(cluster, GUESSES, guess)
        good = {**MCP_HEADERS, "Authorization": f"Bearer {token(endpoint='up')}"}
        async with httpx.AsyncClient(timeout=10) as client:
            after = [await client.post(r.endpoint, headers=good, content=call(0))
                     for r in cluster.replicas]
        keys = await cluster.keys()
    statuses = Counter(r.status_code for r in answers)
    assert statuses == {401: MAX_FAILURES, 429: GUESSES - MAX_FAILURES}, statuses
    for response in answers:
        if response.status_code == 429:
            assert int(response.headers["retry-after"]) > 0
    # locked on every replica, even with a good credential
    assert [r.status_code for r in after] == [429, 429], [r.text for r in after]
    locks = [k for k in keys if k.startswith("lk:l:")]
    assert locks and all(keys[k] > 0 for k in locks)
