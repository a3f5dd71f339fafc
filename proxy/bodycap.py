"""Body caps, and the refusal of a body that is still arriving.

`BodyCap` caps a path prefix, declared or streamed, answered before any route reads the body:
64 KiB in the OAuth shape on /oauth/ (seed 004, whatever max_request_bytes says), and
max_request_bytes in the {"detail": ...} shape on /api/v1. The MCP edge has its own cap
(proxy/mcp/asgi.py) and refuses through the same `refuse`.

A body refused before its end must not be left unread in the socket: Hypercorn closes an HTTP/1
connection as soon as the answer ends while the request is not done, and a close with unread
bytes makes the kernel answer them with a reset, which throws away the answer the client has not
read yet (seed 004's 413 becomes a connection reset). So, like nginx's lingering close, `refuse`
sends the whole answer (with `Connection: close`) but ends it only once the rest of the body has
been read and dropped, or once LINGER_BYTES more have been, or after LINGER_S, whichever comes
first. A declared length already past the bound is not read at all: the reset cannot be avoided
there, and reading it would only cost bandwidth. Over HTTP/2 the stream is kept open the same
way (Hypercorn fails the whole connection on DATA for a stream it has closed).

The bounds: 8 MiB is twice the default max_request_bytes, so a client that overshoots the cap by
as much again still gets its 413, at a cost in bandwidth no larger than two accepted bodies; 5 s
is nginx's lingering_timeout, and on a 100 Mbit/s link 8 MiB take under a second. Neither adds
to what a slow client can already hold a connection for (the 60 s body timeout).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from proxy.errors import BodyTooLarge, Surface, render

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LINGER_BYTES = 8 * 1024 * 1024  # at most this much of a refused body is read and dropped
LINGER_S = 5.0  # for at most this long after the refusal


async def refuse(scope: Scope, receive: Receive, send: Send, status: int,
                 headers: list[tuple[bytes, bytes]], body: bytes, *, ended: bool,
                 declared: int | None = None, received: int = 0) -> None:
    """Answer `status` to a request whose body is refused; `ended` says whether the body was
    read to its end, else `received` bytes of it (of `declared`, when a length was) were."""
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    if ended:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    if scope.get("http_version", "1.1") in ("1.0", "1.1"):
        headers.append((b"connection", b"close"))  # HTTP/2 has no such header
    await send({"type": "http.response.start", "status": status, "headers": headers})
    if declared is not None and declared - received > LINGER_BYTES:
        await send({"type": "http.response.body", "body": body})
        return
    # the answer is all sent; it ends (and Hypercorn closes) once the rest is read
    await send({"type": "http.response.body", "body": body, "more_body": True})
    await discard(receive)
    await send({"type": "http.response.body", "body": b""})


async def discard(receive: Receive) -> None:
    """Read and drop the rest of a request body, at most LINGER_BYTES for at most LINGER_S."""
    dropped = 0
    try:
        async with asyncio.timeout(LINGER_S):
            while dropped <= LINGER_BYTES:
                message = await receive()
                if message["type"] != "http.request":  # the client went away
                    return
                dropped += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return
    except TimeoutError:
        pass


class BodyCap:
    """Caps the bodies of requests under `prefix`, on `surface`, at `limit` bytes."""

    def __init__(self, app: ASGIApp, prefix: str, limit: int, surface: Surface) -> None:
        self.app = app
        self.prefix = prefix
        self.limit = limit
        self.status, headers, self.refusal = render(BodyTooLarge.over(limit), surface=surface)
        self.headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith(self.prefix):
            return await self.app(scope, receive, send)
        declared: int | None = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    pass
        if declared is not None and declared > self.limit:
            return await self._refuse(scope, receive, send, False, declared, 0)
        # read the body whole (at most `limit` bytes) before the route sees any of it
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
            if size > self.limit:
                return await self._refuse(scope, receive, send, not more, declared, size)
            messages.append(message)
            if not more:
                break

        async def replay() -> Message:
            if messages:
                return messages.pop(0)
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, ended: bool,
                      declared: int | None, received: int) -> None:
        await refuse(scope, receive, send, self.status, self.headers, self.refusal,
                     ended=ended, declared=declared, received=received)
