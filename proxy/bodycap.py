"""A body cap for a path prefix, declared or streamed, answered before any route reads the
body: 64 KiB in the OAuth shape on /oauth/ (seed 004, whatever max_request_bytes says), and
max_request_bytes in the {"detail": ...} shape on /api/v1."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyCap:
    def __init__(self, app: ASGIApp, prefix: str, limit: int, refusal: bytes) -> None:
        self.app = app
        self.prefix = prefix
        self.limit = limit
        self.refusal = refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith(self.prefix):
            return await self.app(scope, receive, send)
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    if int(value) > self.limit:
                        return await self._refuse(send)
                except ValueError:
                    pass
        # read the body whole (at most `limit` bytes) before the route sees any of it
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return
            size += len(message.get("body", b""))
            if size > self.limit:
                return await self._refuse(send)
            messages.append(message)
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            if messages:
                return messages.pop(0)
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(self.refusal)).encode())]})
        await send({"type": "http.response.body", "body": self.refusal})
