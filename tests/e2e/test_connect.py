"""Per-user upstream connections end to end. The upstream is a second Tollhouse: a real OAuth
authorization server with its own people (alice2, bob2), whose MCP endpoint checks its bearer
and tells its own upstream (the official SDK server) who is calling. The gateway under test
signs people in locally and connects each one's own upstream account."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import jwt
import orjson
import pytest
from quart import Quart, Response

from proxy.audit import query
from proxy.connect.vault import Vault
from proxy.people.accounts import Accounts
from proxy.storage.db import Database
from tests import db_backends, state_backends
from tests.e2e.test_oauth_sdk import Browser
from tests.e2e.upstreams import UpstreamProbe, stateless_json_app
from tests.servers import bound_socket
from tests.stack import Urls, gateway_stack

SECRET = "outer-jwt-secret-of-thirty-two-bytes!!"
PEOPLE = {"alice": ("alice-pass-1", "alice2", "alice2-pass"),
          "bob": ("bob-pass-123", "bob2", "bob2-pass-1")}
VAULT_KEYS = {"k1": b"\x01" * 32}


@dataclass
class World:
    outer: str
    inner: str
    outer_db: Database
    inner_db: Database
    probe: UpstreamProbe
    state: Any = None  # the gateway's app state
    # every replica of the gateway (the first is `outer`, also their public URL), and its state
    replicas: list[str] = field(default_factory=list)
    states: list[Any] = field(default_factory=list)

    def edited(self, person: str) -> None:
        """The test changed a vault row behind the gateway's back: drop its in-memory copy."""
        for state in self.states or [self.state]:
            state.connections.forget(f"tollhouse:local|local:{person}", "gh")

    def mcp_token(self, person: str) -> str:
        """The person's bearer at the gateway: same principal as their browser sign-in."""
        return jwt.encode({"iss": "tollhouse:local", "sub": f"local:{person}",
                           "aud": f"{self.outer}/mcp/gh", "exp": int(time.time()) + 600},
                          SECRET, algorithm="HS256")

    async def call(self, person: str, tool: str = "echo", method: str = "tools/call",
                   request_id: int = 1, via: str | None = None) -> httpx.Response:
        """A call through the gateway (through replica `via`, a URL of `replicas`)."""
        params = {"name": tool, "arguments": {"text": person}} if method == "tools/call" else {}
        async with httpx.AsyncClient(timeout=10) as client:
            return await client.post(
                f"{via or self.outer}/mcp/gh", content=orjson.dumps(
                    {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}),
                headers={"content-type": "application/json",
                         "accept": "application/json, text/event-stream",
                         "authorization": f"Bearer {self.mcp_token(person)}"})

    def vault_row(self, person: str) -> tuple[Any, ...]:
        (row,) = db_backends.rows(self.outer_db, "SELECT kid, sealed, status, expires_at FROM "
                                  "upstream_tokens WHERE principal = ?",
                                  f"tollhouse:local|local:{person}")
        return row


