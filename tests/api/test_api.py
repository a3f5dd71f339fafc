"""The management API against a real gateway: every route, seed 004's shapes and statuses,
and a registry change reaching the live edge while a long call is in flight."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import jwt
import orjson
import pytest
from quart import Quart

from proxy.auth import keys as api_keys
from proxy.demo import demo_app
from proxy.oauth.server import s256
from proxy.people.accounts import Accounts, UserExists
from tests import db_backends, state_backends
from tests.conftest import MCP_HEADERS
from tests.stack import Urls, gateway_stack


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
async def env(tmp_path: Path, per_user: bool = False, trusted_proxies: list[str] | None = None,
              database: dict[str, Any] | None = None, shared_state: bool = False
              ) -> AsyncIterator[Env]:
    """A gateway with one upstream (cfgd), a root and a pat, and an admin API key; with
    `per_user`, a per_user upstream (gh) too, whose routes include /api/v1/me/connections
    (on a database of its own: a test may build both). With `shared_state`, on this run's
    state store (Redis when the run is on it). A second one in the same test is a restart on
    the same database."""
    db = db_backends.url("per_user" if per_user else "main")
    accounts = Accounts(db)
    with suppress(UserExists):
        accounts.create_local("root", "root-password", admin=True)
        accounts.create_local("pat", "pat-password")
    accounts.close()
    _, secret = api_keys.create(db, "ci", [], role="admin")

    def config(urls: Urls) -> dict[str, Any]:
        upstreams: list[dict[str, Any]] = [{"name": "cfgd", "url": f"{urls.upstream}/mcp"}]
        if per_user:
            upstreams.append({"name": "gh", "url": f"{urls.upstream}/mcp", "auth": "per_user",
                              "oauth": {"client_id": "gw",
                                        "authorization_endpoint": "https://idp.example/auth",
                                        "token_endpoint": "https://idp.example/token"}})
        return {
            "server": {"public_url": urls.gateway, "max_request_bytes": 4096,
                       "trusted_proxies": trusted_proxies or []},
            "auth": {"mode": "jwt", "lockout": {"max_failures": 3}},
            "oauth_server": {"enabled": True},
            "database": {"url": db, **(database or {})},
            "state": state_backends.state() if shared_state else {"url": "memory"},
            "upstreams": upstreams}

    async with gateway_stack(config, upstream=demo_app(), secret_key="k",
                             vault_keys={"k1": b"\x01" * 32},
                             client={"headers": {"Authorization": f"Bearer {secret}"}}) as site:
        yield Env(site.url, site.upstream, secret, site.client, db, site.app)


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
    async with env(tmp_path) as e, httpx.AsyncClient() as attacker:
        for _ in range(3):
            await attacker.get(e.api("/me"), headers={"Authorization": "Bearer th_bad"})
        locked = await attacker.get(e.api("/me"),
                                    headers={"Authorization": f"Bearer {e.admin_key}"})
        assert locked.status_code == 429 and int(locked.headers["retry-after"]) >= 1
        # seed 004: an auth-failure lockout answers in the OAuth shape, as at the edge
        assert locked.json() == {"error": "too_many_requests", "error_description":
                                 "too many failed authentication attempts; try again later"}
        doc = (await e.admin.get(e.api("/openapi.json"))).json()
        answer = doc["paths"]["/api/v1/me"]["get"]["responses"]["429"]
        assert answer["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/OAuthError"}
        assert set(doc["components"]["schemas"]["OAuthError"]["required"]) == set(locked.json())
        assert "Retry-After" in answer["headers"]


async def test_reads_with_a_cookie_need_no_origin(tmp_path: Path) -> None:
    """GET and HEAD change nothing: a browser's HEAD needs no Origin, as its GET does not."""
    async with env(tmp_path) as e:
        pat, root = (await signed_in(e, "pat", "pat-password"),
                     await signed_in(e, "root", "root-password"))
        try:
            for client, path in ((pat, "/me"), (root, "/me"), (root, "/users")):
                for method in ("GET", "HEAD"):
                    read = await client.request(method, e.api(path))
                    assert read.status_code == 200, (method, path, read.text)
            # a change still needs the Origin
            refused = await root.patch(e.api("/users/pat"), json={"admin": False})
            assert refused.status_code == 403
        finally:
            for client in (pat, root):
                await client.aclose()


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


async def test_servers_and_keys_page_with_limit_and_offset(tmp_path: Path) -> None:
    """Without limit and offset, every server as before; with them, a page by name. A bad
    value is a 422 naming it, both at once listed together, never a 500."""
    async with env(tmp_path) as e:
        for name in ("b1", "a1", "c1"):
            made = await e.admin.post(e.api("/servers"), json={
                "name": name, "url": "https://a.example/mcp"})
            assert made.status_code == 201
        every = await e.admin.get(e.api("/servers"))
        assert set(every.json()) == {"items"}
        names = [s["name"] for s in every.json()["items"]]
        assert names == ["a1", "b1", "c1", "cfgd"]
        for params, page in (({"limit": "2"}, names[:2]),
                             ({"limit": "2", "offset": "2"}, names[2:]),
                             ({"offset": "1"}, names[1:]), ({"offset": "0"}, names),
                             ({"limit": "500", "offset": "3"}, ["cfgd"]),
                             ({"offset": "4"}, []), ({"offset": "999999999"}, [])):
            answer = await e.admin.get(e.api("/servers"), params=params)
            assert answer.status_code == 200, (params, answer.text)
            assert [s["name"] for s in answer.json()["items"]] == page, params
            assert answer.json()["items"] == [s for s in every.json()["items"]
                                              if s["name"] in page]
        made = await e.admin.post(e.api("/keys"), json={"name": "bot", "endpoints": []})
        listed = (await e.admin.get(e.api("/keys"))).json()
        keys = listed["items"]
        assert keys[-1]["id"] == made.json()["id"]
        assert listed["endpoints"] == names  # what a new key may name (the keys page's)
        assert (await e.admin.get(e.api("/keys"), params={
            "limit": "1", "offset": str(len(keys) - 1)})).json()["items"] == keys[-1:]
        for path in ("/servers", "/keys"):
            for key, bad in (("limit", "0"), ("limit", "501"), ("limit", "-1"),
                             ("limit", "1.0"), ("limit", ""), ("limit", "x"), ("limit", "١"),
                             ("offset", "-1"), ("offset", "1e3"), ("offset", ""),
                             ("offset", "²"), ("offset", "1234567890"), ("offset", " 1")):
                refused = await e.admin.get(e.api(path), params={key: bad})
                assert refused.status_code == 422, (path, key, bad, refused.text)
                assert [p["loc"] for p in detail(refused)] == [["query", key]]
            both = await e.admin.get(e.api(path), params={"limit": "0", "offset": "x"})
            assert [p["loc"][1] for p in detail(both)] == ["limit", "offset"]
        doc = (await e.admin.get(e.api("/openapi.json"))).json()
        query = {p["name"]: p for p in doc["paths"]["/api/v1/servers"]["get"]["parameters"]}
        assert query["limit"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 500}
        assert (query["offset"]["schema"]["minimum"], query["offset"]["schema"]["maximum"]) == (
            0, 999_999_999)
        assert "422" in doc["paths"]["/api/v1/servers"]["get"]["responses"]


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
    """With the journal on, records gather for the commit window (here a long one) before
    the writer commits them; an audit query reads this process's own writes all the same."""
    async with env(tmp_path, database={"audit_journal": "on",
                                       "audit_journal_path": str(tmp_path / "journal"),
                                       "audit_commit_window_ms": 1000}) as e:
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

        assert await pages() == [["4", "3"], ["2", "1"], ["0"]]
        bad = await e.admin.get(e.api("/audit"), params={"limit": "0", "status": "maybe",
                                                           "since": "yesterday"})
        assert bad.status_code == 422
        assert {p["loc"][1] for p in detail(bad)} == {"limit", "status", "since"}
        usage = (await e.admin.get(e.api("/usage"))).json()["items"]
        assert usage[0]["calls"] == 5 and usage[0]["endpoint"] == "cfgd"
        # a period, an endpoint, a principal
        now = time.time()
        for params, calls in (({"until": str(now - 3600)}, []),
                              ({"since": str(now - 3600), "until": str(now + 60)}, [5]),
                              ({"endpoint": "other"}, []), ({"endpoint": "cfgd"}, [5]),
                              ({"principal": usage[0]["principal"]}, [5]),
                              ({"principal": "nobody"}, [])):
            got = await e.admin.get(e.api("/usage"), params=params)
            assert [r["calls"] for r in got.json()["items"]] == calls, params
        bad_period = await e.admin.get(e.api("/usage"), params={"since": "x", "until": "y",
                                                                 "limit": "501"})
        assert bad_period.status_code == 422
        assert [p["loc"] for p in detail(bad_period)] == [["query", "since"], ["query", "until"],
                                                          ["query", "limit"]]


