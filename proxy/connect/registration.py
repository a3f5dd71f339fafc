"""The gateway's own client at an upstream's authorization server when no `client_id` is
configured: registered (RFC 7591) once for every gateway process on the database, not once per
process, so a connect flow begun on one replica finishes on another, and a token one replica
got is refreshed by any other, with the same client.

One registration per (upstream, issuer, registration endpoint, redirect URI), kept in the
database (proxy.connect.vault, secret sealed). A process that finds it there uses it. One that
does not takes the lease `cr:<upstream>:<digest>` (proxy.state.leases), looks again, registers
and stores what it got, while the others wait for the row. Should two register anyway (a lease
that ran out under a slow authorization server), the row stored first wins: the other process
adopts it, and withdraws its own registration at the authorization server when it was given
the means (RFC 7592: a registration_access_token and a registration_client_uri). A refused or
malformed registration stores nothing (ConnectFailed); a database that fails raises its own
error, which the routes answer as DatabaseUnavailable.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import astuple
from typing import Any

import httpx

from proxy.config import UpstreamConfig
from proxy.connect import ConnectFailed
from proxy.connect.guarded import GuardedClient
from proxy.connect.vault import ClientKey, RegisteredClient, Vault
from proxy.errors import UpstreamFailure
from proxy.state.leases import LeaseStore, by_one_holder

log = logging.getLogger("tollhouse.connect")

# (upstream, method, url, zones, operator_url, what, **kwargs) -> a JSON object, or
# ConnectFailed naming `what` (AuthorizationServers._json, proxy.connect.discovery)
FetchJson = Callable[..., Awaitable[dict[str, Any]]]
InDb = Callable[..., Awaitable[Any]]


def _text(value: object) -> bool:
    """A non-empty string the database can hold (PostgreSQL's text holds no NUL)."""
    return isinstance(value, str) and bool(value) and "\x00" not in value


class Registrar:
    def __init__(self, vault: Vault, in_db: InDb, guarded: GuardedClient, fetch: FetchJson,
                 leases: LeaseStore, *, client_name: str, lease_s: float,
                 poll_s: float) -> None:
        self._vault = vault
        self._in_db = in_db
        self._guarded = guarded
        self._fetch = fetch
        self._leases = leases
        self._client_name = client_name
        self._lease_s = lease_s
        self._poll_s = poll_s

    async def client(self, up: UpstreamConfig, key: ClientKey,
                     zones: Collection[str]) -> RegisteredClient:
        """The one client for `key`: the stored one, or one registered now and stored."""
        stored: RegisteredClient | None = await self._in_db(self._vault.client, key)
        if stored is not None:
            return stored

        async def look() -> RegisteredClient | None:
            found: RegisteredClient | None = await self._in_db(self._vault.client, key)
            return found

        async def work() -> RegisteredClient:
            return await look() or await self._register(up, key, zones)

        digest = hashlib.sha256("\n".join(astuple(key)).encode()).hexdigest()[:32]
        return await by_one_holder(
            self._leases, f"cr:{key.upstream}:{digest}", self._lease_s, self._poll_s,
            work=work, look=look, gave_up=lambda: ConnectFailed(
                "the client registration at the authorization server did not finish; "
                "try again"))

    async def _register(self, up: UpstreamConfig, key: ClientKey,
                        zones: Collection[str]) -> RegisteredClient:
        answer = await self._fetch(up, "POST", key.registration_endpoint, zones, False,
                                   "dynamic client registration", json={
            "client_name": self._client_name,
            "redirect_uris": [key.redirect_uri],
            "token_endpoint_auth_method": "client_secret_post",
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"]})
        got_id, got_secret = answer.get("client_id"), answer.get("client_secret")
        if not _text(got_id):
            raise ConnectFailed("dynamic client registration returned no client_id")
        if got_secret is not None and not (isinstance(got_secret, str)
                                           and "\x00" not in got_secret):
            raise ConnectFailed("dynamic client registration returned a malformed "
                                "client_secret")
        mine = RegisteredClient(str(got_id), got_secret or "")
        # a failure here leaves this registration unused at the authorization server, and
        # it is not withdrawn: the row may have been stored before the failure
        kept: RegisteredClient = await self._in_db(self._vault.keep_client, key, mine)
        if kept.client_id == mine.client_id:
            log.info("connect %s: registered a client at %s", up.name, key.issuer)
        else:
            log.info("connect %s: another gateway process registered first at %s; using "
                     "its client", up.name, key.issuer)
            await self._withdraw(up, answer, zones)
        return kept

    async def _withdraw(self, up: UpstreamConfig, answer: dict[str, Any],
                        zones: Collection[str]) -> None:
        """Delete a registration nobody will use (RFC 7592), if the server said how."""
        uri, token = answer.get("registration_client_uri"), answer.get(
            "registration_access_token")
        if not (_text(uri) and _text(token)):
            return
        try:
            response = await self._guarded.request(
                "DELETE", str(uri), zones, headers={"authorization": f"Bearer {token}"})
        except (UpstreamFailure, httpx.HTTPError) as exc:
            log.info("connect %s: withdrawing an unused client registration failed: %s",
                     up.name, type(exc).__name__)
            return
        if response.status_code >= 400:
            log.info("connect %s: withdrawing an unused client registration answered "
                     "HTTP %s", up.name, response.status_code)
