"""HTTP to an upstream's authorization server through the egress guard (proxy.upstream.fetch):
the host is resolved once, every address must be in a zone the request may use and not a cloud
metadata address, and the connection goes to exactly those addresses. Redirects are never
followed.

Two kinds of URL go through here. One the operator wrote in the config (an upstream's URL, from
which its protected-resource metadata URL is made, or an `[upstreams.oauth]` endpoint) may use
the upstream's `zones`, and may name a cloud metadata address literally, as an upstream URL may.
One that came from a discovery document (the authorization server, its token, registration
and revocation endpoints) is what the upstream, or whoever controls its documents, chose: it
never reaches a cloud metadata address, and reaches loopback or the LAN only when the upstream
itself is there (see `discovery_zones`)."""

from __future__ import annotations

import ipaddress
from collections.abc import Collection
from typing import Any
from urllib.parse import urlsplit

import httpx

from proxy.destinations import Refused, Resolver, classify
from proxy.errors import UpstreamFailure, UpstreamUnavailable
from proxy.upstream.fetch import GuardedFetch


class EgressRefused(UpstreamFailure):
    message = "the upstream's authorization server is not reachable under the egress policy"
    upstream_kind = "egress_denied"


class GuardedClient:
    def __init__(self, resolver: Resolver | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._fetch = GuardedFetch(resolver, transport, timeout=10.0)

    async def request(self, method: str, url: str, zones: Collection[str], *,
                      operator_url: bool = False, **kwargs: Any) -> httpx.Response:
        """`operator_url`: the operator wrote this URL (or its origin) in the config, so a
        cloud metadata address it names literally is allowed. A URL from a discovery document
        never is."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise EgressRefused()
        host = parts.hostname or ""
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise EgressRefused() from None
        if not host:
            raise EgressRefused()
        try:
            addresses = await self._fetch.admit(host, port, zones, named_by_operator=operator_url)
        except Refused:
            raise EgressRefused() from None
        except OSError:
            raise UpstreamUnavailable("the upstream's authorization server does not "
                                      "resolve") from None
        try:
            return await self._fetch.request(method, url, addresses, **kwargs)
        except httpx.HTTPError:
            raise UpstreamUnavailable("the upstream's authorization server is unreachable") \
                from None

    async def discovery_zones(self, upstream_url: str, zones: Collection[str]) -> set[str]:
        """The zones a URL from the upstream's discovery documents may use: `remote`, and
        loopback or lan only where the upstream's own (operator-written) host is, all within
        the upstream's `zones`. A remote upstream cannot send the gateway into the LAN."""
        allowed = {"remote"}
        host = urlsplit(upstream_url).hostname or ""
        try:
            addresses = [str(ipaddress.ip_address(host.strip("[]")))]
        except ValueError:
            try:
                addresses = await self._fetch.resolver.resolve(host, 443)
            except OSError:
                addresses = []
        for text in addresses:
            try:
                allowed.add(classify(ipaddress.ip_address(text)))
            except ValueError:
                continue
        return allowed & set(zones)

    async def aclose(self) -> None:
        await self._fetch.aclose()
