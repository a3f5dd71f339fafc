"""The bare pass-through as a raw ASGI app: the same forwarding without Quart's routing,
request and response objects (Tollhouse answers /mcp/<name> from an ASGI layer of its own)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from transports import FORWARD_HEADERS, Forwarder, make_forwarder

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Message, Receive, Send], Awaitable[None]]

_WANTED = {name.encode() for name in FORWARD_HEADERS}


def create_asgi_app(upstream: str, transport: str, stream: bool) -> ASGIApp:
    state: dict[str, Forwarder] = {}

    async def lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                state["client"] = make_forwarder(transport)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await state["client"].aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def app(scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["method"] != "POST" or not scope["path"].startswith("/mcp/"):
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k in _WANTED}
        up = await state["client"].forward(upstream, b"".join(chunks), headers, stream)
        out = [(b"content-type", up.content_type.encode())] if up.content_type else []
        await send({"type": "http.response.start", "status": up.status, "headers": out})
        if isinstance(up.body, bytes):
            await send({"type": "http.response.body", "body": up.body})
            return
        async for chunk in up.body:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app
