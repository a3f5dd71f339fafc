"""Deprovisioning (issue 42 item 2) in one gateway, on the test's state store (memory, or Redis
with TOLLHOUSE_TEST_STATE=redis) and database: a person provisioned through SCIM signs in
through OpenID Connect, holds every kind of credential (a browser session, an OAuth grant of
this gateway's, an API key of their own, an MCP session, a connected upstream account, a token
of a configured issuer), and the SCIM call that sets `active: false` answers only once each is
refused; reactivating gives back the account and nothing else. Deleting a person through SCIM
or `/api/v1/users` takes the same. Two replicas: tests/replicas/test_deprovisioning.py."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from proxy.auth import keys as api_keys
from proxy.connect.vault import Vault
from proxy.people.accounts import Accounts
from tests.e2e.oidc_provider import OidcProvider, running_provider
from tests.e2e.test_oauth_sdk import INITIALIZE, MCP_HEADERS, REDIRECT_URI, Browser, query, s256
from tests.e2e.upstreams import UpstreamProbe, stateless_json_app
from tests.helpers import jwt_auth, token
from tests.servers import serve
from tests.stack import Site, gateway_stack

SCIM_TOKEN = "scim-" + "d" * 40
USER = "urn:ietf:params:scim:schemas:core:2.0:User"
PATCH = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
SCIM = {"Authorization": f"Bearer {SCIM_TOKEN}", "Content-Type": "application/scim+json"}
ADA = "ada@example.com"
VAULT_KEY = {"k1": b"v" * 32}


@dataclass
class World:
    site: Site
    idp: OidcProvider  # where people sign in, and the upstream `gh`'s authorization server
    probe: UpstreamProbe

    @property
    def url(self) -> str:
        return self.site.url


@pytest.fixture
async def world() -> AsyncIterator[World]:
    idp = OidcProvider(refresh_grant=True)
    app, probe = stateless_json_app()
    async with running_provider(idp) as idp_url, serve(app, graceful_timeout=1) as up_url:
        def config(urls: Any) -> dict[str, Any]:
            return {
                "server": {"public_url": urls.gateway},
                "scim": {"enabled": True, "token": SCIM_TOKEN},
                "auth": {**jwt_auth(lockout={"max_failures": 10_000}),
                         "oidc": {"issuer": idp_url, "client_id": idp.client_id,
                                  "client_secret": idp.client_secret}},
                "oauth_server": {"enabled": True},
                "upstreams": [
                    {"name": "up", "url": f"{up_url}/mcp"},
                    {"name": "gh", "url": f"{up_url}/mcp", "auth": "per_user",
                     "oauth": {"client_id": idp.client_id, "client_secret": idp.client_secret,
                               "authorization_endpoint": f"{idp_url}/authorize",
                               "token_endpoint": f"{idp_url}/token",
                               "revocation_endpoint": f"{idp_url}/revoke",
                               "scopes": ["openid"]}}]}

        async with gateway_stack(config, secret_key="k" * 32, vault_keys=VAULT_KEY) as site:
            yield World(site, idp, probe)


# -- what a person holds ---------------------------------------------------------------------


@dataclass
class Held:
    """Every credential of one person."""

    cookie: str
    client_id: str
    access_token: str
    refresh_token: str
    api_key: str
    session_id: str
    external: str  # a token of the configured issuer, naming them by preferred_username


async def provision(w: World, user_name: str = ADA) -> str:
    r = await w.site.client.post("/scim/v2/Users", headers=SCIM, json={
        "schemas": [USER], "userName": user_name, "emails": [{"value": user_name}]})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def sign_in(w: World, http: httpx.AsyncClient, sub: str = "ada-sub") -> str:
    """OpenID Connect sign-in as the provisioned person (linked by email); the cookie."""
    w.idp.sign_in_as(sub, name="Ada", email=ADA)
    start = await http.get(f"{w.url}/signin/oidc", params={"next": "/signin/done"})
    assert start.status_code == 303, start.text
    back = (await http.get(start.headers["location"])).headers["location"]
    done = await http.get(back)
    assert done.status_code == 303, done.text
    return str(http.cookies["tollhouse_session"])


async def oauth_grant(w: World, http: httpx.AsyncClient) -> tuple[str, str, str]:
    """A client's grant through consent (signed in already): (client, access, refresh)."""
    r = await http.post(f"{w.url}/oauth/register", json={
        "client_name": "deprovisioning test", "redirect_uris": [REDIRECT_URI],
        "token_endpoint_auth_method": "none"})
    assert r.status_code == 201, r.text
    client_id = str(r.json()["client_id"])
    verifier = secrets.token_urlsafe(48)
    url = f"{w.url}/oauth/authorize?" + urlencode({
        "response_type": "code", "client_id": client_id, "redirect_uri": REDIRECT_URI,
        "state": "s", "resource": f"{w.url}/mcp/up", "code_challenge_method": "S256",
        "code_challenge": s256(verifier)})
    back = query(await Browser(w.url, http).consent(url))
    issued = await http.post(f"{w.url}/oauth/token", data={
        "grant_type": "authorization_code", "client_id": client_id, "code": back["code"],
        "redirect_uri": REDIRECT_URI, "code_verifier": verifier})
    assert issued.status_code == 200, issued.text
    return client_id, issued.json()["access_token"], issued.json()["refresh_token"]


