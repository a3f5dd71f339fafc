"""Issue 14, items 1 and 4, for a per_user upstream with no configured client_id: the gateway's
dynamically registered client (RFC 7591) is one for every gateway process on the database.

Two `Connections` on one database stand for two replicas; they share the run's live state (on
Redis a fresh key prefix, a client each, as two processes have; on memory one set of stores).
In front of them, an authorization server behind an httpx MockTransport and the real egress
guard that registers a new client on every POST, and at its token endpoint accepts a code or a
refresh token only from the client it was issued to, with that client's secret: a replica using
a client of its own would be refused."""

from __future__ import annotations

import asyncio
import base64
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlsplit

import httpx
import orjson
import pytest

from proxy.config import from_dict
from proxy.connect.guarded import GuardedClient
from proxy.connect.manager import ConnectFailed, Connections
from proxy.connect.vault import ClientKey, Vault
from proxy.errors import StoreUnavailable
from proxy.state.leases import LeaseStore, MemoryLeases, RedisLeases
from proxy.state.shared import Shared
from proxy.state.stores import Stores, open_stores
from proxy.storage import db
from proxy.storage.db import Database
from tests import db_backends, state_backends
from tests.helpers import DEADLINE_S, until
from tests.proxy.connect.test_connect_discovery import (
    AS_WELL_KNOWN,
    VAULT_KEYS,
    Resolver,
    Upstream,
    as_metadata,
    prm,
)
from tests.proxy.connect.test_replica_refresh import Watched

ALICE = "tollhouse:local|local:alice"
CALLBACK = "https://gw.example/connect/gh/callback"


class Authority(Upstream):
    """The upstream's protected-resource metadata naming `issuer`, and that authorization
    server: /register makes a new client each time (deletable, RFC 7592, when `manageable`),
    waiting for `go` first; /token honours a code or refresh token only for its client."""

    def __init__(self, issuer: str = "https://as.example", *, manageable: bool = False,
                 register: Any = None) -> None:
        meta_url = AS_WELL_KNOWN + urlsplit(issuer).path
        super().__init__({**prm(issuer), meta_url: as_metadata(issuer)})
        self.issuer = issuer
        self.manageable = manageable
        self.register_answer = register  # (status, body) instead of a new client
        self.clients: dict[str, str] = {}  # client id -> secret
        self.registered: list[str] = []
        self.deleted: list[str] = []
        self.grants: dict[str, tuple[str, str]] = {}  # code or refresh token -> (client, uri)
        self.token_clients: list[str] = []
        self.go = asyncio.Event()
        self.go.set()

    async def __call__(self, request: httpx.Request) -> httpx.Response:  # type: ignore[override]
        url = str(request.url)
        if request.method == "POST" and url == f"{self.issuer}/register":
            self.seen.append(url)
            return await self._register(orjson.loads(request.content))
        if request.method == "DELETE" and url.startswith(f"{self.issuer}/register/"):
            client = url.rsplit("/", 1)[1]
            if request.headers.get("authorization") == f"Bearer rat-{client}":
                self.deleted.append(client)
                return httpx.Response(204)
            return httpx.Response(401)
        if request.method == "POST" and url == f"{self.issuer}/token":
            return self._token(dict(parse_qsl(request.content.decode())))
        return super().__call__(request)

    async def _register(self, body: dict[str, Any]) -> httpx.Response:
        arrived = len(self.registered)
        self.registered.append("")  # arrived; the client id once made
        await asyncio.wait_for(self.go.wait(), DEADLINE_S)
        if self.register_answer is not None:
            status, answer = self.register_answer
            return httpx.Response(status, json=answer)
        assert body["redirect_uris"] == [CALLBACK]
        client, secret = f"client-{len(self.clients) + 1}", secrets.token_urlsafe(16)
        self.clients[client] = secret
        self.registered[arrived] = client
        answer = {"client_id": client, "client_secret": secret, **body}
        if self.manageable:
            answer |= {"registration_access_token": f"rat-{client}",
                       "registration_client_uri": f"{self.issuer}/register/{client}"}
        return httpx.Response(201, json=answer)

    def authorize(self, location: str) -> str:
        """The person allows at the authorization endpoint: a code for the client named."""
        query = {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}
        assert query["client_id"] in self.clients, "a client this server never registered"
        code = secrets.token_urlsafe(8)
        self.grants[code] = (query["client_id"], query["redirect_uri"])
        return code

    def _token(self, form: dict[str, str]) -> httpx.Response:
        client = form.get("client_id", "")
        self.token_clients.append(client)
        if client not in self.clients or form.get("client_secret") != self.clients[client]:
            return httpx.Response(401, json={"error": "invalid_client"})
        grant = self.grants.pop(form.get("code") or form.get("refresh_token") or "", None)
        if grant is None or grant[0] != client:
            return httpx.Response(400, json={"error": "invalid_grant"})
        refresh = secrets.token_urlsafe(8)
        self.grants[refresh] = (client, grant[1])
        return httpx.Response(200, json={"access_token": f"access-{secrets.token_hex(4)}",
                                         "refresh_token": refresh,
                                         "expires_in": 30})  # inside the refresh margin

    @property
    def registrations(self) -> list[str]:
        return [c for c in self.registered if c]


