"""Each person's connection to each per_user upstream: the connect flow, the tokens, refresh.

The authorization server is configured or discovered (the upstream's protected-resource
metadata, RFC 9728; its authorization server's metadata, RFC 8414; dynamic client
registration, RFC 7591, when no client id is configured: one client for every gateway process,
kept in the database, proxy.connect.registration: both proxy.connect.discovery's); every
request goes through the egress guard. A connect flow's `state` is bound to the person and to
the browser session. Tokens are refreshed before they expire; concurrent calls of one person
trigger at most one refresh, even when they land on different gateway processes: within a
process they share one (SingleFlight), and across processes only the holder of the lease
`rf:<upstream>:<principal>` (proxy.state.leases) spends the refresh token, while the others
watch the vault row for the token it stores. A refresh refused with invalid_grant marks the
connection `needs_reconnect`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlencode

import httpx
from cachetools import TTLCache

from proxy.config import Config, UpstreamConfig
from proxy.connect import ConnectFailed
from proxy.connect.discovery import AuthorizationServers, Endpoints
from proxy.connect.guarded import GuardedClient
from proxy.connect.vault import Connection as StoredConnection
from proxy.connect.vault import Vault
from proxy.errors import UpstreamFailure
from proxy.singleflight import SingleFlight
from proxy.state.flows import FlowStore, ForeignFlow
from proxy.state.leases import LeaseStore, MemoryLeases, by_one_holder

if TYPE_CHECKING:
    from proxy.connect.links import ConnectLinks

log = logging.getLogger("tollhouse.connect")
T = TypeVar("T")

# how long one process may hold a person's refresh (or the registration of the gateway's
# client): three times the token request's timeout (proxy.connect.guarded), so a live holder
# keeps it; a holder that died blocks the others no longer than this, then one of them takes
# the lease
REFRESH_LEASE_S = 30.0
REFRESH_POLL_S = 0.05  # how often a process waiting on another's refresh reads the vault row

__all__ = ["ConnectFailed", "Connections", "Endpoints", "UpstreamNeedsReconnect",
           "UpstreamNotConnected"]


class UpstreamNotConnected(UpstreamFailure):
    """Seed 004: -32000 naming the connect URL; audited error upstream_not_connected."""

    audit_name = "upstream_not_connected"
    upstream_kind = "not_connected"

    def __init__(self, upstream: str, connect_url: str) -> None:
        super().__init__(f"Connect your {upstream} account first: {connect_url}")

    @property
    def audit_reason(self) -> str:
        return self.audit_name


class UpstreamNeedsReconnect(UpstreamNotConnected):
    audit_name = "upstream_needs_reconnect"

    def __init__(self, upstream: str, connect_url: str) -> None:
        UpstreamFailure.__init__(self, f"Reconnect your {upstream} account: {connect_url}")


def _s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(
        b"=").decode()


def _starter(principal: str, browser_session: str) -> str:
    """Who may finish a connect flow: the person, in the browser session that began it (a
    digest: the store never holds the session id)."""
    return hashlib.sha256(f"{principal}\x00{browser_session}".encode()).hexdigest()


# RFC 6749 section 5.2 error codes: shown as they are; any other answer is described generically
OAUTH_ERRORS = frozenset({"invalid_request", "invalid_client", "invalid_grant",
                          "unauthorized_client", "unsupported_grant_type", "invalid_scope",
                          "invalid_target"})


class Connections:
    def __init__(self, cfg: Config, vault: Vault, guarded: GuardedClient,
                 clock: Callable[[], float] = time.time, *, flows: FlowStore,
                 leases: LeaseStore | None = None, lease_s: float = REFRESH_LEASE_S,
                 poll_s: float = REFRESH_POLL_S, people: Any = None,
                 links: ConnectLinks | None = None) -> None:
        self.public_url = cfg.server.public_url.rstrip("/")
        # the connect links a client that declared URL-mode elicitation is given
        self.links = links
        self.upstreams: dict[str, UpstreamConfig] = {
            u.name: u for u in cfg.upstreams if u.auth == "per_user"}
        self._vault = vault
        self._guarded = guarded
        self.people = people  # a per-caller upstream's attributes (proxy.upstream.tenants)
        self._templates: dict[str, Any] = {}  # per-caller upstream URLs, parsed
        self._clock = clock
        # connect flows under way, by upstream and state, bound to the person and browser
        self._flows = flows
        self._refreshing: SingleFlight[tuple[str, str], str] = SingleFlight()
        # who refreshes a person's token across processes (a memory store: this one alone)
        self._leases: LeaseStore = MemoryLeases() if leases is None else leases
        self._lease_s = lease_s
        self._poll_s = poll_s
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tollhouse-vault")
        # each upstream's authorization server and the gateway's client there
        self._servers = AuthorizationServers(self.upstreams, self.public_url, guarded, vault,
                                             self._in_db, self._leases, lease_s=lease_s,
                                             poll_s=poll_s)
        self.last_lists: dict[tuple[str, str], dict[str, Any]] = {}  # (upstream, method)
        # the hot path: a person's unsealed token for a minute, so a call costs no database
        # read; every change to the row (refresh, reconnect, disconnect) in this process
        # replaces or drops it, and one made by another gateway process is seen here at most
        # 60 s late (a per-process cache, not shared state: the vault row is the truth).
        # `forget` may come from another thread (a user deleted): the lock guards both tables
        self._hot: TTLCache[tuple[str, str], tuple[str, float | None]] = TTLCache(
            maxsize=100_000, ttl=60)
        self._hot_lock = threading.Lock()
        # how often each person was forgotten: a token read before a `forget` is not cached
        # after it
        self._forgotten: dict[str, int] = {}

    async def _in_db(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._db, fn, *args)

    def connect_url(self, upstream: str) -> str:
        return f"{self.public_url}/connect/{upstream}"

    def resource(self, upstream: str) -> str:
        up = self.upstreams[upstream]
        return up.oauth.resource or up.url

    async def _resource(self, upstream: str, principal: str) -> str:
        """The RFC 8707 resource a person's token is asked for: the upstream's URL, and for a
        per-caller upstream this person's own (their subject and stored attributes: a browser
        sign-in carries no token claims), so their token is for their own server."""
        up = self.upstreams[upstream]
        if not up.templated:
            return self.resource(upstream)  # (empty for a stdio upstream that names none)
        from proxy.auth.principal import Principal
        from proxy.config.template import SUBJECT, Missing, UrlTemplate

        template = self._templates.get(upstream)
        if template is None:  # parsed once (the config check parsed it already)
            template = self._templates[upstream] = UrlTemplate.parse(
                up.url, {n: (p.claim, p.attribute, p.pattern)
                         for n, p in up.placeholders.items()})
        issuer, _, subject = principal.partition("|")
        attributes = {} if self.people is None else await self.people.attributes(
            Principal(subject=subject, issuer=issuer))
        url = template.fill({n: subject if n == SUBJECT else attributes.get(p.attribute)
                             for n, p in template.placeholders.items()})
        if isinstance(url, Missing):
            raise ConnectFailed("there is no upstream server for you here; ask an "
                                "administrator to set your attributes")
        return url

    # -- the authorization server ----------------------------------------------------------

    async def endpoints(self, name: str) -> Endpoints:
        return await self._servers.endpoints(name)

    # -- the connect flow ------------------------------------------------------------------

    async def begin(self, name: str, principal: str, browser_session: str) -> str:
        ep = await self.endpoints(name)
        state = secrets.token_urlsafe(32)
        verifier = secrets.token_urlsafe(48)
        redirect_uri = f"{self.public_url}/connect/{name}/callback"
        await self._flows.put(f"{name}:{state}", _starter(principal, browser_session),
                              {"verifier": verifier, "redirect_uri": redirect_uri})
        query = {"response_type": "code", "client_id": ep.client_id,
                 "redirect_uri": redirect_uri, "state": state, "code_challenge": _s256(verifier),
                 "code_challenge_method": "S256",
                 "resource": await self._resource(name, principal)}
        if not query["resource"]:  # a stdio upstream has no URL to name (RFC 8707 optional)
            del query["resource"]
        if ep.scopes:
            query["scope"] = " ".join(ep.scopes)
        separator = "&" if "?" in ep.authorization_endpoint else "?"
        return ep.authorization_endpoint + separator + urlencode(query)

    async def finish(self, name: str, state: str, code: str, principal: str,
                     browser_session: str) -> None:
        try:
            pending = await self._flows.take(f"{name}:{state}",
                                             _starter(principal, browser_session))
        except ForeignFlow:
            raise ConnectFailed("this connect flow was started by someone else") from None
        if pending is None:
            raise ConnectFailed("this connect link is unknown or has expired; start again")
        ep = await self.endpoints(name)
        tokens = await self._token(name, ep, {
            "grant_type": "authorization_code", "code": code,
            "redirect_uri": pending["redirect_uri"], "code_verifier": pending["verifier"],
            "resource": await self._resource(name, principal)})
        await self._in_db(self._vault.put, name, principal, tokens)
        self._drop(name, principal)

    async def _token(self, name: str, ep: Endpoints, form: dict[str, str]) -> dict[str, Any]:
        if not form.get("resource", True):  # a stdio upstream: no resource to name
            form = {k: v for k, v in form.items() if k != "resource"}
        form = {**form, "client_id": ep.client_id}
        if ep.client_secret:
            form["client_secret"] = ep.client_secret
        zones, operator_url = self._servers.zones(name, ep)
        response = await self._guarded.request("POST", ep.token_endpoint, zones,
                                               operator_url=operator_url, data=form)
        try:
            body = response.json()
        except ValueError:
            body = {}
        if response.status_code != 200 or not isinstance(body, dict) \
                or not isinstance(body.get("access_token"), str):
            error = body.get("error") if isinstance(body, dict) else None
            if isinstance(error, str) and error in OAUTH_ERRORS:
                raise ConnectFailed(error)
            log.info("connect %s: the token endpoint answered HTTP %s", name,
                     response.status_code)
            raise ConnectFailed("the token endpoint refused the request")
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
        with self._hot_lock:
            hot = self._hot.get((name, principal))
            epoch = self._forgotten.get(principal, 0)
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
        self._remember(name, principal, token, expires, epoch)
        return token

    def _remember(self, name: str, principal: str, token: str, expires: float | None,
                  epoch: int) -> None:
        """Cache a token read while the person's epoch was `epoch`, unless they were
        forgotten since (the row it came from may be gone)."""
        with self._hot_lock:
            if self._forgotten.get(principal, 0) == epoch:
                self._hot[(name, principal)] = (token, expires)

    def _drop(self, name: str, principal: str) -> None:
        with self._hot_lock:
            self._hot.pop((name, principal), None)

    async def refresh(self, name: str, principal: str, stale: str) -> str:
        """One refresh for everyone waiting on the same person's token."""
        key = (name, principal)
        self._drop(name, principal)
        return await self._refreshing.run(key, lambda: self._refresh(name, principal, stale))

    async def _refresh(self, name: str, principal: str, stale: str) -> str:
        """This process's one refresh: the lease holder refreshes; any other process waits
        for the holder's token to land in the vault row, and takes the lease itself if the
        holder gives it up (or dies, and the lease runs out) without a new token."""
        with self._hot_lock:
            epoch = self._forgotten.get(principal, 0)

        async def look() -> str | None:
            connection = await self._stored(name, principal)
            return self._refreshed_elsewhere(name, principal, stale, epoch, connection)

        return await by_one_holder(
            self._leases, f"rf:{name}:{principal}", self._lease_s, self._poll_s,
            work=lambda: self._refresh_holding(name, principal, stale, epoch), look=look,
            gave_up=lambda: UpstreamFailure("the upstream's token refresh did not finish"))

    async def _stored(self, name: str, principal: str) -> StoredConnection:
        connection = await self._in_db(self._vault.get, name, principal)
        if connection is None:
            raise UpstreamNotConnected(name, self.connect_url(name))
        return connection

    def _refreshed_elsewhere(self, name: str, principal: str, stale: str, epoch: int,
                             connection: StoredConnection) -> str | None:
        """The token another process's refresh stored in the row, once it is there; None
        while the row still has the stale one."""
        if connection.status != "connected":  # the holder's refresh was refused
            raise UpstreamNeedsReconnect(name, self.connect_url(name))
        current = connection.tokens.get("access_token")
        if current == stale:
            return None
        self._remember(name, principal, str(current), connection.expires_at, epoch)
        return str(current)

    async def _refresh_holding(self, name: str, principal: str, stale: str,
                               epoch: int) -> str:
        """Holding the lease: the row read again (another process may have refreshed, or
        been refused, since this one found the token stale), then the refresh."""
        connection = await self._stored(name, principal)
        found = self._refreshed_elsewhere(name, principal, stale, epoch, connection)
        if found is not None:
            return found
        refresh_token = connection.tokens.get("refresh_token")
        if not refresh_token:
            await self._in_db(self._vault.mark, name, principal, "needs_reconnect")
            raise UpstreamNeedsReconnect(name, self.connect_url(name))
        ep = await self.endpoints(name)
        try:
            tokens = await self._token(name, ep, {"grant_type": "refresh_token",
                                                  "refresh_token": str(refresh_token),
                                                  "resource": await self._resource(
                                                      name, principal)})
        except ConnectFailed as exc:
            if str(exc) in ("invalid_grant", "invalid_client", "unauthorized_client"):
                await self._in_db(self._vault.mark, name, principal, "needs_reconnect")
                raise UpstreamNeedsReconnect(name, self.connect_url(name)) from None
            raise UpstreamFailure("the upstream's token refresh failed") from None
        if not await self._in_db(self._vault.replace, name, principal, tokens):
            # disconnected, or the person deleted, while the refresh was under way: the row
            # is not brought back (a new person of the same name must not inherit it)
            raise UpstreamNotConnected(name, self.connect_url(name))
        self._remember(name, principal, str(tokens["access_token"]), tokens.get("expires_at"),
                       epoch)
        return str(tokens["access_token"])

    def forget(self, principal: str, upstream: str | None = None) -> None:
        """Drop the in-memory copies of a person's upstream tokens (`principal` is the
        Principal key, "issuer|subject"), for every upstream or one: their vault rows were
        deleted or changed elsewhere. Call it when a user is deleted, so a new user of the
        same name is never served the old one's token. Safe from any thread."""
        with self._hot_lock:
            self._forgotten[principal] = self._forgotten.get(principal, 0) + 1
            for key in [k for k in list(self._hot)
                        if k[1] == principal and (upstream is None or k[0] == upstream)]:
                self._hot.pop(key, None)

    # -- the person's view -----------------------------------------------------------------

    async def statuses(self, principal: str) -> dict[str, str]:
        known = await self._in_db(self._vault.statuses, principal)
        return {name: known.get(name, "not_connected") for name in self.upstreams}

    async def disconnect(self, name: str, principal: str) -> None:
        self._drop(name, principal)
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
                        zones, operator_url = self._servers.zones(name, ep)
                        await self._guarded.request("POST", ep.revocation_endpoint, zones,
                                                    operator_url=operator_url, data=form)
        except (ConnectFailed, UpstreamFailure, httpx.HTTPError) as exc:
            log.info("revoking %s tokens at the upstream failed: %s", name, type(exc).__name__)

    async def aclose(self) -> None:
        await self._guarded.aclose()
        self._db.shutdown(wait=False)