def cursor_of(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


async def test_an_audit_cursor_is_only_one_the_api_gave(tmp_path: Path) -> None:
    """[time, id]: a finite float time and a row id either database can hold; anything else
    is a 422 naming the cursor, never a 500 (an id past 2**63-1 overflowed SQLite)."""
    async with env(tmp_path) as e:
        fine = await e.admin.get(e.api("/audit"), params={
            "cursor": cursor_of([1.5, 2**63 - 1])})
        assert fine.status_code == 200 and fine.json()["items"] == []
        for cursor in ("WzEsIDkyMjMzNzIwMzY4NTQ3NzU4MDhd",  # [1, 9223372036854775808]
                       cursor_of([1.5, 2**63]), cursor_of([1.5, -1]), cursor_of([1.5, True]),
                       cursor_of([1.5, 2.0]), cursor_of(["1.5", 2]), cursor_of([None, 2]),
                       cursor_of([1, 2]), cursor_of([1.5, 2, 3]), cursor_of([1.5]),
                       cursor_of({"ts": 1.5}), cursor_of([1.5, 2**64]),
                       base64.urlsafe_b64encode(b"[1e400, 2]").decode(), "not base64!", "é"):
            refused = await e.admin.get(e.api("/audit"), params={"cursor": cursor})
            assert refused.status_code == 422, (cursor, refused.text)
            assert [p["loc"] for p in detail(refused)] == [["query", "cursor"]], cursor


async def test_times_and_limits_are_plain_numbers(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        for path in ("/audit", "/usage"):
            for good in ("1700000000", "1700000000.25", "0", "-5"):
                answer = await e.admin.get(e.api(path), params={"since": good, "until": good})
                assert answer.status_code == 200, (path, good, answer.text)
            for bad in ("nan", "NaN", "inf", "-inf", "Infinity", "1e400", "1e5", "9" * 400,
                        "١٢٣", "１２３", "1_000", " 5", "5 ", "+5", "5.", ".5", "0x10", ""):
                for key in ("since", "until"):
                    refused = await e.admin.get(e.api(path), params={key: bad})
                    assert refused.status_code == 422, (path, key, bad, refused.text)
                    assert [p["loc"] for p in detail(refused)] == [["query", key]]
            # a period that ends before it starts, listed with the other problems
            backwards = await e.admin.get(e.api(path), params={"since": "200", "until": "100"})
            assert backwards.status_code == 422
            assert [(p["loc"], p["msg"]) for p in detail(backwards)] == [
                (["query", "since"], "must not be after until")]
        for bad in ("१०", "１０", "0", "501", "-1", "1.0", " 10", "1_0", "+10", ""):
            refused = await e.admin.get(e.api("/audit"), params={"limit": bad})
            assert refused.status_code == 422, (bad, refused.text)
            assert [p["loc"] for p in detail(refused)] == [["query", "limit"]]
        for good in ("1", "500", "050"):
            assert (await e.admin.get(e.api("/audit"), params={"limit": good})
                    ).status_code == 200
        every = await e.admin.get(e.api("/audit"), params={
            "since": "9", "until": "1", "limit": "१०", "cursor": cursor_of([1, 2**63])})
        assert [p["loc"][1] for p in detail(every)] == ["since", "limit", "cursor"]


async def test_openapi_matches_the_routes(tmp_path: Path) -> None:
    for per_user in (False, True):  # a per_user upstream adds /api/v1/me/connections
        async with env(tmp_path, per_user=per_user) as e:
            doc = (await e.admin.get(e.api("/openapi.json"))).json()
            assert doc["openapi"].startswith("3.")
            documented = {(path, method.upper()) for path, ops in doc["paths"].items()
                          for method in ops}
            served = {(rule.rule.replace("<", "{").replace(">", "}"), method)
                      for rule in e.app.url_map.iter_rules()
                      if rule.rule.startswith("/api/v1/")
                      and not rule.rule.endswith("openapi.json")
                      for method in rule.methods or () if method not in ("HEAD", "OPTIONS")}
            assert documented == served, per_user
            connections = ("/api/v1/me/connections", "GET") in documented
            assert connections is per_user
            if per_user:  # what a signed-in person gets matches the documented shape
                pat = await signed_in(e, "pat", "pat-password")
                try:
                    mine = await pat.get(e.api("/me/connections"))
                finally:
                    await pat.aclose()
                item = doc["paths"]["/api/v1/me/connections"]["get"]["responses"]["200"][
                    "content"]["application/json"]["schema"]["properties"]["items"]["items"]
                assert mine.status_code == 200
                assert [set(i) for i in mine.json()["items"]] == [set(item["required"])]
                assert mine.json()["items"][0]["status"] in item["properties"]["status"]["enum"]


def responses(doc: dict[str, Any], path: str, method: str) -> set[str]:
    return set(doc["paths"][f"/api/v1{path}"][method]["responses"])


async def test_openapi_documents_what_each_operation_answers(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        doc = (await e.admin.get(e.api("/openapi.json"))).json()
        auth = {"401", "403", "429", "503"}  # every authenticated operation
        assert responses(doc, "/me", "get") == {"200", *auth}
        assert responses(doc, "/users", "get") == {"200", *auth}
        assert responses(doc, "/users", "post") == {"201", "409", "413", "422", *auth}
        assert responses(doc, "/users/{name}", "get") == {"200", "404", "422", *auth}
        assert responses(doc, "/users/{name}", "patch") == {"200", "400", "404", "409", "413",
                                                             "422", *auth}
        assert responses(doc, "/users/{name}", "delete") == {"204", "400", "404", "409", "422",
                                                              *auth}
        assert responses(doc, "/keys/{key_id}", "put") == {"200", "404", "409", "413", "422",
                                                          *auth}
        assert responses(doc, "/keys/{key_id}", "delete") == {"204", "404", "422", *auth}
        assert responses(doc, "/roles/{name}", "delete") == {"204", "404", "409", "422", *auth}
        assert responses(doc, "/servers/{name}", "delete") == {"204", "400", "404", "409",
                                                              "422", *auth}
        assert responses(doc, "/audit", "get") == {"200", "422", *auth}
        # /usage answers the period it covers
        usage = (await e.admin.get(e.api("/usage"))).json()
        schema = doc["paths"]["/api/v1/usage"]["get"]["responses"]["200"]["content"][
            "application/json"]["schema"]
        assert set(usage) == set(schema["properties"]) == set(schema["required"])
        # typed query parameters
        query = {p["name"]: p["schema"] for p in doc["paths"]["/api/v1/audit"]["get"][
            "parameters"]}
        assert query["since"]["type"] == query["until"]["type"] == "number"
        assert (query["limit"]["type"], query["limit"]["minimum"], query["limit"]["maximum"]
                ) == ("integer", 1, 500)
        assert set(query["status"]["enum"]) == {"ok", "denied", "error", "cancelled"}
        assert query["cursor"] == query["tool"] == {"type": "string"}
        # a route with no query ignores the one it is sent (nothing there is read)
        ignored = await e.admin.get(e.api("/me"), params={"x": "a\x00b"})
        assert ignored.status_code == 200


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
        assert [r["name"] for r in roles] == ["admin", "user", "auditor"]


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


# -- API keys: PUT and PATCH ---------------------------------------------------------------------

async def mcp_call(e: Env, endpoint: str, token: str, tool: str = "echo") -> httpx.Response:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": tool, "arguments": {"text": "hi", "a": 1, "b": 2}}}
    async with httpx.AsyncClient(timeout=10) as mcp:
        return await mcp.post(f"{e.url}/mcp/{endpoint}", content=orjson.dumps(call),
                              headers={**MCP_HEADERS, "Authorization": f"Bearer {token}"})


def ok(response: httpx.Response) -> bool:
    return response.status_code == 200 and "result" in response.json()


async def test_key_put_and_patch_change_everything_but_the_secret(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        made = (await e.admin.post(e.api("/keys"), json={"name": "bot", "endpoints": ["cfgd"],
                                                          "expires_in_days": 1})).json()
        path = e.api(f"/keys/{made['id']}")
        later = time.time() + 7 * 86400
        put = await e.admin.put(path, json={"id": made["id"], "name": "bot-2",
                                            "endpoints": ["cfgd"], "role": "admin",
                                            "expires_at": later})
        assert put.status_code == 200, put.text
        changed = put.json()
        assert "key" not in changed and changed["prefix"] == made["prefix"]
        assert (changed["name"], changed["role"], changed["expires_at"]) == ("bot-2", "admin",
                                                                             later)
        assert changed["created_at"] == made["created_at"]
        assert (await e.admin.get(path)).json() == changed
        assert ok(await mcp_call(e, "cfgd", made["key"]))  # the same secret still works
        # PATCH: only what is sent; expires_at null means "never"
        patched = await e.admin.patch(path, json={"expires_at": None})
        assert patched.status_code == 200
        assert patched.json()["expires_at"] is None and patched.json()["name"] == "bot-2"
        renamed = (await e.admin.patch(path, json={"name": "bot-3"})).json()
        assert renamed["name"] == "bot-3" and renamed["expires_at"] is None
        assert renamed["role"] == "admin" and renamed["endpoints"] == ["cfgd"]
        # unknown keys, well-formed or not
        for missing in ("abcdefghij", "no such key"):
            for method in ("PUT", "PATCH"):
                gone = await e.admin.request(method, e.api(f"/keys/{missing}"), json={
                    "name": "x", "endpoints": [], "expires_at": None})
                assert gone.status_code == 404
                assert detail(gone) == f"API key '{missing}' not found"
        # a revoked key is final
        assert (await e.admin.delete(path)).status_code == 204
        for method, body in (("PUT", {"name": "x", "endpoints": [], "expires_at": None}),
                             ("PATCH", {"name": "x"})):
            refused = await e.admin.request(method, path, json=body)
            assert refused.status_code == 409
            assert detail(refused) == (f"API key '{made['id']}' is revoked; a revoked key "
                                       "cannot be changed")
        assert (await e.admin.get(path)).json()["name"] == "bot-3"


async def test_key_edits_list_every_problem(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        made = (await e.admin.post(e.api("/keys"), json={"name": "bot"})).json()
        path = e.api(f"/keys/{made['id']}")
        # PUT: the body's id, and each unknown endpoint, at its place in the list
        wrong = await e.admin.put(path, json={"id": "zzzzzzzzzz", "name": "bot",
                                              "endpoints": ["nope", "cfgd", "gone"],
                                              "expires_at": None})
        assert wrong.status_code == 422
        assert [(p["loc"], p["msg"]) for p in detail(wrong)] == [
            (["body", "id"], "the id differs from the path"),
            (["body", "endpoints", 0], "no server named nope"),
            (["body", "endpoints", 2], "no server named gone")]
        # PUT requires endpoints and expires_at, so that leaving one out cannot widen a key
        bare = await e.admin.put(path, json={"name": "", "role": "root", "colour": 1})
        assert bare.status_code == 422
        assert {tuple(p["loc"]) for p in detail(bare)} == {
            ("body", "name"), ("body", "role"), ("body", "endpoints"), ("body", "expires_at"),
            ("body", "colour")}
        assert all(set(p) == {"loc", "msg", "type"} for p in detail(bare))
        # PATCH: only expires_at may be null (no expiry); -5 is no Unix time
        nulls = await e.admin.patch(path, json={"name": None, "endpoints": None, "role": None,
                                                "expires_at": -5})
        assert nulls.status_code == 422
        assert {p["loc"][1] for p in detail(nulls)} == {"name", "endpoints", "role",
                                                        "expires_at"}
        unknown = await e.admin.patch(path, json={"id": made["id"], "endpoints": ["a", "b"]})
        assert unknown.status_code == 422
        assert [p["loc"] for p in detail(unknown)] == [["body", "endpoints", 0],
                                                       ["body", "endpoints", 1]]
        # POST names each unknown endpoint the same way
        posted = await e.admin.post(e.api("/keys"), json={"name": "x", "endpoints": ["p", "q"]})
        assert [p["msg"] for p in detail(posted)] == ["no server named p", "no server named q"]
        # nothing was changed by the refused requests
        after = (await e.admin.get(path)).json()
        assert (after["name"], after["endpoints"], after["expires_at"]) == ("bot", [], None)


async def test_a_422_lists_the_path_and_reference_problems_beside_the_schema_ones(
        tmp_path: Path) -> None:
    """A body with a bad field and a name (or id) that differs from the path, or an unknown
    endpoint or role: one 422 lists them all, not only the schema's."""
    async with env(tmp_path) as e:
        made = (await e.admin.post(e.api("/keys"), json={"name": "bot"})).json()
        assert (await e.admin.post(e.api("/roles"), json={"name": "x"})).status_code == 201
        cases: list[tuple[str, str, dict[str, Any], set[tuple[Any, ...]]]] = [
            ("PUT", "/roles/x", {"name": "other", "description": "\u0007"},
             {("body", "description"), ("body", "name")}),
            ("PUT", "/users/pat", {"name": "other", "password": "x"},
             {("body", "password"), ("body", "name")}),
            ("PUT", "/users/pat", {"name": "other", "admin": "no", "roles": ["ghost", 5]},
             {("body", "admin"), ("body", "name"), ("body", "roles", 0),
              ("body", "roles", 1)}),
            ("POST", "/users", {"name": "bad name!", "password": "x", "roles": ["ghost"]},
             {("body", "name"), ("body", "password"), ("body", "roles", 0)}),
            ("PATCH", "/users/pat", {"admin": "yes", "roles": ["x", "ghost", "admin"]},
             {("body", "admin"), ("body", "roles", 1), ("body", "roles", 2)}),
            ("PUT", f"/keys/{made['id']}", {"id": "bbbbbbbbbb", "name": ""},
             {("body", "name"), ("body", "endpoints"), ("body", "expires_at"),
              ("body", "id")}),
            ("PUT", f"/keys/{made['id']}", {"id": "bbbbbbbbbb", "name": "ok",
                                             "endpoints": ["zz", "cfgd"], "expires_at": "soon"},
             {("body", "expires_at"), ("body", "id"), ("body", "endpoints", 0)}),
            ("PATCH", f"/keys/{made['id']}", {"id": "bbbbbbbbbb", "role": "root",
                                               "endpoints": ["zz", 7]},
             {("body", "role"), ("body", "id"), ("body", "endpoints", 0),
              ("body", "endpoints", 1)}),
            ("POST", "/keys", {"name": "", "endpoints": ["zz"]},
             {("body", "name"), ("body", "endpoints", 0)}),
        ]
        for method, path, body, locs in cases:
            refused = await e.admin.request(method, e.api(path), json=body)
            assert refused.status_code == 422, (method, path, refused.text)
            problems = detail(refused)
            assert {tuple(p["loc"]) for p in problems} == locs, (method, path, problems)
            assert len(problems) == len(locs), problems
        # the raw values are looked at only where they have the right type: no 500
        for method, path, body in (("PUT", "/users/pat", {"name": 5, "roles": "x"}),
                                   ("PUT", f"/keys/{made['id']}", {"id": 5, "endpoints": {}}),
                                   ("PUT", "/roles/x", {"name": ["x"]}),
                                   ("PUT", "/roles/x", [1, 2])):
            refused = await e.admin.request(method, e.api(path), json=body)
            assert refused.status_code == 422, (method, path, refused.text)
        # nothing changed
        assert (await e.admin.get(e.api("/users/pat"))).json()["admin"] is False
        assert (await e.admin.get(e.api(f"/keys/{made['id']}"))).json()["name"] == "bot"


async def test_booleans_and_numbers_are_not_coerced(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        for admin in ("yes", "true", 1, 0, None):
            for method, path, body in (("PATCH", "/users/pat", {"admin": admin}),
                                       ("PUT", "/users/pat", {"name": "pat", "admin": admin}),
                                       ("POST", "/users", {"name": "kim", "password": "x" * 9,
                                                           "admin": admin})):
                refused = await e.admin.request(method, e.api(path), json=body)
                assert refused.status_code == 422, (method, admin, refused.text)
                assert [p["loc"] for p in detail(refused)] == [["body", "admin"]]
        assert (await e.admin.get(e.api("/users/pat"))).json()["admin"] is False
        assert (await e.admin.patch(e.api("/users/pat"), json={"admin": True})).json()["admin"]
        # numbers: a JSON number, an integer included; a URL is still a string
        spec = {"name": "strict", "url": "https://a.example/mcp"}
        for field in ("timeout_s", "total_timeout_s"):
            for value in ("5", True, "inf", [5]):
                for method, path in (("POST", "/servers"), ("PATCH", "/servers/strict")):
                    refused = await e.admin.request(method, e.api(path),
                                                    json={**spec, field: value}
                                                    if method == "POST" else {field: value})
                    assert refused.status_code == 422, (method, field, value, refused.text)
                    assert [p["loc"] for p in detail(refused)] == [["body", field]]
        made = await e.admin.post(e.api("/servers"), json={**spec, "timeout_s": 5,
                                                            "total_timeout_s": 60.5})
        assert made.status_code == 201, made.text
        assert (made.json()["timeout_s"], made.json()["url"]) == (5, "https://a.example/mcp")
        patched = await e.admin.patch(e.api("/servers/strict"), json={
            "timeout_s": 7, "url": "https://b.example/mcp"})
        assert patched.status_code == 200, patched.text
        assert (patched.json()["timeout_s"], patched.json()["url"]) == (7,
                                                                         "https://b.example/mcp")
        key = (await e.admin.post(e.api("/keys"), json={"name": "k"})).json()
        for method, path, body in (
                ("POST", "/keys", {"name": "k", "expires_in_days": "1"}),
                ("POST", "/keys", {"name": "k", "expires_in_days": True}),
                ("PATCH", f"/keys/{key['id']}", {"expires_at": "2000000000"}),
                ("PUT", f"/keys/{key['id']}", {"name": "k", "endpoints": [],
                                               "expires_at": True})):
            refused = await e.admin.request(method, e.api(path), json=body)
            assert refused.status_code == 422, (method, body, refused.text)
            assert len(detail(refused)) == 1
        days = await e.admin.post(e.api("/keys"), json={"name": "k", "expires_in_days": 2})
        assert days.status_code == 201


async def test_a_null_in_a_patch_is_a_422_naming_the_field(tmp_path: Path) -> None:
    """null is no value for a field that cannot be null, on every PATCH alike (only a key's
    expires_at may be null: no expiry); nothing is changed."""
    async with env(tmp_path) as e:
        assert (await e.admin.post(e.api("/roles"), json={"name": "ops",
                                                          "description": "d"})).status_code == 201
        assert (await e.admin.post(e.api("/servers"), json={
            "name": "s1", "url": "https://a.example/mcp"})).status_code == 201
        key = (await e.admin.post(e.api("/keys"), json={"name": "k"})).json()
        for path, fields in (
                ("/users/pat", ("admin", "password", "roles")),
                ("/roles/ops", ("description",)),
                (f"/keys/{key['id']}", ("name", "endpoints", "role")),
                ("/servers/s1", ("url", "timeout_s", "total_timeout_s", "zones", "era",
                                 "access"))):
            for field in fields:
                refused = await e.admin.patch(e.api(path), json={field: None})
                assert refused.status_code == 422, (path, field, refused.text)
                assert [p["loc"] for p in detail(refused)] == [["body", field]]
            every = await e.admin.patch(e.api(path), json=dict.fromkeys(fields))
            assert {p["loc"][1] for p in detail(every)} == set(fields)
        assert (await e.admin.get(e.api("/roles/ops"))).json()["description"] == "d"
        assert (await e.admin.get(e.api("/servers/s1"))).json()["timeout_s"] == 30
        # left out is unchanged; a key's expires_at may be null
        assert (await e.admin.patch(e.api("/users/pat"), json={})).status_code == 200
        cleared = await e.admin.patch(e.api(f"/keys/{key['id']}"), json={"expires_at": None})
        assert cleared.status_code == 200 and cleared.json()["expires_at"] is None


async def test_a_narrowed_key_takes_effect_on_the_next_mcp_call(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        other = await e.admin.post(e.api("/servers"), json={
            "name": "other", "url": f"{e.upstream}/mcp", "zones": ["loopback"]})
        assert other.status_code == 201
        made = (await e.admin.post(e.api("/keys"), json={"name": "bot",
                                                          "endpoints": ["cfgd"]})).json()
        path, secret = e.api(f"/keys/{made['id']}"), made["key"]
        assert ok(await mcp_call(e, "cfgd", secret))
        assert (await mcp_call(e, "other", secret)).status_code == 403
        # narrowed to the other endpoint: the very next call on cfgd is refused
        assert (await e.admin.patch(path, json={"endpoints": ["other"]})).status_code == 200
        assert (await mcp_call(e, "cfgd", secret)).status_code == 403
        assert ok(await mcp_call(e, "other", secret))
        # expired by PUT, then given back by PATCH
        gone = await e.admin.put(path, json={"name": "bot", "endpoints": ["other"],
                                             "expires_at": time.time() - 1})
        assert gone.status_code == 200 and gone.json()["status"] == "expired"
        assert (await mcp_call(e, "other", secret)).status_code == 401
        assert (await e.admin.patch(path, json={"expires_at": None})).status_code == 200
        assert ok(await mcp_call(e, "other", secret))
        # made a management key (no endpoints, admin): it can use /api/v1 at once
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {secret}"}) as bot:
            assert (await bot.get(e.api("/me"))).status_code == 403  # endpoint-kind
            await e.admin.patch(path, json={"endpoints": [], "role": "admin"})
            me = await bot.get(e.api("/me"))
            assert me.status_code == 200 and me.json()["admin"] is True


# -- users: PUT, and roles on users ------------------------------------------------------------

async def test_user_put(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        assert (await e.admin.post(e.api("/roles"), json={"name": "ops"})).status_code == 201
        put = await e.admin.put(e.api("/users/pat"), json={"name": "pat", "admin": True,
                                                           "roles": ["ops", "ops"]})
        assert put.status_code == 200, put.text
        assert (put.json()["admin"], put.json()["roles"]) == (True, ["ops"])
        assert (await e.admin.get(e.api("/users/pat"))).json() == put.json()
        client = await signed_in(e, "pat", "pat-password")  # no password sent: it stays
        await client.aclose()
        # PUT replaces: what is left out takes POST's default (not admin, no roles)
        reset = await e.admin.put(e.api("/users/pat"), json={"name": "pat",
                                                             "password": "brand-new-pw"})
        assert (reset.json()["admin"], reset.json()["roles"]) == (False, [])
        client = await signed_in(e, "pat", "brand-new-pw")
        await client.aclose()
        missing = await e.admin.put(e.api("/users/nobody"), json={"name": "nobody"})
        assert missing.status_code == 404 and detail(missing) == "user 'nobody' not found"
        # every problem at once: the name, each unknown role, the built-in ones, a bad field
        wrong = await e.admin.put(e.api("/users/pat"), json={
            "name": "someone-else", "roles": ["ops", "nope", "admin", "gone"]})
        assert wrong.status_code == 422
        assert [(p["loc"], p["msg"].split(":")[0]) for p in detail(wrong)] == [
            (["body", "name"], "the name differs from the path"),
            (["body", "roles", 1], "no role named nope"),
            (["body", "roles", 2], "'admin' is a built-in role"),
            (["body", "roles", 3], "no role named gone")]
        invalid = await e.admin.put(e.api("/users/pat"), json={
            "name": "pat", "password": "short", "admin": "maybe", "roles": ["bad name!"]})
        assert invalid.status_code == 422
        assert {tuple(p["loc"]) for p in detail(invalid)} == {
            ("body", "password"), ("body", "admin"), ("body", "roles", 0)}
        # POST: roles too, and 409 on a name in use
        made = await e.admin.post(e.api("/users"), json={"name": "kim", "password": "kim-pw-123",
                                                         "roles": ["ops"]})
        assert made.status_code == 201 and made.json()["roles"] == ["ops"]
        taken = await e.admin.post(e.api("/users"), json={"name": "kim",
                                                          "password": "kim-pw-123"})
        assert taken.status_code == 409 and detail(taken) == "user 'kim' already exists"
        unknown = await e.admin.post(e.api("/users"), json={"name": "lee", "password": "x" * 9,
                                                            "roles": ["user", "ghost"]})
        assert [p["loc"] for p in detail(unknown)] == [["body", "roles", 0],
                                                       ["body", "roles", 1]]
        assert (await e.admin.get(e.api("/users/lee"))).status_code == 404
        # PATCH: roles alone
        patched = await e.admin.patch(e.api("/users/kim"), json={"roles": []})
        assert patched.status_code == 200 and patched.json()["roles"] == []
        listed = {u["name"]: u for u in (await e.admin.get(e.api("/users"))).json()["items"]}
        assert listed["kim"]["roles"] == [] and listed["pat"]["roles"] == []


async def test_federated_users_keep_their_roles_and_have_no_password(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        accounts = Accounts(e.db)
        try:
            fed = accounts.upsert_federated("https://idp.example", "u-1", "fed",
                                            frozenset({"eng"}), False)
            assert (await e.admin.post(e.api("/roles"), json={"name": "ops"})).status_code == 201
            given = await e.admin.patch(e.api("/users/fed"), json={"roles": ["ops"]})
            assert given.status_code == 200 and given.json()["roles"] == ["ops"]
            # the next sign-in overwrites the provider's groups, and keeps the role
            again = accounts.upsert_federated("https://idp.example", "u-1", "fed",
                                              frozenset({"qa"}), False)
            assert again.id == fed.id
            assert (again.groups, again.roles) == ({"qa", "ops"}, {"ops"})
            stored = accounts.get(fed.id)
            assert stored is not None and stored.groups == {"qa", "ops"}
            assert stored.principal().groups == {"qa", "ops"}
            for method, body in (("PUT", {"name": "fed", "password": "a-password"}),
                                 ("PATCH", {"password": "a-password", "roles": []})):
                refused = await e.admin.request(method, e.api("/users/fed"), json=body)
                assert refused.status_code == 400
                assert detail(refused) == ("user 'fed' signs in through an identity provider "
                                           "and has no password here")
            # the refused requests changed nothing (the PATCH's roles: [] included)
            assert (await e.admin.get(e.api("/users/fed"))).json()["roles"] == ["ops"]
            kept = await e.admin.put(e.api("/users/fed"), json={"name": "fed",
                                                               "roles": ["ops"]})
            assert kept.status_code == 200
            assert kept.json()["issuer"] == "https://idp.example"
            # deleting the user deletes what they held: the role is free to go
            assert (await e.admin.delete(e.api("/users/fed"))).status_code == 204
            assert (await e.admin.delete(e.api("/roles/ops"))).status_code == 204
        finally:
            accounts.close()


# -- roles -------------------------------------------------------------------------------------

async def test_roles_registry(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        listed = (await e.admin.get(e.api("/roles"))).json()["items"]
        assert [(r["name"], r["source"]) for r in listed] == [
            ("admin", "builtin"), ("user", "builtin"), ("auditor", "builtin")]
        made = await e.admin.post(e.api("/roles"), json={"name": "ops",
                                                         "description": "on call"})
        assert made.status_code == 201
        assert made.json() == {"name": "ops", "description": "on call", "source": "api"}
        assert (await e.admin.get(e.api("/roles/ops"))).json() == made.json()
        assert (await e.admin.get(e.api("/roles/user"))).json()["source"] == "builtin"
        for name in ("ops", "admin", "Admin", "user"):
            taken = await e.admin.post(e.api("/roles"), json={"name": name})
            assert taken.status_code == 409
            assert detail(taken) == f"role '{name}' already exists"
        bad = await e.admin.post(e.api("/roles"), json={"name": "no spaces", "description":
                                                        "x" * 501, "colour": "red"})
        assert bad.status_code == 422
        assert {tuple(p["loc"]) for p in detail(bad)} == {
            ("body", "name"), ("body", "description"), ("body", "colour")}
        for name in ("nope", "bad name!"):
            missing = await e.admin.get(e.api(f"/roles/{name}"))
            assert missing.status_code == 404 and detail(missing) == f"role '{name}' not found"
        # PUT and PATCH: the description (a name is a role's identity)
        put = await e.admin.put(e.api("/roles/ops"), json={"name": "ops"})
        assert put.status_code == 200 and put.json()["description"] == ""
        patched = await e.admin.patch(e.api("/roles/ops"), json={"description": "pager"})
        assert patched.json()["description"] == "pager"
        assert (await e.admin.patch(e.api("/roles/ops"), json={})).json() == patched.json()
        renamed = await e.admin.put(e.api("/roles/ops"), json={"name": "sre"})
        assert renamed.status_code == 422 and detail(renamed)[0]["loc"] == ["body", "name"]
        for method, path, body in (("PUT", "/roles/nope", {"name": "nope"}),
                                   ("PATCH", "/roles/nope", {"description": "x"}),
                                   ("PATCH", "/roles/nope", {}),
                                   ("DELETE", "/roles/nope", None)):
            gone = await e.admin.request(method, e.api(path), json=body)
            assert gone.status_code == 404 and detail(gone) == "role 'nope' not found"
        # the built-in roles cannot be changed or deleted
        for method, name, body in (("PUT", "admin", {"name": "admin"}),
                                   ("PATCH", "user", {"description": "x"}),
                                   ("PATCH", "user", {}),
                                   ("DELETE", "admin", None), ("DELETE", "user", None)):
            refused = await e.admin.request(method, e.api(f"/roles/{name}"), json=body)
            assert refused.status_code == 409
            assert detail(refused) == f"role '{name}' is built in and cannot be changed or " \
                                      "deleted"
        # a role someone holds cannot be deleted
        for user in ("pat", "root"):
            await e.admin.patch(e.api(f"/users/{user}"), json={"roles": ["ops"]})
        held = await e.admin.delete(e.api("/roles/ops"))
        assert held.status_code == 409
        assert detail(held) == "role 'ops' is held by 2 users; take it from them first"
        await e.admin.patch(e.api("/users/root"), json={"roles": []})
        held = await e.admin.delete(e.api("/roles/ops"))
        assert detail(held) == "role 'ops' is held by 1 user; take it from them first"
        assert (await e.admin.get(e.api("/users/pat"))).json()["roles"] == ["ops"]
        await e.admin.put(e.api("/users/pat"), json={"name": "pat"})
        assert (await e.admin.delete(e.api("/roles/ops"))).status_code == 204
        assert (await e.admin.get(e.api("/roles/ops"))).status_code == 404
        assert [r["name"] for r in (await e.admin.get(e.api("/roles"))).json()["items"]] == [
            "admin", "user", "auditor"]


# -- a role at the edge --------------------------------------------------------------------------

REDIRECT = "http://127.0.0.1:9/cb"


async def oauth_client(e: Env) -> str:
    async with httpx.AsyncClient() as client:
        made = await client.post(f"{e.url}/oauth/register", json={
            "redirect_uris": [REDIRECT], "token_endpoint_auth_method": "none"})
    assert made.status_code == 201
    return str(made.json()["client_id"])


async def token_request(e: Env, form: dict[str, str]) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        answer = await client.post(f"{e.url}/oauth/token", data=form)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def consented_tokens(e: Env, browser: httpx.AsyncClient, client_id: str,
                           endpoint: str) -> dict[str, Any]:
    """The whole browser flow: authorize, consent as the signed-in person, exchange."""
    verifier = secrets.token_urlsafe(40)
    form = await browser.get(f"{e.url}/oauth/authorize", params={
        "response_type": "code", "client_id": client_id, "redirect_uri": REDIRECT,
        "code_challenge": s256(verifier), "code_challenge_method": "S256",
        "resource": f"{e.url}/mcp/{endpoint}"})
    assert form.status_code == 200, form.text
    consent = re.search(r"name='consent' value='([^']+)'", form.text)
    assert consent is not None
    back = await browser.post(f"{e.url}/oauth/authorize", headers={"Origin": e.url},
                              data={"consent": consent.group(1), "decision": "allow"})
    answered = parse_qs(urlsplit(back.headers["location"]).query)
    assert "code" in answered, answered.get("error")
    code = answered["code"][0]
    return await token_request(e, {"grant_type": "authorization_code", "code": code,
                                   "redirect_uri": REDIRECT, "code_verifier": verifier,
                                   "client_id": client_id})


async def refreshed(e: Env, client_id: str, tokens: dict[str, Any]) -> dict[str, Any]:
    return await token_request(e, {"grant_type": "refresh_token", "client_id": client_id,
                                   "refresh_token": tokens["refresh_token"]})


async def test_a_role_grants_access_through_allow_groups(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        assert (await e.admin.post(e.api("/roles"), json={"name": "ops"})).status_code == 201
        teamed = await e.admin.post(e.api("/servers"), json={
            "name": "teamed", "url": f"{e.upstream}/mcp", "zones": ["loopback"],
            "access": {"allow_groups": ["ops"], "group_tools": {"ops": {"tools_deny": ["add"]}}}})
        assert teamed.status_code == 201
        # the server is new to the live gateway's discovery and authorization server too
        async with httpx.AsyncClient() as anonymous:
            prm = await anonymous.get(f"{e.url}/.well-known/oauth-protected-resource/mcp/teamed")
        assert prm.status_code == 200 and prm.json()["resource"] == f"{e.url}/mcp/teamed"
        client_id = await oauth_client(e)
        # without the role, pat is refused at consent (a token every call would refuse helps
        # nobody: issue 45): the client is sent access_denied
        browser = await signed_in(e, "pat", "pat-password")
        try:
            with pytest.raises(AssertionError, match="access_denied"):
                await consented_tokens(e, browser, client_id, "teamed")
        finally:
            await browser.aclose()
        given = await e.admin.patch(e.api("/users/pat"), json={"roles": ["ops"]})
        assert given.status_code == 200
        browser = await signed_in(e, "pat", "pat-password")
        try:
            tokens = await consented_tokens(e, browser, client_id, "teamed")
        finally:
            await browser.aclose()
        allowed = await mcp_call(e, "teamed", tokens["access_token"])
        assert ok(allowed) and allowed.json()["result"]["content"][0]["text"] == "hi"
        # the gateway reads who a token's user is now: the role taken away closes the
        # endpoint to the token that carries it, and given back opens it again
        await e.admin.patch(e.api("/users/pat"), json={"roles": []})
        refused = await mcp_call(e, "teamed", tokens["access_token"])
        assert refused.status_code == 403, refused.text
        await e.admin.patch(e.api("/users/pat"), json={"roles": ["ops"]})
        assert ok(await mcp_call(e, "teamed", tokens["access_token"]))
        # and a new token (here by refresh, which reads the user again) carries the role
        tokens = await refreshed(e, client_id, tokens)
        assert jwt.decode(tokens["access_token"], options={"verify_signature": False}
                          )["groups"] == ["ops"]
        # the role's tool profile (group_tools) applies too: add is hidden from ops
        hidden = await mcp_call(e, "teamed", tokens["access_token"], tool="add")
        assert hidden.json()["error"]["code"] == -32602
        # a browser session reads the user afresh: the consent flow's token has the role
        browser = await signed_in(e, "pat", "pat-password")
        try:
            consented = await consented_tokens(e, browser, client_id, "cfgd")
        finally:
            await browser.aclose()
        assert jwt.decode(consented["access_token"], options={"verify_signature": False}
                          )["groups"] == ["ops"]
        # the role taken away: the token that carries it no longer opens the endpoint
        await e.admin.patch(e.api("/users/pat"), json={"roles": []})
        assert (await mcp_call(e, "teamed", tokens["access_token"])).status_code == 403
        assert ok(await mcp_call(e, "cfgd", consented["access_token"]))
        # the server deleted: gone from discovery, and no longer a resource to authorize for
        assert (await e.admin.delete(e.api("/servers/teamed"))).status_code == 204
        browser = await signed_in(e, "pat", "pat-password")
        try:
            prm = await browser.get(f"{e.url}/.well-known/oauth-protected-resource/mcp/teamed")
            assert prm.status_code == 404
            refused_resource = await browser.get(f"{e.url}/oauth/authorize", params={
                "response_type": "code", "client_id": client_id, "redirect_uri": REDIRECT,
                "code_challenge": s256("v" * 43), "code_challenge_method": "S256",
                "resource": f"{e.url}/mcp/teamed"})
        finally:
            await browser.aclose()
        assert refused_resource.status_code in (302, 303)
        assert "error=invalid_target" in refused_resource.headers["location"]
        # the user deleted: their tokens stop working on the next call
        assert (await e.admin.delete(e.api("/users/pat"))).status_code == 204
        gone = await mcp_call(e, "cfgd", consented["access_token"])
        assert gone.status_code == 401, gone.text


async def test_a_nul_anywhere_is_a_422_after_authentication(tmp_path: Path) -> None:
    """Nothing the API stores or looks up may hold a NUL (PostgreSQL's text cannot): a 422
    naming where, never a 500, and only for a caller who is let in."""
    async with env(tmp_path) as e:
        async with httpx.AsyncClient() as anonymous:
            assert (await anonymous.get(e.api("/users/a%00b"))).status_code == 401
        cases = [
            (e.admin.get(e.api("/users/a%00b")), ["path", "name"]),
            (e.admin.get(e.api("/audit"), params={"principal": "p\x00"}),
             ["query", "principal"]),
            (e.admin.post(e.api("/servers"), json={
                "name": "n", "url": f"{e.upstream}/mcp",
                "access": {"allow_subjects": ["a\x00"]}}), ["body"]),
            (e.admin.patch(e.api("/roles/admin"), json={"description": "\x00"}), ["body"]),
        ]
        for pending, loc in cases:
            response = await pending
            assert response.status_code == 422, response.text
            assert detail(response) == [{"loc": loc, "msg": "holds a NUL character",
                                         "type": "value_error"}]
        # an escaped backslash before u0000 is text, not a NUL
        fine = await e.admin.post(e.api("/roles"), json={"name": "texty",
                                                         "description": "a \\u0000 b"})
        assert fine.status_code == 201 and fine.json()["description"] == "a \\u0000 b"
        assert (await e.admin.get(e.api("/servers/n"))).status_code == 404


async def test_the_last_administrator_stays_one(tmp_path: Path) -> None:
    async with env(tmp_path) as e:  # root is the only administrator among the users
        demoted = await e.admin.patch(e.api("/users/root"), json={"admin": False})
        assert demoted.status_code == 409 and detail(demoted) == (
            "user 'root' is the last administrator; make another user an administrator first")
        replaced = await e.admin.put(e.api("/users/root"), json={"name": "root"})
        assert replaced.status_code == 409  # PUT without admin means admin: false
        assert (await e.admin.patch(e.api("/users/pat"), json={"admin": True})).is_success
        assert (await e.admin.patch(e.api("/users/root"), json={"admin": False})).is_success
        last = await e.admin.delete(e.api("/users/pat"))
        assert last.status_code == 409 and "last administrator" in detail(last)
        assert (await e.admin.get(e.api("/users/pat"))).json()["admin"] is True
        # two demotions at once: one of them is refused
        assert (await e.admin.patch(e.api("/users/root"), json={"admin": True})).is_success
        both = await asyncio.gather(
            e.admin.patch(e.api("/users/root"), json={"admin": False}),
            e.admin.patch(e.api("/users/pat"), json={"admin": False}))
        assert sorted(r.status_code for r in both) == [200, 409]
        users = (await e.admin.get(e.api("/users"))).json()["items"]
        assert sum(u["admin"] for u in users) == 1


async def test_a_new_password_ends_the_persons_other_sessions(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        pat_a = await signed_in(e, "pat", "pat-password")
        pat_b = await signed_in(e, "pat", "pat-password")
        root_a = await signed_in(e, "root", "root-password")
        root_b = await signed_in(e, "root", "root-password")
        try:
            assert (await pat_a.get(e.api("/me"))).status_code == 200
            changed = await e.admin.patch(e.api("/users/pat"), json={"password": "new-password"})
            assert changed.status_code == 200
            assert (await pat_a.get(e.api("/me"))).status_code == 401
            assert (await pat_b.get(e.api("/me"))).status_code == 401
            # a person changing their own password keeps the session they did it from
            own = await root_a.patch(e.api("/users/root"), headers={"Origin": e.url},
                                     json={"password": "root-new-password"})
            assert own.status_code == 200
            assert (await root_a.get(e.api("/me"))).status_code == 200
            assert (await root_b.get(e.api("/me"))).status_code == 401
        finally:
            for client in (pat_a, pat_b, root_a, root_b):
                await client.aclose()


async def test_deleting_a_user_ends_their_sessions_and_drops_their_upstream_tokens(
        tmp_path: Path) -> None:
    from proxy.connect.vault import Vault

    async with env(tmp_path) as e:
        vault = Vault(db_backends.open_database(), {"k1": b"\x01" * 32})
        vault.put("gh", "tollhouse:local|local:pat", {"access_token": "A", "expires_at": None})
        vault.put("gh", "tollhouse:local|local:root", {"access_token": "R", "expires_at": None})
        pat = await signed_in(e, "pat", "pat-password")
        try:
            assert (await e.admin.delete(e.api("/users/pat"))).status_code == 204
            assert (await pat.get(e.api("/me"))).status_code == 401
        finally:
            await pat.aclose()
        assert vault.get("gh", "tollhouse:local|local:pat") is None
        kept = vault.get("gh", "tollhouse:local|local:root")
        assert kept is not None and kept.tokens["access_token"] == "R"


async def test_api_lockouts_go_by_the_callers_address_through_trusted_proxies(
        tmp_path: Path) -> None:
    async with env(tmp_path, trusted_proxies=["127.0.0.1"]) as e, \
            httpx.AsyncClient(timeout=10) as client:
        def via(address: str, key: str) -> dict[str, str]:
            return {"X-Forwarded-For": address, "Authorization": f"Bearer {key}"}

        for _ in range(3):
            bad = await client.get(e.api("/me"), headers=via("203.0.113.7", "th_nope"))
            assert bad.status_code == 401
        locked = await client.get(e.api("/me"), headers=via("203.0.113.7", e.admin_key))
        assert locked.status_code == 429 and locked.json()["error"] == "too_many_requests"
        other = await client.get(e.api("/me"), headers=via("198.51.100.2", e.admin_key))
        assert other.status_code == 200  # another client behind the same proxy



async def test_a_deleted_users_token_does_not_pass_for_a_new_user_of_the_same_name(
        tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        client_id = await oauth_client(e)
        browser = await signed_in(e, "pat", "pat-password")
        try:
            tokens = await consented_tokens(e, browser, client_id, "cfgd")
        finally:
            await browser.aclose()
        assert ok(await mcp_call(e, "cfgd", tokens["access_token"]))
        assert (await e.admin.delete(e.api("/users/pat"))).status_code == 204
        again = await e.admin.post(e.api("/users"), json={"name": "pat",
                                                          "password": "another-password"})
        assert again.status_code == 201
        stale = await mcp_call(e, "cfgd", tokens["access_token"])
        assert stale.status_code == 401, stale.text


async def test_a_name_in_the_path_is_one_segment(tmp_path: Path) -> None:
    """Routes match the path as sent: an encoded `/` stays inside the name it was sent in
    (a stored name reaches its handler exactly, one that is not stored is a 404), and never
    addresses another resource (#36 item 3)."""
    async with env(tmp_path) as e:
        accounts = Accounts(e.db)
        try:
            pat = accounts.by_name("pat")
            assert pat is not None
            with accounts._db.transaction() as conn:  # a name stored before the name rule
                conn.execute(accounts._db.sql(
                    "INSERT INTO users (id, name, issuer, subject, is_admin, groups, created_at)"
                    " VALUES ('legacy01', 'a/../pat', 'https://idp.example', 's', 0, '', 0)"))
            shown = await e.admin.get(e.api("/users/a%2F..%2Fpat"))
            assert shown.status_code == 200 and shown.json()["name"] == "a/../pat"
            for method in ("GET", "PATCH", "DELETE"):
                missing = await e.admin.request(
                    method, e.api("/users/b%2F..%2F..%2Froles%2Fx"),
                    json={"admin": True} if method == "PATCH" else None)
                assert missing.status_code == 404, method
                assert detail(missing) == "user 'b/../../roles/x' not found"
            gone = await e.admin.delete(e.api("/users/a%2F..%2Fpat"))
            assert gone.status_code == 204
            assert accounts.by_name("a/../pat") is None and accounts.by_name("pat") == pat
        finally:
            accounts.close()
