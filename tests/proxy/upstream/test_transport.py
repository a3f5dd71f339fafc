"""The aiohttp-backed httpx transport against a raw loopback server: each failure surfaces as
the httpx exception that names it, streams arrive as sent, and closed responses free their
connection."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

from proxy.destinations import DIAL
from proxy.errors import UpstreamStreamCut, UpstreamTimeout, UpstreamUnavailable
from proxy.upstream import map_errors
from proxy.upstream.transport import AiohttpTransport, PinnedResolver
from tests.helpers import DEADLINE_S

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}/mcp"


async def read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    await reader.readexactly(length)


@asynccontextmanager
async def client(read_s: float = DEADLINE_S
                 ) -> AsyncIterator[tuple[httpx.AsyncClient, AiohttpTransport]]:
    transport = AiohttpTransport()
    async with httpx.AsyncClient(transport=transport,
                                 timeout=httpx.Timeout(DEADLINE_S, read=read_s)) as c:
        yield c, transport


async def test_connection_refused_is_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    async with client() as (c, _):
        with pytest.raises(httpx.ConnectError):
            await c.post(url, content=b"{}")
        with pytest.raises(UpstreamUnavailable), map_errors():
            await c.post(url, content=b"{}")


async def test_a_name_that_does_not_resolve_is_connect_error() -> None:
    async with client() as (c, _):
        with pytest.raises(UpstreamUnavailable), map_errors():
            await c.post("http://no-such-upstream.invalid/mcp", content=b"{}")


async def test_a_silent_upstream_is_a_read_timeout() -> None:
    done = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await done.wait()
        writer.close()

    # the server never answers, so the read timeout always fires: a short one only makes the
    # test quick, and no load can make it pass or fail otherwise (aiohttp's read timer takes
    # no injected clock)
    async with raw_server(silent) as url, client(read_s=0.1) as (c, _):
        with pytest.raises(UpstreamTimeout), map_errors():
            await c.post(url, content=b"{}")
        done.set()


async def test_a_body_cut_short_is_a_broken_stream_not_a_timeout() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"content-length: 100\r\n\r\n{\"partial\":")
        await writer.drain()
        writer.close()

    async with raw_server(cut) as url, client() as (c, _):
        with pytest.raises(UpstreamStreamCut), map_errors():
            await c.post(url, content=b"{}")


async def test_events_arrive_as_sent_and_connections_are_returned() -> None:
    second = asyncio.Event()
    handlers_done = asyncio.Event()

    async def streaming(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await read_request(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()
                handlers_done.set()
                return
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n")
            writer.write(b"d\r\ndata: first\n\n\r\n")
            await writer.drain()
            await second.wait()
            writer.write(b"e\r\ndata: second\n\n\r\n0\r\n\r\n")
            await writer.drain()

    async with raw_server(streaming) as url, client() as (c, transport):
        async with c.stream("POST", url, content=b"{}") as response:
            chunks = response.aiter_bytes()
            assert await chunks.__anext__() == b"data: first\n\n"  # before the second is sent
            assert transport.open_responses == 1
            second.set()
            assert b"".join([chunk async for chunk in chunks]) == b"data: second\n\n"
        assert transport.open_responses == 0
        second.clear()
        # closing early, mid-stream, frees the connection too
        async with c.stream("POST", url, content=b"{}") as response:
            await response.aiter_bytes().__anext__()
        assert transport.open_responses == 0
        second.set()
        await asyncio.wait_for(handlers_done.wait(), 5)


# -- the pinned dial: only the addresses the egress check admitted -----------------------------

async def test_the_pinned_resolver_answers_only_with_the_pin() -> None:
    request = httpx.Request("POST", "http://CRM.internal.:9000/mcp",
                            extensions={DIAL: ["10.0.0.5", "fd00::5"]})
    resolver = PinnedResolver(lambda: request)
    both = await resolver.resolve("crm.internal", 9000, socket.AF_UNSPEC)
    v4 = await resolver.resolve("crm.internal", 9000, socket.AF_INET)
    with pytest.raises(OSError):
        await resolver.resolve("elsewhere.example", 9000, socket.AF_UNSPEC)
    assert [(r["host"], r["port"], r["family"]) for r in both] == [
        ("10.0.0.5", 9000, socket.AF_INET), ("fd00::5", 9000, socket.AF_INET6)]
    assert [r["host"] for r in v4] == ["10.0.0.5"]
    with pytest.raises(OSError):  # outside a request: nothing is resolved, nothing dialled
        await PinnedResolver().resolve("crm.internal", 9000, socket.AF_UNSPEC)
    unadmitted = httpx.Request("POST", "http://crm.internal:9000/mcp")
    with pytest.raises(OSError):  # a request that carries no admitted addresses
        await PinnedResolver(lambda: unadmitted).resolve("crm.internal", 9000, socket.AF_UNSPEC)


async def test_a_pinned_transport_dials_the_admitted_addresses_and_nothing_else() -> None:
    async def ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    transport = AiohttpTransport(pinned=True)
    async with raw_server(ok) as url, httpx.AsyncClient(transport=transport, timeout=5) as c:
        named = url.replace("127.0.0.1", "upstream.invalid")  # no DNS answers this name
        response = await c.post(named, content=b"{}", extensions={DIAL: ["127.0.0.1"]})
        assert (response.status_code, response.content) == (200, b"ok")
        with pytest.raises(httpx.ConnectError):  # not admitted: never resolved, never dialled
            await c.post(named.replace("upstream.invalid", "other.invalid"), content=b"{}")
