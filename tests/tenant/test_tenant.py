"""Per-caller upstreams end to end: one endpoint, `workspace`, whose URL is filled from each
caller's `tenant` claim (`http://{tenant}.tenants.test:PORT/mcp`), in front of two official-SDK
servers on 127.0.0.2 and 127.0.0.3 (one port, so only the host tells them apart). A resolver
the test holds answers for the tenants' hosts, as DNS would; the gateway's egress check and
pinned dialling run on its answers exactly as on a configured upstream's."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.audit import query
from proxy.auth import keys as api_keys
from proxy.people.accounts import Accounts
from proxy.storage.db import Database
from tests import db_backends, state_backends
from tests.e2e.sdk_client import connect
from tests.e2e.test_eras import MODERN, modern_request, sse_or_json
from tests.e2e.upstreams import UpstreamProbe, build_app
from tests.helpers import DEADLINE_S, ISSUER, jwt_auth, token, until
from tests.servers import serve
from tests.stack import gateway_stack

HOSTS = {"acme.tenants.test": ["127.0.0.2"], "globex.tenants.test": ["127.0.0.3"],
         "inner.tenants.test": ["10.20.30.40"],  # a LAN address: outside zones = loopback
         "meta.tenants.test": ["169.254.169.254"],  # a cloud metadata address
         "mixed.tenants.test": ["127.0.0.2", "10.20.30.40"]}  # one bad address spoils all


class Dns:
    """The tenants' names, answered as a DNS server would; who asked is kept."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def resolve(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        if host not in HOSTS:
            raise OSError(f"{host} has no address")
        return list(HOSTS[host])


def _pair_of_sockets() -> tuple[socket.socket, socket.socket, int]:
    """Listening sockets on 127.0.0.2 and 127.0.0.3 with one port number."""
    for _ in range(50):
        first = socket.socket()
        first.bind(("127.0.0.2", 0))
        port = first.getsockname()[1]
        second = socket.socket()
        try:
            second.bind(("127.0.0.3", port))
        except OSError:
            first.close()
            second.close()
            continue
        first.listen(128)
        second.listen(128)
        return first, second, port
    raise RuntimeError("no port free on both 127.0.0.2 and 127.0.0.3")


@dataclass
class Tenants:
    endpoint: str
    acme: UpstreamProbe
    globex: UpstreamProbe
    dns: Dns
    db: str
    port: int
    app: Any = None


def _config(port: int, db: str, **upstream: Any) -> dict[str, Any]:
    return {
        "auth": jwt_auth(), "database": {"url": db}, "state": state_backends.state(),
        "upstreams": [{
            "name": "workspace", "url": f"http://{{tenant}}.tenants.test:{port}/mcp",
            "zones": ["loopback"], "total_timeout_s": 10,
            "placeholders": {"tenant": {"claim": "tenant"}}, **upstream}],
    }


@asynccontextmanager
async def tenants(extra: dict[str, Any] | None = None, **upstream: Any
                  ) -> AsyncIterator[Tenants]:
    """acme's server speaks only the legacy era (it refuses 2026-07-28), globex's both: with
    era = auto, each resolved upstream's era is learned on its own."""
    acme_app, acme = build_app(stateless=False, json_response=False, name="acme-server",
                               dns_rebinding_protection=False, legacy_only=True)
    globex_app, globex = build_app(stateless=True, json_response=True, name="globex-server",
                                   dns_rebinding_protection=False)
    first, second, port = _pair_of_sockets()
    db = db_backends.url()
    dns = Dns()
    cfg = {**_config(port, db, **upstream), **(extra or {})}
    async with serve(acme_app, graceful_timeout=1, sock=first), \
            serve(globex_app, graceful_timeout=1, sock=second), \
            gateway_stack(cfg, resolver=dns) as site:
        yield Tenants(site.endpoint("workspace"), acme, globex, dns, db, port, site.app)


def bearer(sub: str, **claims: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(endpoint='workspace', sub=sub, **claims)}"}


async def call_modern(http: httpx.AsyncClient, endpoint: str, headers: dict[str, str],
                      text: str) -> dict[str, Any]:
    body, h = modern_request("tools/call", {"name": "echo", "arguments": {"text": text}})
    response = await http.post(endpoint, content=body, headers={**h, **headers})
    assert response.status_code == 200, response.text
    return sse_or_json(response)


def _records(db: str, principal: str) -> list[dict[str, Any]]:
    return [r for r in query(db, limit=200) if r["principal"] == principal]


