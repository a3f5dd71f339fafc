"""Groups mapped to roles (issue 42 item 3), in one gateway on the test's database: a group
named by `[[auth.group_roles]]` or through /api/v1/group-roles, whether it comes from a token's
groups claim or from SCIM, gives its members a custom role that an access rule (`allow_groups`)
and a Cedar policy (`principal.groups.contains`) see, and `admin` makes a person an
administrator of the management API and the console."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.auth import keys as api_keys
from proxy.people.accounts import Accounts
from tests.e2e.oidc_provider import OidcProvider, running_provider
from tests.e2e.upstreams import stateless_json_app
from tests.helpers import jwt_auth, token
from tests.scim.test_deprovisioning import SCIM, World, mcp, oauth_grant, provision, sign_in
from tests.servers import serve
from tests.stack import gateway_stack

GROUP = "urn:ietf:params:scim:schemas:core:2.0:Group"
# members of `deployers` may do anything; nobody else anything (every endpoint)
CEDAR = 'permit(principal, action, resource) when { principal.groups.contains("deployers") };\n'


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    (tmp_path / "roles.cedar").write_text(CEDAR)
    idp = OidcProvider()
    app, probe = stateless_json_app()
    async with running_provider(idp) as idp_url, serve(app, graceful_timeout=1) as up_url:
        def config(urls: Any) -> dict[str, Any]:
            return {
                "server": {"public_url": urls.gateway},
                "scim": {"enabled": True, "token": SCIM["Authorization"][7:]},
                "auth": {**jwt_auth(lockout={"max_failures": 10_000}),
                         "oidc": {"issuer": idp_url, "client_id": idp.client_id,
                                  "client_secret": idp.client_secret},
                         "group_roles": [{"group": "sre", "role": "deployers"},
                                         {"group": "platform-admins", "role": "admin"}]},
                "oauth_server": {"enabled": True},
                "policy": {"files": [str(tmp_path / "*.cedar")]},
                "upstreams": [
                    # an access rule: only `deployers`
                    {"name": "up", "url": f"{up_url}/mcp",
                     "access": {"allow_groups": ["deployers"]}},
                    # no access rule: the Cedar policy alone decides
                    {"name": "ce", "url": f"{up_url}/mcp"}]}

        async with gateway_stack(config, secret_key="k" * 32) as site:
            yield World(site, idp, probe)


def admin_headers(w: World) -> dict[str, str]:
    _, secret = api_keys.create(w.site.services.database, "admin", [], role="admin")
    return {"Authorization": f"Bearer {secret}"}


async def allowed(w: World, credential: str, endpoint: str) -> bool:
    """Whether the call is served; False when refused (403 by the access rule; the Cedar
    policy's refusal: the tool hidden), anything else fails the test."""
    r = await mcp(w, credential, f"to {endpoint}", endpoint=endpoint)
    if r.status_code == 403:
        return False
    if r.status_code == 400:  # no permit could apply: the tool is hidden, as one unknown
        assert r.json()["error"] == {"code": -32602, "message": "Unknown tool: echo"}, r.text
        return False
    assert r.status_code == 200, r.text
    result = r.json().get("result")
    if result is not None and not result.get("isError"):
        assert result["content"][0]["text"] == f"to {endpoint}"
        return True
    refusal = (result or {}).get("structuredContent") or r.json().get("error")
    assert refusal and ("policy" in str(refusal) or "Unknown tool" in str(refusal)), r.text
    return False


async def both(w: World, credential: str) -> tuple[bool, bool]:
    return await allowed(w, credential, "up"), await allowed(w, credential, "ce")


async def test_a_token_group_mapped_in_the_config_or_the_api_is_seen_by_access_and_cedar(
        world: World) -> None:
    w = world
    admin = admin_headers(w)

    def tok(*groups: str) -> str:
        return token(aud=f"{w.url}/mcp/up", sub="t-1", groups=list(groups))

    def tok_ce(*groups: str) -> str:
        return token(aud=f"{w.url}/mcp/ce", sub="t-1", groups=list(groups))

    async def reach(*groups: str) -> tuple[bool, bool]:
        return await allowed(w, tok(*groups), "up"), await allowed(w, tok_ce(*groups), "ce")

    assert await reach("sre") == (True, True)  # the config's mapping
    assert await reach("qa") == (False, False)
    assert await reach("deployers-not") == (False, False)
    # through the API: the role must exist first
    missing = await w.site.client.put("/api/v1/group-roles", headers=admin,
                                      json={"group": "qa", "role": "deployers"})
    assert missing.status_code == 422 and "create it first" in missing.text
    assert (await w.site.client.post("/api/v1/roles", headers=admin,
                                     json={"name": "deployers"})).status_code == 201
    put = await w.site.client.put("/api/v1/group-roles", headers=admin,
                                  json={"group": "qa", "role": "deployers"})
    assert put.status_code == 201, put.text
    again = await w.site.client.put("/api/v1/group-roles", headers=admin,
                                    json={"group": "qa", "role": "deployers"})
    assert again.status_code == 200
    listed = (await w.site.client.get("/api/v1/group-roles", headers=admin)).json()["items"]
    assert listed == [
        {"group": "sre", "role": "deployers", "source": "config"},
        {"group": "platform-admins", "role": "admin", "source": "config"},
        {"group": "qa", "role": "deployers", "source": "api"}]
    assert await reach("qa") == (True, True)  # at once, the token verified before included
    # taken away: refused again; one of the config's cannot be taken through the API
    gone = await w.site.client.delete("/api/v1/group-roles", headers=admin,
                                      params={"group": "qa", "role": "deployers"})
    assert gone.status_code == 204, gone.text
    assert await reach("qa") == (False, False)
    assert (await w.site.client.delete("/api/v1/group-roles", headers=admin, params={
        "group": "qa", "role": "deployers"})).status_code == 404
    assert (await w.site.client.delete("/api/v1/group-roles", headers=admin, params={
        "group": "sre", "role": "deployers"})).status_code == 409
    assert (await w.site.client.delete("/api/v1/group-roles", headers=admin,
                                       params={"group": "sre"})).status_code == 422
    bad = await w.site.client.put("/api/v1/group-roles", headers=admin,
                                  json={"group": "", "role": "a:b"})
    assert bad.status_code == 422 and len(bad.json()["detail"]) == 2, bad.text
    # each change audited
    with w.site.services.database.transaction() as conn:
        rows = conn.execute(w.site.services.database.sql(
            "SELECT method, status FROM audit WHERE method LIKE ? ORDER BY ts"),
            ("%group-roles%",)).fetchall()
    assert [tuple(r) for r in rows][:2] == [("PUT /api/v1/group-roles", "error"),
                                            ("PUT /api/v1/group-roles", "ok")]


async def scim_group(w: World, name: str, *members: str) -> None:
    r = await w.site.client.post("/scim/v2/Groups", headers=SCIM, json={
        "schemas": [GROUP], "displayName": name, "members": [{"value": m} for m in members]})
    assert r.status_code == 201, r.text


async def test_a_scim_group_gives_its_role_to_a_signed_in_person_and_admin_by_group(
        world: World) -> None:
    w = world
    admin = admin_headers(w)
    uid = await provision(w)
    await scim_group(w, "sre", uid)
    person = Accounts(w.site.services.database,
                      w.site.services.accounts.configured_group_roles).get(uid)
    assert person is not None and {"sre", "deployers"} <= person.groups
    assert not person.is_admin
    async with httpx.AsyncClient(timeout=10, follow_redirects=False) as http:
        await sign_in(w, http)  # the ID token has no groups claim: SCIM's are kept
        _, access, _ = await oauth_grant(w, http)
        # a token of this gateway's: the person's SCIM group, mapped, is seen by both
        assert await allowed(w, access, "up")
        assert (await http.get(f"{w.url}/api/v1/users")).status_code == 403  # not an admin
        # an administrator by group, through the API's mapping, at once
        await scim_group(w, "ops", uid)
        put = await w.site.client.put("/api/v1/group-roles", headers=admin,
                                      json={"group": "ops", "role": "admin"})
        assert put.status_code == 201, put.text
        users = await http.get(f"{w.url}/api/v1/users")
        assert users.status_code == 200, users.text
        me = [u for u in users.json()["items"] if u["id"] == uid]
        assert me and me[0]["admin"] is True
        console = await http.get(f"{w.url}/console/servers")
        assert console.status_code == 200, console.text
        # the mapping taken away: not an administrator any more
        assert (await w.site.client.delete("/api/v1/group-roles", headers=admin, params={
            "group": "ops", "role": "admin"})).status_code == 204
        assert (await http.get(f"{w.url}/api/v1/users")).status_code == 403


async def eventually(check: Any, deadline_s: float = 10.0) -> None:
    """Poll `check()` (async, a bool) until it holds; the edge's copy of the SCIM groups is
    looked at every second."""
    start = time.monotonic()
    while not await check():
        assert time.monotonic() - start < deadline_s, "not seen in time"


async def test_a_token_naming_a_provisioned_person_carries_their_scim_groups(
        world: World) -> None:
    w = world

    def naming(endpoint: str, **claims: Any) -> str:  # a token of the configured issuer
        return token(aud=f"{w.url}/mcp/{endpoint}", **{"sub": "idp-7", **claims})

    ada = await provision(w, "ada@example.com")
    await provision(w, "bob@example.com")
    by_email = {"email": "ADA@example.com"}  # the link rule: emails, without regard to case
    assert not await allowed(w, naming("up", **by_email), "up")
    await scim_group(w, "sre", ada)  # mapped to `deployers` by the config

    async def both_allowed() -> bool:
        return await allowed(w, naming("up", **by_email), "up") and \
            await allowed(w, naming("ce", **by_email), "ce")

    await eventually(both_allowed)
    # a token naming nobody provisioned, or two people at once, gets no SCIM group
    assert not await allowed(w, naming("up", email="eve@example.com"), "up")
    assert not await allowed(w, naming("up", email="ada@example.com",
                                       preferred_username="bob@example.com"), "up")
