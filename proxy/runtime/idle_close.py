"""Close a kept-alive HTTP/1.1 connection as soon as its client closes it.

Hypercorn (0.17, 0.18) reads a client's EOF on an idle kept-alive connection, tells its
protocol "closed", and then does nothing more until its idle timer fires
(`keep_alive_timeout`, 75 s here, which must outlast load balancers' own): the socket sits in
CLOSE-WAIT, a file descriptor held for a client that has gone. An MCP client that stops reading
a streamed answer once it has its response (the official SDKs' HTTP clients do, and so does any
httpx client leaving a stream early) leaves one such socket per call, so a busy gateway runs
into its descriptor limit well within those 75 s (bench/soak.py showed 874 in 10 s).

`install()` makes the HTTP/1.1 protocol close the connection when the peer's EOF arrives and
no request is under way on it. A connection with a request under way is left as Hypercorn
handles it (the request's stream is closed and the app told of the disconnect). Applied once
by `proxy.runtime.cli` before it serves; idempotent.
"""

from __future__ import annotations

from typing import Any

_INSTALLED = False


def install() -> None:
    global _INSTALLED
    if _INSTALLED:
        return
    from hypercorn.events import Closed
    from hypercorn.protocol.h11 import H11Protocol

    handle = H11Protocol.handle

    async def handle_closing_idle(self: Any, event: Any) -> None:
        idle = isinstance(event, Closed) and self.stream is None
        await handle(self, event)
        if idle:
            await self.send(Closed())  # the TCP server closes the socket and its idle timer

    H11Protocol.handle = handle_closing_idle  # type: ignore[method-assign]
    _INSTALLED = True
