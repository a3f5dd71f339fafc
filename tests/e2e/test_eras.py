"""Both protocol eras on one endpoint: the official SDK client in 2026-07-28, auto and legacy
modes, through the gateway, to the official SDK server as a modern upstream and as a
legacy one (the gateway forced to treat it so, to exercise the bridge), stateful or stateless."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from mcp import Client

from proxy.audit import query
from proxy.auth import keys as api_keys
from tests import db_backends
from tests.e2e.conftest import open_stack
from tests.e2e.upstreams import UpstreamProbe, build_app, stateful_sse_app, stateless_json_app
from tests.helpers import DEADLINE_S
from tests.stack import gateway_stack

MODERN = "2026-07-28"


@asynccontextmanager
async def stack(tmp_path: Path, make: Any, era: str, **extra: Any
                ) -> AsyncIterator[tuple[str, UpstreamProbe, str]]:
    """`open_stack` with the upstream's era and a 5 s total timeout; `extra` top-level tables."""
    async with open_stack(tmp_path, make, config=extra, era=era, total_timeout_s=5) as s:
        yield s.endpoint, s.probe, s.db_path


UPSTREAMS = {"stateful-modern": (stateful_sse_app, "auto"),
             "stateless-modern": (stateless_json_app, "auto"),
             "stateful-legacy": (stateful_sse_app, "legacy"),
             "stateless-legacy": (stateless_json_app, "legacy")}


@pytest.mark.parametrize("mode", [MODERN, "auto", "legacy"])
@pytest.mark.parametrize("upstream", list(UPSTREAMS))
async def test_every_client_era_reaches_every_upstream_era(tmp_path: Path, mode: str,
                                                            upstream: str) -> None:
    make, era = UPSTREAMS[upstream]
    async with stack(tmp_path, make, era) as (endpoint, probe, db), \
            Client(endpoint, mode=mode) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"echo", "boom"} <= names
        result = await client.call_tool("echo", {"text": f"{mode} via {upstream}"})
        assert result.content[0].text == f"{mode} via {upstream}"
        assert (await client.call_tool("boom", {})).is_error
    modern_client = mode != "legacy"
    records = [r for r in query(db, limit=100) if r["tool"] == "echo"]
    assert [r["era"] for r in records] == ["modern" if modern_client else "legacy"]
    assert records[0]["status"] == "ok"
    if modern_client:
        assert records[0]["client_name"]
        if era == "legacy":  # bridged: the upstream saw a session the gateway opened
            echo = probe.tool_calls("echo")[0]
            assert echo.headers.get("mcp-protocol-version") == "2025-11-25"


def envelope(**extra: Any) -> dict[str, Any]:
    return {"io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"}, **extra}


def modern_request(method: str, params: dict[str, Any] | None = None, request_id: Any = 1,
                   **headers: str) -> tuple[bytes, dict[str, str]]:
    p = {"_meta": envelope(), **(params or {})}
    body = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": p})
    h = {"content-type": "application/json", "accept": "application/json, text/event-stream",
         "mcp-protocol-version": MODERN, "mcp-method": method}
    if method in ("tools/call", "prompts/get"):
        h["mcp-name"] = str((params or {}).get("name"))
    h.update({k.replace("_", "-"): v for k, v in headers.items()})
    return body, h


ECHO = {"name": "echo", "arguments": {"text": "hi"}}


def case(body: bytes, headers: dict[str, str]) -> tuple[bytes, list[tuple[str, str]]]:
    return body, list(headers.items())


