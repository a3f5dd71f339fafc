"""httpx transport over aiohttp with a correct exception mapping.

Wraps ``httpx_aiohttp.AiohttpTransport`` (fast: aiohttp's C HTTP parser and
pool) and re-maps what it raises, because httpx-aiohttp 0.2.0 turns a refused
connection and a server disconnect into ``httpx.ConnectTimeout`` and lets
``aiohttp.ClientResponseError`` (a non-HTTP answer) escape unmapped.

The aiohttp session keeps no cookies (``DummyCookieJar``): a gateway must not
carry one upstream's cookies over to another caller's request. httpx's own
client-level jar does the same, so give the AsyncClient ``cookies=no_cookie_jar()``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import aiohttp
import httpx
from aiohttp import client_exceptions as ae
from httpx_aiohttp import AiohttpTransport

# First match wins: most specific aiohttp classes first.
EXCEPTION_MAP: tuple[tuple[type[BaseException], type[httpx.TransportError]], ...] = (
    (ae.ConnectionTimeoutError, httpx.ConnectTimeout),
    (ae.SocketTimeoutError, httpx.ReadTimeout),
    (ae.ServerTimeoutError, httpx.ReadTimeout),
    (ae.ClientProxyConnectionError, httpx.ProxyError),
    (ae.ClientConnectorError, httpx.ConnectError),  # refused, DNS, TLS handshake
    (ae.ServerDisconnectedError, httpx.RemoteProtocolError),
    (ae.ClientPayloadError, httpx.RemoteProtocolError),  # body cut short, bad chunking
    (ae.ClientResponseError, httpx.RemoteProtocolError),  # bad status line or headers
    (ae.NonHttpUrlClientError, httpx.UnsupportedProtocol),
    (ae.ClientOSError, httpx.ReadError),
    (ae.ClientConnectionResetError, httpx.ReadError),
    (ae.ClientConnectionError, httpx.NetworkError),
    (TimeoutError, httpx.TimeoutException),
    (aiohttp.ClientError, httpx.TransportError),
)


# True while the current task's request waits for a free pooled connection.
_waiting_for_pool: ContextVar[bool] = ContextVar("waiting_for_pool", default=False)


async def _queued_start(*_: Any) -> None:
    _waiting_for_pool.set(True)


async def _queued_end(*_: Any) -> None:
    _waiting_for_pool.set(False)


def no_cookie_jar() -> CookieJar:
    """A cookie jar that accepts no cookie, for ``httpx.AsyncClient(cookies=...)``."""
    return CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))


def _original(exc: BaseException) -> BaseException:
    """The aiohttp exception behind one that httpx-aiohttp already (mis)mapped."""
    cause = exc.__cause__
    if isinstance(exc, httpx.TransportError) and isinstance(cause, (aiohttp.ClientError, TimeoutError)):
        return cause
    return exc


@contextmanager
def mapped_exceptions() -> Iterator[None]:
    try:
        yield
    except (TimeoutError, httpx.TransportError, aiohttp.ClientError) as exc:
        original = _original(exc)
        for source, target in EXCEPTION_MAP:
            if isinstance(original, source):
                raise target(str(original) or type(original).__name__) from original
        raise


class _MappedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream) -> None:
        self._inner = inner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with mapped_exceptions():
            async for chunk in self._inner:
                yield chunk

    async def aclose(self) -> None:
        with mapped_exceptions():
            await self._inner.aclose()


class MappedAiohttpTransport(httpx.AsyncBaseTransport):
    """``httpx.AsyncClient(transport=MappedAiohttpTransport(...))``.

    aiohttp's connect timeout also covers the wait for a pooled connection; a
    trace hook tells the two apart so that a full pool gives ``httpx.PoolTimeout``.
    """

    def __init__(self, max_connections: int = 100, keepalive_expiry: float = 60.0) -> None:
        def session() -> aiohttp.ClientSession:  # called on first use, inside the running loop
            trace = aiohttp.TraceConfig()
            trace.on_connection_queued_start.append(_queued_start)
            trace.on_connection_queued_end.append(_queued_end)
            connector = aiohttp.TCPConnector(limit=max_connections, keepalive_timeout=keepalive_expiry)
            return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
                                         trace_configs=[trace])

        self._inner = AiohttpTransport(client=session)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        token = _waiting_for_pool.set(False)
        try:
            with mapped_exceptions():
                response = await self._inner.handle_async_request(request)
        except httpx.ConnectTimeout as exc:
            if _waiting_for_pool.get():
                raise httpx.PoolTimeout(str(exc)) from exc.__cause__
            raise
        finally:
            _waiting_for_pool.reset(token)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(status_code=response.status_code, headers=response.headers,
                              stream=_MappedStream(response.stream), request=request,
                              extensions=response.extensions)

    async def aclose(self) -> None:
        await self._inner.aclose()
