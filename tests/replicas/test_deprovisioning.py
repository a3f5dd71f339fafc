"""Deprovisioning across two replicas (issue 42 item 2): two `tollhouse serve` processes on one
Redis and one database (SQLite, or PostgreSQL with TOLLHOUSE_TEST_DATABASE=postgresql) behind
HAProxy (`tests/replicas/harness.py`). A person provisioned through SCIM at one replica holds
every kind of credential, each made on one replica or the other; the SCIM call that sets
`active: false`, sent to one replica, answers only once the other refuses each of them on its
very next request; reactivating at the other gives back the account alone. A person deleted
through `/api/v1/users` on one replica is refused at once on the other."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from proxy.auth import keys as api_keys
from tests.e2e.oidc_provider import OidcProvider, running_provider
from tests.e2e.test_oauth_sdk import INITIALIZE, MCP_HEADERS, REDIRECT_URI, query, s256
from tests.e2e.upstreams import stateless_json_app
from tests.helpers import ISSUER, SECRET, token
from tests.replicas.harness import Cluster, Replica, open_cluster
from tests.replicas.test_security import Crossing, on
from tests.servers import serve

SCIM_TOKEN = "scim-" + "r" * 40
SCIM = {"Authorization": f"Bearer {SCIM_TOKEN}", "Content-Type": "application/scim+json"}
USER = "urn:ietf:params:scim:schemas:core:2.0:User"
PATCH = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
SECRET_KEY = "replicas-secret-key-of-at-least-32-bytes"


@dataclass
class World:
    cluster: Cluster
    idp: OidcProvider

    @property
    def public(self) -> str:
        return self.cluster.lb_url

    @property
    def r0(self) -> Replica:
        return self.cluster.replicas[0]

    @property
    def r1(self) -> Replica:
        return self.cluster.replicas[1]


@pytest.fixture
async def world(tmp_path: Any) -> AsyncIterator[World]:
    idp = OidcProvider(refresh_grant=True)
    app, _ = stateless_json_app()
    async with running_provider(idp) as idp_url, serve(app, graceful_timeout=1) as up_url:
        config = {
            "scim": {"enabled": True, "token": SCIM_TOKEN},
            "auth": {"mode": "jwt", "lockout": {"max_failures": 10_000},
                     "issuers": [{"issuer": ISSUER, "hs256_secret": SECRET,
                                  "algorithms": ["HS256"]}],
                     "oidc": {"issuer": idp_url, "client_id": idp.client_id,
                              "client_secret": idp.client_secret}},
            "oauth_server": {"enabled": True},
            "upstreams": [{"name": "gh", "url": f"{up_url}/mcp", "auth": "per_user",
                           "oauth": {"client_id": idp.client_id,
                                     "client_secret": idp.client_secret,
                                     "authorization_endpoint": f"{idp_url}/authorize",
                                     "token_endpoint": f"{idp_url}/token",
                                     "revocation_endpoint": f"{idp_url}/revoke",
                                     "scopes": ["openid"]}}]}
        async with open_cluster(tmp_path, up_url, config=config,
                                env={"TOLLHOUSE_SECRET_KEY": SECRET_KEY}) as cluster:
            yield World(cluster, idp)


@dataclass
class Held:
    cookie: str
    client_id: str
    access: str
    refresh: str
    key: str
    session: str
    external: str


async def provision(w: World, at: Replica, name: str) -> str:
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.post(f"{at.url}/scim/v2/Users", headers=SCIM, json={
            "schemas": [USER], "userName": name, "emails": [{"value": name}]})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def set_active(w: World, at: Replica, uid: str, value: bool) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.patch(f"{at.url}/scim/v2/Users/{uid}", headers=SCIM, json={
            "schemas": [PATCH], "Operations": [{"op": "replace", "path": "active",
                                                "value": value}]})
    assert r.status_code in (200, 204), r.text


async def sign_in(w: World, http: httpx.AsyncClient, sub: str, email: str) -> str:
    """OpenID Connect sign-in started at r0, its callback at r1."""
    w.idp.sign_in_as(sub, name=sub, email=email)
    start = await http.get(f"{w.r0.url}/signin/oidc", params={"next": "/signin/done"})
    assert start.status_code == 303, start.text
    back = (await http.get(start.headers["location"])).headers["location"]
    done = await http.get(on(w.r1, back))
    assert done.status_code == 303, done.text
    return str(http.cookies["tollhouse_session"])


async def everything(w: World, sub: str, email: str) -> Held:
    async with httpx.AsyncClient(timeout=10, follow_redirects=False) as http:
        cookie = await sign_in(w, http, sub, email)
        browser = Crossing(w.public, http, replicas=[w.r0, w.r1])
        r = await http.post(f"{w.r1.url}/oauth/register", json={
            "client_name": "t", "redirect_uris": [REDIRECT_URI],
            "token_endpoint_auth_method": "none"})
        client_id, verifier = str(r.json()["client_id"]), secrets.token_urlsafe(48)
        back = query(await browser.consent(f"{w.public}/oauth/authorize?" + urlencode({
            "response_type": "code", "client_id": client_id, "redirect_uri": REDIRECT_URI,
            "state": "s", "resource": f"{w.public}/mcp/up", "code_challenge_method": "S256",
            "code_challenge": s256(verifier)})))
        issued = await http.post(f"{w.r0.url}/oauth/token", data={
            "grant_type": "authorization_code", "client_id": client_id, "code": back["code"],
            "redirect_uri": REDIRECT_URI, "code_verifier": verifier})
        assert issued.status_code == 200, issued.text
        start = await http.get(f"{w.r1.url}/connect/gh", params={"start": "1"})
        done = await http.get(on(w.r0, (await http.get(start.headers["location"])
                                        ).headers["location"]))
        assert done.status_code == 200 and "connected" in done.text, done.text
        made = await http.post(f"{w.r0.url}/api/v1/me/keys", headers={"Origin": w.public},
                               json={"name": "k", "endpoints": ["up"]})
        assert made.status_code == 201, made.text
    access = issued.json()["access_token"]
    async with httpx.AsyncClient(timeout=10) as http:
        opened = await http.post(f"{w.r1.url}/mcp/up", json=INITIALIZE,
                                 headers={**MCP_HEADERS, "Authorization": f"Bearer {access}"})
    assert opened.status_code == 200, opened.text
    return Held(cookie, client_id, access, issued.json()["refresh_token"], made.json()["key"],
                opened.headers["mcp-session-id"],
                token(aud=f"{w.public}/mcp/up", sub=f"ext-{sub}", preferred_username=email))


async def mcp(at: Replica, credential: str, session: str | None = None) -> httpx.Response:
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {credential}",
               "MCP-Protocol-Version": "2025-11-25"}
    if session is not None:
        headers["Mcp-Session-Id"] = session
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.post(f"{at.url}/mcp/up", headers=headers, json={
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "hi"}}})


def ok(r: httpx.Response) -> bool:
    return r.status_code == 200 and r.json()["result"]["content"][0]["text"] == "hi"


def refused(r: httpx.Response) -> bool:
    return r.status_code == 401 and 'error="invalid_token"' in r.headers["www-authenticate"]


async def me(at: Replica, cookie: str) -> int:
    async with httpx.AsyncClient(timeout=10, cookies={"tollhouse_session": cookie}) as http:
        return (await http.get(f"{at.url}/api/v1/me")).status_code


async def refresh(at: Replica, held: Held) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.post(f"{at.url}/oauth/token", data={
            "grant_type": "refresh_token", "client_id": held.client_id,
            "refresh_token": held.refresh})


async def credentials(at: Replica, held: Held) -> dict[str, bool]:
    """Whether each credential works at `at` (the MCP session with the OAuth token)."""
    return {"cookie": await me(at, held.cookie) == 200,
            "access": ok(await mcp(at, held.access)), "key": ok(await mcp(at, held.key)),
            "external": ok(await mcp(at, held.external)),
            "session": ok(await mcp(at, held.access, held.session)),
            "refresh": (await refresh(at, held)).status_code == 200}


async def test_deactivated_on_one_replica_every_credential_is_refused_on_the_other(
        world: World) -> None:
    w = world
    uid = await provision(w, w.r0, "ada@example.com")
    held = await everything(w, "ada-sub", "ada@example.com")
    for at in (w.r0, w.r1):  # every credential works on both (no refresh: it rotates)
        works = await credentials(at, held)
        works.pop("refresh")
        assert works == dict.fromkeys(works, True), (at.name, works)
    assert len(w.idp.revoked) == 0

    await set_active(w, w.r0, uid, False)
    # r1's very next request with each is refused, and r0's
    for at in (w.r1, w.r0):
        assert await me(at, held.cookie) == 401
        for credential in (held.access, held.key, held.external):
            assert refused(await mcp(at, credential)), at.name
        assert (await refresh(at, held)).json()["error"] == "invalid_grant"
    assert len(w.idp.revoked) == 2  # the gh account: revoked at the upstream, then deleted
    # a token of the configured issuer minted now, naming them by email, on r1
    assert refused(await mcp(w.r1, token(aud=f"{w.public}/mcp/up", sub="n",
                                         email="Ada@Example.com")))

    await set_active(w, w.r1, uid, True)
    assert ok(await mcp(w.r0, held.external))  # the account is back...
    for at in (w.r0, w.r1):  # ...and nothing else
        assert await me(at, held.cookie) == 401
        assert refused(await mcp(at, held.access)) and refused(await mcp(at, held.key))
    fresh = await everything(w, "ada-sub", "ada@example.com")
    for at in (w.r0, w.r1):
        gone = await mcp(at, fresh.access, held.session)
        assert gone.status_code == 404 and gone.json() == {"error": "session not found"}
        assert ok(await mcp(at, fresh.access, fresh.session))


async def test_deleted_through_the_api_on_one_replica_is_refused_on_the_other(
        world: World) -> None:
    w = world
    await provision(w, w.r1, "bob@example.com")
    held = await everything(w, "bob-sub", "bob@example.com")
    for credential in (held.access, held.key, held.external):
        assert ok(await mcp(w.r1, credential))
    _, admin = api_keys.create(w.cluster.database_url, "admin", [], role="admin")
    async with httpx.AsyncClient(timeout=30) as http:
        gone = await http.delete(f"{w.r0.url}/api/v1/users/bob@example.com",
                                 headers={"Authorization": f"Bearer {admin}"})
    assert gone.status_code == 204, gone.text
    assert await me(w.r1, held.cookie) == 401
    for credential in (held.access, held.key, held.external):
        assert refused(await mcp(w.r1, credential))
    async with httpx.AsyncClient(timeout=10) as http:
        opened = await http.post(f"{w.r1.url}/mcp/up", json=INITIALIZE, headers={
            **MCP_HEADERS, "Authorization": f"Bearer {token(aud=f'{w.public}/mcp/up')}"})
    assert opened.status_code == 200  # someone else is not refused