@asynccontextmanager
async def world(tmp_path: Path, explicit: bool = False, replicas: int = 1,
                gh: Callable[[str], dict[str, Any]] | None = None,
                stdio: dict[str, Any] | None = None,
                inner_host: str = "127.0.0.1", **options: Any) -> AsyncIterator[World]:
    """The upstream Tollhouse and the gateway under test; `replicas` > 1: that many gateway
    apps on one database and one Redis (a fresh key prefix), all with the first one's URL as
    their public URL, as behind a load balancer. `gh(inner_url)`: more of gh's settings.
    `stdio`: `gh` is that stdio upstream instead, its people's tokens those of the same
    authorization server. `inner_host`: where the upstream listens. `options`: more
    `create_app` keywords for the gateway under test (its clocks)."""
    app, probe = stateless_json_app()
    inner_db, outer_db = db_backends.open_database("inner"), db_backends.open_database("outer")
    for person, (_, upstream_user, upstream_password) in PEOPLE.items():
        Accounts(inner_db).create_local(upstream_user, upstream_password)
        Accounts(outer_db).create_local(person, PEOPLE[person][0])
    async with gateway_stack(lambda urls: {
            "server": {"public_url": urls.gateway}, "auth": {"mode": "jwt"},
            "oauth_server": {"enabled": True}, "database": {"url": inner_db.url},
            "state": {"url": "memory"},
            "upstreams": [{"name": "up", "url": f"{urls.upstream}/mcp", "identity": "headers"}]},
            upstream=app, host=inner_host, secret_key="inner-secret") as upstream_site:
        inner = upstream_site.url
        outer_sock, outer = bound_socket()
        oauth: dict[str, Any] = {"discover": True}
        if explicit:  # a client registered beforehand, configured by hand
            async with httpx.AsyncClient() as admin:
                client = (await admin.post(f"{inner}/oauth/register", json={
                    "redirect_uris": [f"{outer}/connect/gh/callback"],
                    "token_endpoint_auth_method": "client_secret_post",
                    "client_name": "gateway"})).json()
            oauth = {"client_id": client["client_id"],
                     "client_secret": client["client_secret"],
                     "authorization_endpoint": f"{inner}/oauth/authorize",
                     "token_endpoint": f"{inner}/oauth/token",
                     "revocation_endpoint": f"{inner}/oauth/revoke"}
        if stdio is not None:  # no URL: the resource its tokens are for is configured
            oauth["resource"] = f"{inner}/mcp/up"
        outer_cfg = {
            "server": {"public_url": outer},
            "state": state_backends.state() if replicas > 1 else {"url": "memory"},
            "auth": {"mode": "jwt", "issuers": [{"issuer": "tollhouse:local",
                                                  "hs256_secret": SECRET,
                                                  "algorithms": ["HS256"]}]},
            "database": {"url": outer_db.url},
            "upstreams": [{"name": "gh", "auth": "per_user", "oauth": oauth,
                           **(stdio or {"url": f"{inner}/mcp/up"}),
                           **(gh(inner) if gh else {})}]}
        async with AsyncExitStack() as stack:
            sites = [await stack.enter_async_context(gateway_stack(
                outer_cfg, sock=outer_sock if n == 0 else None, vault_keys=VAULT_KEYS,
                **options))
                     for n in range(replicas)]
            urls, states = [s.url for s in sites], [s.services for s in sites]
            yield World(outer, inner, outer_db, inner_db, probe, states[0], urls, states)


async def sign_in(http: httpx.AsyncClient, base: str, name: str, password: str) -> None:
    signed = await http.post(f"{base}/signin", data={"name": name, "password": password,
                                                     "next": "/signin/done"},
                             headers={"Origin": base})
    assert signed.status_code == 303, signed.text


async def connect(w: World, person: str, callback_via: str | None = None
                  ) -> httpx.AsyncClient:
    """The person signs in at the gateway, opens the connect URL, signs in at the upstream's
    authorization server as their upstream account and allows; the gateway stores the tokens.
    `callback_via`: the replica the load balancer sends the way back to."""
    password, upstream_user, upstream_password = PEOPLE[person]
    http = httpx.AsyncClient(follow_redirects=False, timeout=10)
    await sign_in(http, w.outer, person, password)
    intro = await http.get(f"{w.outer}/connect/gh")
    assert intro.status_code == 200
    assert "gh" in intro.text and person in intro.text  # names upstream and identity
    start = await http.get(f"{w.outer}/connect/gh?start=1")
    assert start.status_code == 303
    authorize = start.headers["location"]
    assert authorize.startswith(f"{w.inner}/oauth/authorize?")
    params = {k: v[0] for k, v in parse_qs(urlsplit(authorize).query).items()}
    assert params["code_challenge_method"] == "S256" and params["resource"] == \
        f"{w.inner}/mcp/up"
    upstream_browser = Browser(w.inner, httpx.AsyncClient(follow_redirects=False, timeout=10),
                               user=upstream_user, password=upstream_password)
    back = await upstream_browser.consent(authorize)
    await upstream_browser.http.aclose()
    assert back.startswith(f"{w.outer}/connect/gh/callback?")
    if callback_via is not None:
        back = callback_via + back.removeprefix(w.outer)
    done = await http.get(back)
    assert done.status_code == 200 and "connected" in done.text, done.text
    return http


