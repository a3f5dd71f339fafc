"""An upstream that streams large answers without holding them: a tools/call of `big` with
`{"size": n}` is answered with a text result of n bytes, written 64 KiB at a time as the
reader takes it, as JSON under `/json` and as one SSE
event under `/sse`. The SDK's servers build each answer whole, so they serve the byte-exact
checks; this one serves the memory checks, where the upstream must not be what holds memory.
`tools/list` answers `list_bytes` of tools (an answer the gateway must hold to filter).
`closed` is set each time a reader goes away before the end of an answer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson

PIECE = b"0123456789abcdef" * 4096  # 64 KiB of the text


def result_text(size: int) -> bytes:
    """The text of a `size`-byte answer (what the client must receive)."""
    whole, rest = divmod(size, len(PIECE))
    return PIECE * whole + PIECE[:rest]


class LargeUpstream:
    """A plain asyncio HTTP/1.1 server (one request per connection), so a reader that goes
    away is seen at once: the next write's drain fails (Hypercorn's send does not say so)."""

    def __init__(self, list_bytes: int = 2 * 1024 * 1024) -> None:
        self.list_bytes = list_bytes
        self.closed = asyncio.Event()
        self.finished = 0  # answers written to their end

    @contextlib.asynccontextmanager
    async def serve(self) -> AsyncIterator[str]:
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.close()
            await server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split()[1]
            length = next(int(v) for k, _, v in (line.partition(":") for line in lines[1:])
                          if k.strip().lower() == "content-length")
            msg = orjson.loads(await reader.readexactly(length))
            await self._respond(msg, path.startswith("/sse"), writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.closed.set()  # the reader went away mid-answer
        finally:
            writer.close()

    async def _respond(self, msg: dict[str, Any], sse: bool,
                       writer: asyncio.StreamWriter) -> None:
        head, pieces, tail = self._answer(msg)
        if sse:
            head = b"event: message\r\ndata: " + head
            tail += b"\r\n\r\n"
        ctype = b"text/event-stream" if sse else b"application/json"
        size = len(head) + sum(len(p) for p in pieces) + len(tail)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + ctype + b"\r\ncontent-length: "
                     + str(size).encode() + b"\r\nconnection: close\r\n\r\n" + head)
        await writer.drain()
        for piece in pieces:
            writer.write(piece)
            await writer.drain()  # the reader's pace: fails once it has gone away
        writer.write(tail)
        await writer.drain()
        self.finished += 1

    def _answer(self, msg: dict[str, Any]) -> tuple[bytes, Any, bytes]:
        rid = orjson.dumps(msg.get("id"))
        if msg.get("method") == "tools/list":
            tools = [{"name": f"t{i}", "description": "x" * 1000,
                      "inputSchema": {"type": "object"}}
                     for i in range(self.list_bytes // 1000 + 1)]
            return (b'{"jsonrpc":"2.0","id":' + rid + b',"result":'
                    + orjson.dumps({"tools": tools}) + b"}", (), b"")
        size = int(msg["params"]["arguments"]["size"])
        whole, rest = divmod(size, len(PIECE))
        pieces = [PIECE] * whole + ([PIECE[:rest]] if rest else [])
        return (b'{"jsonrpc":"2.0","id":' + rid
                + b',"result":{"content":[{"type":"text","text":"', pieces,
                b'"}],"isError":false}}')
