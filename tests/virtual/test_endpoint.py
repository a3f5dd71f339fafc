"""A virtual endpoint end to end: three official-SDK upstreams (two legacy, one spoken to only
in 2026-07-28) behind /mcp/team, the official SDK client in both eras, one member made slow or
dead mid-test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import mcp_types as types
import orjson
import pytest
from mcp import Client, MCPError
from mcp.server.lowlevel import Server

from proxy.audit import query
from proxy.runtime.app import Services
from proxy.virtual import naming
from tests import db_backends
from tests.e2e.sdk_client import connect
from tests.e2e.upstreams import (
    ASGIApp,
    UpstreamProbe,
    build_app,
    stateful_sse_app,
    stateless_json_app,
)
from tests.helpers import DEADLINE_S
from tests.stack import gateway_stack

MODERN = "2026-07-28"
LONG = "crm-of-the-sales-team-in-the-european-region-and-beyond"  # 55: names past 64


class Switch:
    """In front of one upstream: `ok`, `slow` (a request waits until `release` is set) or
    `dead` (every request answers 503)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.mode = "ok"
        self.release = asyncio.Event()
        self.held = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.mode == "dead":
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        if scope["type"] == "http" and self.mode == "slow":
            self.held.set()
            await self.release.wait()
        await self.app(scope, receive, send)


def paging_app() -> ASGIApp:
    """A low-level SDK server whose tools come in two pages, with one resource."""
    pages = {None: (["t0", "t1", "t2"], "p2"), "p2": (["t3", "t4"], None)}

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None
                         ) -> types.ListToolsResult:
        names, nxt = pages[params.cursor if params else None]
        return types.ListToolsResult(next_cursor=nxt, tools=[
            types.Tool(name=n, input_schema={"type": "object"}) for n in names])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text",
                                                               text=f"pages:{params.name}")])

    async def list_resources(ctx: Any, params: types.PaginatedRequestParams | None
                             ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[
            types.Resource(uri="file:///notes/a.txt", name="a")])

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams
                            ) -> types.ReadResourceResult:
        return types.ReadResourceResult(contents=[
            types.TextResourceContents(uri=params.uri, text=f"read {params.uri}")])

    server = Server("pages", on_list_tools=list_tools, on_call_tool=call_tool,
                    on_list_resources=list_resources, on_read_resource=read_resource)
    return server.streamable_http_app(streamable_http_path="/mcp", stateless_http=True,
                                      json_response=True)


@dataclass
class Team:
    url: str
    probes: dict[str, UpstreamProbe]
    switch: Switch
    state: Services
    db: str


@asynccontextmanager
async def team(list_timeout_s: float = 10.0, **endpoint: Any) -> AsyncIterator[Team]:
    alpha_app, alpha = build_app(stateless=False, json_response=False, legacy_only=True)
    beta_app, beta = stateless_json_app()
    gamma_app, gamma = stateful_sse_app()
    switch = Switch(gamma_app)
    settings: dict[str, dict[str, Any]] = {
        "alpha": {"total_timeout_s": 20}, LONG: {"era": "legacy"},
        "gamma": {"era": "modern", "timeout_s": 5},
        "pages": {"era": "legacy", "access": {"tools_deny": ["t1"]}}}
    async with gateway_stack(lambda urls: {
            "upstreams": [{"name": name, "url": f"{url}/mcp", **settings[name]}
                          for name, url in urls.upstreams.items()],
            "endpoints": [{"name": "team", "members": ["alpha", LONG, "gamma"],
                           "list_timeout_s": list_timeout_s,
                           "aliases": {"shout": "gamma:echo"}, **endpoint},
                          {"name": "paged", "members": ["pages", "gamma"],
                           "access": {"tools_deny": ["gamma__*"]}}]},
            upstreams={"alpha": alpha_app, LONG: beta_app, "gamma": switch,
                       "pages": paging_app()}) as site:
        yield Team(site.endpoint("team"), {"alpha": alpha, LONG: beta, "gamma": gamma},
                   switch, site.services, db_backends.url())


