"""The MCP edge as a plain ASGI handler in front of the Quart app.

Every proxied call crosses this code, so it talks ASGI directly: no framework request and
response objects, no routing table, no request context, one task per call (to notice a client
that goes away) instead of the framework's two. Measured against the same edge written as a
Quart route, it takes about a fifth off the gateway's added latency (bench/README.md). Every
other path (metadata, health, the management API, sign-in, OAuth) goes to Quart unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from proxy import bodycap
from proxy.errors import BodyTimeout, BodyTooLarge, GatewayError, MethodNotAllowed, render
from proxy.mcp.exchange import EdgeRequest, EdgeResponse
from proxy.mcp.gateway import Gateway

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PREFIX = "/mcp/"
ALLOW = {"Allow": "GET, POST, DELETE"}
HEARTBEAT = b": keepalive\n\n"  # an SSE comment: every client skips it


class McpEdge:
    def __init__(self, app: ASGIApp, gateway: Callable[[], Gateway], *, max_body: int,
                 body_timeout_s: float, heartbeat_s: float = 0.0,
                 refused: Callable[[str, str, int], None] | None = None,
                 passed_on: tuple[str, ...] = ()) -> None:
        self.app = app
        # `/mcp/<endpoint><suffix>` the app serves (a server card, proxy.cards), not the edge
        self.passed_on = passed_on
        self.gateway = gateway
        self.refused = refused  # the request log's line for a refusal before any endpoint
        self.max_body = max_body
        self.body_timeout_s = body_timeout_s
        self.heartbeat_s = heartbeat_s  # server.sse_heartbeat_s; 0: none

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(PREFIX):
            return await self.app(scope, receive, send)
        endpoint = path[len(PREFIX):]
        if endpoint.endswith(self.passed_on) and endpoint.count("/") == 1:
            return await self.app(scope, receive, send)
        gateway = self.gateway()
        method = scope["method"]
        try:
            route = gateway.route(endpoint)
        except GatewayError as exc:
            return await self._refuse(send, exc, endpoint, method)
        if method not in ("POST", "GET", "DELETE"):
            return await self._refuse(send, MethodNotAllowed(headers=ALLOW), endpoint, method)
        # ASGI header names are lower case already: one pass builds the map every step reads
        raw = scope["headers"]
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in raw}
        duplicated: frozenset[str] = frozenset()
        if len(headers) != len(raw):
            seen: set[str] = set()
            duplicated = frozenset(n for n in (k.decode("latin-1") for k, _ in raw)
                                   if n in seen or seen.add(n))  # type: ignore[func-returns-value]
        client = scope.get("client")
        # The body is read inside post(), whose first check is the size cap; the disconnect
        # watcher starts once the body is in, when receive() is free for it.
        body = _Body(receive, headers.get("content-length"), self.max_body, self.body_timeout_s,
                     watch=method == "POST")
        forwarded: tuple[tuple[str, str], ...] = ()
        if "x-forwarded-for" in headers or "forwarded" in headers:
            forwarded = tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in raw
                              if k in (b"x-forwarded-for", b"forwarded"))
        request = EdgeRequest(headers, body.read, client[0] if client else None, duplicated,
                              forwarded)
        try:
            if method == "POST":
                result = await gateway.post(route, request)
            elif method == "GET":
                body.watcher = _watch(receive)
                result = await gateway.get(route, request)
            else:
                result = await gateway.delete(route, request)
            if body.refused is None or result.stream is not None:
                await _send(send, result, self.heartbeat_s)
            else:  # a body refused before its end: its rest is read before the connection ends
                await bodycap.refuse(scope, receive, send, result.status, _headers(result),
                                     result.body, ended=False, declared=body.refused[0],
                                     received=body.refused[1])
        finally:
            if body.watcher is not None:
                body.watcher.cancel()


    async def _refuse(self, send: Send, exc: GatewayError, endpoint: str, method: str) -> None:
        answer = _rendered(exc)
        if self.refused is not None:
            self.refused(endpoint, method, answer.status)
        await _send(send, answer)


class _Body:
    """Reads the request body under the size cap and the body timeout. `refused` is set
    (declared length, bytes read) when the cap refused the body before its end."""

    refused: tuple[int | None, int] | None = None

    def __init__(self, receive: Receive, content_length: str | None, cap: int,
                 timeout_s: float, *, watch: bool) -> None:
        self._receive = receive
        self._declared = content_length
        self._cap = cap
        self._timeout_s = timeout_s
        self._watch = watch
        self.watcher: asyncio.Task[None] | None = None

    async def read(self) -> bytes:
        declared: int | None = None
        if self._declared is not None:
            try:
                declared = int(self._declared)
            except ValueError:
                pass
            else:
                if declared > self._cap:
                    self.refused = (declared, 0)
                    raise BodyTooLarge()
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self._timeout_s):
                while True:
                    message = await self._receive()
                    if message["type"] != "http.request":  # the client went away
                        raise asyncio.CancelledError()
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    more = message.get("more_body", False)
                    if size > self._cap:
                        if more:
                            self.refused = (declared, size)
                        raise BodyTooLarge()
                    chunks.append(chunk)
                    if not more:
                        break
        except TimeoutError:
            raise BodyTimeout() from None
        if self._watch:
            self.watcher = _watch(self._receive)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _watch(receive: Receive) -> asyncio.Task[None]:
    """A client that goes away cancels its call: the gateway then closes the upstream request
    and tells the upstream (seed 004: a disconnect is a cancellation)."""
    call = asyncio.current_task()

    async def wait_for_disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if call is not None:
            call.cancel()

    return asyncio.get_running_loop().create_task(wait_for_disconnect())


def _rendered(exc: GatewayError) -> EdgeResponse:
    status, headers, body = render(exc)
    return EdgeResponse(status, headers, body)


def _headers(result: EdgeResponse) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in result.headers.items()]


async def _send(send: Send, result: EdgeResponse, heartbeat_s: float = 0.0) -> None:
    headers = _headers(result)
    if result.stream is None:
        headers.append((b"content-length", str(len(result.body)).encode()))
        await send({"type": "http.response.start", "status": result.status, "headers": headers})
        await send({"type": "http.response.body", "body": result.body})
        return
    stream = result.stream
    beat: _Heartbeat | None = None
    try:  # the stream is closed however this ends, the first send included
        await send({"type": "http.response.start", "status": result.status, "headers": headers})
        if heartbeat_s and result.headers.get("Content-Type") == "text/event-stream":
            beat = _Heartbeat(send, heartbeat_s, stream)
        async for chunk in stream:
            if not chunk:
                continue
            if beat is None:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                continue
            async with beat.lock:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                beat.sent()
        if beat is not None:
            beat.stop()
            async with beat.lock:
                await send({"type": "http.response.body", "body": b""})
        else:
            await send({"type": "http.response.body", "body": b""})
    finally:
        if beat is not None:
            beat.stop()
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


class _Heartbeat:
    """A comment line on a streamed answer that has sent nothing for `interval` seconds, so a
    proxy or load balancer between the client and the gateway does not take an idle stream
    for a dead one. A stream that is never idle that long costs one timer; the lock keeps a
    comment between two whole events, never inside one."""

    __slots__ = ("_handle", "_interval", "_last", "_loop", "_send", "_stream", "_task", "lock")

    def __init__(self, send: Send, interval: float, stream: object = None) -> None:
        self._send = send
        self._stream = stream  # a relay passing a large event on says when it is mid-event
        self._interval = interval
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._task: asyncio.Task[None] | None = None
        self.lock = asyncio.Lock()
        self._handle = self._loop.call_later(interval, self._due)

    def sent(self) -> None:
        self._last = self._loop.time()

    def stop(self) -> None:
        self._handle.cancel()
        if self._task is not None:
            self._task.cancel()

    def _due(self) -> None:
        idle = self._loop.time() - self._last
        if getattr(self._stream, "mid_event", False):  # never inside an event
            idle = 0.0
        if idle < self._interval:  # something was sent meanwhile
            self._handle = self._loop.call_later(self._interval - idle, self._due)
            return
        self._task = self._loop.create_task(self._beat())
        self._task.add_done_callback(_retrieve)

    async def _beat(self) -> None:
        async with self.lock:
            await self._send({"type": "http.response.body", "body": HEARTBEAT,
                              "more_body": True})
            self._last = self._loop.time()
        self._handle = self._loop.call_later(self._interval, self._due)


def _retrieve(task: asyncio.Task[None]) -> None:
    """A heartbeat whose send failed (the client went away): the stream's own send says so."""
    if not task.cancelled():
        task.exception()