async def connect_gh(w: World, http: httpx.AsyncClient) -> None:
    start = await http.get(f"{w.url}/connect/gh", params={"start": "1"})
    assert start.status_code == 303, start.text
    back = (await http.get(start.headers["location"])).headers["location"]
    done = await http.get(back)
    assert done.status_code == 200 and "connected" in done.text, done.text


async def everything(w: World, http: httpx.AsyncClient) -> Held:
    cookie = await sign_in(w, http)
    client_id, access, refresh = await oauth_grant(w, http)
    await connect_gh(w, http)
    made = await http.post(f"{w.url}/api/v1/me/keys", headers={"Origin": w.url},
                           json={"name": "laptop", "endpoints": ["up"]})
    assert made.status_code == 201, made.text
    opened = await http.post(f"{w.url}/mcp/up", json=INITIALIZE,
                             headers={**MCP_HEADERS, "Authorization": f"Bearer {access}"})
    assert opened.status_code == 200, opened.text
    external = token(aud=f"{w.url}/mcp/up", sub="idp-7", preferred_username=ADA)
    return Held(cookie, client_id, access, refresh, made.json()["key"],
                opened.headers["mcp-session-id"], external)


# -- what each credential answers -------------------------------------------------------------


def echo(text: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": text}}}


async def mcp(w: World, credential: str, text: str, session: str | None = None,
              endpoint: str = "up") -> httpx.Response:
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {credential}",
               "MCP-Protocol-Version": "2025-11-25"}
    if session is not None:
        headers["Mcp-Session-Id"] = session
    async with httpx.AsyncClient(timeout=10) as http:  # no cookie of anyone's
        return await http.post(f"{w.url}/mcp/{endpoint}", json=echo(text), headers=headers)


def answered(r: httpx.Response, text: str) -> bool:
    return r.status_code == 200 and r.json()["result"]["content"][0]["text"] == text


def refused(r: httpx.Response) -> bool:
    return r.status_code == 401 and 'error="invalid_token"' in r.headers["www-authenticate"]


async def as_browser(w: World, cookie: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10, cookies={"tollhouse_session": cookie}) as http:
        return await http.get(f"{w.url}/api/v1/me")


async def refresh(w: World, held: Held) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.post(f"{w.url}/oauth/token", data={
            "grant_type": "refresh_token", "client_id": held.client_id,
            "refresh_token": held.refresh_token})


async def active(w: World, uid: str, value: bool) -> None:
    r = await w.site.client.patch(f"/scim/v2/Users/{uid}", headers=SCIM, json={
        "schemas": [PATCH], "Operations": [{"op": "replace", "path": "active",
                                            "value": value}]})
    assert r.status_code in (200, 204), r.text


def vault_rows(w: World, principal: str) -> dict[str, str]:
    return Vault(w.site.services.database, VAULT_KEY).statuses(principal)


async def audited(w: World, method: str) -> list[tuple[str, str]]:
    """(status, note) of every audit record of `method`, as the database holds them."""
    sink = w.site.services.gateway.audit if w.site.services.gateway else None
    assert sink is not None
    await sink.settled()
    with w.site.services.database.transaction() as conn:
        rows = conn.execute(w.site.services.database.sql(
            "SELECT status, note FROM audit WHERE method = ? ORDER BY ts"), (method,)).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


# -- the tests --------------------------------------------------------------------------------