async def test_not_connected_then_connected_each_person_with_their_own_account(tmp_path: Path
                                                                             ) -> None:
    async with world(tmp_path) as w:
        hint = await w.call("alice")
        assert hint.status_code == 200
        assert hint.json()["error"] == {
            "code": -32000, "message": f"Connect your gh account first: {w.outer}/connect/gh"}
        assert w.probe.calls == []
        alice = await connect(w, "alice")
        listed = await alice.get(f"{w.outer}/api/v1/me/connections")
        assert listed.json()["items"] == [{"upstream": "gh", "status": "connected",
                                           "connect_url": f"{w.outer}/connect/gh"}]
        ok = await w.call("alice")
        assert ok.json()["result"]["content"][0]["text"] == "alice", ok.text
        assert (await w.call("alice", method="tools/list", request_id=2)).status_code == 200
        bob = await connect(w, "bob")
        assert (await w.call("bob")).json()["result"]["content"][0]["text"] == "bob"
        subjects = [c.headers["x-tollhouse-subject"] for c in w.probe.tool_calls("echo")]
        assert subjects == ["local:alice2", "local:bob2"]  # each through their own account
        row = w.vault_row("alice")
        assert row[0] == "k1" and b"access_token" not in row[1].encode()  # sealed at rest
        await alice.aclose()
        await bob.aclose()
    records = [r for r in query(w.outer_db, limit=50) if r["method"] == "tools/call"]
    not_connected = [r for r in records if r["status"] == "error"]
    assert [r["error_message"] for r in not_connected] == ["upstream_not_connected"]