def long_name(tool: str) -> str:
    return naming.exposed(LONG, tool, "__")


async def test_legacy_client_lists_and_calls_every_member() -> None:
    async with team() as t, connect(t.url) as client:
        caps = client.initialize_result.capabilities
        assert caps.tools is not None and caps.tools.list_changed  # relayed as its own
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert {"alpha__echo", "gamma__slow_progress", "shout", long_name("echo")} <= names
        assert "gamma__echo" not in names  # aliased: listed under its alias only
        assert all(naming.NAME_RULE.match(n) for n in names)  # every name fits 64
        assert len(long_name("slow_progress")) <= 64 and long_name("echo") in names
        for name in ("alpha__echo", long_name("echo"), "shout"):
            result = await client.call_tool(name, {"text": f"to {name}"})
            assert result.content[0].text == f"to {name}"
        assert (await client.call_tool("alpha__boom", {})).is_error
        for unknown in ("nobody__echo", "gamma__echo"):  # an aliased tool has one name
            with pytest.raises(MCPError) as caught:
                await client.call_tool(unknown, {"text": "x"})
            assert caught.value.error.message == f"Unknown tool: {unknown}"
    # the client's DELETE ended the member session held for its gateway session
    sid = t.probes["alpha"].tool_calls("echo")[0].headers["mcp-session-id"]
    assert any(x.method == "DELETE" and x.request_header("mcp-session-id") == sid
               for x in t.probes["alpha"].exchanges)
    # each member got its own name, and the 2026-07-28 member only 2026-07-28 requests
    assert [c.arguments["text"] for c in t.probes["alpha"].tool_calls("echo")] == \
        ["to alpha__echo"]
    assert [c.arguments["text"] for c in t.probes[LONG].tool_calls("echo")] == \
        [f"to {long_name('echo')}"]
    gamma_calls = t.probes["gamma"].tool_calls("echo")
    assert {c.headers.get("mcp-protocol-version") for c in gamma_calls} == {MODERN}
    assert [c.arguments["text"] for c in gamma_calls] == ["to shout"]
    assert {c.headers.get("mcp-name") for c in gamma_calls} == {"echo"}
    assert not any(x.rpc_method == "initialize" for x in t.probes["gamma"].exchanges)
    records = [r for r in query(t.db, limit=200) if r["method"] == "tools/call"]
    shout = next(r for r in records if r["tool"] == "shout")
    assert shout["endpoint"] == "team" and shout["status"] == "ok"
    assert "member gamma, name echo" in shout["note"]


async def test_modern_client_on_legacy_members_and_the_reverse() -> None:
    async with team() as t, Client(t.url, mode=MODERN) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert {"alpha__echo", "gamma__slow_progress", "shout", long_name("echo")} <= names
        for name in ("alpha__echo", long_name("echo"), "shout"):
            assert (await client.call_tool(name, {"text": name})).content[0].text == name
    # the legacy members saw a session the gateway opened for this endpoint and caller
    (echo,) = t.probes["alpha"].tool_calls("echo")
    assert echo.headers.get("mcp-protocol-version") == "2025-11-25"
    assert echo.headers.get("mcp-session-id")


async def test_a_slow_or_dead_member_is_left_out_and_comes_back() -> None:
    async with team(list_timeout_s=0.5) as t, connect(t.url) as client:
        assert "gamma__slow_progress" in {x.name for x in (await client.list_tools()).tools}
        t.switch.mode = "slow"
        names = {x.name for x in (await client.list_tools()).tools}
        assert t.switch.held.is_set()
        assert "alpha__echo" in names and long_name("echo") in names
        assert not any(n.startswith("gamma__") or n == "shout" for n in names)
        t.switch.mode = "dead"
        t.switch.release.set()
        with pytest.raises(MCPError) as caught:
            await client.call_tool("shout", {"text": "x"})
        assert caught.value.error.code == -32000
        assert (await client.call_tool("alpha__echo", {"text": "still"})).content[0].text \
            == "still"
        assert "gamma__slow_progress" not in {x.name for x in (await client.list_tools()).tools}
        t.switch.mode = "ok"  # retried on the next request
        assert "gamma__slow_progress" in {x.name for x in (await client.list_tools()).tools}
        assert (await client.call_tool("shout", {"text": "back"})).content[0].text == "back"