async def test_two_callers_reach_their_own_servers_in_both_eras() -> None:
    async with tenants() as t, httpx.AsyncClient(timeout=DEADLINE_S) as http:
        # the legacy era, through the official SDK client
        async with connect(t.endpoint, headers=bearer("alice", tenant="acme")) as alice:
            assert alice.initialize_result.server_info.name == "acme-server"
            assert (await alice.call_tool("echo", {"text": "alice legacy"})
                    ).content[0].text == "alice legacy"
        async with connect(t.endpoint, headers=bearer("bob", tenant="globex")) as bob:
            assert bob.initialize_result.server_info.name == "globex-server"
            assert (await bob.call_tool("echo", {"text": "bob legacy"})
                    ).content[0].text == "bob legacy"
        # the 2026-07-28 era: acme's legacy-only server bridged, globex's straight through
        for sub, tenant in (("alice", "acme"), ("bob", "globex")):
            answer = await call_modern(http, t.endpoint, bearer(sub, tenant=tenant),
                                       f"{sub} modern")
            assert answer["result"]["content"][0]["text"] == f"{sub} modern"
    assert sorted(c.arguments["text"] for c in t.acme.tool_calls("echo")) == [
        "alice legacy", "alice modern"]
    assert sorted(c.arguments["text"] for c in t.globex.tool_calls("echo")) == [
        "bob legacy", "bob modern"]
    # each resolved upstream's era learned on its own: acme's bridged, globex's not
    (acme_modern,) = [c for c in t.acme.tool_calls("echo") if c.arguments["text"] ==
                      "alice modern"]
    (globex_modern,) = [c for c in t.globex.tool_calls("echo") if c.arguments["text"] ==
                        "bob modern"]
    assert acme_modern.protocol_version == "2025-11-25"
    assert globex_modern.protocol_version == MODERN
    # the audit names the endpoint and the origin each call went to
    for principal, host in (("alice", "acme"), ("bob", "globex")):
        calls = [r for r in _records(t.db, principal) if r["tool"] == "echo"]
        assert len(calls) == 2
        assert {(r["endpoint"], r["upstream"], r["status"]) for r in calls} == {
            ("workspace", f"http://{host}.tenants.test:{t.port}", "ok")}


async def test_tools_list_is_each_callers_own() -> None:
    async with tenants() as t, httpx.AsyncClient(timeout=DEADLINE_S) as http:
        for sub, tenant in (("alice", "acme"), ("bob", "globex"), ("alice", "acme")):
            body, h = modern_request("tools/list")
            response = await http.post(t.endpoint, content=body,
                                       headers={**h, **bearer(sub, tenant=tenant)})
            assert response.status_code == 200
            tools = sse_or_json(response)["result"]["tools"]
            assert "echo" in {tool["name"] for tool in tools}
    assert len(t.acme.posts("tools/list")) == 2  # nothing answered from globex's list
    assert len(t.globex.posts("tools/list")) == 1


NO_UPSTREAM = {"code": -32000, "message": "no upstream for this caller"}


@pytest.mark.parametrize(("claims", "why"), [
    ({}, "absent"),                               # no tenant claim, no attribute
    ({"tenant": ""}, "absent"),
    ({"tenant": "../acme"}, "invalid"),
    ({"tenant": "acme@globex"}, "invalid"),
    ({"tenant": "acme%2Fx"}, "invalid"),
    ({"tenant": ".evil.example"}, "invalid"),
    ({"tenant": "acme.evil.example"}, "invalid"),
    ({"tenant": "acme:1"}, "invalid"),
    ({"tenant": "\u0430cme"}, "invalid"),          # Cyrillic a: a look-alike of acme
    ({"tenant": "ACME"}, "invalid"),               # the pattern is case-sensitive
    ({"tenant": "acme\n"}, "invalid"),
    ({"tenant": ["acme"]}, "absent"),              # not text: no value
])
async def test_a_caller_without_a_valid_value_reaches_nothing(claims: dict[str, Any],
                                                               why: str) -> None:
    async with tenants() as t, httpx.AsyncClient(timeout=DEADLINE_S) as http:
        body, h = modern_request("tools/call", {"name": "echo", "arguments": {"text": "x"}})
        response = await http.post(t.endpoint, content=body,
                                   headers={**h, **bearer("mallory", **claims)})
    assert response.status_code == 200
    assert response.json()["error"] == NO_UPSTREAM
    assert t.dns.asked == []  # nothing resolved, nothing dialled
    assert t.acme.calls == [] and t.globex.calls == []
    (record,) = _records(t.db, "mallory")
    assert record["status"] == "error"
    assert record["error_message"] == f"no_upstream_for_caller: {why} tenant"
    assert record["upstream"] is None


