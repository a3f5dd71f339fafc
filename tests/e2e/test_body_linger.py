"""A body over a cap, sent on a connection that already served a request, gets its 413.

Refusing a body and closing the connection while the rest of it is still arriving makes the
kernel answer the unread bytes with a reset, which throws away the 413 the client has not read
yet (httpx: ReadError). Tollhouse reads and discards the rest of such a body, within a bound of
bytes and time, before it ends the answer (proxy/bodycap.py), on /mcp, /api/v1 and /oauth/ alike.
Only a real server on a real socket shows it, so these run Hypercorn on a loopback port.
"""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from proxy import bodycap
from proxy.config import from_dict
from tests import db_backends
from tests.conftest import MCP_HEADERS, running_gateway
from tests.servers import bound_socket

CAP = 4096
BIG = 4 * 1024 * 1024  # over the cap, and more than loopback socket buffers hold; under the
#                        bound of what is read and discarded
ATTEMPTS = 12

MCP_413 = {"jsonrpc": "2.0", "id": None,
           "error": {"code": -32600, "message": "Request body too large"}}
API_413 = {"detail": f"request body exceeds the {CAP}-byte limit"}
OAUTH_413 = {"error": "invalid_request",
             "error_description": "request body exceeds the 65536-byte limit"}

PATHS: dict[str, tuple[str, dict[str, str], dict[str, Any]]] = {
    "mcp": ("/mcp/e", MCP_HEADERS, MCP_413),
    "api": ("/api/v1/servers", {"content-type": "application/json"}, API_413),
    "oauth": ("/oauth/token", {"content-type": "application/x-www-form-urlencoded"},
              OAUTH_413),
}


@asynccontextmanager
async def gateway(**server: Any) -> AsyncIterator[str]:
    sock, url = bound_socket()
    cfg = from_dict({
        "server": {"listen": "127.0.0.1:8080", "public_url": url, "max_request_bytes": CAP,
                   **server},
        "auth": {"mode": "jwt"},
        "oauth_server": {"enabled": True},
        "database": {"url": db_backends.url()},
        "upstreams": [{"name": "e", "url": "http://upstream.test/mcp"}],
    }, env={})
    try:
        async with running_gateway(cfg, sock=sock, secret_key="linger-test-secret"):
            yield url
    finally:
        sock.close()  # a no-op once detached


def one_connection() -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=1,
                                                             max_keepalive_connections=1))


def body_of(size: int) -> bytes:
    return b'{"jsonrpc":"2.0","id":1,"method":"ping","pad":"' + b"x" * size + b'"}'


@pytest.mark.parametrize("where", list(PATHS))
async def test_oversized_body_on_a_kept_alive_connection_gets_its_413(where: str) -> None:
    path, headers, expected = PATHS[where]
    big = body_of(BIG)
    async with gateway() as url:
        for _ in range(ATTEMPTS):
            async with one_connection() as client:
                assert (await client.get(f"{url}/elsewhere")).status_code == 404
                refused = await client.post(f"{url}{path}", content=big, headers=headers)
                assert refused.status_code == 413
                assert orjson.loads(refused.content) == expected
                # the rest of the body was not read when the answer began: the client is told
                # not to reuse the connection, and a next request on a new one is served
                assert refused.headers["connection"] == "close"
                assert (await client.get(f"{url}/elsewhere")).status_code == 404


@pytest.mark.parametrize("where", list(PATHS))
async def test_oversized_streamed_body_on_a_kept_alive_connection_gets_its_413(where: str
                                                                               ) -> None:
    path, headers, expected = PATHS[where]
    big = body_of(BIG)

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked
        for i in range(0, len(big), 16384):
            yield big[i:i + 16384]

    async with gateway() as url:
        for _ in range(ATTEMPTS):
            async with one_connection() as client:
                assert (await client.get(f"{url}/elsewhere")).status_code == 404
                refused = await client.post(f"{url}{path}", content=chunks(), headers=headers)
                assert refused.status_code == 413
                assert orjson.loads(refused.content) == expected


@pytest.mark.parametrize("where", list(PATHS))
async def test_oversized_body_over_http2_gets_its_413(where: str) -> None:
    """HTTP/2 has no connection to close, but a stream answered before its body ended loses
    the connection too (Hypercorn fails on the DATA frames that keep coming): the rest is read
    there as well."""
    path, headers, expected = PATHS[where]
    big = body_of(BIG)
    async with gateway() as url, httpx.AsyncClient(http1=False, http2=True, timeout=10) as client:
        for _ in range(3):
            assert (await client.get(f"{url}/elsewhere")).status_code == 404
            refused = await client.post(f"{url}{path}", content=big, headers=headers)
            assert refused.http_version == "HTTP/2" and refused.status_code == 413
            assert orjson.loads(refused.content) == expected
            assert "connection" not in refused.headers
    # httpcore leaves the socket of an HTTP/2 connection the server dropped mid-body to the
    # garbage collector (the client's, not the gateway's): collected here, where its
    # ResourceWarning is expected, not in whatever test the collector next runs in
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


async def test_a_body_past_the_discard_bound_is_not_read() -> None:
    """What is declared beyond the bound of bytes read and discarded is refused at once, with
    `Connection: close`, and nothing of it is read."""
    async with gateway() as url:
        reader, writer = await _connect(url)
        try:
            writer.write(b"POST /mcp/e HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % (bodycap.LINGER_BYTES + CAP + 1))
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 413")
            assert b"\r\nconnection: close\r\n" in head.lower()
            assert orjson.loads(await reader.read(-1)) == MCP_413  # and the server closed
        finally:
            writer.close()


async def test_a_body_that_ends_within_the_bound_closes_cleanly() -> None:
    """The discarded rest is read to its end, so the client sees the 413 and an orderly end of
    the connection, never a reset."""
    async with gateway() as url:
        reader, writer = await _connect(url)
        try:
            writer.write(b"GET /elsewhere HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            await reader.readexactly(length)
            big = body_of(BIG)
            writer.write(b"POST /api/v1/servers HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                         % len(big) + big)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 413")
            assert orjson.loads(await reader.read(-1)) == API_413  # EOF, not ECONNRESET
        finally:
            writer.close()


async def test_the_discard_stops_after_its_bound_of_bytes(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """A body that goes on and on is read past the cap for LINGER_BYTES at most: then the
    connection is closed under the client, which is still sending."""
    monkeypatch.setattr(bodycap, "LINGER_BYTES", 256 * 1024)
    monkeypatch.setattr(bodycap, "LINGER_S", 60.0)
    async with gateway() as url:
        _reader, writer = await _connect(url)
        try:
            writer.write(b"POST /api/v1/servers HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
            sent = 0
            with pytest.raises(ConnectionError):
                while sent < 1024 * 1024 * 1024:  # a gigabyte, were it all read
                    writer.write(chunk)
                    await writer.drain()
                    sent += 65536
        finally:
            writer.close()


async def test_the_discard_stops_after_its_bound_of_time(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """A client that stops sending in the middle of a refused body has the 413 ended and the
    connection closed after LINGER_S, not after the 60-second body timeout or never."""
    monkeypatch.setattr(bodycap, "LINGER_S", 0.2)
    async with gateway() as url:
        reader, writer = await _connect(url)
        try:
            writer.write(b"POST /mcp/e HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % (2 * CAP) + b"x" * (CAP + 1))
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(-1), 30)  # to the end: the server closed
            head, _, rest = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 413") and orjson.loads(rest) == MCP_413
        finally:
            writer.close()


async def _connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(url)
    return await asyncio.open_connection(parts.hostname, parts.port)
