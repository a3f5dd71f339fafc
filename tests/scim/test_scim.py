"""SCIM 2.0 at /scim/v2 against a real gateway: Users and Groups created, read, listed with
filters, sorted and paged, replaced, patched and deleted; the enterprise extension's
attributes in the person's attributes, SCIM groups in their groups; the token compared and
never echoed; every malformed request answered as a SCIM error, never a 500."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from proxy.people.accounts import Accounts
from tests.stack import Site, gateway_stack

TOKEN = "scim-" + "t" * 40
USER = "urn:ietf:params:scim:schemas:core:2.0:User"
GROUP = "urn:ietf:params:scim:schemas:core:2.0:Group"
ENTERPRISE = "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"
PATCH = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
ERROR = "urn:ietf:params:scim:api:messages:2.0:Error"
H = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/scim+json"}


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    async with gateway_stack(lambda urls: {"scim": {"enabled": True, "token": TOKEN},
                                           "server": {"public_url": urls.gateway}},
                             secret_key="k" * 32) as running:
        yield running


async def _user(client: httpx.AsyncClient, name: str, **more: Any) -> dict[str, Any]:
    body = {"schemas": [USER], "userName": name, **more}
    r = await client.post("/scim/v2/Users", headers=H, json=body)
    assert r.status_code == 201, r.text
    return dict(r.json())


async def test_users_crud_with_the_enterprise_extension(site: Site) -> None:
    c = site.client
    made = await _user(c, "bjensen@example.com", externalId="e-1",
                       emails=[{"value": "Barbara@Example.com", "primary": True}],
                       schemas=[USER, ENTERPRISE],
                       **{ENTERPRISE: {"department": "R&D", "costCenter": "42"}})
    uid = made["id"]
    assert made["meta"]["version"] == 'W/"1"'
    assert made["meta"]["location"] == f"{site.url}/scim/v2/Users/{uid}"
    got = (await c.get(f"/scim/v2/Users/{uid}", headers=H)).json()
    assert got[ENTERPRISE] == {"department": "R&D", "costCenter": "42"}
    accounts = Accounts(site.services.database)
    person = accounts.get(uid)
    assert person is not None and person.active
    assert dict(person.attributes) == {"costCenter": "42", "department": "R&D"}

    replaced = await c.put(f"/scim/v2/Users/{uid}", headers=H, json={
        "schemas": [USER, ENTERPRISE], "userName": "bjensen@example.com",
        ENTERPRISE: {"department": "Ops"}})
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["meta"]["version"] == 'W/"2"'
    person = accounts.get(uid)
    assert person is not None and dict(person.attributes) == {"department": "Ops"}

    patched = await c.patch(f"/scim/v2/Users/{uid}", headers=H, json={
        "schemas": [PATCH], "Operations": [{"op": "replace", "path": "displayName",
                                            "value": "Babs"}]})
    assert patched.status_code == 204, patched.text  # RFC 7644 3.5.2: no body asked for
    got = (await c.get(f"/scim/v2/Users/{uid}", headers=H)).json()
    assert got["displayName"] == "Babs" and got["meta"]["version"] == 'W/"3"'
    stale = await c.put(f"/scim/v2/Users/{uid}", headers={**H, "If-Match": 'W/"1"'},
                        json={"schemas": [USER], "userName": "bjensen@example.com"})
    assert stale.status_code == 412 and stale.json()["schemas"] == [ERROR]

    assert (await c.delete(f"/scim/v2/Users/{uid}", headers=H)).status_code == 204
    gone = await c.get(f"/scim/v2/Users/{uid}", headers=H)
    assert gone.status_code == 404 and gone.json()["schemas"] == [ERROR]
    assert accounts.get(uid) is None


async def test_filters_sorting_and_paging(site: Site) -> None:
    c = site.client
    for name in ("carol", "alice", "bob", "alfred"):
        await _user(c, name, emails=[{"value": f"{name}@example.org"}],
                    **({"title": "boss"} if name == "bob" else {}))

    async def names(query: str) -> list[str]:
        r = await c.get(f"/scim/v2/Users?{query}", headers=H)
        assert r.status_code == 200, r.text
        return [u["userName"] for u in r.json().get("Resources", [])]

    assert await names('filter=userName eq "ALICE"') == ["alice"]  # caseExact false
    assert sorted(await names('filter=userName sw "al"')) == ["alfred", "alice"]
    assert await names('filter=emails.value co "carol@"') == ["carol"]
    assert await names("filter=title pr") == ["bob"]
    assert sorted(await names('filter=userName eq "bob" or userName eq "carol"')) == \
        ["bob", "carol"]
    assert await names('filter=userName sw "al" and emails co "fred"') == ["alfred"]
    assert await names("sortBy=userName") == ["alfred", "alice", "bob", "carol"]
    assert await names("sortBy=userName&sortOrder=descending&startIndex=2&count=2") == \
        ["bob", "alice"]
    page = (await c.get("/scim/v2/Users?sortBy=userName&count=1&startIndex=4",
                        headers=H)).json()
    assert page["totalResults"] == 4 and page["itemsPerPage"] == 1 and page["startIndex"] == 4


async def test_groups_give_their_members_groups(site: Site) -> None:
    c = site.client
    ann = await _user(c, "ann")
    ben = await _user(c, "ben")
    r = await c.post("/scim/v2/Groups", headers=H, json={
        "schemas": [GROUP], "displayName": "sre", "members": [{"value": ann["id"]}]})
    assert r.status_code == 201, r.text
    gid = r.json()["id"]
    accounts = Accounts(site.services.database)
    person = accounts.get(ann["id"])
    assert person is not None and "sre" in person.groups
    added = await c.patch(f"/scim/v2/Groups/{gid}", headers=H, json={
        "schemas": [PATCH], "Operations": [{"op": "add", "path": "members",
                                            "value": [{"value": ben["id"]}]}]})
    assert added.status_code == 204, added.text
    group = (await c.get(f"/scim/v2/Groups/{gid}", headers=H)).json()
    assert {m["value"] for m in group["members"]} == {ann["id"], ben["id"]}
    user = (await c.get(f"/scim/v2/Users/{ben['id']}", headers=H)).json()
    assert [g["display"] for g in user["groups"]] == ["sre"]
    removed = await c.patch(f"/scim/v2/Groups/{gid}", headers=H, json={
        "schemas": [PATCH], "Operations": [
            {"op": "remove", "path": f'members[value eq "{ann["id"]}"]'}]})
    assert removed.status_code == 204, removed.text
    person = accounts.get(ann["id"])
    assert person is not None and "sre" not in person.groups
    unknown = await c.post("/scim/v2/Groups", headers=H, json={
        "schemas": [GROUP], "displayName": "ops", "members": [{"value": "nobody"}]})
    assert unknown.status_code == 400 and unknown.json()["scimType"] == "invalidValue"
    taken = await c.post("/scim/v2/Groups", headers=H, json={"schemas": [GROUP],
                                                             "displayName": "sre"})
    assert taken.status_code == 409 and taken.json()["scimType"] == "uniqueness"


@pytest.mark.parametrize(("method", "path", "body", "status", "scim_type"), [
    ("GET", '/Users?filter=userName eq', None, 400, "invalidFilter"),
    ("GET", '/Users?filter=(((', None, 400, "invalidFilter"),
    ("GET", '/Users?filter=nosuch eq "x"', None, 400, "invalidFilter"),
    ("POST", "/Users", b"{not json", 400, "invalidSyntax"),
    ("POST", "/Users", b'{"schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"]}', 400,
     "invalidValue"),
    ("POST", "/Users", b'[1, 2]', 400, None),
    ("PATCH", "/Users/nobody", (b'{"schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],'
                                b' "Operations": [{"op": "replace", "path": "active",'
                                b' "value": false}]}'), 404, None),
    ("PATCH", "/Groups/x", b'{"Operations": "no"}', 400, None),
    ("GET", "/Nothing", None, 404, None),
    ("GET", "/Users?count=-1&startIndex=abc", None, 400, None),
    ("POST", "/Bulk", b"{}", 501, None),
])
async def test_bad_requests_answer_scim_errors(site: Site, method: str, path: str,
                                               body: bytes | None, status: int,
                                               scim_type: str | None) -> None:
    r = await site.client.request(method, "/scim/v2" + path, headers=H, content=body)
    assert r.status_code == status, r.text
    assert r.json()["schemas"] == [ERROR]
    if scim_type is not None:
        assert r.json()["scimType"] == scim_type


async def test_the_token_is_required_and_never_echoed(site: Site) -> None:
    c = site.client
    spc = await c.get("/scim/v2/ServiceProviderConfig")  # public (RFC 7643 section 5)
    assert spc.status_code == 200 and spc.json()["filter"]["supported"] is True
    for auth in (None, "Bearer " + TOKEN[:-1], "Bearer " + TOKEN + "x", "Basic " + TOKEN):
        headers = {"Authorization": auth} if auth else {}
        r = await c.get("/scim/v2/Users", headers=headers)
        assert r.status_code == 401 and r.json()["schemas"] == [ERROR]
        assert TOKEN not in r.text
    big = await c.post("/scim/v2/Users", headers=H, content=b"x" * (4 << 20 + 1))
    assert big.status_code == 413 and big.json()["schemas"] == [ERROR]
    for path in ("/scim/v2/ResourceTypes", "/scim/v2/Schemas"):
        assert (await c.get(path, headers=H)).status_code == 200


async def test_scim_is_off_unless_enabled() -> None:
    async with gateway_stack({}) as off:
        assert (await off.client.get("/scim/v2/Users", headers=H)).status_code == 404
