"""A code or a refresh token presented twice at the same moment (at two replicas, or in two
requests to one): the second presentation is refused and revokes what the first produced,
even when the first stores its refresh token only after the second revoked the family's rows.
A refresh token presented again by its client within `refresh_grace_s` is not a reuse: it gets
the same new tokens (a client's calls in flight at expiry each refresh); after it, it is.

Two authorization servers on one database and one live-state store (this run's: memory or
Redis) stand for two replicas. The first one's token issue is held in its worker thread
until the second has been answered: the order in which a race between two replicas stores
the refresh row last (tests/replicas/test_security.py meets it now and then)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import jwt
import pytest

from proxy.oauth.keys import KeyRing
from proxy.oauth.server import AuthorizationServer, Client, OAuthError, s256
from proxy.people.accounts import Accounts, User
from proxy.state import open_stores
from proxy.storage.db import Database
from tests import state_backends
from tests.conftest import make_config
from tests.helpers import DEADLINE_S, Clock, until

REDIRECT_URI = "http://127.0.0.1:3000/cb"
VERIFIER = "v" * 50


class HeldKeys(KeyRing):
    """A server's key ring. Once `hold` is called, each token issue of the server (which asks
    the ring first whether a new signing key is due, before it stores anything) waits, in its
    worker thread, for `go`; `entered` once one does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.entered, self.go = threading.Event(), threading.Event()
        self._held = False
        super().__init__(*args, **kwargs)

    def hold(self) -> HeldKeys:
        self._held = True
        return self

    def rotate_if_due(self, now: float | None = None) -> None:
        if self._held:
            self.entered.set()
            assert self.go.wait(DEADLINE_S), "the held token issue was never let go"
        super().rotate_if_due(now)


class Two:
    def __init__(self, a: AuthorizationServer, b: AuthorizationServer, client: Client,
                 user: User, database: Database, a_keys: HeldKeys) -> None:
        self.a, self.b, self.client, self.user = a, b, client, user
        self.a_keys = a_keys  # a's key ring, which holds its token issue when told to
        self.resource = f"{a.issuer}/mcp/e"  # make_config's one endpoint
        self.accounts = Accounts(database)

    def lookup(self, user_id: str) -> User | None:
        return self.accounts.get(user_id)

    async def code(self) -> dict[str, str]:
        code = await self.a.issue_code(self.client, REDIRECT_URI,
                                       {"code_challenge": s256(VERIFIER)}, self.user,
                                       self.resource)
        return {"code": code, "code_verifier": VERIFIER, "redirect_uri": REDIRECT_URI}

    async def refused(self, tokens: dict[str, Any]) -> None:
        """Neither token of `tokens` is any good, at either server."""
        for server in (self.a, self.b):
            with pytest.raises(jwt.InvalidTokenError, match="revoked"):
                await server.verify_access(tokens["access_token"], self.resource)
        with pytest.raises(OAuthError, match="revoked"):
            await self.b.refresh(self.client, {"refresh_token": tokens["refresh_token"]},
                                 self.lookup)


@asynccontextmanager
async def servers(database: Database, grace_s: int, clock: Clock | None = None
                  ) -> AsyncIterator[Two]:
    """Two servers on one database and one live-state store (the run's; a memory one on
    `clock` when given)."""
    state = {"url": "memory"} if clock is not None else state_backends.state()
    cfg = make_config(auth={"mode": "jwt"}, oauth_server={"enabled": True,
                                                          "refresh_grace_s": grace_s},
                      state=state)
    stores = open_stores(cfg, clock) if clock is not None else open_stores(cfg)

    def ring() -> HeldKeys:
        return HeldKeys(database, "test-secret", cfg.oauth_server.key_rotation_s,
                        cfg.oauth_server.access_token_ttl_s)

    def server(ring: KeyRing) -> AuthorizationServer:
        return AuthorizationServer(cfg, database, ring, codes=stores.codes,
                                   revocations=stores.revocations,
                                   consents=stores.consent_flows, rotations=stores.rotations)

    try:
        a_keys = ring()
        a, b = server(a_keys), server(ring())
        registered = a.register({"redirect_uris": [REDIRECT_URI], "client_name": "Test",
                                 "token_endpoint_auth_method": "none"})
        client = a.authenticate_client(registered["client_id"], None)
        yield Two(a, b, client, Accounts(database).create_local("ann", "ann-password"),
                  database, a_keys)
    finally:
        await stores.aclose()


@pytest.fixture
async def two(database: Database) -> AsyncIterator[Two]:
    async with servers(database, grace_s=0) as pair:
        yield pair