VALIDATION = {
    "unsupported version in envelope and header": (
        lambda: case(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {
            "_meta": {**envelope(), "io.modelcontextprotocol/protocolVersion": "2099-01-01"}}}),
            {**modern_request("tools/list")[1], "mcp-protocol-version": "2099-01-01"}),
        400, -32022, {"supported": [MODERN], "requested": "2099-01-01"}),
    # the mismatch is named whatever the two revisions are (the SDK's ladder and the suite)
    "header names an unknown revision, the envelope a served one": (
        lambda: case(*modern_request("tools/list", mcp_protocol_version="2099-01-01")),
        400, -32020, {"mismatch": "MCP-Protocol-Version"}),
    "header names the served revision, the envelope an unknown one": (
        lambda: case(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {
            "_meta": {**envelope(), "io.modelcontextprotocol/protocolVersion": "v999.0.0"}}}),
            modern_request("tools/list")[1]),
        400, -32020, {"mismatch": "MCP-Protocol-Version"}),
    "no header, the envelope an unknown revision": (
        lambda: case(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {
            "_meta": {**envelope(), "io.modelcontextprotocol/protocolVersion": "2099-01-01"}}}),
            {k: v for k, v in modern_request("tools/list")[1].items()
             if k != "mcp-protocol-version"}),
        400, -32020, {"mismatch": "MCP-Protocol-Version"}),
    "header and envelope agree on a legacy revision": (
        lambda: case(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {
            "_meta": {**envelope(), "io.modelcontextprotocol/protocolVersion": "2025-11-25"}}}),
            {**modern_request("tools/list")[1], "mcp-protocol-version": "2025-11-25"}),
        400, -32022, {"supported": [MODERN], "requested": "2025-11-25"}),
    # 2026-07-28 removed initialize: with the envelope it is a method the revision lacks
    "initialize with the 2026-07-28 envelope": (
        lambda: case(*modern_request("initialize", {
            "protocolVersion": MODERN, "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}})),
        404, -32601, {"method": "initialize"}),
    "unknown version in the header, no envelope": (
        lambda: case(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
                     {**modern_request("tools/list")[1], "mcp-protocol-version": "2027-01-01"}),
        400, -32022, {"supported": [MODERN], "requested": "2027-01-01"}),
    "MCP-Protocol-Version missing": (
        lambda: case(modern_request("tools/list")[0],
                     {k: v for k, v in modern_request("tools/list")[1].items()
                      if k != "mcp-protocol-version"}),
        400, -32020, {"mismatch": "MCP-Protocol-Version"}),
    "Mcp-Method missing": (
        lambda: case(modern_request("tools/list")[0],
                     {k: v for k, v in modern_request("tools/list")[1].items()
                      if k != "mcp-method"}),
        400, -32020, {"mismatch": "Mcp-Method"}),
    "Mcp-Method disagrees (case-sensitive)": (
        lambda: case(*modern_request("tools/list", mcp_method="Tools/List")),
        400, -32020, {"mismatch": "Mcp-Method"}),
    "Mcp-Name disagrees": (
        lambda: case(*modern_request("tools/call", ECHO, mcp_name="boom")),
        400, -32020, {"mismatch": "Mcp-Name"}),
    "Mcp-Name duplicated": (
        lambda: (modern_request("tools/call", ECHO)[0],
                 [*modern_request("tools/call", ECHO)[1].items(), ("mcp-name", "echo")]),
        400, -32020, {"mismatch": "Mcp-Name"}),
    "Mcp-Name base64 of the name": (
        lambda: case(*modern_request("tools/call", ECHO, mcp_name="=?base64?ZWNobw==?=")),
        200, None, None),
    "Mcp-Name non-canonical base64": (
        lambda: case(*modern_request("tools/call", ECHO, mcp_name="=?base64?ZWNobw?=")),
        400, -32020, {"mismatch": "Mcp-Name"}),
    # found by the header fuzz target: prefix and suffix overlap, no payload, no encoding
    "Mcp-Name =?base64?= for an empty name": (
        lambda: case(*modern_request("tools/call", {"name": ""}, mcp_name="=?base64?=")),
        400, -32020, {"mismatch": "Mcp-Name"}),
    "modern header without an envelope": (
        lambda: case(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
                     modern_request("tools/list")[1]),
        400, -32602, None),
    "malformed clientInfo": (
        lambda: case(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {
            "_meta": {**envelope(), "io.modelcontextprotocol/clientInfo": "me"}}}),
            modern_request("tools/list")[1]),
        400, -32602, None),
    "clientCapabilities missing": (
        lambda: case(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {
            "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN}}}),
            modern_request("tools/list")[1]),
        400, -32602, None),
    "unknown log level": (
        lambda: case(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {
            "_meta": {**envelope(), "io.modelcontextprotocol/logLevel": "bogus"}}}),
            modern_request("tools/list")[1]),
        400, -32602, None),
    "log level not a string": (
        lambda: case(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {
            "_meta": {**envelope(), "io.modelcontextprotocol/logLevel": 5}}}),
            modern_request("tools/list")[1]),
        400, -32602, None),
    "log level in the wrong case": (
        lambda: case(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {
            "_meta": {**envelope(), "io.modelcontextprotocol/logLevel": "DEBUG"}}}),
            modern_request("tools/list")[1]),
        400, -32602, None),
    "a known log level": (
        lambda: case(*modern_request("tools/call", {**ECHO, "_meta": envelope(**{
            "io.modelcontextprotocol/logLevel": "warning"})})),
        200, None, None),
    "Mcp-Session-Id on a modern request": (
        lambda: case(*modern_request("tools/list", mcp_session_id="abc")),
        400, -32600, None),
    "batch with a modern request": (
        lambda: case(b"[" + modern_request("tools/list")[0] + b"]", modern_request("tools/list")[1]),
        400, -32600, None),
    "unknown method": (
        lambda: case(*modern_request("tools/frobnicate")),
        404, -32601, {"method": "tools/frobnicate"}),
    "ping is not a 2026-07-28 method": (
        lambda: case(*modern_request("ping")),
        404, -32601, {"method": "ping"}),
}


