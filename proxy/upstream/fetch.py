"""HTTP to a URL someone else chose, through the egress guard: the URL's host is admitted first
(`proxy.destinations.admit`: resolved once, every address in a zone the request may use and none a
cloud metadata address the operator did not name), then the request dials exactly those
addresses over a pinned pool (`DIAL`, proxy.upstream.transport). Redirects are never followed.

The connect flow (proxy.connect.guarded) and client metadata documents (proxy.oauth.cimd) fetch
through this; upstream MCP calls take the same two steps with a pin per upstream
(proxy.destinations.Destinations and UpstreamClient.open). Each caller parses its own URLs and says
what a refusal means on its surface.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx

from proxy.destinations import DIAL, Destination, Resolver, SystemResolver, admit
from proxy.upstream.transport import AiohttpTransport


class GuardedFetch:
    def __init__(self, resolver: Resolver | None = None,
                 transport: httpx.AsyncBaseTransport | None = None, *,
                 timeout: float = 10.0) -> None:
        self.resolver = resolver or SystemResolver()
        self._http = httpx.AsyncClient(transport=transport or AiohttpTransport(pinned=True),
                                       follow_redirects=False, trust_env=False, timeout=timeout)

    async def admit(self, host: str, port: int, zones: Collection[str], *,
                    named_by_operator: bool = False) -> Sequence[str]:
        """The addresses a request to `host` may dial; raise `proxy.destinations.Refused`, or
        OSError when the host does not resolve."""
        return await admit(Destination.of(host, port, zones,
                                          named_by_operator=named_by_operator), self.resolver)

    async def request(self, method: str, url: str, addresses: Sequence[str],
                      **kwargs: Any) -> httpx.Response:
        """One request to `url`, whose host `admit` answered `addresses`."""
        return await self._http.request(method, url, extensions={DIAL: addresses}, **kwargs)

    def stream(self, method: str, url: str, addresses: Sequence[str],
               **kwargs: Any) -> AbstractAsyncContextManager[httpx.Response]:
        return self._http.stream(method, url, extensions={DIAL: addresses}, **kwargs)

    async def aclose(self) -> None:
        await self._http.aclose()
