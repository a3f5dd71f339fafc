"""HTTP client variants the bare pass-through can forward with.

Every variant is wrapped in a ``Forwarder``: one POST of raw bytes to the
upstream, giving back status, body and content type, either buffered or as an
async iterator of raw chunks (``streamed``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

# Headers the pass-through copies from the client request to the upstream.
FORWARD_HEADERS = ("content-type", "accept", "mcp-protocol-version", "mcp-session-id")


@dataclass
class Upstream:
    status: int
    content_type: str | None
    body: bytes | AsyncIterator[bytes]


class Forwarder(Protocol):
    async def forward(self, url: str, body: bytes, headers: dict[str, str], stream: bool) -> Upstream: ...

    async def aclose(self) -> None: ...


class HttpxForwarder:
    """Forwarder over an httpx (or API-compatible httpx2) AsyncClient."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def forward(self, url: str, body: bytes, headers: dict[str, str], stream: bool) -> Upstream:
        if not stream:
            r = await self.client.post(url, content=body, headers=headers)
            return Upstream(r.status_code, r.headers.get("content-type"), r.content)
        request = self.client.build_request("POST", url, content=body, headers=headers)
        r = await self.client.send(request, stream=True)
        return Upstream(r.status_code, r.headers.get("content-type"), _relay(r.aiter_raw(), r.aclose))

    async def aclose(self) -> None:
        await self.client.aclose()


class AiohttpForwarder:
    """Reference only: plain aiohttp.ClientSession, no httpx API on top."""

    def __init__(self, limit: int) -> None:
        import aiohttp

        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit, keepalive_timeout=60),
            auto_decompress=False,
        )

    async def forward(self, url: str, body: bytes, headers: dict[str, str], stream: bool) -> Upstream:
        r = await self.session.post(url, data=body, headers=headers)
        if not stream:
            async with r:
                return Upstream(r.status, r.headers.get("content-type"), await r.read())

        async def close() -> None:
            r.release()

        return Upstream(r.status, r.headers.get("content-type"), _relay(r.content.iter_any(), close))

    async def aclose(self) -> None:
        await self.session.close()


class LocalForwarder:
    """No upstream at all: answers the echo result itself (the Quart + Hypercorn floor)."""

    BODY = b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"echo"}],"isError":false}}'

    async def forward(self, url: str, body: bytes, headers: dict[str, str], stream: bool) -> Upstream:
        return Upstream(200, "application/json", self.BODY)

    async def aclose(self) -> None:
        pass


async def _relay(chunks: AsyncIterator[bytes], close: Callable[[], Any]) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        await close()


def _httpx_limits(module: Any, size: int, keepalive: int | None = None) -> Any:
    keep = size if keepalive is None else keepalive
    return module.Limits(max_connections=size, max_keepalive_connections=keep, keepalive_expiry=60)


def _httpx(pool: int | None, keepalive: int | None = None) -> Forwarder:
    if pool is None:
        return HttpxForwarder(httpx.AsyncClient())
    return HttpxForwarder(httpx.AsyncClient(limits=_httpx_limits(httpx, pool, keepalive), trust_env=False))


def _httpx_aiohttp(pool: int) -> Forwarder:
    from httpx_aiohttp import AiohttpTransport

    transport = AiohttpTransport(limits=_httpx_limits(httpx, pool))
    return HttpxForwarder(httpx.AsyncClient(transport=transport, trust_env=False))


def _httpx_aiohttp_mapped(pool: int) -> Forwarder:
    from aiohttp_transport import MappedAiohttpTransport, no_cookie_jar

    transport = MappedAiohttpTransport(pool)
    return HttpxForwarder(httpx.AsyncClient(transport=transport, trust_env=False, cookies=no_cookie_jar()))


def _httpx_tollhouse() -> Forwarder:
    from proxy.upstream.transport import AiohttpTransport  # the gateway's own transport

    return HttpxForwarder(httpx.AsyncClient(transport=AiohttpTransport(), trust_env=False))


def _httpx2(pool: int | None) -> Forwarder:
    import httpx2

    if pool is None:
        return HttpxForwarder(httpx2.AsyncClient())
    return HttpxForwarder(httpx2.AsyncClient(limits=_httpx_limits(httpx2, pool), trust_env=False))


def _httpx2_aiohttp(pool: int) -> Forwarder:
    import httpx2
    from httpx_aiohttp.httpx2 import AiohttpTransport

    transport = AiohttpTransport(limits=_httpx_limits(httpx2, pool))
    return HttpxForwarder(httpx2.AsyncClient(transport=transport, trust_env=False))


TRANSPORTS: dict[str, Callable[[], Forwarder]] = {
    "default": lambda: _httpx(None),  # httpx.AsyncClient(): 100 conns, 20 kept alive
    "tuned": lambda: _httpx(100),  # 100 conns, all 100 kept alive
    "tuned-256": lambda: _httpx(256),
    "tuned-32": lambda: _httpx(32),  # bounded pool: at c=64 requests queue for a connection
    "aiohttp": lambda: _httpx_aiohttp(100),  # httpx API over httpx-aiohttp's AiohttpTransport
    "aiohttp-mapped": lambda: _httpx_aiohttp_mapped(100),  # + bench/aiohttp_transport.py's exception fix
    "tollhouse-transport": _httpx_tollhouse,  # proxy/upstream/transport.py, when installed
    "httpx2": lambda: _httpx2(None),
    "httpx2-tuned": lambda: _httpx2(100),
    "httpx2-aiohttp": lambda: _httpx2_aiohttp(100),
    "aiohttp-raw": lambda: AiohttpForwarder(100),  # reference: no httpx layer at all
    "none": LocalForwarder,  # reference: no upstream hop, Quart + Hypercorn only
}


def make_forwarder(name: str) -> Forwarder:
    try:
        return TRANSPORTS[name]()
    except KeyError:
        raise SystemExit(f"unknown transport {name!r}; choose from {', '.join(TRANSPORTS)}") from None
