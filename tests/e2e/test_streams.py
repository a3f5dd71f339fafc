"""Streams that survive proxies (issue 15, item 6) and end cleanly on a drain (item 5): an
idle SSE answer, GET stream or streamed POST, carries a comment line every
`server.sse_heartbeat_s`; every SSE answer says `Cache-Control: no-cache` and
`X-Accel-Buffering: no`; a drain ends a GET stream with its last whole event and a proper
end of the chunked body."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import orjson
from mcp import types

from tests.conftest import MCP_HEADERS
from tests.e2e.conftest import Stack, open_stack
from tests.e2e.sdk_client import connect
from tests.e2e.upstreams import stateful_sse_app
from tests.helpers import DEADLINE_S

HEARTBEAT = b": keepalive\n\n"


async def _session(raw: httpx.AsyncClient, stack: Stack) -> dict[str, str]:
    init = await raw.post(stack.endpoint, headers=MCP_HEADERS, content=orjson.dumps({
        "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}}))
    assert init.status_code == 200, init.text
    headers = {**MCP_HEADERS, "Mcp-Session-Id": init.headers["mcp-session-id"]}
    note = await raw.post(stack.endpoint, headers=headers,
                          content=b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    assert note.status_code == 202
    return headers


@asynccontextmanager
async def _stack(tmp_path: Path, heartbeat_s: float) -> AsyncIterator[Stack]:
    async with open_stack(tmp_path, stateful_sse_app,
                          config={"server": {"sse_heartbeat_s": heartbeat_s}}) as stack:
        yield stack


async def _until_heartbeat(chunks: AsyncIterator[bytes]) -> bytes:
    """The stream's bytes up to and including its first comment line (the deadline is the
    test's failure, not a wait)."""
    seen = b""
    async with asyncio.timeout(DEADLINE_S):
        async for chunk in chunks:
            seen += chunk
            if HEARTBEAT in seen:
                return seen
    raise AssertionError(f"the stream ended without a heartbeat: {seen!r}")


def _proxy_safe(response: httpx.Response) -> None:
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"


async def test_an_idle_get_stream_gets_a_comment_line(tmp_path: Path) -> None:
    async with _stack(tmp_path, 0.05) as stack, httpx.AsyncClient(timeout=DEADLINE_S) as raw:
        headers = await _session(raw, stack)
        async with raw.stream("GET", stack.endpoint, headers=headers) as response:
            assert response.status_code == 200
            _proxy_safe(response)
            seen = await _until_heartbeat(response.aiter_raw())
            assert seen.startswith(HEARTBEAT) or b"\n\n" + HEARTBEAT in seen  # whole events


async def test_a_streamed_call_gets_comment_lines_while_it_waits(tmp_path: Path) -> None:
    async with _stack(tmp_path, 0.05) as stack, httpx.AsyncClient(timeout=DEADLINE_S) as raw:
        headers = await _session(raw, stack)
        body = orjson.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                             "params": {"name": "wait_forever", "arguments": {}}})
        async with raw.stream("POST", stack.endpoint, headers=headers,
                              content=body) as response:
            assert response.status_code == 200
            _proxy_safe(response)
            await asyncio.wait_for(stack.probe.started.wait(), DEADLINE_S)
            seen = await _until_heartbeat(response.aiter_raw())
            assert b"error" not in seen


async def test_no_heartbeat_when_it_is_off(tmp_path: Path) -> None:
    """0 turns it off: a streamed answer is then exactly the upstream's events."""
    async with _stack(tmp_path, 0) as stack, httpx.AsyncClient(timeout=DEADLINE_S) as raw:
        headers = await _session(raw, stack)
        body = orjson.dumps({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
                             "params": {"name": "slow_progress", "arguments": {"steps": 3}}})
        async with raw.stream("POST", stack.endpoint, headers=headers,
                              content=body) as response:
            _proxy_safe(response)
            data = b"".join([chunk async for chunk in response.aiter_raw()])
        assert b"keepalive" not in data and b'"result"' in data


async def test_a_drain_ends_a_get_stream_cleanly(tmp_path: Path) -> None:
    async with _stack(tmp_path, 0.05) as stack, httpx.AsyncClient(timeout=DEADLINE_S) as raw:
        headers = await _session(raw, stack)
        serving = stack.state.serving
        assert serving is not None and not serving.draining
        async with raw.stream("GET", stack.endpoint, headers=headers) as response:
            assert response.status_code == 200
            chunks = response.aiter_raw()
            await _until_heartbeat(chunks)  # open and relaying
            left = await serving.drain(DEADLINE_S)
            assert serving.draining and left > 0
            # the body ends as a chunked body should (httpx raises on a cut one)
            async with asyncio.timeout(DEADLINE_S):
                rest = b"".join([chunk async for chunk in chunks])
            assert b"error" not in rest
        again = await raw.get(stack.endpoint, headers=headers)
        assert again.status_code == 503 and again.headers["retry-after"] == "1"
        serving.draining = False  # the stack closes as usual


async def test_the_sdk_client_reads_through_comment_lines(tmp_path: Path) -> None:
    """A streamed call stays idle while its client answers a sampling request; by the time a
    second stream has had two comment lines (after two intervals), the call's stream has had
    at least one, and the official client still gets its result."""
    go = asyncio.Event()

    async def on_sampling(ctx: object, params: types.CreateMessageRequestParams
                          ) -> types.CreateMessageResult:
        await go.wait()
        return types.CreateMessageResult(role="assistant", model="test",
                                         content=types.TextContent(type="text", text="ok"))

    async with _stack(tmp_path, 0.05) as stack, httpx.AsyncClient(timeout=DEADLINE_S) as raw, \
            connect(stack.endpoint, sampling_callback=on_sampling) as client:
        call = asyncio.create_task(client.call_tool("ask_sampling", {"prompt": "hi"}))
        headers = await _session(raw, stack)
        async with raw.stream("GET", stack.endpoint, headers=headers) as response:
            chunks = response.aiter_raw()
            seen = await _until_heartbeat(chunks)
            while seen.count(HEARTBEAT) < 2:
                seen += await _until_heartbeat(chunks)
        go.set()
        result = await asyncio.wait_for(call, DEADLINE_S)
        assert result.content[0].text == "ok"
