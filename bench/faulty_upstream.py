"""In-process HTTP/1.1 upstream with misbehaving routes, for bench/check_transport.py.

Routes (any method):
  /sse        200 text/event-stream, chunked: event 1, then waits for ``release`` (at most 1 s), event 2, end
  /sse-hold   like /sse but holds the stream open after event 1 until the client goes away (at most 10 s)
  /ok         200 small JSON body
  /set-cookie 200, sets cookie ``upstream=secret``
  /cookie     200, the body is the Cookie header the request carried (empty if none)
  /hang       reads the request, never answers (until the client goes away, at most 10 s)
  /close      reads the request, closes the connection without answering
  /garbage    answers bytes that are not HTTP
  /short      announces Content-Length 100, sends 10 bytes, closes
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Self

HOLD_S = 10.0


class FaultyUpstream:
    def __init__(self) -> None:
        self.release = asyncio.Event()  # set by the client when it has seen event 1
        self.second_sent_at: float | None = None
        self.first_sent_at: float | None = None
        self.open_connections = 0
        self.total_connections = 0
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def reset_sse(self) -> None:
        self.release = asyncio.Event()
        self.first_sent_at = self.second_sent_at = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open_connections += 1
        self.total_connections += 1
        try:
            while not reader.at_eof():
                request = await self._read_request(reader)
                if request is None or not await self._answer(*request, reader, writer):
                    break
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.open_connections -= 1
            writer.close()

    @staticmethod
    async def _read_request(reader: asyncio.StreamReader) -> tuple[str, bytes] | None:
        """(path, Cookie header) of the next request."""
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HOLD_S)
        lines = head.decode("latin-1").split("\r\n")
        length, cookie = 0, b""
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
            elif name.strip().lower() == "cookie":
                cookie = value.strip().encode("latin-1")
        if length:
            await reader.readexactly(length)
        parts = lines[0].split(" ")
        return (parts[1], cookie) if len(parts) == 3 else None

    async def _answer(self, path: str, cookie: bytes, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> bool:
        """Write the route's answer; True when the connection stays usable."""
        if path in ("/ok", "/set-cookie", "/cookie"):
            body = cookie if path == "/cookie" else b'{"ok":true}'
            extra = b"Set-Cookie: upstream=secret; Path=/\r\n" if path == "/set-cookie" else b""
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
                         % (extra, len(body), body))
            await writer.drain()
            return True
        if path in ("/sse", "/sse-hold"):
            await self._sse(writer, reader, hold=path == "/sse-hold")
            return path == "/sse"
        if path == "/hang":
            await _until_eof(reader)
        elif path == "/garbage":
            writer.write(b"THIS IS NOT HTTP\r\n\r\n")
            await writer.drain()
        elif path == "/short":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n0123456789")
            await writer.drain()
        return False  # /close and the rest: drop the connection

    async def _sse(self, writer: asyncio.StreamWriter, reader: asyncio.StreamReader, hold: bool) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        writer.write(_chunk(b'event: message\ndata: {"n":1}\n\n'))
        await writer.drain()
        self.first_sent_at = time.monotonic()
        if hold:
            await _until_eof(reader)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.release.wait(), 1.0)
        self.second_sent_at = time.monotonic()
        writer.write(_chunk(b'event: message\ndata: {"n":2}\n\n') + b"0\r\n\r\n")
        await writer.drain()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _until_eof(reader: asyncio.StreamReader) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(reader.read(), HOLD_S)
