"""Per-user connections, below the web pages: what discovery may reach, how malformed discovery
documents are answered, and forgetting a person's cached upstream tokens.

The upstream's side is an httpx MockTransport behind the real egress guard (GuardedClient's
admission runs, on a fake resolver's addresses), so every request the gateway would send is
recorded, and one it refuses is never made."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from proxy.config import from_dict
from proxy.connect.guarded import EgressRefused, GuardedClient
from proxy.connect.manager import ConnectFailed, Connections, UpstreamNotConnected
from proxy.connect.vault import Vault
from proxy.state.flows import MemoryFlowStore
from tests import db_backends

VAULT_KEYS = {"k1": b"\x01" * 32}
PUBLIC = "93.184.216.34"
HOSTS = {"mcp.example": PUBLIC, "as.example": "93.184.216.35", "imds.example": "169.254.169.254",
         "intranet.example": "10.0.0.5", "lan-mcp.example": "10.0.0.7",
         "lan-as.example": "10.0.0.8"}


class Resolver:
    async def resolve(self, host: str, port: int) -> list[str]:
        if host not in HOSTS:
            raise OSError("no such host")
        return [HOSTS[host]]


def as_metadata(issuer: Any = "https://as.example", **override: Any) -> dict[str, Any]:
    return {"issuer": issuer, "authorization_endpoint": f"{issuer}/authorize",
            "token_endpoint": f"{issuer}/token", "registration_endpoint": f"{issuer}/register",
            "revocation_endpoint": f"{issuer}/revoke",
            "code_challenge_methods_supported": ["S256"], **override}


class Upstream:
    """Documents by URL; every request that reached it, in order."""

    def __init__(self, documents: dict[str, Any]) -> None:
        self.documents = documents
        self.seen: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        self.seen.append(url)
        if url not in self.documents:
            return httpx.Response(404, json={"error": "not found"})
        return httpx.Response(200, json=self.documents[url])

    @property
    def hosts(self) -> set[str]:
        return {urlsplit(u).hostname or "" for u in self.seen}


@asynccontextmanager
async def connections(upstream: Upstream, url: str = "https://mcp.example/mcp",
                      oauth: dict[str, Any] | None = None) -> AsyncIterator[Connections]:
    cfg = from_dict({"server": {"public_url": "https://gw.example"}, "auth": {"mode": "jwt"},
                     "database": {"url": db_backends.url()},
                     "upstreams": [{"name": "gh", "url": url, "auth": "per_user",
                                    "oauth": oauth or {"discover": True}}]}, env={})
    guarded = GuardedClient(Resolver(), transport=httpx.MockTransport(upstream))
    c = Connections(cfg, Vault(db_backends.open_database(), VAULT_KEYS), guarded,
                    flows=MemoryFlowStore())
    try:
        yield c
    finally:
        await c.aclose()


def prm(authorization_server: Any, resource: str = "https://mcp.example/mcp"
        ) -> dict[str, Any]:
    return {resource.rsplit("/mcp", 1)[0] + "/.well-known/oauth-protected-resource/mcp":
            {"resource": resource, "authorization_servers": [authorization_server]}}


# -- item: discovered URLs never reach metadata addresses, loopback or the LAN ---------------


@pytest.mark.parametrize("server", [
    "http://169.254.169.254", "http://[::ffff:169.254.169.254]", "http://[fd00:ec2::254]",
    "https://imds.example", "http://127.0.0.1:1", "http://localhost:8080",
    "http://10.0.0.5", "https://intranet.example", "http://[::1]:9"],
    ids=["imds", "imds mapped", "imds v6", "name for imds", "loopback", "localhost", "lan",
         "name for lan", "loopback v6"])
async def test_a_remote_upstreams_discovery_cannot_send_the_gateway_inside(server: str) -> None:
    upstream = Upstream({**prm(server)})
    async with connections(upstream) as c:
        with pytest.raises(ConnectFailed) as info:
            await c.begin("gh", "p|alice", "browser")
    assert upstream.hosts == {"mcp.example"}  # only the protected-resource metadata
    message = str(info.value)
    assert "HTTP" not in message and "egress" not in message and "reach" not in message
    assert message == "the authorization server's metadata could not be fetched"


@pytest.mark.parametrize("field", ["registration_endpoint", "token_endpoint"])
@pytest.mark.parametrize("target", ["http://169.254.169.254/latest/meta-data",
                                    "http://127.0.0.1:8080/x", "https://intranet.example/x"])
async def test_endpoints_named_by_the_metadata_are_guarded_too(field: str, target: str) -> None:
    docs = {**prm("https://as.example"),
            "https://as.example/.well-known/oauth-authorization-server":
                as_metadata(**{field: target}),
            "https://as.example/register": {"client_id": "cid", "client_secret": "sec"}}
    upstream = Upstream(docs)
    async with connections(upstream) as c:
        if field == "registration_endpoint":
            with pytest.raises(ConnectFailed, match="could not be fetched"):
                await c.begin("gh", "p|alice", "browser")
        else:
            location = await c.begin("gh", "p|alice", "browser")
            state = dict(p.split("=", 1) for p in urlsplit(location).query.split("&"))["state"]
            with pytest.raises(EgressRefused):
                await c.finish("gh", state, "code", "p|alice", "browser")
    assert upstream.hosts <= {"mcp.example", "as.example"}


async def test_an_upstream_on_the_lan_may_have_its_authorization_server_there() -> None:
    docs = {**prm("http://lan-as.example", "http://lan-mcp.example/mcp"),
            "http://lan-as.example/.well-known/oauth-authorization-server":
                as_metadata("http://lan-as.example"),
            "http://lan-as.example/register": {"client_id": "cid"}}
    upstream = Upstream(docs)
    async with connections(upstream, "http://lan-mcp.example/mcp") as c:
        location = await c.begin("gh", "p|alice", "browser")
    assert location.startswith("http://lan-as.example/authorize?")
    # ... but never on a metadata address, even there
    docs = {**prm("http://169.254.169.254", "http://lan-mcp.example/mcp")}
    upstream = Upstream(docs)
    async with connections(upstream, "http://lan-mcp.example/mcp") as c:
        with pytest.raises(ConnectFailed):
            await c.begin("gh", "p|alice", "browser")
    assert upstream.hosts == {"lan-mcp.example"}


async def test_an_operator_written_endpoint_may_name_a_metadata_address_literally() -> None:
    """The literal exception is for URLs the operator wrote, as for an upstream's URL."""
    upstream = Upstream({"http://169.254.169.254/token": {"access_token": "A",
                                                          "expires_in": 3600}})
    oauth = {"client_id": "c", "authorization_endpoint": "https://as.example/authorize",
             "token_endpoint": "http://169.254.169.254/token"}
    async with connections(upstream, oauth=oauth) as c:
        location = await c.begin("gh", "p|alice", "browser")
        state = dict(p.split("=", 1) for p in urlsplit(location).query.split("&"))["state"]
        await c.finish("gh", state, "code", "p|alice", "browser")
        assert await c.access_token("gh", "p|alice") == "A"
    assert upstream.seen == ["http://169.254.169.254/token"]


