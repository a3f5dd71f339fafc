"""Each person's connection to each per_user upstream: the connect flow, the tokens, refresh.

The authorization server is configured or discovered (the upstream's protected-resource
metadata, RFC 9728; its authorization server's metadata, RFC 8414; dynamic client
registration, RFC 7591, when no client id is configured); every request goes through the egress
guard. A connect flow's `state` is bound to the person and to the browser session. Tokens are
refreshed before they expire; concurrent calls of one person trigger at most one refresh; a
refresh refused with invalid_grant marks the connection `needs_reconnect`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlencode, urlsplit

import httpx
from cachetools import TTLCache

from proxy.config import Config, UpstreamConfig
from proxy.connect.guarded import GuardedClient
from proxy.connect.vault import Vault
from proxy.errors import UpstreamFailure

log = logging.getLogger("tollhouse.connect")
T = TypeVar("T")


class UpstreamNotConnected(UpstreamFailure):
    """Seed 004: -32000 naming the connect URL; audited error upstream_not_connected."""

    audit_name = "upstream_not_connected"

    def __init__(self, upstream: str, connect_url: str) -> None:
        super().__init__(f"Connect your {upstream} account first: {connect_url}")

    @property
    def audit_reason(self) -> str:
        return self.audit_name


class UpstreamNeedsReconnect(UpstreamNotConnected):
    audit_name = "upstream_needs_reconnect"

    def __init__(self, upstream: str, connect_url: str) -> None:
        UpstreamFailure.__init__(self, f"Reconnect your {upstream} account: {connect_url}")


class ConnectFailed(Exception):
    """The connect flow failed; the message is for the person's page (no tokens in it)."""


@dataclass(frozen=True)
class Endpoints:
    authorization_endpoint: str
    token_endpoint: str
    revocation_endpoint: str
    client_id: str
    client_secret: str
    scopes: tuple[str, ...]


@dataclass(frozen=True)
class Pending:
    upstream: str
    principal: str
    browser: str  # hash of the browser session id
    verifier: str
    redirect_uri: str


def _s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(
        b"=").decode()


