"""The management API against a real gateway: every route, seed 004's shapes and statuses,
and a registry change reaching the live edge while a long call is in flight."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
from quart import Quart

from proxy.accounts import Accounts
from proxy.app import create_app
from proxy.auth import keys as api_keys
from proxy.config import from_dict
from proxy.demo import demo_app
from tests import db_backends
from tests.conftest import MCP_HEADERS
from tests.servers import bound_socket, serve


@dataclass
class Env:
    url: str
    upstream: str
    admin_key: str
    admin: httpx.AsyncClient  # an API-key script
    db: str
    app: Quart

    def api(self, path: str) -> str:
        return f"{self.url}/api/v1{path}"


@asynccontextmanager
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    db = db_backends.url()
    accounts = Accounts(db)
    accounts.create_local("root", "root-password", admin=True)
    accounts.create_local("pat", "pat-password")
    accounts.close()
    _, secret = api_keys.create(db, "ci", [], role="admin")
    async with serve(demo_app(), graceful_timeout=1) as upstream:
        sock, url = bound_socket()
        cfg = from_dict({
            "server": {"public_url": url, "max_request_bytes": 4096},
            "auth": {"mode": "jwt", "lockout": {"max_failures": 3}},
            "oauth_server": {"enabled": True},
            "database": {"url": db},
            "upstreams": [{"name": "cfgd", "url": f"{upstream}/mcp"}]}, env={})
        app = create_app(cfg, secret_key="k")
        async with serve(app, sock=sock, graceful_timeout=1), \
                httpx.AsyncClient(headers={"Authorization": f"Bearer {secret}"},
                                  timeout=10) as admin:
            yield Env(url, upstream, secret, admin, db, app)


async def signed_in(e: Env, name: str, password: str) -> httpx.AsyncClient:
    client = httpx.AsyncClient(follow_redirects=False, timeout=10)
    response = await client.post(f"{e.url}/signin", data={"name": name, "password": password},
                                 headers={"Origin": e.url})
    assert response.status_code == 303
    return client


def detail(response: httpx.Response) -> Any:
    body = response.json()
    assert set(body) == {"detail"}
    return body["detail"]


async def test_who_may_call(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        async with httpx.AsyncClient() as anonymous:
            response = await anonymous.get(e.api("/servers"))
            assert response.status_code == 401 and detail(response) == "not signed in"
            bad = await anonymous.get(e.api("/servers"),
                                      headers={"Authorization": "Bearer th_nope"})
            assert bad.status_code == 401 and isinstance(detail(bad), str)
        me = (await e.admin.get(e.api("/me"))).json()
        assert me["admin"] is True and me["via"] == "api_key"
        pat = await signed_in(e, "pat", "pat-password")
        mine = await pat.get(e.api("/me"))
        assert mine.status_code == 200 and mine.json()["admin"] is False
        forbidden = await pat.get(e.api("/servers"))
        assert forbidden.status_code == 403 and detail(forbidden) == "administrators only"
        _, narrow = api_keys.create(e.db, "edge-only", ["cfgd"], role="admin")
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {narrow}"}) as edge:
            refused = await edge.get(e.api("/me"))
            assert refused.status_code == 403
        root = await signed_in(e, "root", "root-password")
        no_origin = await root.post(e.api("/users"), json={"name": "x1", "password": "p" * 10})
        assert no_origin.status_code == 403 and "Origin" in detail(no_origin)
        ok = await root.post(e.api("/users"), json={"name": "x1", "password": "p" * 10},
                             headers={"Origin": e.url})
        assert ok.status_code == 201
        for client in (pat, root):
            await client.aclose()


async def test_lockout_after_bad_keys(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        async with httpx.AsyncClient() as attacker:
            for _ in range(3):
                await attacker.get(e.api("/me"), headers={"Authorization": "Bearer th_bad"})
            locked = await attacker.get(e.api("/me"),
                                        headers={"Authorization": f"Bearer {e.admin_key}"})
            assert locked.status_code == 429 and int(locked.headers["retry-after"]) >= 1
            assert isinstance(detail(locked), str)


async def test_servers_crud_and_the_live_edge(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        listed = (await e.admin.get(e.api("/servers"))).json()["items"]
        assert [(s["name"], s["source"]) for s in listed] == [("cfgd", "config")]
        spec = {"name": "live", "url": f"{e.upstream}/mcp", "zones": ["loopback"]}
        created = await e.admin.post(e.api("/servers"), json=spec)
        assert created.status_code == 201 and created.json()["source"] == "api"
        assert created.json()["mcp_url"] == f"{e.url}/mcp/live"
        again = await e.admin.post(e.api("/servers"), json=spec)
        assert again.status_code == 409 and detail(again) == "server 'live' already exists"
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": "new route"}}}
        async with httpx.AsyncClient(timeout=10) as mcp:
            # the edge uses each person's credential: an admin key works here as any key
            headers = {**MCP_HEADERS, "Authorization": f"Bearer {e.admin_key}"}
            routed = await mcp.post(f"{e.url}/mcp/live", content=orjson.dumps(call),
                                    headers=headers)
            assert routed.json()["result"]["content"][0]["text"] == "new route"
            # a change while a long call is in flight: the call completes on its route
            slow = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                    "params": {"name": "count", "arguments": {"to": 10}}}
            in_flight = asyncio.create_task(mcp.post(f"{e.url}/mcp/live",
                                                     content=orjson.dumps(slow), headers=headers))
            patched = await e.admin.patch(e.api("/servers/live"), json={"timeout_s": 12})
            assert patched.status_code == 200 and patched.json()["timeout_s"] == 12
            assert b"counted to 10" in (await in_flight).content
            assert (await e.admin.delete(e.api("/servers/live"))).status_code == 204
            gone = await mcp.post(f"{e.url}/mcp/live", content=orjson.dumps(call),
                                  headers=headers)
            assert gone.status_code == 404 and gone.json() == {"error": "not found"}
        config_server = await e.admin.delete(e.api("/servers/cfgd"))
        assert config_server.status_code == 400 and "config file" in detail(config_server)
        missing = await e.admin.get(e.api("/servers/nope"))
        assert missing.status_code == 404 and detail(missing) == "server 'nope' not found"


async def test_validation_lists_every_problem(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        bad = await e.admin.post(e.api("/servers"), json={
            "name": "bad name!", "url": "ftp://x", "zones": [], "colour": "red"})
        assert bad.status_code == 422
        problems = detail(bad)
        assert {tuple(p["loc"]) for p in problems} >= {
            ("body", "name"), ("body", "url"), ("body", "zones"), ("body", "colour")}
        assert all(set(p) == {"loc", "msg", "type"} for p in problems)
        created = await e.admin.post(e.api("/servers"), json={"name": "a1",
                                                               "url": "https://a.example/mcp"})
        assert created.status_code == 201
        mismatch = await e.admin.put(e.api("/servers/a1"), json={
            "name": "other", "url": "https://a.example/mcp"})
        assert mismatch.status_code == 422
        assert detail(mismatch)[0]["loc"] == ["body", "name"]
        not_json = await e.admin.post(e.api("/servers"), content=b"{nope",
                                      headers={"content-type": "application/json"})
        assert not_json.status_code == 422 and detail(not_json)[0]["type"] == "json_invalid"
        big = await e.admin.post(e.api("/servers"), content=b"x" * 5000)
        assert big.status_code == 413 and "4096" in detail(big)


async def test_keys_and_users(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        made = await e.admin.post(e.api("/keys"), json={"name": "bot", "endpoints": ["cfgd"]})
        assert made.status_code == 201
        key = made.json()
        assert key["key"].startswith(f"th_{key['id']}_") and key["endpoints"] == ["cfgd"]
        listed = (await e.admin.get(e.api("/keys"))).json()["items"]
        assert all("key" not in k for k in listed) and key["id"] in {k["id"] for k in listed}
        assert (await e.admin.delete(e.api(f"/keys/{key['id']}"))).status_code == 204
        assert (await e.admin.delete(e.api(f"/keys/{key['id']}"))).status_code == 404
        unknown = await e.admin.post(e.api("/keys"), json={"name": "x", "endpoints": ["zz"]})
        assert unknown.status_code == 422
        user = await e.admin.post(e.api("/users"), json={"name": "new", "password": "long-pw-1"})
        assert user.status_code == 201 and user.json()["subject"] == "local:new"
        dup = await e.admin.post(e.api("/users"), json={"name": "new", "password": "long-pw-1"})
        assert dup.status_code == 409
        short = await e.admin.post(e.api("/users"), json={"name": "s", "password": "x"})
        assert short.status_code == 422
        names = {u["name"] for u in (await e.admin.get(e.api("/users"))).json()["items"]}
        assert {"root", "pat", "new"} <= names


async def test_audit_pages_newest_first_and_usage(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        async with httpx.AsyncClient(timeout=10) as mcp:
            headers = {**MCP_HEADERS, "Authorization": f"Bearer {e.admin_key}"}
            for i in range(5):
                call = {"jsonrpc": "2.0", "id": i, "method": "tools/call",
                        "params": {"name": "echo", "arguments": {"text": str(i)}}}
                await mcp.post(f"{e.url}/mcp/cfgd", content=orjson.dumps(call), headers=headers)

        async def pages() -> list[list[str]]:
            seen, cursor = [], None
            for _ in range(5):
                params = {"limit": "2", "tool": "echo"}
                if cursor:
                    params["cursor"] = cursor
                body = (await e.admin.get(e.api("/audit"), params=params)).json()
                seen.append([r["request_id"] for r in body["items"]])
                cursor = body["next_cursor"]
                if cursor is None:
                    return seen
            return seen

        for _ in range(50):  # the audit writer lingers up to 50 ms before a batch
            if len((await e.admin.get(e.api("/audit"), params={"tool": "echo"})).json()[
                    "items"]) == 5:
                break
            await asyncio.sleep(0.02)
        assert await pages() == [["4", "3"], ["2", "1"], ["0"]]
        bad = await e.admin.get(e.api("/audit"), params={"limit": "0", "status": "maybe",
                                                           "since": "yesterday"})
        assert bad.status_code == 422
        assert {p["loc"][1] for p in detail(bad)} == {"limit", "status", "since"}
        usage = (await e.admin.get(e.api("/usage"))).json()["items"]
        assert usage[0]["calls"] == 5 and usage[0]["endpoint"] == "cfgd"


async def test_openapi_matches_the_routes(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        doc = (await e.admin.get(e.api("/openapi.json"))).json()
        assert doc["openapi"].startswith("3.")
        documented = {(path, method.upper()) for path, ops in doc["paths"].items()
                      for method in ops}
        served = {(rule.rule.replace("<", "{").replace(">", "}"), method)
                  for rule in e.app.url_map.iter_rules() if rule.rule.startswith("/api/v1/")
                  and not rule.rule.endswith("openapi.json")
                  for method in rule.methods or () if method not in ("HEAD", "OPTIONS")}
        assert documented == served


async def test_unknown_api_paths_keep_the_detail_shape(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        missing = await e.admin.get(e.api("/nothing-here"))
        assert missing.status_code == 404 and detail(missing) == "not found"
        wrong = await e.admin.put(e.api("/keys"))
        assert wrong.status_code == 405 and isinstance(detail(wrong), str)


async def test_access_rules_through_the_api_apply_on_the_next_call(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        created = await e.admin.post(e.api("/servers"), json={
            "name": "ruled", "url": f"{e.upstream}/mcp", "zones": ["loopback"],
            "access": {"tools_deny": ["add"]}})
        assert created.status_code == 201
        assert created.json()["access"]["tools_deny"] == ["add"]
        headers = {**MCP_HEADERS, "Authorization": f"Bearer {e.admin_key}"}

        async def tool(name: str) -> httpx.Response:
            call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {"name": name, "arguments": {"a": 1, "b": 2}}}
            async with httpx.AsyncClient() as mcp:
                return await mcp.post(f"{e.url}/mcp/ruled", content=orjson.dumps(call),
                                      headers=headers)

        assert (await tool("add")).json()["error"]["code"] == -32602
        patched = await e.admin.patch(e.api("/servers/ruled"),
                                      json={"access": {"tools_deny": []}})
        assert patched.status_code == 200, patched.text
        assert "result" in (await tool("add")).json()
        roles = (await e.admin.get(e.api("/roles"))).json()["items"]
        assert [r["name"] for r in roles] == ["admin", "user"]


async def test_single_users_and_keys(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        pat = await e.admin.get(e.api("/users/pat"))
        assert pat.status_code == 200 and pat.json()["admin"] is False
        promoted = await e.admin.patch(e.api("/users/pat"), json={"admin": True,
                                                                  "password": "new-pat-pass"})
        assert promoted.status_code == 200 and promoted.json()["admin"] is True
        client = await signed_in(e, "pat", "new-pat-pass")  # the new password works
        assert (await client.get(e.api("/me"))).json()["admin"] is True
        await client.aclose()
        short = await e.admin.patch(e.api("/users/pat"), json={"password": "x"})
        assert short.status_code == 422
        assert (await e.admin.delete(e.api("/users/pat"))).status_code == 204
        assert (await e.admin.get(e.api("/users/pat"))).status_code == 404
        assert (await e.admin.patch(e.api("/users/pat"), json={"admin": False})
                ).status_code == 404
        made = (await e.admin.post(e.api("/keys"), json={"name": "one"})).json()
        one = await e.admin.get(e.api(f"/keys/{made['id']}"))
        assert one.status_code == 200 and "key" not in one.json()
        assert (await e.admin.get(e.api("/keys/nope"))).status_code == 404