# -- item: malformed discovery documents are the documented failure, not a 500 ---------------


AS_WELL_KNOWN = "https://as.example/.well-known/oauth-authorization-server"


@pytest.mark.parametrize(("documents", "message"), [
    ({AS_WELL_KNOWN: as_metadata(issuer=5)}, "another issuer"),
    ({AS_WELL_KNOWN: as_metadata(issuer=None)}, "another issuer"),
    ({AS_WELL_KNOWN: as_metadata(issuer=["https://as.example"])}, "another issuer"),
    ({AS_WELL_KNOWN: ["not", "an", "object"]}, "not a JSON object"),
    ({AS_WELL_KNOWN: as_metadata(code_challenge_methods_supported="S256")}, "PKCE S256"),
    ({AS_WELL_KNOWN: as_metadata(code_challenge_methods_supported=None)}, "PKCE S256"),
    ({AS_WELL_KNOWN: {k: v for k, v in as_metadata().items()
                      if k != "authorization_endpoint"}}, "usable"),
    ({AS_WELL_KNOWN: as_metadata(token_endpoint=7)}, "usable"),
    ({AS_WELL_KNOWN: as_metadata(authorization_endpoint="javascript:alert(1)")}, "usable"),
    ({AS_WELL_KNOWN: as_metadata(revocation_endpoint=["x"])}, "usable"),
    ({AS_WELL_KNOWN: as_metadata(registration_endpoint=3)}, "registration"),
    ({AS_WELL_KNOWN: as_metadata(), "https://as.example/register": ["cid"]},
     "not a JSON object"),
    ({AS_WELL_KNOWN: as_metadata(), "https://as.example/register": {"client_id": 5}},
     "no client_id"),
    ({AS_WELL_KNOWN: as_metadata(),
      "https://as.example/register": {"client_id": "c", "client_secret": {"x": 1}}},
     "client_secret"),
], ids=["issuer int", "issuer null", "issuer list", "metadata list", "pkce string",
        "pkce null", "no authorization endpoint", "token endpoint int", "javascript endpoint",
        "revocation list", "registration int", "registration answer list", "client_id int",
        "client_secret object"])
