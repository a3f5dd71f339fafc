"""Memory per call is bounded by what the call must hold (issue 20, item 2), on a real gateway
process (`python -m proxy serve`, Hypercorn) whose RSS is read from /proc:

- an answer no policy rewrites streams through, JSON or one SSE event, at any size: a 64 MiB
  result read slowly raises the gateway's RSS by at most `BOUND`, and 32 such 8 MiB results at
  once by at most 32 x `BOUND`; the bytes are the upstream's, exactly (the SDK's servers);
- an answer the gateway must hold (a tools/list, filtered) past `server.max_response_bytes`
  is -32000 naming the limit, audited;
- a client that goes away mid-answer closes the upstream request and leaves its record.

One gateway serves the module (one database: each test looks for its own request ids)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import pytest_asyncio

from tests import db_backends, state_backends
from tests.durability.large_upstream import LargeUpstream, result_text
from tests.e2e.upstreams import LARGE_PATTERN, UpstreamProbe, build_app
from tests.helpers import DEADLINE_S, until
from tests.replicas.harness import Replica, _healthy, _start_replica, _stop, free_port
from tests.servers import serve

pytestmark = pytest.mark.asyncio(loop_scope="module")

MiB = 1024 * 1024
BOUND = 8 * MiB  # what one streamed answer may add to the gateway's RSS, whatever its size
LIMIT = 1 * MiB  # server.max_response_bytes here: a held answer larger than this is refused
HEADERS = {"content-type": "application/json",
           "accept": "application/json, text/event-stream"}


@dataclass
class World:
    gateway: Replica
    database_url: str
    large: LargeUpstream
    sdk_json: UpstreamProbe
    sdk_sse: UpstreamProbe

    def rss(self) -> int:
        pid = self.gateway.process.pid
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def url(self, endpoint: str) -> str:
        return f"{self.gateway.url}/mcp/{endpoint}"

    async def audited(self, request_id: str) -> tuple[Any, ...]:
        """The call's audit record, once written (the writer may still have it)."""
        rows: list[tuple[Any, ...]] = []

        def written() -> bool:
            rows[:] = db_backends.rows(self.database_url, "SELECT status, error_message "
                                       "FROM audit WHERE request_id = ?", request_id)
            return bool(rows)

        await until(written, DEADLINE_S, f"the audit record of {request_id}")
        assert len(rows) == 1
        return rows[0]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    databases = db_backends.TestDatabases()  # the module's own: it outlives each test's
    try:
        url = databases.url("large")
        large = LargeUpstream(list_bytes=2 * LIMIT)
        json_app, json_probe = build_app(stateless=True, json_response=True)
        sse_app, sse_probe = build_app(stateless=True, json_response=False)
        async with large.serve() as large_url, \
                serve(json_app, graceful_timeout=1) as json_url, \
                serve(sse_app, graceful_timeout=1) as sse_url:
            port = free_port()
            tables = {
                "server": {"listen": f"127.0.0.1:{port}", "public_url": f"http://127.0.0.1:{port}",
                           "shutdown_grace_s": 1.0,
                           "max_response_bytes": LIMIT},
                "database": {"url": url},
                "state": state_backends.state(),
                "upstreams": [{"name": "big-json", "url": f"{large_url}/json"},
                              {"name": "big-sse", "url": f"{large_url}/sse"},
                              {"name": "sdk-json", "url": f"{json_url}/mcp"},
                              {"name": "sdk-sse", "url": f"{sse_url}/mcp"}],
            }
            process = await _start_replica("large", port, tables,
                                           tmp_path_factory.mktemp("large"))
            try:
                async with httpx.AsyncClient(timeout=5) as client:
                    await _healthy(process, client)
                yield World(process, url, large, json_probe, sse_probe)
            finally:
                await _stop(process.process)
    finally:
        databases.close()


def call(rid: str, name: str, arguments: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                         "params": {"name": name, "arguments": arguments}})


async def read_big(world: World, http: httpx.AsyncClient, endpoint: str, rid: str, size: int,
                   *, slow: bool = False, peak: list[int] | None = None) -> bytes:
    """The body of a `big` call, read as it arrives (slowly: a pause every 64 KiB), the
    gateway's RSS sampled all the while into `peak`."""
    out = bytearray()
    async with http.stream("POST", world.url(endpoint), headers=HEADERS,
                           content=call(rid, "big", {"size": size})) as response:
        assert response.status_code == 200
        async for chunk in response.aiter_raw(64 * 1024):
            out += chunk
            if peak is not None:
                peak[0] = max(peak[0], world.rss())
            if slow:
                await asyncio.sleep(0.0005)  # pacing the reader, not waiting for anything
    return bytes(out)


def text_of(body: bytes, sse: bool) -> tuple[Any, bytes]:
    """(the id, the result's text) of a `big` answer."""
    if sse:
        assert body.startswith(b"event: message\r\ndata: ") and body.endswith(b"\r\n\r\n")
        body = body[len(b"event: message\r\ndata: "):-4]
    msg = orjson.loads(body)
    assert msg["result"]["isError"] is False
    return msg["id"], msg["result"]["content"][0]["text"].encode()


async def warm(world: World, http: httpx.AsyncClient) -> None:
    """One answer of each kind first: what the process allocates once is not per call."""
    for endpoint in ("big-json", "big-sse"):
        await read_big(world, http, endpoint, f"warm-{endpoint}", 2 * MiB)