def config(**oauth: Any) -> Any:
    return from_dict({"server": {"public_url": "https://gw.example"}, "auth": {"mode": "jwt"},
                      "database": {"url": db_backends.url()},
                      "state": state_backends.state(),
                      "upstreams": [{"name": "gh", "url": "https://mcp.example/mcp",
                                     "auth": "per_user",
                                     "oauth": {"discover": True, **oauth}}]}, env={})


class Cluster:
    """Replicas on the test's database and one live state."""

    def __init__(self, authority: Authority) -> None:
        self.authority = authority
        self.cfg = config()
        self.stores: list[Stores] = []
        self.replicas: list[Connections] = []
        self.leases: list[Watched] = []

    def replica(self, authority: Authority | None = None, leases: LeaseStore | None = None,
                database: Database | None = None, **oauth: Any) -> Connections:
        """One more gateway process: its own database connections, HTTP client and (on
        Redis) Redis client; `leases` of its own stand for a lease that was lost."""
        cfg = config(**oauth) if oauth else self.cfg
        if state_backends.on_redis() or not self.stores:
            self.stores.append(open_stores(self.cfg))  # one memory store, or one prefix
        stores = self.stores[-1]
        watched = Watched(stores.leases if leases is None else leases)
        self.leases.append(watched)
        guarded = GuardedClient(Resolver(), transport=httpx.MockTransport(
            authority or self.authority))
        c = Connections(cfg, Vault(database or db_backends.open_database(), VAULT_KEYS),
                        guarded, flows=stores.connect_flows, leases=watched, poll_s=0.01)
        self.replicas.append(c)
        return c

    async def aclose(self) -> None:
        for c in self.replicas:
            await c.aclose()
        for s in self.stores:
            await s.aclose()


@asynccontextmanager
async def cluster(authority: Authority) -> AsyncIterator[Cluster]:
    made = Cluster(authority)
    try:
        yield made
    finally:
        await made.aclose()


def client_of(location: str) -> str:
    return parse_qs(urlsplit(location).query)["client_id"][0]


def state_of(location: str) -> str:
    return parse_qs(urlsplit(location).query)["state"][0]


def stored_rows() -> list[tuple[Any, ...]]:
    return db_backends.rows(db_backends.url(), "SELECT upstream, issuer, registration_endpoint, "
                            "redirect_uri, client_id, kid, sealed FROM upstream_clients")


# -- racing first use ------------------------------------------------------------------------


async def test_two_replicas_on_first_use_register_one_client() -> None:
    authority = Authority()
    authority.go.clear()
    async with cluster(authority) as c:
        a, b = c.replica(), c.replica()
        starts = [asyncio.create_task(r.begin("gh", ALICE, "browser")) for r in (a, b, a, b)]
        # one replica's registration is at the server; the other waits for its row (were
        # the lease not shared, its own registration would have arrived too)
        await until(lambda: authority.registered and sum(w.refused for w in c.leases)
                    or len(authority.registered) > 1, what="both replicas registering")
        authority.go.set()
        locations = await asyncio.gather(*starts)
        assert len(authority.registered) == 1
        assert {client_of(location) for location in locations} == {"client-1"}
        assert [row[4] for row in stored_rows()] == ["client-1"]