async def test_malformed_discovery_documents_fail_cleanly(documents: dict[str, Any],
                                                          message: str) -> None:
    async with connections(Upstream({**prm("https://as.example"), **documents})) as c:
        with pytest.raises(ConnectFailed, match=message):
            await c.begin("gh", "p|alice", "browser")


@pytest.mark.parametrize("body", [["https://as.example"], {"authorization_servers": "x"},
                                  {"authorization_servers": [5]},
                                  {"authorization_servers": ["ftp://as.example"]}])
async def test_a_malformed_protected_resource_document_fails_cleanly(body: Any) -> None:
    url = "https://mcp.example/.well-known/oauth-protected-resource/mcp"
    async with connections(Upstream({url: body})) as c:
        with pytest.raises(ConnectFailed):
            await c.begin("gh", "p|alice", "browser")


async def test_scopes_supported_of_the_wrong_type_are_ignored() -> None:
    docs = {"https://mcp.example/.well-known/oauth-protected-resource/mcp":
            {"authorization_servers": ["https://as.example"], "scopes_supported": 5},
            AS_WELL_KNOWN: as_metadata(), "https://as.example/register": {"client_id": "c"}}
    async with connections(Upstream(docs)) as c:
        location = await c.begin("gh", "p|alice", "browser")
    assert "scope=" not in location


# -- item: a deleted person's cached upstream tokens -----------------------------------------


async def test_forget_drops_every_cached_token_of_the_person() -> None:
    oauth = {"client_id": "c", "authorization_endpoint": "https://as.example/authorize",
             "token_endpoint": "https://as.example/token"}
    cfg_upstreams = [{"name": n, "url": "https://mcp.example/mcp", "auth": "per_user",
                      "oauth": oauth} for n in ("gh", "jira")]
    cfg = from_dict({"server": {"public_url": "https://gw.example"}, "auth": {"mode": "jwt"},
                     "database": {"url": db_backends.url()}, "upstreams": cfg_upstreams},
                    env={})
    database = db_backends.open_database()
    vault = Vault(database, VAULT_KEYS)
    c = Connections(cfg, vault, GuardedClient(Resolver(), transport=httpx.MockTransport(
        Upstream({}))), flows=MemoryFlowStore())
    try:
        bob, carol = "tollhouse:local|local:bob", "tollhouse:local|local:carol"
        for name in ("gh", "jira"):
            vault.put(name, bob, {"access_token": f"OLD-BOB-{name}", "refresh_token": "r",
                                  "expires_at": None})
        vault.put("gh", carol, {"access_token": "CAROL", "refresh_token": "r",
                                "expires_at": None})
        assert await c.access_token("gh", bob) == "OLD-BOB-gh"
        assert await c.access_token("jira", bob) == "OLD-BOB-jira"
        assert await c.access_token("gh", carol) == "CAROL"
        # bob is deleted: his rows go (proxy.people.accounts), and the gateway forgets its copies
        with database.transaction() as conn:
            conn.execute(database.sql("DELETE FROM upstream_tokens WHERE principal = ?"), (bob,))
        c.forget(bob)
        for name in ("gh", "jira"):  # a new bob of the same name is not connected
            with pytest.raises(UpstreamNotConnected):
                await c.access_token(name, bob)
        assert await c.access_token("gh", carol) == "CAROL"  # nobody else is touched
        # one upstream only
        vault.put("gh", carol, {"access_token": "CAROL-2", "refresh_token": "r",
                                "expires_at": None})
        c.forget(carol, "jira")
        assert await c.access_token("gh", carol) == "CAROL"
        c.forget(carol, "gh")
        assert await c.access_token("gh", carol) == "CAROL-2"
    finally:
        await c.aclose()