@pytest.mark.parametrize("endpoint", ["big-json", "big-sse"])
async def test_a_64_mib_answer_read_slowly_adds_a_bounded_rss(world: World,
                                                              endpoint: str) -> None:
    size = 64 * MiB
    async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
        await warm(world, http)
        before = world.rss()
        peak = [before]
        body = await read_big(world, http, endpoint, f"slow-{endpoint}", size, slow=True,
                              peak=peak)
    rid, text = text_of(body, endpoint == "big-sse")
    assert rid == f"slow-{endpoint}" and text == result_text(size)
    grown = peak[0] - before
    assert grown <= BOUND, f"a {size >> 20} MiB answer grew the gateway by {grown >> 20} MiB"
    assert (await world.audited(f"slow-{endpoint}"))[0] == "ok"


async def test_32_concurrent_8_mib_answers_fit_in_32_bounds(world: World) -> None:
    size = 8 * MiB
    async with httpx.AsyncClient(timeout=DEADLINE_S,
                                 limits=httpx.Limits(max_connections=64)) as http:
        await warm(world, http)
        before = world.rss()
        peak = [before]
        bodies = await asyncio.gather(*[
            read_big(world, http, "big-json" if i % 2 else "big-sse", f"many-{i}", size,
                     peak=peak) for i in range(32)])
    for i, body in enumerate(bodies):
        rid, text = text_of(body, not i % 2)
        assert rid == f"many-{i}" and len(text) == size
    grown = peak[0] - before
    assert grown <= 32 * BOUND, f"32 answers of 8 MiB grew the gateway by {grown >> 20} MiB"


async def upstream_body(probe: UpstreamProbe, rid: str) -> bytes:
    """The answer's body as the upstream sent it, once sent whole."""
    exchange = await asyncio.wait_for(probe.wait_exchange(
        lambda ex: ex.rpc_method == "tools/call" and ex.rpc["id"] == rid), DEADLINE_S)
    return exchange.response_body


@pytest.mark.parametrize("endpoint", ["sdk-json", "sdk-sse"])
async def test_a_large_answer_passes_byte_exact(world: World, endpoint: str) -> None:
    """20 MiB in one JSON answer or one SSE event (past the 16 MiB that used to fail), from
    the SDK's own server: the client gets the upstream's bytes, unchanged."""
    size = 20 * MiB
    rid = f"exact-{endpoint}"
    async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
        response = await http.post(world.url(endpoint), headers=HEADERS,
                                   content=call(rid, "large_text", {"size": size}))
    assert response.status_code == 200
    probe = world.sdk_json if endpoint == "sdk-json" else world.sdk_sse
    assert response.content == await upstream_body(probe, rid)
    data = response.content
    if endpoint == "sdk-sse":
        assert response.headers["content-type"].startswith("text/event-stream")
        data = next(line[6:] for line in data.splitlines() if line.startswith(b"data: "))
    msg = orjson.loads(data)
    text = msg["result"]["content"][0]["text"]
    assert msg["id"] == rid and len(text) == size and text.startswith(LARGE_PATTERN)
    assert (await world.audited(rid))[0] == "ok"


@pytest.mark.parametrize("endpoint", ["big-json", "big-sse"])
async def test_a_held_answer_over_the_limit_is_refused_and_audited(world: World,
                                                                   endpoint: str) -> None:
    rid = f"list-{endpoint}"
    async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
        response = await http.post(world.url(endpoint), headers=HEADERS, content=orjson.dumps(
            {"jsonrpc": "2.0", "id": rid, "method": "tools/list"}))
    assert response.status_code == 200
    data = response.content
    if endpoint == "big-sse":
        data = data.rstrip().rpartition(b"data: ")[2]
    error = orjson.loads(data)
    assert error["id"] == rid and error["error"]["code"] == -32000
    assert "server.max_response_bytes" in error["error"]["message"]
    assert str(LIMIT) in error["error"]["message"]
    status, message = await world.audited(rid)
    assert status == "error" and "server.max_response_bytes" in message


@pytest.mark.parametrize("endpoint", ["big-json", "big-sse"])
async def test_a_client_gone_mid_answer_closes_the_upstream_and_is_audited(
        world: World, endpoint: str) -> None:
    rid = f"gone-{endpoint}"
    world.large.closed.clear()
    async with httpx.AsyncClient(timeout=DEADLINE_S) as http, \
            http.stream("POST", world.url(endpoint), headers=HEADERS,
                        content=call(rid, "big", {"size": 256 * MiB})) as response:
        got = 0
        async for chunk in response.aiter_raw(64 * 1024):
            got += len(chunk)
            if got > 2 * MiB:
                break  # the client goes away with most of the answer still to come
    await asyncio.wait_for(world.large.closed.wait(), DEADLINE_S)
    status, message = await world.audited(rid)
    assert status == "cancelled", (status, message)


async def test_small_answers_are_unchanged(world: World) -> None:
    """Below the head bound an answer is read whole, as before: same bytes, same record."""
    async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
        for endpoint in ("sdk-json", "sdk-sse"):
            rid = f"small-{endpoint}"
            response = await http.post(world.url(endpoint), headers=HEADERS,
                                       content=call(rid, "echo", {"text": "hi"}))
            probe = world.sdk_json if endpoint == "sdk-json" else world.sdk_sse
            assert response.content == await upstream_body(probe, rid)
            assert (await world.audited(rid))[0] == "ok"
