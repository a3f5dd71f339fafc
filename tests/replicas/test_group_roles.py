"""Groups mapped to roles across two replicas (issue 42 item 3): two `tollhouse serve` processes
on one Redis and one database (SQLite, or PostgreSQL with TOLLHOUSE_TEST_DATABASE=postgresql)
behind HAProxy (`tests/replicas/harness.py`). A mapping added through /api/v1/group-roles at
one replica is listed at once by the other, and admits a token whose groups claim names the
group there within the mirror's poll (a second); taken away at the other, it stops admitting
at the first alike. The config's mapping works on both from the start. A SCIM group given to a
provisioned person at one replica reaches, at the other, a token that names that person."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from proxy.auth import keys as api_keys
from tests.e2e.test_oauth_sdk import MCP_HEADERS
from tests.e2e.upstreams import stateless_json_app
from tests.helpers import ISSUER, SECRET, token
from tests.replicas.harness import Cluster, Replica, open_cluster
from tests.servers import serve

SEEN_WITHIN_S = 15.0  # the mirror polls every second; a loaded 2-core machine gets slack
SCIM_TOKEN = "scim-" + "g" * 40
SCIM = {"Authorization": f"Bearer {SCIM_TOKEN}", "Content-Type": "application/scim+json"}


@pytest.fixture
async def cluster(tmp_path: Any) -> AsyncIterator[Cluster]:
    app, _ = stateless_json_app()
    async with serve(app, graceful_timeout=1) as up_url:
        config = {"scim": {"enabled": True, "token": SCIM_TOKEN},
                  "auth": {"mode": "jwt", "lockout": {"max_failures": 10_000},
                           "issuers": [{"issuer": ISSUER, "hs256_secret": SECRET,
                                        "algorithms": ["HS256"]}],
                           "group_roles": [{"group": "sre", "role": "deployers"}]}}
        async with open_cluster(tmp_path, up_url, config=config,
                                access={"allow_groups": ["deployers"]}) as c:
            yield c


async def status(at: Replica, public: str, *groups: str, **claims: Any) -> int:
    """An echo call at `at` with a token whose groups claim holds `groups`: 200 or 403."""
    credential = token(aud=f"{public}/mcp/up", **{"sub": "t-1", "groups": list(groups),
                                                   **claims})
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.post(f"{at.url}/mcp/up", headers={
            **MCP_HEADERS, "Authorization": f"Bearer {credential}",
            "MCP-Protocol-Version": "2025-11-25"}, json={
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "hi"}}})
    assert r.status_code in (200, 403), r.text
    return r.status_code


async def becomes(at: Replica, public: str, group: str, wanted: int) -> float:
    """Poll until a call with `group` answers `wanted` (a deadline, never a sleep alone);
    the seconds it took."""
    start = time.monotonic()
    while (got := await status(at, public, group)) != wanted:
        assert time.monotonic() - start < SEEN_WITHIN_S, f"still {got} at {at.name}"
    return time.monotonic() - start


async def test_a_mapping_made_at_one_replica_applies_at_the_other(cluster: Cluster) -> None:
    r0, r1 = cluster.replicas
    public = cluster.lb_url
    _, admin = api_keys.create(cluster.database_url, "admin", [], role="admin")
    headers = {"Authorization": f"Bearer {admin}"}
    assert [await status(r, public, "sre") for r in (r0, r1)] == [200, 200]  # the config's
    assert [await status(r, public, "qa") for r in (r0, r1)] == [403, 403]
    async with httpx.AsyncClient(timeout=30) as http:
        made = await http.post(f"{r0.url}/api/v1/roles", headers=headers,
                               json={"name": "deployers"})
        assert made.status_code == 201, made.text
        put = await http.put(f"{r0.url}/api/v1/group-roles", headers=headers,
                             json={"group": "qa", "role": "deployers"})
        assert put.status_code == 201, put.text
        assert await status(r0, public, "qa") == 200  # where it was made: at once
        listed = (await http.get(f"{r1.url}/api/v1/group-roles", headers=headers)).json()
        assert {"group": "qa", "role": "deployers", "source": "api"} in listed["items"]
        await becomes(r1, public, "qa", 200)
        gone = await http.delete(f"{r1.url}/api/v1/group-roles", headers=headers,
                                 params={"group": "qa", "role": "deployers"})
        assert gone.status_code == 204, gone.text
        assert await status(r1, public, "qa") == 403
        await becomes(r0, public, "qa", 403)


async def test_a_scim_group_given_at_one_replica_reaches_a_token_at_the_other(
        cluster: Cluster) -> None:
    r0, r1 = cluster.replicas
    public = cluster.lb_url
    async with httpx.AsyncClient(timeout=30) as http:
        made = await http.post(f"{r0.url}/scim/v2/Users", headers=SCIM, json={
            "schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"],
            "userName": "ada@example.com"})
        assert made.status_code == 201, made.text
        assert await status(r1, public, email="ada@example.com") == 403
        group = await http.post(f"{r0.url}/scim/v2/Groups", headers=SCIM, json={
            "schemas": ["urn:ietf:params:scim:schemas:core:2.0:Group"],
            "displayName": "sre", "members": [{"value": made.json()["id"]}]})
        assert group.status_code == 201, group.text
    start = time.monotonic()
    while await status(r1, public, email="ada@example.com") != 200:  # sre -> deployers
        assert time.monotonic() - start < SEEN_WITHIN_S, "the SCIM group never reached r1"
    assert await status(r1, public, email="eve@example.com") == 403
