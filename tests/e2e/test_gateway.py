"""The official SDK client drives an official SDK server through the gateway exactly as if the
gateway were the server: tools, progress, server-to-client requests, the GET stream, DELETE,
cancellation, and failures."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import orjson
import pytest
from mcp import types
from mcp.shared.exceptions import MCPError

from proxy.audit import query
from tests import db_backends
from tests.conftest import MCP_HEADERS
from tests.e2e.conftest import open_stack
from tests.e2e.sdk_client import connect
from tests.e2e.upstreams import BOOM_RPC_CODE, stateful_sse_app, stateless_json_app
from tests.helpers import DEADLINE_S, Deadlines, until


async def test_list_and_call_tools(tmp_path: Path, upstream_kind) -> None:
    async with open_stack(tmp_path, upstream_kind) as stack:
        async with connect(stack.endpoint) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"echo", "slow_progress", "wait_forever", "boom"} <= names
            result = await client.call_tool("echo", {"text": "through the gateway"})
            assert result.content[0].text == "through the gateway"
            boom = await client.call_tool("boom", {})
            assert boom.is_error
            with pytest.raises(MCPError) as info:
                await client.call_tool("boom_rpc", {})
            assert info.value.error.code == BOOM_RPC_CODE
            gateway_sid = client.session_id
        # the client saw only the gateway's session id, never the upstream's
        upstream_sids = {v for ex in stack.probe.exchanges for k, v in ex.response_headers
                         if k == "mcp-session-id"}
        assert gateway_sid is not None and gateway_sid not in upstream_sids
        # the client's requests reached the upstream with the upstream's own id
        echo = stack.probe.tool_calls("echo")[0]
        if upstream_sids:
            assert echo.headers["mcp-session-id"] in upstream_sids
        assert "authorization" not in echo.headers
    records = query(stack.db_path, limit=100)
    methods = [r["method"] for r in records]
    assert methods.count("tools/call") == 3 and "initialize" in methods
    by_tool = {r["tool"]: r for r in records if r["tool"]}
    assert by_tool["echo"]["status"] == "ok"
    assert by_tool["boom_rpc"]["status"] == "error"
    assert by_tool["echo"]["session_hash"] and by_tool["echo"]["session_hash"] != gateway_sid
    assert all(r["era"] == "legacy" for r in records)


async def test_progress_travels_on_the_call_stream(tmp_path: Path) -> None:
    async with open_stack(tmp_path, stateful_sse_app) as stack:
        seen: list[float] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append(progress)

        async with connect(stack.endpoint) as client:
            result = await client.call_tool("slow_progress", {"steps": 4},
                                            progress_callback=on_progress)
            assert result.content[0].text == "done"
        assert seen == [1, 2, 3, 4]


@pytest.mark.parametrize("standalone", [False, True], ids=["on-call-stream", "on-get-stream"])
async def test_server_to_client_request_round_trip(tmp_path: Path, standalone: bool) -> None:
    async with open_stack(tmp_path, stateful_sse_app) as stack:
        async def on_sampling(ctx, params: types.CreateMessageRequestParams
                              ) -> types.CreateMessageResult:
            prompt = params.messages[0].content.text
            return types.CreateMessageResult(
                role="assistant", model="test",
                content=types.TextContent(type="text", text=f"sampled: {prompt}"))

        async with connect(stack.endpoint, sampling_callback=on_sampling) as client:
            if standalone:  # the request goes out on the GET stream, which must be open
                await _wait_get_stream(stack)
            result = await client.call_tool("ask_sampling", {"prompt": "hello",
                                                              "standalone": standalone})
            assert result.content[0].text == "sampled: hello"


async def _wait_get_stream(stack) -> None:
    await until(lambda: any(ex.method == "GET" and ex.status == 200
                            for ex in stack.probe.exchanges), what="the GET stream to open")


async def test_elicitation_round_trip(tmp_path: Path) -> None:
    async with open_stack(tmp_path, stateful_sse_app) as stack:
        async def on_elicit(ctx, params) -> types.ElicitResult:
            return types.ElicitResult(action="accept", content={"answer": "yes"})

        async with connect(stack.endpoint, elicitation_callback=on_elicit) as client:
            result = await client.call_tool("ask_elicitation", {"message": "ok?"})
            assert result.content[0].text == "accept:yes"


async def test_delete_ends_the_session_at_both_ends(tmp_path: Path) -> None:
    async with open_stack(tmp_path, stateful_sse_app) as stack:
        async with connect(stack.endpoint, terminate_on_close=False) as client:
            await client.call_tool("echo", {"text": "x"})
            sid = client.session_id
            assert await client.terminate() == 200
        upstream_delete = [ex for ex in stack.probe.exchanges if ex.method == "DELETE"]
        assert len(upstream_delete) == 1 and upstream_delete[0].status == 200
        async with httpx.AsyncClient() as raw:
            after = await raw.post(stack.endpoint, headers={**MCP_HEADERS, "Mcp-Session-Id": sid},
                                   content=b'{"jsonrpc":"2.0","id":1,"method":"ping"}')
        assert after.status_code == 404 and after.json() == {"error": "session not found"}


async def test_client_cancel_reaches_the_upstream(tmp_path: Path) -> None:
    async with open_stack(tmp_path, stateful_sse_app) as stack:
        async with connect(stack.endpoint) as client:
            call = asyncio.create_task(client.call_tool("wait_forever", {}))
            await asyncio.wait_for(stack.probe.started.wait(), DEADLINE_S)
            call.cancel()
            await asyncio.wait_for(stack.probe.cancelled.wait(), DEADLINE_S)
            # the session still works after a cancelled call
            assert (await client.call_tool("echo", {"text": "still here"})).content[0].text
        await _settled(stack)
    statuses = {r["tool"]: r["status"] for r in query(stack.db_path) if r["tool"]}
    assert statuses["wait_forever"] == "cancelled"


async def test_total_timeout_is_32800_and_cancels_upstream(tmp_path: Path) -> None:
    deadlines = Deadlines()
    async with open_stack(tmp_path, stateful_sse_app, total_timeout_s=30,
                          later=deadlines) as stack:
        async with connect(stack.endpoint) as client:
            call = asyncio.create_task(client.call_tool("wait_forever", {}))
            await asyncio.wait_for(stack.probe.started.wait(), DEADLINE_S)
            assert deadlines.expire() == 1  # the call's deadline, and only it, is armed
            with pytest.raises(MCPError) as info:
                await asyncio.wait_for(call, DEADLINE_S)
            assert info.value.error.code == -32800
            await asyncio.wait_for(stack.probe.cancelled.wait(), DEADLINE_S)
        await _settled(stack)


async def test_client_disconnect_cancels_upstream(tmp_path: Path) -> None:
    async with open_stack(tmp_path, stateful_sse_app) as stack:
        async with httpx.AsyncClient() as raw:
            init = await raw.post(stack.endpoint, headers=MCP_HEADERS, content=orjson.dumps({
                "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"}}}))
            headers = {**MCP_HEADERS, "Mcp-Session-Id": init.headers["mcp-session-id"]}
            await raw.post(stack.endpoint, headers=headers,
                           content=b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
            call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                    "params": {"name": "wait_forever", "arguments": {}}}
            async with httpx.AsyncClient() as doomed:
                pending = asyncio.create_task(doomed.post(stack.endpoint, headers=headers,
                                                          content=orjson.dumps(call)))
                await asyncio.wait_for(stack.probe.started.wait(), DEADLINE_S)
                pending.cancel()
            await asyncio.wait_for(stack.probe.cancelled.wait(), DEADLINE_S)
        await _settled(stack)


async def test_upstream_down_is_32000(tmp_path: Path) -> None:
    async with open_stack(tmp_path, stateless_json_app) as stack:
        pass  # the upstream has stopped; the gateway's config still points at it
    import socket

    from tests.e2e.conftest import stack_config
    from tests.stack import gateway_stack

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    async with gateway_stack(stack_config(dead, db_backends.url())) as site:
        with pytest.raises(MCPError) as info:
            async with connect(site.endpoint("up")):
                pass
        assert info.value.error.code == -32000
        assert info.value.error.message == "upstream unavailable"
    del stack


async def _settled(stack) -> None:
    """No in-flight call, background task or borrowed upstream connection is left."""
    gateway = stack.gateway
    await gateway.drain(DEADLINE_S)

    def ours() -> list[asyncio.Task]:
        return [t for t in asyncio.all_tasks()
                if t.get_coro().__qualname__.startswith(("Gateway", "StreamRelay"))]

    def quiet() -> bool:
        return not (len(gateway.inflight) or gateway._tasks or ours()
                    or gateway.upstream.connections_in_use())

    await until(quiet, what="the gateway to settle")
