"""HTTP to an upstream's authorization server through the egress guard: the host is resolved
once, every address must be in a zone the upstream may use and not a cloud metadata address,
and the connection goes to exactly those addresses. Redirects are never followed."""

from __future__ import annotations

import ipaddress
from collections.abc import Collection
from typing import Any
from urllib.parse import urlsplit

import httpx

from proxy.egress import Resolver, SystemResolver, classify, dialling, is_metadata
from proxy.errors import UpstreamFailure, UpstreamUnavailable
from proxy.upstream.transport import AiohttpTransport


class EgressRefused(UpstreamFailure):
    message = "the upstream's authorization server is not reachable under the egress policy"


class GuardedClient:
    def __init__(self, resolver: Resolver | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._resolver = resolver or SystemResolver()
        self._http = httpx.AsyncClient(transport=transport or AiohttpTransport(pinned=True),
                                       follow_redirects=False, trust_env=False, timeout=10.0)
        self._pinned = transport is None

    async def request(self, method: str, url: str, zones: Collection[str],
                      **kwargs: Any) -> httpx.Response:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        addresses = await self._admit(host, port, zones, literal_ok=url)
        try:
            if not self._pinned:
                return await self._http.request(method, url, **kwargs)
            with dialling(host, addresses):
                return await self._http.request(method, url, **kwargs)
        except httpx.HTTPError:
            raise UpstreamUnavailable("the upstream's authorization server is unreachable") \
                from None

    async def _admit(self, host: str, port: int, zones: Collection[str], literal_ok: str
                     ) -> list[str]:
        try:
            literal = ipaddress.ip_address(host.strip("[]"))
            addresses = [str(literal)]
        except ValueError:
            try:
                addresses = await self._resolver.resolve(host, port)
            except OSError:
                raise UpstreamUnavailable("the upstream's authorization server does not "
                                          "resolve") from None
        if not addresses:
            raise UpstreamUnavailable("the upstream's authorization server does not resolve")
        for text in addresses:
            ip = ipaddress.ip_address(text)
            if classify(ip) not in zones or (is_metadata(ip) and text != host.strip("[]")):
                raise EgressRefused()
        return addresses

    async def aclose(self) -> None:
        await self._http.aclose()