@pytest.mark.parametrize("manageable", [False, True], ids=["plain", "rfc7592"])
async def test_two_registrations_that_raced_end_in_one_client(manageable: bool) -> None:
    """The lease was lost (each replica holds its own here): both register, and the row
    stored first wins; the other replica adopts it, withdrawing its own when it can."""
    authority = Authority(manageable=manageable)
    authority.go.clear()
    async with cluster(authority) as c:
        a, b = c.replica(leases=MemoryLeases()), c.replica(leases=MemoryLeases())
        starts = [asyncio.create_task(r.begin("gh", ALICE, "browser")) for r in (a, b)]
        await until(lambda: len(authority.registered) == 2, what="both registering")
        authority.go.set()
        locations = await asyncio.gather(*starts)
        assert sorted(authority.registrations) == ["client-1", "client-2"]
        (winner,) = {client_of(location) for location in locations}
        assert [row[4] for row in stored_rows()] == [winner]
        loser = ({"client-1", "client-2"} - {winner}).pop()
        assert authority.deleted == ([loser] if manageable else [])
        for r in (a, b):  # and it stays so
            assert client_of(await r.begin("gh", ALICE, "browser")) == winner
        assert len(authority.registered) == 2


# -- a flow and a refresh across replicas ------------------------------------------------------


async def test_connect_begun_on_one_replica_finishes_and_refreshes_on_the_other() -> None:
    authority = Authority()
    async with cluster(authority) as c:
        a, b = c.replica(), c.replica()
        location = await a.begin("gh", ALICE, "browser")
        code = authority.authorize(location)
        await b.finish("gh", state_of(location), code, ALICE, "browser")
        first = await b.access_token("gh", ALICE)  # expires within the margin: refreshed
        assert authority.token_clients == ["client-1", "client-1"]
        second = await a.access_token("gh", ALICE)  # A refreshes B's token again
        assert first != second and authority.token_clients == ["client-1"] * 3
        assert authority.registrations == ["client-1"]
        row = b._vault.get("gh", ALICE)
        assert row is not None and row.status == "connected"


async def test_a_restarted_replica_reuses_the_stored_client() -> None:
    authority = Authority()
    async with cluster(authority) as c:
        first = await c.replica().begin("gh", ALICE, "browser")
        await c.replicas[0].aclose()
        c.replicas.clear()
        again = await c.replica().begin("gh", ALICE, "browser")
        assert client_of(first) == client_of(again) == "client-1"
        assert authority.registrations == ["client-1"]


# -- what is stored --------------------------------------------------------------------------


async def test_the_client_secret_is_sealed_at_rest_and_bound_to_its_row() -> None:
    authority = Authority()
    async with cluster(authority) as c:
        await c.replica().begin("gh", ALICE, "browser")
    secret = authority.clients["client-1"]
    ((upstream, issuer, registration, redirect, client_id, kid, sealed),) = stored_rows()
    assert (upstream, issuer, registration, redirect, client_id, kid) == (
        "gh", "https://as.example", "https://as.example/register", CALLBACK, "client-1", "k1")
    assert secret not in sealed and secret.encode() not in base64.b64decode(sealed)
    vault = Vault(db_backends.open_database(), VAULT_KEYS)
    key = ClientKey("gh", issuer, registration, redirect)
    stored = vault.client(key)
    assert stored is not None and stored.client_secret == secret
    assert secret not in repr(stored)
    # the row copied under another upstream's name does not unseal there: it is dropped, so
    # that upstream registers a client of its own
    database = db_backends.open_database()
    with database.transaction() as conn:
        conn.execute(database.sql(
            "INSERT INTO upstream_clients SELECT 'jira', issuer, registration_endpoint, "
            "redirect_uri, client_id, kid, sealed, created_at FROM upstream_clients"))
    assert vault.client(ClientKey("jira", issuer, registration, redirect)) is None
    assert [row[0] for row in stored_rows()] == ["gh"]