async def test_a_member_session_that_died_is_reopened() -> None:
    async with team() as t, connect(t.url) as client:
        assert (await client.call_tool("alpha__echo", {"text": "1"})).content[0].text == "1"
        (first,) = t.probes["alpha"].tool_calls("echo")
        sid = first.headers["mcp-session-id"]
        base = t.url.rsplit("/mcp/", 1)[0]
        alpha_url = next(str(r.url) for r in t.state.gateway.routes.values()
                         if r.name == "alpha")
        assert base != alpha_url
        async with httpx.AsyncClient() as raw:  # the member forgets the session
            gone = await raw.delete(alpha_url, headers={"mcp-session-id": sid,
                                                        "mcp-protocol-version": "2025-11-25"})
        assert gone.status_code == 200
        assert (await client.call_tool("alpha__echo", {"text": "2"})).content[0].text == "2"
        second = t.probes["alpha"].tool_calls("echo")[1]
        assert second.headers["mcp-session-id"] != sid


async def test_long_names_route_after_a_restart_of_the_name_map() -> None:
    async with team() as t, connect(t.url) as client:
        name = long_name("slow_progress")
        assert len(f"{LONG}__slow_progress") > 64 and name in \
            {x.name for x in (await client.list_tools()).tools}
        # a restart: the same config in front of the same members, a name map that has learned
        # nothing yet, so the call's name is learned again on a miss
        async with gateway_stack(t.state.cfg) as restarted, \
                connect(restarted.endpoint("team")) as again:
            assert (await again.call_tool(name, {"steps": 1})).content[0].text == "done"
        assert t.probes[LONG].tool_calls("slow_progress")


async def test_a_forged_cursor_reaches_no_page() -> None:
    async with team() as t, httpx.AsyncClient(timeout=DEADLINE_S) as raw:
        forged = "eyJnYW1tYSI6IngifQ.AAAAAAAAAAAAAAAAAAAAAA"
        response = await modern_post(raw, t.url, "tools/list", {"cursor": forged})
        assert response.json()["error"]["code"] == -32602
        assert not t.probes["gamma"].posts("tools/list")


async def test_cancellation_reaches_the_member_that_runs_the_call() -> None:
    async with team() as t, connect(t.url) as client:
        alpha = t.probes["alpha"]
        call = asyncio.create_task(client.call_tool("alpha__wait_forever", {}))
        await asyncio.wait_for(alpha.started.wait(), DEADLINE_S)
        call.cancel()
        await asyncio.wait_for(alpha.cancelled.wait(), DEADLINE_S)
        assert (await client.call_tool("shout", {"text": "after"})).content[0].text == "after"


async def modern_post(raw: httpx.AsyncClient, url: str, method: str,
                      params: dict[str, Any] | None = None) -> httpx.Response:
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {}}
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": method,
                         "params": {**(params or {}), "_meta": meta}})
    headers = {"content-type": "application/json", "accept": "application/json, "
               "text/event-stream", "mcp-protocol-version": MODERN, "mcp-method": method}
    named = (params or {}).get("name") or (params or {}).get("uri")
    if named:
        headers["mcp-name"] = named
    return await raw.post(url, content=body, headers=headers)


async def test_modern_lists_are_one_answer_with_every_member() -> None:
    async with team() as t, httpx.AsyncClient(timeout=DEADLINE_S) as raw:
        for method in ("server/discover", "resources/list", "prompts/list",
                       "resources/templates/list"):
            response = await modern_post(raw, t.url, method)
            assert response.status_code == 200, response.text
            result = response.json()["result"]
            assert result["resultType"] == "complete"
            if method == "server/discover":
                assert "tools" in result["capabilities"]
                assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "team"
            else:
                assert "nextCursor" not in result