async def test_tools_list_answers_from_the_last_known_list_when_not_connected(
        tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        alice = await connect(w, "alice")
        assert (await w.call("alice", method="tools/list")).status_code == 200
        listed = await w.call("bob", method="tools/list")  # bob never connected
        names = {t["name"] for t in listed.json()["result"]["tools"]}
        assert "echo" in names
        await alice.aclose()


async def test_expiry_refresh_401_retry_and_invalid_grant(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        alice = await connect(w, "alice")
        vault = Vault(w.outer_db, VAULT_KEYS)
        principal = "tollhouse:local|local:alice"
        first = vault.get("gh", principal)
        assert first is not None
        # about to expire: the next call refreshes first
        vault.put("gh", principal, {**first.tokens, "expires_at": time.time() + 5})
        w.edited("alice")
        assert (await w.call("alice")).status_code == 200
        second = vault.get("gh", principal)
        assert second is not None
        assert second.tokens["access_token"] != first.tokens["access_token"]
        assert second.tokens["refresh_token"] != first.tokens["refresh_token"]
        # the upstream refuses the access token it is sent (401): one refresh, one retry
        client_row = db_backends.rows(w.inner_db, "SELECT client_id FROM oauth_clients")
        vault.put("gh", principal, {**second.tokens, "access_token": "not-a-valid-token",
                                    "expires_at": time.time() + 3600})
        w.edited("alice")
        retried = await w.call("alice")
        assert retried.status_code == 200 and "result" in retried.json(), retried.text
        third = vault.get("gh", principal)
        assert third is not None and third.tokens["access_token"] != "not-a-valid-token"
        assert client_row
        # the refresh token is refused (invalid_grant): needs_reconnect
        vault.put("gh", principal, {**third.tokens, "refresh_token": "revoked-or-unknown",
                                    "access_token": "also-invalid",
                                    "expires_at": time.time() + 3600})
        w.edited("alice")
        broken = await w.call("alice")
        assert broken.json()["error"] == {
            "code": -32000, "message": f"Reconnect your gh account: {w.outer}/connect/gh"}
        listed = await alice.get(f"{w.outer}/api/v1/me/connections")
        assert listed.json()["items"][0]["status"] == "needs_reconnect"
        await alice.aclose()
    reasons = [r["error_message"] for r in query(w.outer_db, limit=50)
               if r["status"] == "error"]
    assert "upstream_needs_reconnect" in reasons


async def test_forged_state_and_another_persons_flow_are_refused(tmp_path: Path) -> None:
    async with world(tmp_path) as w, \
            httpx.AsyncClient(follow_redirects=False, timeout=10) as alice, \
            httpx.AsyncClient(follow_redirects=False, timeout=10) as bob:
        await sign_in(alice, w.outer, "alice", PEOPLE["alice"][0])
        await sign_in(bob, w.outer, "bob", PEOPLE["bob"][0])
        forged = await alice.get(f"{w.outer}/connect/gh/callback?code=x&state=forged")
        assert forged.status_code == 400 and "unknown" in forged.text
        start = await alice.get(f"{w.outer}/connect/gh?start=1")
        state = parse_qs(urlsplit(start.headers["location"]).query)["state"][0]
        stolen = await bob.get(f"{w.outer}/connect/gh/callback?code=x&state={state}")
        assert stolen.status_code == 400 and "someone else" in stolen.text
        async with httpx.AsyncClient() as nobody:
            anonymous = await nobody.get(f"{w.outer}/connect/gh/callback?code=x&"
                                         f"state={state}")
        assert anonymous.status_code == 401


async def test_disconnect_revokes_at_the_upstream(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        alice = await connect(w, "alice")
        tokens = Vault(w.outer_db, VAULT_KEYS).get("gh", "tollhouse:local|local:alice")
        assert tokens is not None
        refused = await alice.delete(f"{w.outer}/api/v1/me/connections/gh")
        assert refused.status_code == 403  # a cookie change without our Origin
        gone = await alice.delete(f"{w.outer}/api/v1/me/connections/gh",
                                  headers={"Origin": w.outer})
        assert gone.status_code == 204
        listed = await alice.get(f"{w.outer}/api/v1/me/connections")
        assert listed.json()["items"][0]["status"] == "not_connected"
        ((revoked,),) = db_backends.rows(
            w.inner_db, "SELECT count(*) FROM oauth_refresh WHERE revoked_at IS NOT NULL")
        assert revoked >= 1  # the upstream revoked the family (RFC 7009)
        assert (await w.call("alice")).json()["error"]["message"].startswith(
            "Connect your gh account first")
        await alice.aclose()


def test_vault_binds_rows_to_their_person_and_rotates_keys(tmp_path: Path) -> None:
    db = db_backends.open_database()
    old = Vault(db, {"k1": b"\x01" * 32})
    old.put("gh", "p|alice", {"access_token": "A", "refresh_token": "R", "expires_at": None})
    # a row copied to another person does not decrypt
    with db.transaction() as conn:
        conn.execute(db.sql(
            "INSERT INTO upstream_tokens (upstream, principal, kid, sealed, status, expires_at, "
            "updated_at) SELECT upstream, 'p|mallory', kid, sealed, status, expires_at, "
            "updated_at FROM upstream_tokens WHERE principal = 'p|alice'"))
    stolen = old.get("gh", "p|mallory")
    assert stolen is not None and stolen.status == "needs_reconnect" and stolen.tokens == {}
    # rotation: a new sealing key, the old one still unseals, and the row is resealed on use
    rotated = Vault(db, {"k2": b"\x02" * 32, "k1": b"\x01" * 32})
    got = rotated.get("gh", "p|alice")
    assert got is not None and got.tokens["access_token"] == "A"
    assert db_backends.rows(db, "SELECT kid FROM upstream_tokens WHERE principal = 'p|alice'"
                            ) == [("k2",)]
    only_new = Vault(db, {"k2": b"\x02" * 32})
    again = only_new.get("gh", "p|alice")
    assert again is not None and again.tokens["refresh_token"] == "R"


async def test_concurrent_calls_of_one_person_refresh_once(tmp_path: Path) -> None:
    import asyncio

    async with world(tmp_path) as w:
        alice = await connect(w, "alice")
        vault = Vault(w.outer_db, VAULT_KEYS)
        principal = "tollhouse:local|local:alice"
        tokens = vault.get("gh", principal)
        assert tokens is not None
        vault.put("gh", principal, {**tokens.tokens, "expires_at": time.time() + 1})
        w.edited("alice")

        def refresh_rows() -> int:
            ((count,),) = db_backends.rows(w.inner_db, "SELECT count(*) FROM oauth_refresh")
            return int(count)

        before = refresh_rows()
        results = await asyncio.gather(*(w.call("alice", request_id=i) for i in range(6)))
        assert all(r.json()["result"]["content"][0]["text"] == "alice" for r in results)
        assert refresh_rows() == before + 1  # one refresh grant served all six calls
        await alice.aclose()


async def test_explicit_client_configuration(tmp_path: Path) -> None:
    async with world(tmp_path, explicit=True) as w:
        alice = await connect(w, "alice")
        assert (await w.call("alice")).json()["result"]["content"][0]["text"] == "alice"
        page = await alice.get(f"{w.outer}/connections")
        assert page.status_code == 200 and "gh" in page.text and "connected" in page.text
        # no dynamic registration happened beside the one done by hand
        assert db_backends.rows(w.inner_db, "SELECT count(*) FROM oauth_clients") == [(1,)]
        await alice.aclose()


@asynccontextmanager
async def discovering_gateway(documents: dict[str, Any]) -> AsyncIterator[tuple[str, str]]:
    """A gateway with one per_user upstream that discovers, in front of an upstream serving
    `documents` by path ("{self}" in a string is that upstream's own URL). Yields the
    gateway's URL and the upstream's."""
    upstream = Quart("discovery")
    me: dict[str, str] = {}

    @upstream.route("/<path:path>")
    async def document(path: str) -> Any:
        body = documents.get("/" + path)
        if body is None:
            return {"error": "not found"}, 404
        text = orjson.dumps(body).decode().replace("{self}", me["url"])
        return Response(text, 200, {"Content-Type": "application/json"})

    database = db_backends.open_database()
    Accounts(database).create_local("alice", "alice-pass-1")

    def config(urls: Urls) -> dict[str, Any]:
        me["url"] = urls.upstream
        return {"server": {"public_url": urls.gateway}, "auth": {"mode": "jwt"},
                "database": {"url": database.url}, "state": {"url": "memory"},
                "upstreams": [{"name": "gh", "url": f"{urls.upstream}/mcp",
                               "auth": "per_user", "oauth": {"discover": True}}]}

    async with gateway_stack(config, upstream=upstream, vault_keys=VAULT_KEYS) as site:
        yield site.url, site.upstream


PRM = "/.well-known/oauth-protected-resource/mcp"
AS_META = "/.well-known/oauth-authorization-server"


@pytest.mark.parametrize(("documents", "says"), [
    ({PRM: {"authorization_servers": ["http://169.254.169.254"]}},
     "the authorization server&#x27;s metadata could not be fetched"),
    ({PRM: {"authorization_servers": ["http://[::ffff:169.254.169.254]"]}},
     "the authorization server&#x27;s metadata could not be fetched"),
    ({PRM: {"authorization_servers": ["{self}"]},
      AS_META: {"issuer": 5, "code_challenge_methods_supported": ["S256"]}},
     "names another issuer"),
    ({PRM: {"authorization_servers": ["{self}"]},
      AS_META: {"issuer": "{self}", "code_challenge_methods_supported": ["S256"]}},
     "usable authorization or token endpoint"),
], ids=["metadata address", "mapped metadata address", "issuer not a string",
        "no endpoints"])
async def test_a_bad_discovery_is_a_plain_failure_page(documents: dict[str, Any], says: str,
                                                      ) -> None:
    async with discovering_gateway(documents) as (url, _), \
            httpx.AsyncClient(follow_redirects=False, timeout=10) as alice:
        await sign_in(alice, url, "alice", "alice-pass-1")
        page = await alice.get(f"{url}/connect/gh?start=1")
        assert page.status_code == 502, page.text
        assert says in page.text
        assert "HTTP" not in page.text and "egress" not in page.text


@pytest.mark.skipif(not state_backends.on_redis(),
                    reason="replicas share their live state on Redis (TOLLHOUSE_TEST_STATE)")
async def test_two_replicas_share_one_dynamically_registered_client(tmp_path: Path) -> None:
    """Issue 14 items 1 and 4: no client_id configured, two replicas on one database. The
    connect flow begun on one finishes on the other, the token it got is refreshed by the
    other, and the upstream's authorization server saw one registration."""
    async with world(tmp_path, replicas=2) as w:
        a, b = w.replicas
        alice = await connect(w, "alice", callback_via=b)
        assert (await w.call("alice", via=b)).json()["result"]["content"][0]["text"] == "alice"
        vault = Vault(w.outer_db, VAULT_KEYS)
        principal = "tollhouse:local|local:alice"
        got = vault.get("gh", principal)
        assert got is not None
        vault.put("gh", principal, {**got.tokens, "expires_at": time.time() + 1})
        w.edited("alice")
        refreshed = await w.call("alice", via=b)  # B refreshes with the client A registered
        assert refreshed.json()["result"]["content"][0]["text"] == "alice", refreshed.text
        after = vault.get("gh", principal)
        assert after is not None and after.status == "connected"
        assert after.tokens["refresh_token"] != got.tokens["refresh_token"]
        assert (await w.call("alice", via=a)).status_code == 200
        bob = await connect(w, "bob", callback_via=a)  # and the other way round
        assert (await w.call("bob", via=b)).json()["result"]["content"][0]["text"] == "bob"
        (registered,) = db_backends.rows(w.inner_db, "SELECT client_id FROM oauth_clients")
        assert db_backends.rows(w.outer_db, "SELECT client_id FROM upstream_clients") == [
            registered]
        await alice.aclose()
        await bob.aclose()