class SlowVault(Vault):
    """A vault whose reads can be held after they read the row."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.hold = False
        self.reading = threading.Event()
        self.go = threading.Event()

    def get(self, upstream: str, principal: str) -> Any:
        row = super().get(upstream, principal)
        if self.hold:
            self.reading.set()
            self.go.wait(10)
        return row


def per_user_cfg(**oauth: Any) -> Any:
    return from_dict({"server": {"public_url": "https://gw.example"}, "auth": {"mode": "jwt"},
                      "database": {"url": db_backends.url()},
                      "upstreams": [{"name": "gh", "url": "https://mcp.example/mcp",
                                     "auth": "per_user", "oauth": {
                                         "client_id": "c",
                                         "authorization_endpoint": "https://as.example/a",
                                         "token_endpoint": "https://as.example/token",
                                         **oauth}}]}, env={})


async def test_a_token_read_before_forget_is_not_cached_after_it() -> None:
    database = db_backends.open_database()
    vault = SlowVault(database, VAULT_KEYS)
    c = Connections(per_user_cfg(), vault, GuardedClient(
        Resolver(), transport=httpx.MockTransport(Upstream({}))), flows=MemoryFlowStore())
    bob = "tollhouse:local|local:bob"
    try:
        vault.put("gh", bob, {"access_token": "OLD-BOB", "refresh_token": "r",
                              "expires_at": None})
        vault.hold = True
        call = asyncio.create_task(c.access_token("gh", bob))
        assert await asyncio.to_thread(vault.reading.wait, 10)
        vault.delete("gh", bob)  # bob is deleted while his call was reading the row
        c.forget(bob)
        vault.hold = False
        vault.go.set()
        assert await call == "OLD-BOB"  # that call had read it already
        with pytest.raises(UpstreamNotConnected):
            await c.access_token("gh", bob)
    finally:
        vault.go.set()
        await c.aclose()


async def test_a_refresh_does_not_bring_back_a_deleted_row() -> None:
    database = db_backends.open_database()
    vault = Vault(database, VAULT_KEYS)
    bob = "tollhouse:local|local:bob"

    def token_endpoint(request: httpx.Request) -> httpx.Response:
        vault.delete("gh", bob)  # bob is deleted while the refresh is at the upstream
        return httpx.Response(200, json={"access_token": "NEW", "refresh_token": "r2",
                                         "expires_in": 3600})

    c = Connections(per_user_cfg(), vault, GuardedClient(
        Resolver(), transport=httpx.MockTransport(token_endpoint)), flows=MemoryFlowStore())
    try:
        vault.put("gh", bob, {"access_token": "OLD", "refresh_token": "r",
                              "expires_at": time.time() + 1})
        with pytest.raises(UpstreamNotConnected):
            await c.access_token("gh", bob)
        assert vault.get("gh", bob) is None
        with pytest.raises(UpstreamNotConnected):
            await c.access_token("gh", bob)
    finally:
        await c.aclose()
