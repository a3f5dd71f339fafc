"""The cluster soak's upstream: an official-SDK MCP server (`MCPServer`) whose `echo` tool
answers its text after `delay_ms`, with an event store, so that a 2025-11-25 client whose
POST stream breaks resumes it with GET + `Last-Event-ID` and gets the answer replayed.

    python bench/cluster_upstream.py --port 9100

One event store per session: the SDK's `EventStore` is handed no session, and a POST's
stream is named by its JSON-RPC request id, so one store shared by every session (as
tests/conformance/server.py's, which serves one client) would replay client A's request 57
to client B resuming its own request 57, and every SDK client numbers its requests 1, 2, 3...
The SDK's session manager has no hook for a store per session: its new transports are given
one here, as each session is admitted. Each keeps its last `KEEP` events.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
from collections import deque
from typing import Any

import anyio
from hypercorn.asyncio import serve
from hypercorn.config import Config
from mcp import types
from mcp.server.mcpserver import MCPServer
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore

KEEP = 512  # events per session: a resumed stream is at most a few calls old
RETRY_MS = 100  # the `retry:` of each priming event: how long a client waits to resume
MAX_DELAY_MS = 5000


class SessionEvents(EventStore):
    """One session's SSE events in order (the last KEEP), each under an id unique in the
    process."""

    def __init__(self, ids: itertools.count[int]) -> None:
        self._events: deque[tuple[int, str, types.JSONRPCMessage | None]] = deque(maxlen=KEEP)
        self._ids = ids

    async def store_event(self, stream_id: str, message: types.JSONRPCMessage | None) -> str:
        event_id = next(self._ids)
        self._events.append((event_id, stream_id, message))
        return str(event_id)

    async def replay_events_after(self, last_event_id: str,
                                  send_callback: EventCallback) -> str | None:
        try:
            after = int(last_event_id)
        except ValueError:
            return None
        stream = next((s for e, s, _ in self._events if e == after), None)
        if stream is None:
            return None
        for event_id, s, message in list(self._events):
            if s == stream and event_id > after and message is not None:
                await send_callback(EventMessage(message, str(event_id)))
        return stream


def build_app() -> Any:
    server = MCPServer("cluster-soak", version="1.0.0")

    @server.tool()
    async def echo(text: str, delay_ms: int = 0) -> str:
        """The text, after delay_ms milliseconds (at most 5 s)."""
        if delay_ms > 0:
            await anyio.sleep(min(delay_ms, MAX_DELAY_MS) / 1000)
        return text

    ids = itertools.count(1)
    app = server.streamable_http_app(streamable_http_path="/mcp",
                                     event_store=SessionEvents(ids), retry_interval=RETRY_MS)
    manager = server.session_manager
    admit = manager._admit_session

    def admit_with_own_events(requestor: Any) -> Any:
        transport = admit(requestor)
        if transport is not None:
            transport._event_store = SessionEvents(ids)
        return transport

    manager._admit_session = admit_with_own_events  # type: ignore[method-assign]
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = build_app()
    logging.getLogger().setLevel(logging.WARNING)  # MCPServer() set INFO: a line per session
    cfg = Config()
    cfg.bind = [f"127.0.0.1:{args.port}"]
    cfg.accesslog = None
    cfg.graceful_timeout = 1
    asyncio.run(serve(app, cfg))


if __name__ == "__main__":
    main()
