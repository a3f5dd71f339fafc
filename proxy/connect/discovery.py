"""Each per_user upstream's authorization server as the connect flow and a refresh reach it
(`AuthorizationServers`): its endpoints and the gateway's client there (`Endpoints`), either
configured or discovered once per process: the upstream's protected-resource metadata
(RFC 9728), then its authorization server's metadata (RFC 8414), then, when no client id is
configured, the gateway's own client, registered once for every gateway process (RFC 7591,
proxy.connect.registration). It also says where a request to one of those endpoints may go
(`zones`): every request goes through the egress guard (proxy.connect.guarded), and a failure
names only what could not be fetched. The connect flow, the tokens and their refresh are
`Connections`' (proxy.connect.manager).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard
from urllib.parse import urlsplit

from proxy.config import UpstreamConfig
from proxy.connect import ConnectFailed
from proxy.connect.guarded import GuardedClient
from proxy.connect.registration import InDb, Registrar
from proxy.connect.vault import ClientKey, Vault
from proxy.errors import UpstreamFailure
from proxy.singleflight import SingleFlight
from proxy.state.leases import LeaseStore

log = logging.getLogger("tollhouse.connect")


@dataclass(frozen=True)
class Endpoints:
    authorization_endpoint: str
    token_endpoint: str
    revocation_endpoint: str
    client_id: str
    client_secret: str
    scopes: tuple[str, ...]
    # None: the operator configured these URLs. Else they came from discovery documents, and
    # the gateway sends requests to them only in these zones (never to a metadata address)
    discovered_zones: frozenset[str] | None = None


def _http_url(value: object) -> TypeGuard[str]:
    """A string that is an absolute http(s) URL with a host (from a discovery document)."""
    if not isinstance(value, str) or not value.startswith(("https://", "http://")):
        return False
    try:
        return bool(urlsplit(value).hostname)
    except ValueError:
        return False


class AuthorizationServers:
    """The authorization server of each upstream in `upstreams` (the per_user ones), for a
    gateway at `public_url`; `in_db` runs a vault step off the event loop, and the lease
    store lets one gateway process register the client while the others wait for its row."""

    def __init__(self, upstreams: Mapping[str, UpstreamConfig], public_url: str,
                 guarded: GuardedClient, vault: Vault, in_db: InDb, leases: LeaseStore, *,
                 lease_s: float, poll_s: float) -> None:
        self._upstreams = upstreams
        self._public_url = public_url
        self._guarded = guarded
        # each upstream's authorization server and the gateway's client there, for the life
        # of the process: discovered once (one discovery at a time per upstream), and a
        # registered client read from the database once. Its row is written once and never
        # changed, so this copy cannot disagree with it; an upstream that names another
        # authorization server, or a row deleted by hand, is seen at the next start
        self._endpoints: dict[str, Endpoints] = {}
        self._discovering: SingleFlight[str, Endpoints] = SingleFlight(detached=True)
        self._registrar = Registrar(vault, in_db, guarded, self._json, leases,
                                    client_name=f"Tollhouse ({public_url})",
                                    lease_s=lease_s, poll_s=poll_s)

    async def endpoints(self, name: str) -> Endpoints:
        """The upstream's authorization server, found (or discovered) once."""
        known = self._endpoints.get(name)
        if known is not None:
            return known
        return await self._discovering.run(name, lambda: self._find_endpoints(name))

    async def _find_endpoints(self, name: str) -> Endpoints:
        up = self._upstreams[name]
        o = up.oauth
        if not o.discover:
            found = Endpoints(o.authorization_endpoint, o.token_endpoint, o.revocation_endpoint,
                              o.client_id, o.client_secret, tuple(o.scopes))
        else:
            found = await self._discover(up)
        self._endpoints[name] = found  # only once all of it succeeded
        return found

    def zones(self, name: str, ep: Endpoints) -> tuple[Collection[str], bool]:
        """Where a request to one of these endpoints may go, and whether the operator wrote
        its URL (only then may it name a cloud metadata address literally)."""
        if ep.discovered_zones is None:
            return self._upstreams[name].zones, True
        return ep.discovered_zones, False

    async def _json(self, up: UpstreamConfig, method: str, url: str, zones: Collection[str],
                    operator_url: bool, what: str, **kwargs: Any) -> dict[str, Any]:
        """A JSON object from the upstream's side. A failure names only `what` failed: the
        status or the kind of error could tell a person which internal addresses answer."""
        try:
            response = await self._guarded.request(method, url, zones,
                                                   operator_url=operator_url, **kwargs)
        except UpstreamFailure as exc:
            log.info("connect %s: %s %s failed: %s", up.name, method, url, exc)
            raise ConnectFailed(f"{what} could not be fetched") from None
        if response.status_code >= 400:
            log.info("connect %s: %s %s answered HTTP %s", up.name, method, url,
                     response.status_code)
            raise ConnectFailed(f"{what} could not be fetched")
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise ConnectFailed(f"{what} is not a JSON object")
        return body

    async def _discover(self, up: UpstreamConfig) -> Endpoints:
        parts = urlsplit(up.url)
        origin = f"{parts.scheme}://{parts.netloc}"
        # the protected-resource metadata is at the origin the operator configured; what it
        # names was chosen by the upstream, so it may reach fewer places
        prm = await self._json(up, "GET", f"{origin}/.well-known/oauth-protected-resource"
                                          f"{parts.path}", up.zones, True,
                               "the upstream's protected-resource metadata")
        zones = frozenset(await self._guarded.discovery_zones(up.url, up.zones))
        servers = prm.get("authorization_servers")
        if not isinstance(servers, list) or not servers or not _http_url(servers[0]):
            raise ConnectFailed("the upstream names no authorization server")
        issuer = servers[0].rstrip("/")
        isp = urlsplit(issuer)
        meta = await self._json(up, "GET", f"{isp.scheme}://{isp.netloc}/.well-known/"
                                           f"oauth-authorization-server{isp.path}", zones, False,
                                "the authorization server's metadata")
        found_issuer = meta.get("issuer")
        if not isinstance(found_issuer, str) or found_issuer.rstrip("/") != issuer:
            raise ConnectFailed("the authorization server's metadata names another issuer")
        methods = meta.get("code_challenge_methods_supported")
        if not isinstance(methods, list) or "S256" not in methods:
            raise ConnectFailed("the authorization server does not offer PKCE S256")
        authorization, token = meta.get("authorization_endpoint"), meta.get("token_endpoint")
        revocation = meta.get("revocation_endpoint") or ""
        if not _http_url(authorization) or not _http_url(token) \
                or not (revocation == "" or _http_url(revocation)):
            raise ConnectFailed("the authorization server's metadata lacks a usable "
                                "authorization or token endpoint")
        o = up.oauth
        client_id, secret = o.client_id, o.client_secret  # a configured client wins
        if not client_id:
            registration = meta.get("registration_endpoint")
            if not _http_url(registration):
                raise ConnectFailed("no client_id is configured and the authorization server "
                                    "offers no dynamic client registration")
            key = ClientKey(up.name, issuer, registration,
                            f"{self._public_url}/connect/{up.name}/callback")
            client = await self._registrar.client(up, key, zones)
            client_id, secret = client.client_id, client.client_secret
        offered = prm.get("scopes_supported")
        scopes = tuple(o.scopes) or (tuple(s for s in offered if isinstance(s, str))
                                     if isinstance(offered, list) else ())
        return Endpoints(str(authorization), str(token), str(revocation), client_id, secret,
                         scopes, discovered_zones=zones)