async def test_rotated_vault_keys_reseal_the_stored_client() -> None:
    authority = Authority()
    async with cluster(authority) as c:
        await c.replica().begin("gh", ALICE, "browser")
    ((*key, _, _, _),) = stored_rows()
    rotated = Vault(db_backends.open_database(), {"k2": b"\x02" * 32, **VAULT_KEYS})
    stored = rotated.client(ClientKey(*key))
    assert stored is not None and stored.client_secret == authority.clients["client-1"]
    assert [row[5] for row in stored_rows()] == ["k2"]
    only_new = Vault(db_backends.open_database(), {"k2": b"\x02" * 32})
    assert only_new.client(ClientKey(*key)) == stored


async def test_another_authorization_server_gets_a_registration_of_its_own() -> None:
    authority = Authority()
    async with cluster(authority) as c:
        assert client_of(await c.replica().begin("gh", ALICE, "browser")) == "client-1"
        elsewhere = Authority("https://as.example/tenant2")
        moved = c.replica(elsewhere)  # the upstream now names another authorization server
        assert client_of(await moved.begin("gh", ALICE, "browser")) == "client-1"
        assert elsewhere.registrations == ["client-1"]
    assert sorted((row[1], row[4]) for row in stored_rows()) == [
        ("https://as.example", "client-1"), ("https://as.example/tenant2", "client-1")]


async def test_a_configured_client_id_wins_over_the_stored_registration() -> None:
    authority = Authority()
    async with cluster(authority) as c:
        await c.replica().begin("gh", ALICE, "browser")
        fixed = c.replica(client_id="fixed-client", client_secret="fixed-secret")
        location = await fixed.begin("gh", ALICE, "browser")
        assert client_of(location) == "fixed-client"
        assert authority.registrations == ["client-1"]


# -- failures ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("answer", "message"), [
    ((400, {"error": "invalid_client_metadata"}), "registration could not be fetched"),
    ((201, {"client_secret": "s"}), "returned no client_id"),
    ((201, {"client_id": "c\x00d"}), "returned no client_id"),
    ((201, {"client_id": "c", "client_secret": 5}), "malformed client_secret"),
    ((201, ["c"]), "not a JSON object"),
], ids=["refused", "no client_id", "nul in client_id", "secret not a string", "not an object"])
async def test_a_refused_or_malformed_registration_stores_nothing(answer: Any,
                                                                  message: str) -> None:
    authority = Authority(register=answer)
    async with cluster(authority) as c:
        r = c.replica()
        with pytest.raises(ConnectFailed, match=message):
            await r.begin("gh", ALICE, "browser")
        assert stored_rows() == []
        authority.register_answer = None  # the server is fixed: the next attempt registers
        assert client_of(await r.begin("gh", ALICE, "browser")) == "client-1"
        assert [row[4] for row in stored_rows()] == ["client-1"]


@contextmanager
def held(database: Database) -> Iterator[None]:
    with db_backends.tables_held(database.url, "upstream_clients"):
        yield


async def test_a_database_that_is_away_is_unavailable_and_caches_nothing() -> None:
    authority = Authority()
    database = Database(db_backends.url(), busy_timeout_s=0.2)
    try:
        async with cluster(authority) as c:
            r = c.replica(database=database)
            with held(database), pytest.raises(Exception) as info:
                await r.begin("gh", ALICE, "browser")
            assert db.is_unavailable(info.value)  # the routes answer DatabaseUnavailable
            assert stored_rows() == []
            location = await r.begin("gh", ALICE, "browser")
            # SQLite lets the read through and refuses the write: that registration is
            # left unused; PostgreSQL's lock holds the read, so nothing was registered
            expected = ["client-1"] if database.postgresql else ["client-1", "client-2"]
            assert authority.registrations == expected
            assert [row[4] for row in stored_rows()] == [client_of(location)]
            assert client_of(location) == expected[-1]
    finally:
        database.close()


async def test_a_lease_store_that_is_away_registers_nothing() -> None:
    """Redis away with no registration stored: StoreUnavailable (503, retry later), and no
    registration is made without the lease (another replica could make one too)."""
    authority = Authority()
    shared = Shared("redis://127.0.0.1:1/0", "tollhouse-test:away:", timeout_s=0.5)
    try:
        async with cluster(authority) as c:
            r = c.replica(leases=RedisLeases(shared))
            with pytest.raises(StoreUnavailable):
                await r.begin("gh", ALICE, "browser")
            assert authority.registered == [] and stored_rows() == []
    finally:
        await shared.aclose()