async def test_a_reload_that_fills_the_url_from_another_claim_reads_it_from_the_next_call(
        tmp_path: Path) -> None:
    """A reload points the URL's {tenant} at the `org` claim: the very token that reached
    nothing before (verified and cached without `org`) reaches its server on the next call,
    and one that only has the old claim now reaches nothing."""
    async with tenants() as t, httpx.AsyncClient(timeout=DEADLINE_S) as http:
        body, h = modern_request("tools/call", {"name": "echo", "arguments": {"text": "x"}})
        dora = bearer("dora", org="acme")
        before = await http.post(t.endpoint, content=body, headers={**h, **dora})
        assert before.json()["error"] == NO_UPSTREAM
        config = tmp_path / "reloaded.toml"
        config.write_text(f"""
[[upstreams]]
name = "workspace"
url = "http://{{tenant}}.tenants.test:{t.port}/mcp"
zones = ["loopback"]
total_timeout_s = 10
[upstreams.placeholders.tenant]
claim = "org"
""")
        assert await t.app.extensions["tollhouse"].serving.reload(config)
        answer = await call_modern(http, t.endpoint, dora, "dora after the reload")
        assert answer["result"]["content"][0]["text"] == "dora after the reload"
        old_claim = await http.post(t.endpoint, content=body,
                                    headers={**h, **bearer("erin", tenant="globex")})
        assert old_claim.json()["error"] == NO_UPSTREAM
    assert [c.arguments["text"] for c in t.acme.tool_calls("echo")] == ["dora after the reload"]
    assert t.globex.calls == []


async def test_a_numeric_claim_is_its_text_and_a_host_without_an_address_is_unreachable(
        ) -> None:
    async with tenants() as t, httpx.AsyncClient(timeout=DEADLINE_S) as http:
        answer = await call_modern(http, t.endpoint, bearer("mallory", tenant=7), "x")
    assert answer["error"] == {"code": -32000, "message": "upstream unavailable"}
    assert t.dns.asked == ["7.tenants.test"]
    (record,) = _records(t.db, "mallory")
    assert record["upstream"] == f"http://7.tenants.test:{t.port}"


@pytest.mark.parametrize("tenant", ["inner", "meta", "mixed"])
async def test_a_value_resolving_into_a_forbidden_zone_is_refused(tenant: str) -> None:
    async with tenants() as t, httpx.AsyncClient(timeout=DEADLINE_S) as http:
        body, h = modern_request("tools/call", {"name": "echo", "arguments": {"text": "x"}})
        response = await http.post(t.endpoint, content=body,
                                   headers={**h, **bearer("mallory", tenant=tenant)})
    assert response.json()["error"] == {"code": -32000,
                                        "message": "upstream not reachable under the egress "
                                                   "policy"}
    assert t.acme.calls == []
    (record,) = _records(t.db, "mallory")
    assert record["error_message"] == "egress_destination_denied"
    assert record["upstream"] == f"http://{tenant}.tenants.test:{t.port}"


async def test_a_session_is_bound_to_its_caller_and_upstream() -> None:
    async with tenants() as t, httpx.AsyncClient(timeout=DEADLINE_S) as http, \
            connect(t.endpoint, headers=bearer("alice", tenant="acme")) as alice:
        assert alice.session_id is not None
        listed = {"jsonrpc": "2.0", "id": 9, "method": "tools/list"}
        legacy = {"content-type": "application/json", "mcp-session-id": alice.session_id,
                  "accept": "application/json, text/event-stream",
                  "mcp-protocol-version": "2025-11-25"}
        # bob, on his own server, presents alice's session id
        stolen = await http.post(t.endpoint, json=listed,
                                 headers={**legacy, **bearer("bob", tenant="globex")})
        assert (stolen.status_code, stolen.json()) == (404, {"error": "session not found"})
        # bob naming alice's tenant in his token still does not get her session
        stolen = await http.post(t.endpoint, json=listed,
                                 headers={**legacy, **bearer("bob", tenant="acme")})
        assert (stolen.status_code, stolen.json()) == (404, {"error": "session not found"})
        # alice herself, routed elsewhere now, cannot carry the session to that server
        moved = await http.post(t.endpoint, json=listed,
                                headers={**legacy, **bearer("alice", tenant="globex")})
        assert (moved.status_code, moved.json()) == (404, {"error": "session not found"})
        assert (await alice.call_tool("echo", {"text": "still mine"})
                ).content[0].text == "still mine"
    assert t.globex.calls == []