@pytest.mark.parametrize("row", list(VALIDATION))
async def test_validation_table(tmp_path: Path, row: str) -> None:
    build, status, code, data = VALIDATION[row]
    async with stack(tmp_path, stateless_json_app, "auto") as (endpoint, probe, _):
        body, headers = build()
        async with httpx.AsyncClient() as raw:
            response = await raw.post(endpoint, content=body, headers=headers)
        assert response.status_code == status, response.text
        if code is None:
            assert response.json()["result"]["resultType"] == "complete"
            return
        error = response.json()["error"]
        assert error["code"] == code
        assert error.get("data") == data
        assert probe.tool_calls("echo") == []  # nothing invalid was forwarded


@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_get_and_delete_claiming_modern_are_405(tmp_path: Path, method: str) -> None:
    async with stack(tmp_path, stateful_sse_app, "auto") as (endpoint, _, _db):
        async with httpx.AsyncClient() as raw:
            response = await raw.request(method, endpoint,
                                         headers={"mcp-protocol-version": MODERN})
        assert response.status_code == 405 and response.headers["allow"] == "POST"


async def test_discover_built_from_a_legacy_upstream(tmp_path: Path) -> None:
    async with stack(tmp_path, stateful_sse_app, "legacy") as (endpoint, _, _db):
        body, headers = modern_request("server/discover")
        async with httpx.AsyncClient() as raw:
            result = (await raw.post(endpoint, content=body, headers=headers)).json()["result"]
        assert result["supportedVersions"] == [MODERN]
        assert result["resultType"] == "complete" and result["cacheScope"] == "private"
        assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"]
        assert "tools" in result["capabilities"]


def legacy_only_app() -> Any:
    return build_app(stateless=False, json_response=False, legacy_only=True)


@pytest.mark.parametrize("mode", [MODERN, "auto"])
async def test_a_modern_client_reaches_a_legacy_only_upstream(tmp_path: Path, mode: str) -> None:
    """An upstream that refuses every request claiming a later revision (TypeScript SDK v1
    servers do) still serves 2026-07-28 clients: the bridge sends it the legacy era only."""
    async with stack(tmp_path, legacy_only_app, "auto") as (endpoint, probe, _db):
        async with Client(endpoint, mode=mode) as client:
            assert "echo" in {t.name for t in (await client.list_tools()).tools}
            result = await client.call_tool("echo", {"text": "across eras"})
            assert result.content[0].text == "across eras"
        refused = [x for x in probe.exchanges if x.status == 400 and x.rpc_method != "server/discover"]
        assert refused == []


async def test_the_bridge_strips_the_2026_envelope_and_keeps_other_meta(tmp_path: Path) -> None:
    async with stack(tmp_path, legacy_only_app, "legacy") as (endpoint, probe, _db):
        meta = {**envelope(), "progressToken": "p-1", "com.example/trace": "t-1"}
        body, headers = modern_request("tools/call", {**ECHO, "_meta": meta},
                                       mcp_param_region="eu")
        async with httpx.AsyncClient(timeout=DEADLINE_S) as raw:
            response = await raw.post(endpoint, content=body, headers=headers)
        assert response.status_code == 200, response.text
        events = [orjson.loads(line[6:]) for line in response.content.splitlines()
                  if line.startswith(b"data: ")] or [response.json()]
        assert events[-1]["result"]["content"][0]["text"] == "hi"
        (call,) = [x for x in probe.exchanges if x.rpc_method == "tools/call"]
        assert call.status == 200
        assert call.rpc["params"]["_meta"] == {"progressToken": "p-1", "com.example/trace": "t-1"}
        assert call.request_header("mcp-protocol-version") == "2025-11-25"
        for name in ("mcp-method", "mcp-name", "mcp-param-region"):
            assert call.request_header(name) is None


