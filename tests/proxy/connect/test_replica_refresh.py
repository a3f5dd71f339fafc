"""Item 4, a person's upstream token: two `Connections` on one database stand for two gateway
replicas, sharing a lease store (one Redis under a fresh key prefix, with a Redis client each,
as two processes have; or one memory store). In front of them, an authorization server that
rotates refresh tokens and answers invalid_grant to one used twice, and holds every refresh
until the test lets it go, so the calls of both replicas are under way at once.

Concurrent calls on both replicas with an expiring token: exactly one refresh reaches the
authorization server, every call gets the new token, and the connection stays connected."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import parse_qsl

import httpx
import pytest

from proxy.connect.guarded import GuardedClient
from proxy.connect.manager import REFRESH_POLL_S, Connections, UpstreamNeedsReconnect
from proxy.connect.vault import Vault
from proxy.errors import StoreUnavailable
from proxy.state.flows import MemoryFlowStore
from proxy.state.leases import LeaseStore, MemoryLeases, RedisLeases
from proxy.state.shared import Shared
from tests import db_backends, state_backends
from tests.helpers import DEADLINE_S, Clock, until
from tests.proxy.connect.test_connect_discovery import VAULT_KEYS, Resolver, per_user_cfg

REDIS_URL = "redis://127.0.0.1:6379/0"
ALICE = "tollhouse:local|local:alice"


class RotatingServer:
    """A token endpoint that rotates refresh tokens: each is good once; a reused one is
    invalid_grant. Every refresh waits for `go`; `seen` lists the refresh tokens sent."""

    def __init__(self, *valid: str) -> None:
        self.valid = set(valid)
        self.seen: list[str] = []
        self.go = asyncio.Event()
        self.issued = 1

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        form = dict(parse_qsl(request.content.decode()))
        self.seen.append(form["refresh_token"])
        await asyncio.wait_for(self.go.wait(), DEADLINE_S)
        if form.get("grant_type") != "refresh_token" or form["refresh_token"] not in self.valid:
            return httpx.Response(400, json={"error": "invalid_grant"})
        self.valid.discard(form["refresh_token"])
        self.issued += 1
        self.valid.add(f"r{self.issued}")
        return httpx.Response(200, json={"access_token": f"A{self.issued}",
                                         "refresh_token": f"r{self.issued}",
                                         "expires_in": 3600})


class Watched:
    """A lease store that counts the acquires it refused: a replica waiting on another's
    refresh."""

    def __init__(self, inner: LeaseStore) -> None:
        self.inner = inner
        self.refused = 0

    async def acquire(self, name: str, ttl_s: float) -> str | None:
        got = await self.inner.acquire(name, ttl_s)
        self.refused += got is None
        return got

    async def release(self, name: str, token: str) -> None:
        await self.inner.release(name, token)


def replica(server: RotatingServer, leases: LeaseStore,
            poll_s: float = REFRESH_POLL_S) -> Connections:
    """One gateway process: its own vault connection, HTTP client and in-process state."""
    guarded = GuardedClient(Resolver(), transport=httpx.MockTransport(server))
    return Connections(per_user_cfg(), Vault(db_backends.open_database(), VAULT_KEYS), guarded,
                       flows=MemoryFlowStore(), leases=leases, poll_s=poll_s)


@asynccontextmanager
async def two_lease_stores(kind: str) -> AsyncIterator[tuple[Watched, Watched]]:
    """What each of two replicas reaches its shared lease store through."""
    if kind == "memory":
        one = MemoryLeases()
        yield Watched(one), Watched(one)
        return
    prefix = state_backends.fresh_prefix()
    a, b = Shared(REDIS_URL, prefix, 5.0), Shared(REDIS_URL, prefix, 5.0)
    try:
        yield Watched(RedisLeases(a)), Watched(RedisLeases(b))
    finally:
        await a.aclose()
        await b.aclose()


def expiring(c: Connections, refresh_token: str = "r1") -> None:
    c._vault.put("gh", ALICE, {"access_token": "A1", "refresh_token": refresh_token,
                               "expires_at": time.time() + 1})  # inside the refresh margin


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_concurrent_calls_on_two_replicas_refresh_once(kind: str) -> None:
    server = RotatingServer("r1")
    async with two_lease_stores(kind) as (leases_a, leases_b):
        a, b = replica(server, leases_a), replica(server, leases_b)
        try:
            expiring(a)
            calls = [asyncio.create_task(c.access_token("gh", ALICE))
                     for c in (a, b, a, b, a, b)]
            # one replica's refresh is at the server; the other found the lease taken (or,
            # were the lease not shared, its own refresh reached the server too)
            await until(lambda: server.seen and leases_a.refused + leases_b.refused
                        or len(server.seen) > 1, what="both replicas refreshing")
            server.go.set()
            assert await asyncio.gather(*calls) == ["A2"] * 6
            assert server.seen == ["r1"]  # exactly one refresh reached the server
            for c in (a, b):
                row = c._vault.get("gh", ALICE)
                assert row is not None and row.status == "connected"
                assert row.tokens["refresh_token"] == "r2"
                assert await c.access_token("gh", ALICE) == "A2"
            assert server.seen == ["r1"]
        finally:
            await a.aclose()
            await b.aclose()


async def test_a_refused_refresh_on_one_replica_is_needs_reconnect_on_both() -> None:
    server = RotatingServer()  # r1 is no longer good: the person revoked the gateway
    async with two_lease_stores("memory") as (leases_a, leases_b):
        a, b = replica(server, leases_a), replica(server, leases_b)
        try:
            expiring(a)
            calls = [asyncio.create_task(c.access_token("gh", ALICE)) for c in (a, b)]
            await until(lambda: server.seen and leases_a.refused + leases_b.refused
                        or len(server.seen) > 1, what="both replicas refreshing")
            server.go.set()
            for outcome in await asyncio.gather(*calls, return_exceptions=True):
                assert isinstance(outcome, UpstreamNeedsReconnect)
            assert server.seen == ["r1"]  # the waiter did not spend the refused token again
        finally:
            await a.aclose()
            await b.aclose()


async def test_a_lease_whose_holder_died_is_taken_once_it_runs_out() -> None:
    clock = Clock()
    leases = Watched(MemoryLeases(clock=clock))
    server = RotatingServer("r1")
    server.go.set()
    a = replica(server, leases, poll_s=0.001)
    try:
        expiring(a)
        assert await leases.inner.acquire(f"rf:gh:{ALICE}", 30) is not None  # then it died
        call = asyncio.create_task(a.access_token("gh", ALICE))
        await until(lambda: leases.refused >= 3, what="the replica waiting on the lease")
        assert server.seen == [] and not call.done()  # it waits for the holder's token
        clock.advance(30)  # the dead holder's lease runs out
        assert await call == "A2"
        assert server.seen == ["r1"]
    finally:
        await a.aclose()


async def test_a_lease_store_that_is_away_refreshes_nothing() -> None:
    """Redis away: the call is StoreUnavailable (503, retry later), and the refresh token is
    not spent without the lease (a second replica could spend it too)."""
    server = RotatingServer("r1")
    server.go.set()
    shared = Shared("redis://127.0.0.1:1/0", "tollhouse-test:away:", timeout_s=0.5)
    a = replica(server, RedisLeases(shared))
    try:
        expiring(a)
        with pytest.raises(StoreUnavailable, match="lease"):
            await a.access_token("gh", ALICE)
        assert server.seen == []
        row = a._vault.get("gh", ALICE)
        assert row is not None and row.status == "connected" and row.tokens["access_token"] == "A1"
    finally:
        await a.aclose()
        await shared.aclose()