async def test_a_person_attribute_fills_what_no_claim_does() -> None:
    """carol's token has no tenant claim: her attribute, set through /api/v1/users/{name},
    routes her (seen on her next call: the API's own write)."""
    db = db_backends.url()
    _, admin = api_keys.create(db, "ops", [], role="admin")
    acme_app, acme = build_app(stateless=True, json_response=True, name="acme-server",
                               dns_rebinding_protection=False)
    first, second, port = _pair_of_sockets()
    second.close()
    database = Database(db)
    try:
        Accounts(database).upsert_federated(ISSUER, "carol", "carol", frozenset(), False)
    finally:
        database.close()
    async with serve(acme_app, graceful_timeout=1, sock=first), \
            gateway_stack(_config(port, db), resolver=Dns(),
                          client={"timeout": DEADLINE_S}) as site:
        url, http, endpoint = site.url, site.client, site.endpoint("workspace")
        answer = await call_modern(http, endpoint, bearer("carol"), "before")
        assert answer["error"] == NO_UPSTREAM
        ops = {"Authorization": f"Bearer {admin}"}
        bad = await http.patch(f"{url}/api/v1/users/carol", headers=ops,
                               json={"attributes": {"x y": "1"}})
        assert bad.status_code == 422
        set_ = await http.patch(f"{url}/api/v1/users/carol", headers=ops,
                                json={"attributes": {"tenant": "acme"}})
        assert set_.status_code == 200, set_.text
        assert set_.json()["attributes"] == {"tenant": "acme"}
        assert (await http.get(f"{url}/api/v1/users/carol", headers=ops)
                ).json()["attributes"] == {"tenant": "acme"}
        answer = await call_modern(http, endpoint, bearer("carol"), "after")
        assert answer["result"]["content"][0]["text"] == "after"
        # a claim, when the token has one, wins over the attribute
        answer = await call_modern(http, endpoint, bearer("carol", tenant="nobody"), "x")
        assert answer["error"]["code"] == -32000
    assert [c.arguments["text"] for c in acme.tool_calls("echo")] == ["after"]


async def test_per_user_on_a_per_caller_url_gets_each_person_a_token_for_their_own_server(
        tmp_path: Any) -> None:
    """auth = "per_user" with a templated URL: the connect flow asks the authorization server
    for a token for the person's own resolved URL (RFC 8707 resource), from their attributes;
    a person with no server here cannot start it, and their calls reach nothing."""
    from tests.e2e import test_connect as flow

    def gh(inner: str) -> dict[str, Any]:
        return {"url": f"{inner}/mcp/{{tenant}}", "placeholders": {"tenant": {}}}

    async with flow.world(tmp_path, explicit=True, gh=gh) as w:
        _, admin = api_keys.create(w.outer_db, "ops", [], role="admin")
        async with httpx.AsyncClient(timeout=DEADLINE_S) as ops:
            set_ = await ops.patch(f"{w.outer}/api/v1/users/alice",
                                   headers={"Authorization": f"Bearer {admin}"},
                                   json={"attributes": {"tenant": "up"}})
            assert set_.status_code == 200, set_.text
        alice = await flow.connect(w, "alice")  # asserts resource == f"{inner}/mcp/up"
        ok = await w.call("alice")
        assert ok.json()["result"]["content"][0]["text"] == "alice", ok.text
        assert (await w.call("bob")).json()["error"] == NO_UPSTREAM
        bob = httpx.AsyncClient(follow_redirects=False, timeout=DEADLINE_S)
        await flow.sign_in(bob, w.outer, "bob", flow.PEOPLE["bob"][0])
        start = await bob.get(f"{w.outer}/connect/gh?start=1")
        assert start.status_code != 303 and "no upstream server for you" in start.text
        await alice.aclose()
        await bob.aclose()
    (record,) = [r for r in query(w.outer_db, limit=50)
                 if r["method"] == "tools/call" and r["status"] == "ok"]
    assert record["upstream"] == w.inner


class Meter:
    """The metering hook of the test below (`metering.hook` names METER): allows every call,
    keeps each authorize request and usage event."""

    def __init__(self) -> None:
        self.authorized: list[dict[str, Any]] = []
        self.recorded: list[dict[str, Any]] = []

    async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
        self.authorized.append(request)
        return {"allow": True}

    async def record(self, event: dict[str, Any]) -> None:
        self.recorded.append(event)


METER = Meter()