async def test_bridged_server_request_ends_the_call_clearly(tmp_path: Path) -> None:
    async with stack(tmp_path, stateful_sse_app, "legacy") as (endpoint, _probe, db):
        body, headers = modern_request("tools/call", {"name": "ask_sampling",
                                                      "arguments": {"prompt": "x"}})
        async with httpx.AsyncClient(timeout=DEADLINE_S) as raw:
            response = await raw.post(endpoint, content=body, headers=headers)
        last = orjson.loads(response.content.rsplit(b"data: ", 1)[1])
        assert last["error"]["code"] == -32000
        assert "sampling/createMessage" in last["error"]["message"]
    (record,) = [r for r in query(db) if r["tool"] == "ask_sampling"]
    assert record["status"] == "error" and "sampling/createMessage" in record["error_message"]


async def test_modern_disconnect_cancels_the_upstream_call(tmp_path: Path) -> None:
    async with stack(tmp_path, stateful_sse_app, "auto") as (endpoint, probe, _db):
        body, headers = modern_request("tools/call", {"name": "wait_forever", "arguments": {}})
        async with httpx.AsyncClient() as doomed:
            pending = asyncio.create_task(doomed.post(endpoint, content=body, headers=headers))
            await asyncio.wait_for(probe.started.wait(), DEADLINE_S)
            pending.cancel()
        await asyncio.wait_for(probe.cancelled.wait(), DEADLINE_S)


async def test_modern_cancel_request_ends_only_the_callers_own_call(tmp_path: Path) -> None:
    async with stack(tmp_path, stateful_sse_app, "auto") as (endpoint, probe, _db):
        body, headers = modern_request("tools/call", {"name": "wait_forever", "arguments": {}},
                                       request_id="call-7")
        async with httpx.AsyncClient(timeout=DEADLINE_S) as raw:
            pending = asyncio.create_task(raw.post(endpoint, content=body, headers=headers))
            await asyncio.wait_for(probe.started.wait(), DEADLINE_S)
            other = orjson.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                  "params": {"requestId": "someone-else",
                                             "_meta": envelope()}})
            note_headers = {**headers, "mcp-method": "notifications/cancelled"}
            note_headers.pop("mcp-name")
            assert (await raw.post(endpoint, content=other, headers=note_headers)
                    ).status_code == 202
            assert not pending.done()
            mine = orjson.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                 "params": {"requestId": "call-7", "_meta": envelope()}})
            assert (await raw.post(endpoint, content=mine, headers=note_headers)
                    ).status_code == 202
            response = await asyncio.wait_for(pending, DEADLINE_S)
        last = orjson.loads(response.content.rsplit(b"data: ", 1)[-1].split(b"\r\n")[0]
                            if response.headers["content-type"].startswith("text/event-stream")
                            else response.content)
        assert last["error"]["code"] == -32800
        await asyncio.wait_for(probe.cancelled.wait(), DEADLINE_S)


def sse_or_json(response: httpx.Response) -> dict[str, Any]:
    if response.headers["content-type"].startswith("text/event-stream"):
        return orjson.loads(response.content.rsplit(b"data: ", 1)[-1].split(b"\r\n")[0])
    return orjson.loads(response.content)


async def test_sessionless_calls_sharing_an_id_all_stay_cancellable(tmp_path: Path) -> None:
    """Two sessionless clients of one principal both number a call 1: the second call,
    finishing first, must not unregister the first, and a cancel for id 1 reaches it."""
    async with stack(tmp_path, stateful_sse_app, "auto") as (endpoint, probe, _db):
        body, headers = modern_request("tools/call", {"name": "wait_forever", "arguments": {}},
                                       request_id=1)
        quick, quick_headers = modern_request("tools/call", ECHO, request_id=1)
        cancel = orjson.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                               "params": {"requestId": 1, "_meta": envelope()}})
        note_headers = {**headers, "mcp-method": "notifications/cancelled"}
        note_headers.pop("mcp-name")
        async with httpx.AsyncClient(timeout=DEADLINE_S) as one, \
                httpx.AsyncClient(timeout=DEADLINE_S) as two:
            pending = asyncio.create_task(one.post(endpoint, content=body, headers=headers))
            await asyncio.wait_for(probe.started.wait(), DEADLINE_S)
            echoed = await two.post(endpoint, content=quick, headers=quick_headers)
            assert sse_or_json(echoed)["result"]["content"][0]["text"] == "hi"
            assert (await one.post(endpoint, content=cancel, headers=note_headers)
                    ).status_code == 202
            response = await asyncio.wait_for(pending, DEADLINE_S)
        assert sse_or_json(response)["error"] == {"code": -32800,
                                                  "message": "cancelled by the client"}
        await asyncio.wait_for(probe.cancelled.wait(), DEADLINE_S)


