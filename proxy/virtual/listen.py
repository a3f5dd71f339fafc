"""A legacy client's GET stream on a virtual endpoint: its members' GET streams, merged.

Each member's stream (on the member session held for the client's gateway session) is read by
its own task and split into whole events; each message goes through the same view as a call's
stream (`VirtualForwarder.outgoing`: a request's id sealed, the member named) and is queued
for the client as a plain `data` event. A member's event ids are dropped: they name a
position in that member's stream alone, which a merged stream cannot resume. A member whose
stream fails or ends is left out; the merged stream lasts until the client leaves, so that a
change to the endpoint's members (`announce`) still reaches it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import httpx
import orjson

from proxy.errors import GatewayError
from proxy.mcp.sse import EventSplitter, event_data
from proxy.upstream import BodyChunks

log = logging.getLogger("tollhouse.virtual")

Outgoing = Callable[[dict[str, Any]], bool]
LIST_CHANGED = ("notifications/tools/list_changed", "notifications/prompts/list_changed",
                "notifications/resources/list_changed")
_END = b""


class Merged:
    """Async iterator of the merged stream's bytes; `aclose` ends it (safe to call again)."""

    def __init__(self, endpoint: str, members: tuple[str, ...]) -> None:
        self.endpoint = endpoint
        self.members = members  # the endpoint's members when the stream opened
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=256)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def add(self, member: str, response: httpx.Response, outgoing: Outgoing) -> None:
        task = asyncio.get_running_loop().create_task(self._pump(member, response, outgoing))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def announce(self, methods: tuple[str, ...] = LIST_CHANGED) -> None:
        """The gateway's own notices (the members changed): queued, never waited for; a
        client too slow to take them loses them rather than holding the registry up."""
        for method in methods:
            try:
                self._queue.put_nowait(_event({"jsonrpc": "2.0", "method": method}))
            except asyncio.QueueFull:
                log.info("/mcp/%s: a GET stream too slow for %s: dropped", self.endpoint, method)

    async def _pump(self, member: str, response: httpx.Response, outgoing: Outgoing) -> None:
        splitter = EventSplitter()
        try:
            async for chunk in BodyChunks(response):
                for event in splitter.feed(chunk):
                    out = _message(event, outgoing)
                    if out is not None:
                        await self._queue.put(out)
        except (GatewayError, ValueError) as exc:
            log.info("/mcp/%s: member %s's GET stream ended: %s", self.endpoint, member, exc)
        finally:
            await response.aclose()

    def __aiter__(self) -> Merged:
        return self

    async def __anext__(self) -> bytes:
        if self._closed:
            raise StopAsyncIteration
        out = await self._queue.get()
        if out is _END or self._closed:
            raise StopAsyncIteration
        return out

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        try:
            self._queue.put_nowait(_END)  # wakes a read waiting on the queue
        except asyncio.QueueFull:
            pass


def _message(event: bytes, outgoing: Outgoing) -> bytes | None:
    """One member event as the client gets it; None for one with no JSON-RPC message."""
    data = event_data(event)
    if not data:
        return None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    if "method" in obj:
        outgoing(obj)
    return _event(obj)


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"