async def test_rate_limits_and_metering_count_each_caller_of_a_templated_endpoint() -> None:
    """One rule and one hook on the endpoint, whichever server each caller resolves to: each
    caller has their own bucket (a caller over the limit reaches no server, the other caller
    still does), and each metered call's usage event names the endpoint, the caller and the
    call id of its audit record."""
    METER.authorized.clear()
    METER.recorded.clear()
    extra = {"rate_limits": [{"name": "per-caller", "key": "principal", "rate": "2/h"}],
             "metering": {"hook": f"{__name__}:METER", "timeout_ms": 2000}}
    async with tenants(extra=extra) as t, httpx.AsyncClient(timeout=DEADLINE_S) as http:
        body, h = modern_request("tools/call", {"name": "echo", "arguments": {"text": "x"}})
        for sub, tenant in (("alice", "acme"), ("bob", "globex")):
            for _ in range(2):
                answer = await call_modern(http, t.endpoint, bearer(sub, tenant=tenant), sub)
                assert answer["result"]["content"][0]["text"] == sub
            refused = await http.post(t.endpoint, content=body,
                                      headers={**h, **bearer(sub, tenant=tenant)})
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == -32000
        assert [c.arguments["text"] for c in t.acme.tool_calls("echo")] == ["alice"] * 2
        assert [c.arguments["text"] for c in t.globex.tool_calls("echo")] == ["bob"] * 2
        # the outbox worker delivers them
        await until(lambda: len(METER.recorded) >= 4, what="the four usage events' delivery")
    assert sorted(r["principal"] for r in METER.authorized) == ["alice"] * 2 + ["bob"] * 2
    assert {r["endpoint"] for r in METER.authorized} == {"workspace"}
    assert sorted((e["principal"], e["endpoint"], e["status"]) for e in METER.recorded) == [
        ("alice", "workspace", "ok")] * 2 + [("bob", "workspace", "ok")] * 2
    for sub, host in (("alice", "acme"), ("bob", "globex")):
        records = [r for r in _records(t.db, sub) if r["method"] == "tools/call"]
        assert sorted(r["status"] for r in records) == ["denied", "ok", "ok"]
        (denied,) = [r for r in records if r["status"] == "denied"]
        assert denied["denied_reason"] == "rate_limit: per-caller"
        ok = {r["call_id"] for r in records if r["status"] == "ok"}
        assert ok == {e["call_id"] for e in METER.recorded if e["principal"] == sub}
        # the origin the caller resolves to, named on the refusal too (not dialled: above)
        assert {r["upstream"] for r in records} == {f"http://{host}.tenants.test:{t.port}"}


async def test_cedar_policies_decide_on_a_templated_endpoint_by_the_callers_claims(
        tmp_path: Path) -> None:
    """The Cedar policies on a per-caller endpoint: the tenant claim (listed in [policy]
    claims) decides; for the other tenant no call of the tool could be permitted, so it
    answers as an unknown tool, and that caller's server is never reached. A call refused
    for its arguments answers the policy's tool result."""
    (tmp_path / "tenants.cedar").write_text(
        '@id("acme-echoes")\n'
        'permit(principal, action == Tollhouse::Action::"tools/call",\n'
        '       resource == Tollhouse::Tool::"workspace/echo")\n'
        'when { principal.claims has tenant && principal.claims.tenant == "acme"\n'
        '       && context.input.text != "secret" };\n')
    extra = {"policy": {"files": [str(tmp_path / "tenants.cedar")], "claims": ["tenant"]}}
    body, h = modern_request("tools/call", {"name": "echo", "arguments": {"text": "hi"}})
    async with tenants(extra=extra) as t, httpx.AsyncClient(timeout=DEADLINE_S) as http:
        allowed = await call_modern(http, t.endpoint, bearer("alice", tenant="acme"), "hi")
        argued = await call_modern(http, t.endpoint, bearer("alice", tenant="acme"), "secret")
        hidden = await http.post(t.endpoint, content=body,
                                 headers={**h, **bearer("bob", tenant="globex")})
    assert allowed["result"]["content"][0]["text"] == "hi"
    assert argued["result"]["isError"] is True
    assert argued["result"]["structuredContent"]["code"] == "gateway.policy.denied"
    assert hidden.status_code == 400 and hidden.json()["error"]["code"] == -32602
    assert [c.arguments["text"] for c in t.acme.tool_calls("echo")] == ["hi"]
    assert t.globex.tool_calls("echo") == []
    (denied,) = [r for r in _records(t.db, "bob") if r["method"] == "tools/call"]
    assert denied["status"] == "denied"
    assert "secret" not in repr(_records(t.db, "alice"))
