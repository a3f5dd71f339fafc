"""The answers that come before the upstream is called: seed 004's pre-parse answers, media
types, parse errors, and sessions. A real Hypercorn serves; the upstream is a
MockTransport (tests.conftest.mock_upstream)."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest

from tests.conftest import MCP_HEADERS, make_config, mock_upstream, running_gateway

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}}}
CALL = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "hi"}}}


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert body["jsonrpc"] == "2.0"
    return body


async def test_unknown_endpoint_is_plain_404() -> None:
    up = mock_upstream()
    async with running_gateway(make_config(), up.transport) as gw:
        response = await gw.post(CALL, name="nope")
        assert response.status_code == 404
        assert response.json() == {"error": "not found"}
        assert (await gw.client.get(f"{gw.url}/elsewhere")).status_code == 404


async def test_body_over_the_cap_declared_or_streamed_is_413_first() -> None:
    up = mock_upstream()
    cfg = make_config(server={"max_request_bytes": 64})
    async with running_gateway(cfg, up.transport) as gw:
        big = b'{"jsonrpc":"2.0","id":1,"method":"ping","pad":"' + b"x" * 100 + b'"}'
        # over the cap and from a foreign Origin with no credential: 413 comes first
        declared = await gw.post(big, headers={"Origin": "http://evil.example"})

        async def chunks():
            yield big[:50]
            yield big[50:]

        streamed = await gw.client.post(gw.endpoint(), content=chunks(), headers=MCP_HEADERS)
        for response in (declared, streamed):
            assert response.status_code == 413
            assert error_of(response) == {"jsonrpc": "2.0", "id": None, "error": {
                "code": -32600, "message": "Request body too large"}}
        assert up.seen == []
        records = await gw.audit.wait_for(2)
        assert [r.status for r in records] == ["denied", "denied"]


async def test_foreign_origin_is_403_before_credentials() -> None:
    up = mock_upstream()
    cfg = make_config(server={"allowed_origins": ["https://app.example.com"]})
    async with running_gateway(cfg, up.transport) as gw:
        denied = await gw.post(CALL, headers={"Origin": "https://evil.example"})
        assert denied.status_code == 403
        assert error_of(denied)["error"]["code"] == -32600 and error_of(denied)["id"] is None
        allowed = await gw.post(CALL, headers={"Origin": "https://app.example.com"})
        own = await gw.post(CALL, headers={"Origin": "http://127.0.0.1:8080"})
        no_origin = await gw.post(CALL)
        assert [r.status_code for r in (allowed, own, no_origin)] == [200, 200, 200]
        assert len(up.seen) == 3


@pytest.mark.parametrize(
    ("body", "status", "code", "echo_id"),
    [
        (b"{not json", 400, -32700, None),
        (b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', 400, -32600, None),
        (b'{"jsonrpc":"2.0","id":5}', 400, -32600, 5),
        (b'{"hello":"world"}', 400, -32700, None),
        (b'"hello"', 400, -32700, None),
        (b'{"jsonrpc":"1.0","id":3,"method":"ping"}', 400, -32700, None),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":"no"}', 400, -32600, 1),
    ],
)
async def test_malformed_messages(body: bytes, status: int, code: int, echo_id: object) -> None:
    up = mock_upstream()
    async with running_gateway(make_config(), up.transport) as gw:
        response = await gw.post(body)
        assert response.status_code == status
        assert error_of(response)["error"]["code"] == code
        assert error_of(response)["id"] == echo_id
        assert up.seen == []
        (record,) = await gw.audit.wait_for(1)
        assert record.status == "error"


async def test_media_types() -> None:
    up = mock_upstream()
    async with running_gateway(make_config(), up.transport) as gw:
        text = await gw.post(CALL, headers={"Content-Type": "text/plain"})
        assert text.status_code == 415 and error_of(text)["error"]["code"] == -32600
        for ctype in ("application/jsonx", "application/json-seq", "application/json5",
                      "application/jsonx; charset=utf-8", "json", ""):
            response = await gw.post(CALL, headers={"Content-Type": ctype})
            assert response.status_code == 415, ctype
        for ctype in ("application/json; charset=utf-8", "Application/JSON",
                      "application/json ; charset=UTF-8", "application/json;"):
            response = await gw.post(CALL, headers={"Content-Type": ctype})
            assert response.status_code == 200, ctype
        json_only = await gw.post(CALL, headers={"Accept": "application/json"})
        assert json_only.status_code == 406
        anything = await gw.post(CALL, headers={"Accept": "*/*"})
        assert anything.status_code == 200


async def test_other_http_methods_are_405() -> None:
    up = mock_upstream()
    async with running_gateway(make_config(), up.transport) as gw:
        response = await gw.client.put(gw.endpoint(), content=b"{}")
        assert response.status_code == 405
        assert response.json() == {"error": "method not allowed"}
        assert response.headers["allow"] == "GET, POST, DELETE"


async def test_gateway_issues_its_own_session_and_maps_it() -> None:
    up = mock_upstream()
    async with running_gateway(make_config(), up.transport) as gw:
        init = await gw.post(INIT)
        sid = init.headers["mcp-session-id"]
        assert sid != "UPSTREAM-SID" and "UPSTREAM-SID" not in init.text
        call = await gw.post(CALL, headers={"Mcp-Session-Id": sid})
        assert call.status_code == 200 and call.headers["mcp-session-id"] == sid
        assert up.seen[-1].headers["mcp-session-id"] == "UPSTREAM-SID"

        dead = await gw.post(CALL, headers={"Mcp-Session-Id": "made-up"})
        assert dead.status_code == 404 and dead.json() == {"error": "session not found"}

        deleted = await gw.client.delete(gw.endpoint(), headers={"Mcp-Session-Id": sid})
        assert deleted.status_code == 200
        after = await gw.post(CALL, headers={"Mcp-Session-Id": sid})
        assert after.status_code == 404 and after.json() == {"error": "session not found"}


async def test_a_session_from_another_endpoint_is_not_found() -> None:
    up = mock_upstream()
    cfg = make_config(upstreams=[{"name": "e", "url": "http://upstream.test/mcp"},
                                 {"name": "f", "url": "http://upstream.test/mcp"}])
    async with running_gateway(cfg, up.transport) as gw:
        sid = (await gw.post(INIT, name="e")).headers["mcp-session-id"]
        foreign = await gw.post(CALL, name="f", headers={"Mcp-Session-Id": sid})
        assert foreign.status_code == 404 and foreign.json() == {"error": "session not found"}


async def test_upstream_session_expiry_ends_ours() -> None:
    up = mock_upstream()
    # the memory store: the test edits the session object it holds
    async with running_gateway(make_config(state={"url": "memory"}), up.transport) as gw:
        sid = (await gw.post(INIT)).headers["mcp-session-id"]
        session = await gw.gateway.sessions.get(sid)
        assert session is not None
        session.upstream_session_id = "EXPIRED-AT-UPSTREAM"
        gone = await gw.post(CALL, headers={"Mcp-Session-Id": sid})
        assert gone.status_code == 404 and gone.json() == {"error": "session not found"}
        assert await gw.gateway.sessions.get(sid) is None


async def test_notifications_and_responses_are_relayed_as_202() -> None:
    up = mock_upstream()
    async with running_gateway(make_config(), up.transport) as gw:
        sid = (await gw.post(INIT)).headers["mcp-session-id"]
        note = await gw.post({"jsonrpc": "2.0", "method": "notifications/initialized"},
                             headers={"Mcp-Session-Id": sid})
        answer = await gw.post({"jsonrpc": "2.0", "id": "srv-1", "result": {}},
                               headers={"Mcp-Session-Id": sid})
        assert (note.status_code, answer.status_code) == (202, 202)
        assert up.seen[-1].headers["mcp-session-id"] == "UPSTREAM-SID"
        assert orjson.loads(up.seen[-1].content)["id"] == "srv-1"


async def test_an_unsupported_protocol_version_header_is_32022_before_the_session() -> None:
    """A revision of neither era in MCP-Protocol-Version: -32022 with supported/requested
    (seed 003), not the -32600 a modern request with a session id gets, nor -32602."""
    up = mock_upstream()
    async with running_gateway(make_config(), up.transport) as gw:
        sid = (await gw.post(INIT)).headers["mcp-session-id"]
        seen = len(up.seen)
        for headers in ({"Mcp-Session-Id": sid, "MCP-Protocol-Version": "1999-01-01"},
                        {"MCP-Protocol-Version": "2027-01-01"},
                        {"Mcp-Session-Id": "made-up", "MCP-Protocol-Version": "1999-01-01"}):
            response = await gw.post(CALL, headers=headers)
            assert response.status_code == 400
            assert error_of(response) == {"jsonrpc": "2.0", "id": 2, "error": {
                "code": -32022, "message": "Unsupported protocol version", "data": {
                    "supported": ["2026-07-28"],
                    "requested": headers["MCP-Protocol-Version"]}}}
        for method in ("GET", "DELETE"):
            response = await gw.client.request(method, gw.endpoint(), headers={
                "Mcp-Session-Id": sid, "MCP-Protocol-Version": "1999-01-01"})
            assert response.status_code == 400
            assert error_of(response)["error"]["code"] == -32022
        assert len(up.seen) == seen  # nothing went upstream
        # every legacy revision still goes through on the session
        for version in ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"):
            ok = await gw.post(CALL, headers={"Mcp-Session-Id": sid,
                                              "MCP-Protocol-Version": version})
            assert ok.status_code == 200 and ok.json()["result"] == {}


async def test_a_client_gone_before_its_body_arrived_is_audited_once() -> None:
    up = mock_upstream()
    async with running_gateway(make_config(), up.transport) as gw:
        host, port = gw.url.removeprefix("http://").split(":")
        _reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /mcp/e HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"jsonrpc\"")
        await writer.drain()
        writer.close()  # gone, 90 bytes short
        await writer.wait_closed()
        (record,) = await gw.audit.wait_for(1)
        assert (record.status, record.error_message) == ("cancelled", "client disconnected")
        assert up.seen == []
