"""An httpx transport over aiohttp's connection pool.

httpx's own pool (httpcore) loses throughput as concurrency rises: measured on the bare
pass-through, 529 -> 323 req/s from concurrency 1 to 64, against 758 -> 1,035 with aiohttp's
pool underneath (bench/README.md). The gateway keeps httpx's API (requests, responses, respx
in tests) and puts aiohttp's pool under it. This transport, rather than the httpx-aiohttp
package's, because every failure must map to the httpx exception that names it: a stream cut by
the upstream is a ReadError, not a timeout, and the gateway's wire message depends on it.

A pinned transport is the dial half of the egress guard (proxy.destinations.admit): each request
carries the addresses it was admitted to as its `DIAL` extension, and a connection it opens
goes to those addresses and nothing else.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import aiohttp
import httpx
from aiohttp.abc import AbstractResolver, ResolveResult

from proxy.destinations import DIAL

_CHUNK = 64 * 1024


@contextmanager
def _mapped(request: httpx.Request) -> Iterator[None]:
    """aiohttp's exceptions, as the httpx exceptions that mean the same thing."""
    try:
        yield
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            raise httpx.ConnectTimeout(str(exc), request=request) from exc
        raise httpx.ReadTimeout(str(exc) or "read timed out", request=request) from exc
    except aiohttp.ClientConnectorError as exc:
        raise httpx.ConnectError(str(exc), request=request) from exc
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError,
            aiohttp.ClientResponseError) as exc:
        raise httpx.RemoteProtocolError(str(exc), request=request) from exc
    except aiohttp.InvalidURL as exc:
        raise httpx.UnsupportedProtocol(str(exc), request=request) from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise httpx.ReadError(str(exc), request=request) from exc


class _Body(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request,
                 transport: AiohttpTransport) -> None:
        self._response = response
        self._request = request
        self._transport = transport
        self._open = True
        transport.open_responses += 1

    async def __aiter__(self) -> AsyncIterator[bytes]:
        content = self._response.content
        while True:
            with _mapped(self._request):
                chunk = await content.readany()
            if not chunk:
                return
            yield chunk

    async def aclose(self) -> None:
        # A body read to its end returns the connection to the pool; one closed early
        # cannot be reused, so its connection is closed.
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()
        if self._open:
            self._open = False
            self._transport.open_responses -= 1


# The request a pinned transport is sending, for its resolver: aiohttp asks a connector's
# resolver about a host with no request in hand, so the request's own `DIAL` addresses reach it
# through this, set and reset around the one call that may connect.
_SENDING: ContextVar[httpx.Request | None] = ContextVar("tollhouse_sending", default=None)


class PinnedResolver(AbstractResolver):
    """aiohttp's resolver, answering only with the `DIAL` addresses of the request in progress.

    Used with `use_dns_cache=False`: with the cache on, aiohttp shares one lookup between
    concurrent requests for a host, which could hand one request's pin to another. aiohttp
    never asks a resolver about an IP literal; those were checked whole by `admit`. Any other
    question is an OSError, which aiohttp reports as a connect failure: nothing unchecked is
    dialled."""

    def __init__(self, sending: Callable[[], httpx.Request | None] = _SENDING.get) -> None:
        self._sending = sending

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        request = self._sending()
        addresses = None if request is None else request.extensions.get(DIAL)
        if addresses is None or request is None or _bare(request.url.host) != _bare(host):
            raise OSError(f"egress: no checked address for {host}")
        results: list[ResolveResult] = []
        for address in addresses:
            fam = socket.AF_INET6 if ":" in address else socket.AF_INET
            if family in (socket.AF_UNSPEC, fam):
                results.append(ResolveResult(
                    hostname=host, host=address, port=port, family=fam,
                    proto=socket.IPPROTO_TCP, flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV))
        if not results:
            raise OSError(f"egress: no checked address for {host} in family {family!r}")
        return results

    async def close(self) -> None:
        return None


def _bare(host: str) -> str:
    return host.lower().rstrip(".").strip("[]")


class AiohttpTransport(httpx.AsyncBaseTransport):
    """Pooled HTTP/1.1 to upstreams; connects lazily inside the running event loop."""

    def __init__(self, *, max_connections: int = 0, keepalive_expiry: float = 30.0,
                 pinned: bool = False) -> None:
        self._pinned = pinned
        self._max_connections = max_connections
        self._keepalive_expiry = keepalive_expiry
        self._session: aiohttp.ClientSession | None = None
        self.open_responses = 0  # responses not yet closed: each holds a connection

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            if self._pinned:
                # each connection resolves to its request's admitted addresses; no shared cache
                connector = aiohttp.TCPConnector(limit=self._max_connections,
                                                 keepalive_timeout=self._keepalive_expiry,
                                                 resolver=PinnedResolver(), use_dns_cache=False)
            else:
                connector = aiohttp.TCPConnector(limit=self._max_connections,
                                                 keepalive_timeout=self._keepalive_expiry,
                                                 ttl_dns_cache=10)
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",),
                cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {})
        body = request.content if request.method != "GET" else None
        sending = _SENDING.set(request) if self._pinned else None
        try:
            with _mapped(request):
                response = await self._client().request(
                    request.method, str(request.url), headers=request.headers.multi_items(),
                    data=body or None, allow_redirects=False, compress=None,
                    timeout=aiohttp.ClientTimeout(total=None, connect=timeout.get("pool"),
                                                  sock_connect=timeout.get("connect"),
                                                  sock_read=timeout.get("read")))
        finally:
            if sending is not None:
                _SENDING.reset(sending)
        return httpx.Response(response.status, headers=list(response.raw_headers),
                              stream=_Body(response, request, self), request=request,
                              extensions={"http_version": b"HTTP/1.1"})

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