async def test_pages_merge_into_one_cursor_and_rules_apply_per_member_then_endpoint() -> None:
    async with team() as t, httpx.AsyncClient(timeout=DEADLINE_S) as raw:
        paged = t.url.replace("/mcp/team", "/mcp/paged")
        first = (await modern_post(raw, paged, "tools/list")).json()["result"]
        # t1: the member's own rule; gamma's tools: the endpoint's
        assert [x["name"] for x in first["tools"]] == ["pages__t0", "pages__t2"]
        cursor = first["nextCursor"]
        assert cursor.count(".") == 1
        second = (await modern_post(raw, paged, "tools/list", {"cursor": cursor})).json()
        assert [x["name"] for x in second["result"]["tools"]] == ["pages__t3", "pages__t4"]
        assert "nextCursor" not in second["result"]
        assert len(t.probes["gamma"].posts("tools/list")) == 1  # not asked for page two
        for hidden in ("pages__t1", "gamma__echo"):
            denied = (await modern_post(raw, paged, "tools/call",
                                        {"name": hidden, "arguments": {"text": "x"}})).json()
            assert denied["error"]["code"] == -32602
            assert denied["error"]["message"] == f"Unknown tool: {hidden}"
        assert not t.probes["gamma"].tool_calls("echo")
        called = (await modern_post(raw, paged, "tools/call",
                                    {"name": "pages__t4", "arguments": {}})).json()
        assert called["result"]["content"][0]["text"] == "pages:t4"
        listed = (await modern_post(raw, paged, "resources/list")).json()["result"]
        (resource,) = listed["resources"]
        assert resource["uri"] == "tollhouse://pages/file:///notes/a.txt"
        read = (await modern_post(raw, paged, "resources/read",
                                  {"uri": resource["uri"]})).json()["result"]
        assert read["contents"][0]["text"] == "read file:///notes/a.txt"


async def legacy_post(raw: httpx.AsyncClient, url: str, body: dict[str, Any],
                      session_id: str | None = None) -> httpx.Response:
    headers = {"content-type": "application/json", "accept": "application/json, "
               "text/event-stream", "mcp-protocol-version": "2025-11-25"}
    if session_id is not None:
        headers["mcp-session-id"] = session_id
    return await raw.post(url, content=orjson.dumps(body), headers=headers)


def answer_of(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC answer of a JSON or SSE response."""
    if response.headers["content-type"].startswith("application/json"):
        found: dict[str, Any] = response.json()
        return found
    for line in response.text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            event = orjson.loads(line[5:])
            if "id" in event and ("result" in event or "error" in event):
                found = event
                return found
    raise AssertionError(f"no answer in {response.text[:300]}")


async def test_a_legacy_client_gets_legacy_results_from_legacy_members() -> None:
    """A legacy member's result reaches a legacy client as the member gave it: nothing of
    2026-07-28 (resultType, ttlMs, cacheScope) is added on the way."""
    async with team() as t, httpx.AsyncClient(timeout=DEADLINE_S) as raw:
        opened = await legacy_post(raw, t.url, {
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"}}})
        sid = opened.headers["mcp-session-id"]
        await legacy_post(raw, t.url, {"jsonrpc": "2.0",
                                       "method": "notifications/initialized"}, sid)
        for name in ("alpha__echo", long_name("echo")):
            called = answer_of(await legacy_post(raw, t.url, {
                "jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": name, "arguments": {"text": "plain"}}}, sid))
            result = called["result"]
            assert result["content"][0]["text"] == "plain", called
            assert not {"resultType", "ttlMs", "cacheScope"} & set(result), (name, result)
        listed = answer_of(await legacy_post(raw, t.url, {
            "jsonrpc": "2.0", "id": 3, "method": "tools/list"}, sid))["result"]
        assert not {"resultType", "ttlMs", "cacheScope"} & set(listed), listed