def _browser(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class Connections:
    def __init__(self, cfg: Config, vault: Vault, guarded: GuardedClient,
                 clock: Callable[[], float] = time.time) -> None:
        self.public_url = cfg.server.public_url.rstrip("/")
        self.upstreams: dict[str, UpstreamConfig] = {
            u.name: u for u in cfg.upstreams if u.auth == "per_user"}
        self._vault = vault
        self._guarded = guarded
        self._clock = clock
        self._endpoints: dict[str, Endpoints] = {}
        self._pending: TTLCache[str, Pending] = TTLCache(maxsize=10_000, ttl=600)
        self._refreshing: dict[tuple[str, str], asyncio.Future[str]] = {}
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tollhouse-vault")
        self.last_lists: dict[tuple[str, str], dict[str, Any]] = {}  # (upstream, method)
        # the hot path: a person's unsealed token for a minute, so a call costs no database
        # read; every change to the row (refresh, reconnect, disconnect) replaces or drops it
        self._hot: TTLCache[tuple[str, str], tuple[str, float | None]] = TTLCache(
            maxsize=100_000, ttl=60)

    async def _in_db(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._db, fn, *args)

    def connect_url(self, upstream: str) -> str:
        return f"{self.public_url}/connect/{upstream}"

    def resource(self, upstream: str) -> str:
        return self.upstreams[upstream].url

    # -- the authorization server ----------------------------------------------------------

    async def endpoints(self, name: str) -> Endpoints:
        known = self._endpoints.get(name)
        if known is not None:
            return known
        up = self.upstreams[name]
        o = up.oauth
        if not o.discover:
            found = Endpoints(o.authorization_endpoint, o.token_endpoint, o.revocation_endpoint,
                              o.client_id, o.client_secret, tuple(o.scopes))
        else:
            found = await self._discover(up)
        self._endpoints[name] = found
        return found

    async def _json(self, up: UpstreamConfig, method: str, url: str, **kwargs: Any) -> Any:
        response = await self._guarded.request(method, url, up.zones, **kwargs)
        if response.status_code >= 400:
            raise ConnectFailed(f"{urlsplit(url).path} answered HTTP {response.status_code}")
        try:
            return response.json()
        except ValueError:
            raise ConnectFailed(f"{urlsplit(url).path} answered no JSON") from None

    async def _discover(self, up: UpstreamConfig) -> Endpoints:
        parts = urlsplit(up.url)
        origin = f"{parts.scheme}://{parts.netloc}"
        prm = await self._json(up, "GET", f"{origin}/.well-known/oauth-protected-resource"
                                          f"{parts.path}")
        servers = prm.get("authorization_servers") if isinstance(prm, dict) else None
        if not isinstance(servers, list) or not servers or not isinstance(servers[0], str):
            raise ConnectFailed("the upstream names no authorization server")
        issuer = servers[0].rstrip("/")
        isp = urlsplit(issuer)
        meta = await self._json(up, "GET", f"{isp.scheme}://{isp.netloc}/.well-known/"
                                           f"oauth-authorization-server{isp.path}")
        if not isinstance(meta, dict) or meta.get("issuer", "").rstrip("/") != issuer:
            raise ConnectFailed("the authorization server's metadata names another issuer")
        if "S256" not in meta.get("code_challenge_methods_supported", []):
            raise ConnectFailed("the authorization server does not offer PKCE S256")
        o = up.oauth
        client_id, secret = o.client_id, o.client_secret
        if not client_id:
            registration = meta.get("registration_endpoint")
            if not isinstance(registration, str):
                raise ConnectFailed("no client_id is configured and the authorization server "
                                    "offers no dynamic client registration")
            registered = await self._json(up, "POST", registration, json={
                "client_name": f"Tollhouse ({self.public_url})",
                "redirect_uris": [f"{self.public_url}/connect/{up.name}/callback"],
                "token_endpoint_auth_method": "client_secret_post",
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"]})
            client_id = str(registered.get("client_id", ""))
            secret = str(registered.get("client_secret", ""))
            if not client_id:
                raise ConnectFailed("dynamic client registration returned no client_id")
        scopes = tuple(o.scopes) or tuple(s for s in prm.get("scopes_supported", [])
                                          if isinstance(s, str))
        return Endpoints(str(meta["authorization_endpoint"]), str(meta["token_endpoint"]),
                         str(meta.get("revocation_endpoint") or ""), client_id, secret, scopes)

    # -- the connect flow ------------------------------------------------------------------

    async def begin(self, name: str, principal: str, browser_session: str) -> str:
        ep = await self.endpoints(name)
        state = secrets.token_urlsafe(32)
        verifier = secrets.token_urlsafe(48)
        redirect_uri = f"{self.public_url}/connect/{name}/callback"
        self._pending[state] = Pending(name, principal, _browser(browser_session), verifier,
                                       redirect_uri)
        query = {"response_type": "code", "client_id": ep.client_id,
                 "redirect_uri": redirect_uri, "state": state, "code_challenge": _s256(verifier),
                 "code_challenge_method": "S256", "resource": self.resource(name)}
        if ep.scopes:
            query["scope"] = " ".join(ep.scopes)
        separator = "&" if "?" in ep.authorization_endpoint else "?"
        return ep.authorization_endpoint + separator + urlencode(query)

    async def finish(self, name: str, state: str, code: str, principal: str,
                     browser_session: str) -> None:
        pending = self._pending.get(state)
        if pending is None or pending.upstream != name:
            raise ConnectFailed("this connect link is unknown or has expired; start again")
        if pending.principal != principal or pending.browser != _browser(browser_session):
            raise ConnectFailed("this connect flow was started by someone else")
        del self._pending[state]
        ep = await self.endpoints(name)
        tokens = await self._token(name, ep, {
            "grant_type": "authorization_code", "code": code,
            "redirect_uri": pending.redirect_uri, "code_verifier": pending.verifier,
            "resource": self.resource(name)})
        await self._in_db(self._vault.put, name, principal, tokens)
        self._hot.pop((name, principal), None)

    async def _token(self, name: str, ep: Endpoints, form: dict[str, str]) -> dict[str, Any]:
        form = {**form, "client_id": ep.client_id}
        if ep.client_secret:
            form["client_secret"] = ep.client_secret
        response = await self._guarded.request("POST", ep.token_endpoint,
                                               self.upstreams[name].zones, data=form)
        try:
            body = response.json()
        except ValueError:
            body = {}
        if response.status_code != 200 or not isinstance(body, dict) \
                or not isinstance(body.get("access_token"), str):
            error = body.get("error") if isinstance(body, dict) else None
            raise ConnectFailed(str(error) if isinstance(error, str) else
                                f"the token endpoint answered HTTP {response.status_code}")
        lifetime = body.get("expires_in")
        tokens = {"access_token": body["access_token"],
                  "refresh_token": body.get("refresh_token") or form.get("refresh_token"),
                  "expires_at": self._clock() + float(lifetime)
                  if isinstance(lifetime, (int, float)) else None}
        return tokens

    # -- on a call -------------------------------------------------------------------------

    async def access_token(self, name: str, principal: str) -> str:
        """This person's access token for this upstream, refreshed first if it is about to
        expire; UpstreamNotConnected / UpstreamNeedsReconnect otherwise."""
        margin = self.upstreams[name].oauth.refresh_margin_s
        hot = self._hot.get((name, principal))
        if hot is not None and (hot[1] is None or hot[1] - self._clock() >= margin):
            return hot[0]
        connection = await self._in_db(self._vault.get, name, principal)
        if connection is None:
            raise UpstreamNotConnected(name, self.connect_url(name))
        if connection.status != "connected":
            raise UpstreamNeedsReconnect(name, self.connect_url(name))
        expires = connection.expires_at
        if expires is not None and expires - self._clock() < margin:
            return await self.refresh(name, principal, connection.tokens["access_token"])
        token = str(connection.tokens["access_token"])
        self._hot[(name, principal)] = (token, expires)
        return token

    async def refresh(self, name: str, principal: str, stale: str) -> str:
        """One refresh for everyone waiting on the same person's token."""
        key = (name, principal)
        self._hot.pop(key, None)
        pending = self._refreshing.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._refreshing[key] = future
        try:
            token = await self._refresh(name, principal, stale)
            future.set_result(token)
            return token
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()
            raise
        finally:
            del self._refreshing[key]

    async def _refresh(self, name: str, principal: str, stale: str) -> str:
        connection = await self._in_db(self._vault.get, name, principal)
        if connection is None:
            raise UpstreamNotConnected(name, self.connect_url(name))
        current = connection.tokens.get("access_token")
        if current != stale and connection.status == "connected":
            return str(current)  # someone refreshed it already
        refresh_token = connection.tokens.get("refresh_token")
        if not refresh_token:
            await self._in_db(self._vault.mark, name, principal, "needs_reconnect")
            raise UpstreamNeedsReconnect(name, self.connect_url(name))
        ep = await self.endpoints(name)
        try:
            tokens = await self._token(name, ep, {"grant_type": "refresh_token",
                                                  "refresh_token": str(refresh_token),
                                                  "resource": self.resource(name)})
        except ConnectFailed as exc:
            if str(exc) in ("invalid_grant", "invalid_client", "unauthorized_client"):
                await self._in_db(self._vault.mark, name, principal, "needs_reconnect")
                raise UpstreamNeedsReconnect(name, self.connect_url(name)) from None
            raise UpstreamFailure("the upstream's token refresh failed") from None
        await self._in_db(self._vault.put, name, principal, tokens)
        self._hot[(name, principal)] = (str(tokens["access_token"]), tokens.get("expires_at"))
        return str(tokens["access_token"])

    def forget(self, name: str, principal: str) -> None:
        """Drop the in-memory copy of a person's token: the vault row changed elsewhere."""
        self._hot.pop((name, principal), None)

    # -- the person's view -----------------------------------------------------------------

    async def statuses(self, principal: str) -> dict[str, str]:
        known = await self._in_db(self._vault.statuses, principal)
        return {name: known.get(name, "not_connected") for name in self.upstreams}

    async def disconnect(self, name: str, principal: str) -> None:
        self._hot.pop((name, principal), None)
        connection = await self._in_db(self._vault.get, name, principal)
        await self._in_db(self._vault.delete, name, principal)
        if connection is None or not connection.tokens:
            return
        try:
            ep = await self.endpoints(name)
            if ep.revocation_endpoint:
                for token in ("refresh_token", "access_token"):
                    value = connection.tokens.get(token)
                    if value:
                        form = {"token": str(value), "token_type_hint": token,
                                "client_id": ep.client_id}
                        if ep.client_secret:
                            form["client_secret"] = ep.client_secret
                        await self._guarded.request("POST", ep.revocation_endpoint,
                                                    self.upstreams[name].zones, data=form)
        except (ConnectFailed, UpstreamFailure, httpx.HTTPError) as exc:
            log.info("revoking %s tokens at the upstream failed: %s", name, type(exc).__name__)

    async def aclose(self) -> None:
        await self._guarded.aclose()
        self._db.shutdown(wait=False)
