"""/api/v1/servers/{name}/status and /api/v1/sessions against a real gateway, the demo
upstream and the official SDK client: health from the audit log, the era and tools last
seen (kept in the database across a restart, written only when the list changed), the live
sessions and their scope."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from mcp import MCPError

from proxy.audit.record import AuditRecord
from proxy.demo import TOOLS
from proxy.jsonrpc import McpMessage
from proxy.runtime.app import Services
from proxy.seen import MAX_DESCRIPTION, MAX_SCHEMA, LastSeen
from proxy.storage.db import Database
from tests import db_backends, state_backends
from tests.api.test_api import Env, detail, env, signed_in
from tests.builders import message
from tests.e2e.sdk_client import connect


def seen_of(e: Env) -> LastSeen:
    state: Services = e.app.extensions["tollhouse"]
    assert state.api is not None and state.api.seen is not None
    return state.api.seen


def auth(e: Env) -> dict[str, str]:
    return {"Authorization": f"Bearer {e.admin_key}"}


async def status(e: Env, name: str = "cfgd") -> dict[str, Any]:
    response = await e.admin.get(e.api(f"/servers/{name}/status"))
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_status_health_era_and_tools(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        idle = await status(e)
        assert idle["state"] == "idle" and idle["era"] is None and idle["tools"] is None
        assert idle["health"]["last_5m"] == {"calls": 0, "errors": 0, "error_rate": 0.0}
        async with connect(f"{e.url}/mcp/cfgd", headers=auth(e)) as client:
            listed = await client.list_tools()
            assert [t.name for t in listed.tools] == [t["name"] for t in TOOLS]
            for _ in range(3):
                await client.call_tool("echo", {"text": "hi"})
            with pytest.raises(MCPError):
                await client.call_tool("nope", {})
        body = await status(e)
        assert body["name"] == "cfgd" and body["era"] == "2025-11-25"
        assert [t["name"] for t in body["tools"]] == ["echo", "add", "count"]
        assert body["tools"][0] == {"name": "echo", "title": None,
                                    "description": "Echo the text back."}
        assert body["tools_seen_at"] <= body["at"]
        recent, hour = body["health"]["last_5m"], body["health"]["last_hour"]
        # initialize, tools/list, three echoes and the failing call (the DELETE too)
        assert recent["errors"] == hour["errors"] == 1
        assert recent["calls"] == hour["calls"] >= 6
        assert recent["error_rate"] == round(1 / recent["calls"], 4)
        assert body["health"]["last_error"] == "upstream error -32602"  # as audited
        assert body["health"]["last_error_at"] is not None
        # the latest call was ok (the DELETE), and one error in six or more is not failing
        assert body["state"] == "ok"


async def test_failing_when_the_latest_call_failed(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        async with connect(f"{e.url}/mcp/cfgd", headers=auth(e),
                           terminate_on_close=False) as client:
            await client.call_tool("echo", {"text": "hi"})
            with pytest.raises(MCPError):
                await client.call_tool("nope", {})
        body = await status(e)
        assert body["state"] == "failing"
        assert body["health"]["last_error_at"] > body["health"]["last_ok_at"]


async def test_tools_last_seen_survive_a_restart_and_cost_no_write_unchanged(
        tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        async with connect(f"{e.url}/mcp/cfgd", headers=auth(e)) as client:
            await client.list_tools()
            first = await status(e)  # flushes this process's sightings
            writes = seen_of(e).writes
            assert writes == 2  # the era at initialize, the list
            await client.list_tools()
            await client.list_tools()
        again = await status(e)
        assert seen_of(e).writes == writes  # the same list: nothing written
        assert again["tools_seen_at"] == first["tools_seen_at"]
    async with env(tmp_path) as restarted:  # the same database, a new process's view
        after = await status(restarted)
        assert after["tools"] == first["tools"] and after["era"] == "2025-11-25"
        assert after["tools_seen_at"] == first["tools_seen_at"]
        async with connect(f"{restarted.url}/mcp/cfgd", headers=auth(restarted)) as client:
            await client.list_tools()
        await status(restarted)
        assert seen_of(restarted).writes == 0  # what it loaded at start-up is what it saw


def _list(tools: list[dict[str, Any]], *, cursor: str | None = None) -> tuple[
        McpMessage, dict[str, Any]]:
    params = {"cursor": cursor} if cursor else {}
    return message("tools/list", **params), {"tools": tools}


async def test_a_changed_list_is_written_trimmed(tmp_path: Path) -> None:
    database = Database(db_backends.url())
    seen = LastSeen(database, {"s"}.__contains__)
    await seen.start()
    try:
        record = AuditRecord(endpoint="s")
        small = {"type": "object", "properties": {"n": {"type": "integer"}}}
        huge = {"type": "object", "description": "x" * (MAX_SCHEMA + 1)}
        for tools in ([{"name": "a"}], [{"name": "a"}], [
                {"name": "a", "inputSchema": huge},
                {"name": "b", "description": "x" * 5000, "inputSchema": small,
                 "annotations": {"title": "B", "readOnlyHint": True, "openWorldHint": "no"}}]):
            msg, result = _list(tools)
            rewrite = seen.results(msg, record, None)
            assert rewrite is not None and rewrite(result) is False
        # a later page, a virtual endpoint's list and another method are not a server's list
        msg, result = _list([{"name": "zz"}], cursor="2")
        later_page = seen.results(msg, record, None)
        assert later_page is not None and later_page(result) is False
        assert seen.results(msg, AuditRecord(endpoint="virtual"), None) is None
        assert seen.results(message("tools/call", id=2), record, None) is None
        stored = await seen.get("s")
        assert seen.writes == 2
        assert [t["name"] for t in stored["tools"]] == ["a", "b"]
        b = stored["tools"][1]
        assert b["title"] == "B" and len(b["description"]) == MAX_DESCRIPTION
        assert set(b) == {"name", "title", "description"}  # what the API shows
        with database.transaction() as conn:
            text = conn.execute("SELECT tools FROM server_tools WHERE server = 's'").fetchone()
        # kept for the Cedar policies (proxy.seen_targets): the boolean hints, and a schema
        # within MAX_SCHEMA
        kept = orjson.loads(text[0])
        assert kept[1]["annotations"] == {"readOnlyHint": True}
        assert kept[1]["inputSchema"] == small and "inputSchema" not in kept[0]
        assert [{k: t[k] for k in ("name", "title", "description")} for t in kept] == stored[
            "tools"]
    finally:
        await seen.aclose()
        database.close()


async def test_status_unknown_server_and_non_admin(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        missing = await e.admin.get(e.api("/servers/nope/status"))
        assert missing.status_code == 404 and isinstance(detail(missing), str)
        assert "nope" in detail(missing)
        pat = await signed_in(e, "pat", "pat-password")
        for path in ("/servers/cfgd/status", "/sessions"):
            forbidden = await pat.get(e.api(path))
            assert forbidden.status_code == 403 and detail(forbidden) == "administrators only"
        await pat.aclose()


async def test_sessions_with_a_real_session_open(tmp_path: Path) -> None:
    async with env(tmp_path, shared_state=True) as e:
        scope = "cluster" if state_backends.on_redis() else "process"
        none = (await e.admin.get(e.api("/sessions"))).json()
        assert none == {"total": 0, "scope": scope, "endpoints": []}
        async with connect(f"{e.url}/mcp/cfgd", headers=auth(e)) as client:
            await client.list_tools()
            one = (await e.admin.get(e.api("/sessions"))).json()
            assert one == {"total": 1, "scope": scope,
                           "endpoints": [{"endpoint": "cfgd", "sessions": 1}]}
        # the client's DELETE on close ended it
        gone = (await e.admin.get(e.api("/sessions"))).json()
        assert gone["total"] == 0


async def test_several_servers_status_in_one_request(tmp_path: Path) -> None:
    """/server-status answers each server as /servers/{name}/status does, in the order named,
    a name twice once; names of no server are listed apart, not an error."""
    async with env(tmp_path) as e:
        made = await e.admin.post(e.api("/servers"), json={
            "name": "quiet", "url": f"{e.upstream}/mcp", "zones": ["loopback"]})
        assert made.status_code == 201
        async with connect(f"{e.url}/mcp/cfgd", headers=auth(e),
                           terminate_on_close=False) as client:
            await client.list_tools()
            await client.call_tool("echo", {"text": "hi"})
            with pytest.raises(MCPError):
                await client.call_tool("nope", {})
        answer = await e.admin.get(e.api("/server-status"), params={
            "name": ["quiet", "nope", "cfgd", "quiet"]})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert set(body) == {"items", "not_found"} and body["not_found"] == ["nope"]
        assert [s["name"] for s in body["items"]] == ["quiet", "cfgd"]
        for item in body["items"]:
            alone = await status(e, item["name"])
            assert set(item) == set(alone)
            assert {**item, "at": 0} == {**alone, "at": 0}
        cfgd = body["items"][1]
        assert cfgd["state"] == "failing" and cfgd["era"] == "2025-11-25"
        assert cfgd["health"]["last_error"] == "upstream error -32602"
        assert [t["name"] for t in cfgd["tools"]] == ["echo", "add", "count"]
        assert body["items"][0]["state"] == "idle" and body["items"][0]["tools"] is None


async def test_several_servers_status_refuses_bad_requests(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        for params, msg in (({}, "name a server (name=...)"),
                            ({"other": "cfgd"}, "name a server (name=...)"),
                            ({"name": ["cfgd"] * 101}, "at most 100 names in one request")):
            refused = await e.admin.get(e.api("/server-status"), params=params)
            assert refused.status_code == 422, refused.text
            assert detail(refused) == [{"loc": ["query", "name"], "msg": msg,
                                        "type": "value_error"}]
        most = await e.admin.get(e.api("/server-status"), params={"name": ["cfgd"] * 100})
        assert most.status_code == 200 and len(most.json()["items"]) == 1
        nul = await e.admin.get(e.api("/server-status"), params={"name": "cf\x00gd"})
        assert nul.status_code == 422
        assert [p["loc"] for p in detail(nul)] == [["query", "name"]]
        nothing = await e.admin.get(e.api("/server-status"), params={"name": ""})
        assert nothing.json() == {"items": [], "not_found": [""]}
        pat = await signed_in(e, "pat", "pat-password")
        forbidden = await pat.get(e.api("/server-status"), params={"name": "cfgd"})
        assert forbidden.status_code == 403 and detail(forbidden) == "administrators only"
        await pat.aclose()
        doc = (await e.admin.get(e.api("/openapi.json"))).json()
        op = doc["paths"]["/api/v1/server-status"]["get"]
        assert set(op["responses"]) == {"200", "401", "403", "422", "429", "503"}
        [name] = op["parameters"]
        assert (name["name"], name["required"], name["schema"]["maxItems"]) == ("name", True,
                                                                               100)