@pytest.mark.parametrize("make", [stateful_sse_app, stateless_json_app],
                         ids=["stateful", "stateless"])
async def test_legacy_client_on_a_modern_only_upstream(tmp_path: Path, make: Any) -> None:
    from tests.e2e.sdk_client import connect

    async with stack(tmp_path, make, "modern") as (endpoint, probe, db):
        progress: list[float] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(value)

        async with connect(endpoint, terminate_on_close=False) as client:
            assert client.session_id is not None  # the gateway's own session
            assert client.initialize_result.server_info.name
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"echo", "slow_progress"} <= names
            assert (await client.call_tool("echo", {"text": "bridged"})).content[0].text \
                == "bridged"
            await client.call_tool("slow_progress", {"steps": 2}, progress_callback=on_progress)
            assert await client.terminate() == 200
        # every request reached the upstream as a 2026-07-28 request, enveloped and mirrored
        echo = probe.tool_calls("echo")[0]
        assert echo.headers["mcp-protocol-version"] == MODERN
        assert echo.headers["mcp-name"] == "echo" and echo.headers["mcp-method"] == "tools/call"
        assert not any(ex.rpc_method == "initialize" for ex in probe.exchanges)
        if make is stateful_sse_app:
            assert progress == [1, 2]
    eras_seen = {r["era"] for r in query(db, limit=50)}
    assert eras_seen == {"legacy"}


async def test_listen_is_a_long_lived_stream_on_a_modern_upstream(tmp_path: Path) -> None:
    async with stack(tmp_path, stateful_sse_app, "auto") as (endpoint, _, _db):
        body, headers = modern_request("subscriptions/listen",
                                       {"notifications": {"toolsListChanged": True}},
                                       request_id="listen-1")
        async with httpx.AsyncClient(timeout=DEADLINE_S) as raw, \
                raw.stream("POST", endpoint, content=body, headers=headers) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            first = await asyncio.wait_for(response.aiter_bytes().__anext__(), DEADLINE_S)
        ack = orjson.loads(first.split(b"data: ", 1)[1].split(b"\r\n")[0])
        assert ack["method"] == "notifications/subscriptions/acknowledged"
        assert ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "listen-1"


async def test_listen_on_a_legacy_upstream_is_404(tmp_path: Path) -> None:
    async with stack(tmp_path, stateful_sse_app, "legacy") as (endpoint, _, _db):
        body, headers = modern_request("subscriptions/listen", {"notifications": {}})
        async with httpx.AsyncClient(timeout=DEADLINE_S) as raw:
            response = await raw.post(endpoint, content=body, headers=headers)
        assert response.status_code == 404
        assert response.json()["error"] == {"code": -32601, "message": "Method not found",
                                             "data": {"method": "subscriptions/listen"}}


async def test_an_era_set_through_the_api_applies_on_the_next_call(tmp_path: Path) -> None:
    """A server created with an era after start-up, and its era changed, bridge (or not) on
    their very next call: the bridge reads the live route, not a copy taken at start-up."""
    app, probe = stateful_sse_app()
    db = db_backends.url()
    _, secret = api_keys.create(db, "ops", [], role="admin")
    async with gateway_stack({"auth": {"mode": "jwt"}, "database": {"url": db},
                              "state": {"url": "memory"}}, upstream=app,
                             client={"headers": {"Authorization": f"Bearer {secret}"},
                                     "timeout": DEADLINE_S}) as site:
        upstream, url, admin = site.upstream, site.url, site.client
        spec = {"name": "late", "url": f"{upstream}/mcp", "zones": ["loopback"],
                "era": "legacy"}
        assert (await admin.post(f"{url}/api/v1/servers", json=spec)).status_code == 201

        async def echo(text: str) -> str | None:
            body, headers = modern_request("tools/call", {"name": "echo",
                                                          "arguments": {"text": text}})
            response = await admin.post(f"{url}/mcp/late", content=body, headers=headers)
            assert response.status_code == 200, response.text
            (call,) = [c for c in probe.tool_calls("echo") if c.arguments["text"] == text]
            return call.protocol_version

        assert await echo("first") == "2025-11-25"  # bridged onto a gateway-held session
        changed = await admin.patch(f"{url}/api/v1/servers/late", json={"era": "modern"})
        assert changed.status_code == 200
        assert await echo("second") == MODERN  # straight through, on the next call
        assert (await admin.patch(f"{url}/api/v1/servers/late",
                                  json={"era": "legacy"})).status_code == 200
        assert await echo("third") == "2025-11-25"