async def test_deactivating_takes_every_credential_and_reactivating_gives_back_the_account(
        world: World) -> None:
    w = world
    uid = await provision(w)
    async with httpx.AsyncClient(timeout=10, follow_redirects=False) as http:
        held = await everything(w, http)
    person = Accounts(w.site.services.database).get(uid)
    assert person is not None and person.subject == "ada-sub"  # linked at sign-in
    principal = f"{w.idp.base}|ada-sub"
    # before: every credential works
    assert (await as_browser(w, held.cookie)).status_code == 200
    assert answered(await mcp(w, held.access_token, "oauth"), "oauth")
    assert answered(await mcp(w, held.api_key, "key"), "key")
    assert answered(await mcp(w, held.external, "external"), "external")
    assert answered(await mcp(w, held.access_token, "in session", held.session_id),
                    "in session")
    assert vault_rows(w, principal) == {"gh": "connected"}
    gh_tokens = set(w.idp.issued)

    await active(w, uid, False)
    # the SCIM call has answered: every credential is refused now, none after a wait
    assert (await as_browser(w, held.cookie)).status_code == 401
    assert refused(await mcp(w, held.access_token, "oauth after"))
    assert refused(await mcp(w, held.api_key, "key after"))
    assert refused(await mcp(w, held.external, "external after"))
    refreshed = await refresh(w, held)
    assert refreshed.status_code == 400 and refreshed.json()["error"] == "invalid_grant"
    assert vault_rows(w, principal) == {}  # deleted from the vault...
    assert len(w.idp.revoked) == 2 and set(w.idp.revoked) <= gh_tokens  # ...revoked first
    assert not [c for c in w.probe.tool_calls("echo") if "after" in c.arguments["text"]]
    # a token of the configured issuer naming them by another claim, minted now, too
    assert refused(await mcp(w, token(aud=f"{w.url}/mcp/up", sub="x", email=ADA.upper()),
                             "email after"))
    (deactivated,) = await audited(w, "people/deactivate")
    assert deactivated == ("ok", (f"{ADA} ({principal}, id {uid}): browser sessions 1, OAuth "
                                  "grants 1, API keys 1, MCP sessions 1, pending approvals 0, "
                                  "upstream accounts 1"))
    (revoked,) = await audited(w, "keys/revoke")
    assert held.api_key.split("_")[1] in revoked[1]

    await active(w, uid, True)
    # the account is back: a token of the configured issuer that names them works again...
    assert answered(await mcp(w, held.external, "external back"), "external back")
    # ...and nothing taken came back with it
    assert (await as_browser(w, held.cookie)).status_code == 401
    assert refused(await mcp(w, held.access_token, "oauth back"))
    assert refused(await mcp(w, held.api_key, "key back"))
    assert (await refresh(w, held)).status_code == 400
    assert vault_rows(w, principal) == {}
    assert await audited(w, "people/reactivate") == [
        ("ok", f"{ADA} ({principal}, id {uid}): the account is active again")]
    # a new sign-in and grant work; the old MCP session does not come back with them
    async with httpx.AsyncClient(timeout=10, follow_redirects=False) as http:
        await sign_in(w, http)
        _, access, _ = await oauth_grant(w, http)
    assert answered(await mcp(w, access, "new grant"), "new grant")
    gone = await mcp(w, access, "old session", held.session_id)
    assert gone.status_code == 404 and gone.json() == {"error": "session not found"}


async def test_deleting_through_scim_or_the_api_takes_every_credential(world: World) -> None:
    w = world
    admin_key = _admin_key(w)
    for how in ("scim", "api"):
        sub, name = f"{how}-sub", f"{how}@example.com"
        uid = await provision(w, name)
        w.idp.sign_in_as(sub, name=how, email=name)
        async with httpx.AsyncClient(timeout=10, follow_redirects=False) as http:
            start = await http.get(f"{w.url}/signin/oidc", params={"next": "/signin/done"})
            back = (await http.get(start.headers["location"])).headers["location"]
            assert (await http.get(back)).status_code == 303
            _, access, _ = await oauth_grant(w, http)
            made = await http.post(f"{w.url}/api/v1/me/keys", headers={"Origin": w.url},
                                   json={"name": "k", "endpoints": ["up"]})
            key = made.json()["key"]
        external = token(aud=f"{w.url}/mcp/up", sub=f"ext-{how}", email=name)
        assert all([answered(await mcp(w, c, how), how) for c in (access, key, external)])
        person = Accounts(w.site.services.database).get(uid)
        assert person is not None
        if how == "scim":
            r = await w.site.client.delete(f"/scim/v2/Users/{uid}", headers=SCIM)
        else:
            r = await w.site.client.delete(f"/api/v1/users/{person.name}",
                                           headers={"Authorization": f"Bearer {admin_key}"})
        assert r.status_code == 204, r.text
        assert [refused(await mcp(w, c, f"{how} gone")) for c in (access, key, external)] \
            == [True, True, True]
    notes = [note for _, note in await audited(w, "people/delete")]
    assert len(notes) == 2 and all("OAuth grants 1, API keys 1" in n for n in notes)


def _admin_key(w: World) -> str:
    _, secret = api_keys.create(w.site.services.database, "admin", [], role="admin")
    return secret