@pytest.fixture
async def graced(database: Database) -> AsyncIterator[Two]:
    async with servers(database, grace_s=10) as pair:
        yield pair


async def test_a_code_presented_again_while_its_first_use_issues_revokes_what_it_issues(
        two: Two) -> None:
    form = await two.code()
    held = two.a_keys.hold()
    first = asyncio.create_task(two.a.exchange_code(two.client, form))
    await until(held.entered.is_set, what="the first use issuing its tokens")
    with pytest.raises(OAuthError, match="already used"):
        await two.b.exchange_code(two.client, form)
    held.go.set()
    tokens = await first  # the first use is answered; what it carries is refused
    await two.refused(tokens)


async def test_without_a_grace_a_refresh_token_presented_twice_at_once_revokes_the_family(
        two: Two) -> None:
    """`refresh_grace_s = 0`: the use that marks the token first is answered, and what it
    carries is refused once the other presentation finds the token used."""
    tokens = await two.a.exchange_code(two.client, await two.code())
    form = {"refresh_token": tokens["refresh_token"]}
    held = two.a_keys.hold()
    first = asyncio.create_task(two.a.refresh(two.client, form, two.lookup))
    await until(held.entered.is_set, what="the first use issuing its tokens")
    rotated = await two.b.refresh(two.client, form, two.lookup)
    held.go.set()
    with pytest.raises(OAuthError, match="reused"):
        await first
    await two.refused(rotated)


async def test_within_the_grace_a_refresh_token_presented_at_once_gets_the_same_tokens(
        graced: Two) -> None:
    """Each of three presentations at two replicas, one held while the others finish, gets
    the one rotation's tokens; they all work, and the new refresh token rotates on."""
    two = graced
    tokens = await two.a.exchange_code(two.client, await two.code())
    form = {"refresh_token": tokens["refresh_token"]}
    held = two.a_keys.hold()
    first = asyncio.create_task(two.a.refresh(two.client, form, two.lookup))
    await until(held.entered.is_set, what="the first use issuing its tokens")
    second = await two.b.refresh(two.client, form, two.lookup)
    third = await two.b.refresh(two.client, form, two.lookup)
    held.go.set()
    answers = [await first, second, third]
    assert {(t["access_token"], t["refresh_token"]) for t in answers} == {
        (second["access_token"], second["refresh_token"])}
    for server in (two.a, two.b):
        claims = await server.verify_access(second["access_token"], two.resource)
        assert claims["sub"] == two.user.subject
    onward = await two.a.refresh(two.client, {"refresh_token": second["refresh_token"]},
                                 two.lookup)
    assert onward["refresh_token"] != second["refresh_token"]


async def test_within_the_grace_another_client_presenting_the_token_revokes_the_family(
        graced: Two) -> None:
    two = graced
    tokens = await two.a.exchange_code(two.client, await two.code())
    rotated = await two.a.refresh(two.client, {"refresh_token": tokens["refresh_token"]},
                                  two.lookup)
    other = two.a.register({"redirect_uris": [REDIRECT_URI], "client_name": "Other",
                            "token_endpoint_auth_method": "none"})
    thief = two.a.authenticate_client(other["client_id"], None)
    with pytest.raises(OAuthError, match="reused"):
        await two.b.refresh(thief, {"refresh_token": tokens["refresh_token"]}, two.lookup)
    await two.refused(rotated)


async def test_after_the_grace_a_refresh_token_presented_again_revokes_the_family(
        database: Database) -> None:
    clock = Clock()
    async with servers(database, grace_s=10, clock=clock) as two:
        tokens = await two.a.exchange_code(two.client, await two.code())
        form = {"refresh_token": tokens["refresh_token"]}
        rotated = await two.a.refresh(two.client, form, two.lookup)
        clock.advance(9)
        again = await two.b.refresh(two.client, form, two.lookup)
        assert again["access_token"] == rotated["access_token"]
        assert again["expires_in"] < rotated["expires_in"] + 1
        clock.advance(2)
        with pytest.raises(OAuthError, match="reused"):
            await two.b.refresh(two.client, form, two.lookup)
        await two.refused(rotated)


async def test_one_use_at_a_time_is_not_revoked(two: Two) -> None:
    """The look at the store after issuing revokes nothing when nothing was presented
    twice: the code's tokens and each rotation's work."""
    tokens = await two.a.exchange_code(two.client, await two.code())
    for server in (two.b, two.a):
        tokens = await server.refresh(two.client, {"refresh_token": tokens["refresh_token"]},
                                      two.lookup)
        for verifier in (two.a, two.b):
            claims = await verifier.verify_access(tokens["access_token"], two.resource)
            assert claims["sub"] == two.user.subject
