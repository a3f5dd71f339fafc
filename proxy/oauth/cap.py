"""Every path under /oauth/ has a fixed 64 KiB body cap, declared or streamed, whatever
`max_request_bytes` says (seed 004): these routes answer before anyone signs in."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Awaitable[None]]

LIMIT = 65536
TOO_LARGE = orjson.dumps({"error": "invalid_request",
                          "error_description": f"request body exceeds the {LIMIT}-byte limit"})


class OAuthBodyCap:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith("/oauth/"):
            return await self.app(scope, receive, send)
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    if int(value) > LIMIT:
                        return await _refuse(send)
                except ValueError:
                    pass
        # read the body whole (at most LIMIT bytes) before the route sees any of it
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return
            size += len(message.get("body", b""))
            if size > LIMIT:
                return await _refuse(send)
            messages.append(message)
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            if messages:
                return messages.pop(0)
            return await receive()

        await self.app(scope, replay, send)


async def _refuse(send: Callable[[Message], Awaitable[None]]) -> None:
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(TOO_LARGE)).encode())]})
    await send({"type": "http.response.body", "body": TOO_LARGE})
