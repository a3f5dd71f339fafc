"""A legacy client's GET stream on a virtual endpoint: its members' GET streams, merged.

Each member's stream (on the member session held for the client's gateway session) is read by
its own task and split into whole events; each message goes through the same view as a call's
stream (`VirtualForwarder.outgoing`: a request's id sealed, the member named) and is queued
for the client as a plain `data` event. A member's event ids are dropped: they name a
position in that member's stream alone, which a merged stream cannot resume. A member whose
stream fails or ends is left out; the merged stream lasts until the client leaves, so that a
change to the endpoint's members still reaches it: told (`announce`), a member that joined
listened to (`join`), one that left no more (`drop`, its stream closed).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import orjson

from proxy.errors import GatewayError
from proxy.mcp.sse import EventSplitter, event_object
from proxy.upstream import UpstreamAnswer

log = logging.getLogger("tollhouse.virtual")

Outgoing = Callable[[dict[str, Any]], bool]
Opening = Callable[[], Awaitable["tuple[UpstreamAnswer, Outgoing] | None"]]
LIST_CHANGED = ("notifications/tools/list_changed", "notifications/prompts/list_changed",
                "notifications/resources/list_changed")
_END = b""


class Merged:
    """Async iterator of the merged stream's bytes; `aclose` ends it (safe to call again)."""

    def __init__(self, endpoint: str, members: tuple[str, ...]) -> None:
        self.endpoint = endpoint
        self.members = members  # the endpoint's members served now
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=256)
        self._tasks: dict[str, asyncio.Task[None]] = {}  # member -> the task reading it
        self.closed = False

    def add(self, member: str, response: UpstreamAnswer, outgoing: Outgoing) -> None:
        """A member's stream, open (when the merged stream opens)."""
        self._start(member, self._pump(member, response, outgoing))

    def join(self, member: str, opening: Opening) -> None:
        """A member that joined the endpoint: its stream opened (`opening`, None when it has
        none) and read by one task, which `drop` and `aclose` end wherever it is."""
        if not self.closed:
            self._start(member, self._opened(member, opening))

    def drop(self, member: str) -> None:
        """A member that left the endpoint: its stream closed, nothing more read from it."""
        task = self._tasks.pop(member, None)
        if task is not None:
            task.cancel()

    def _start(self, member: str, work: Any) -> None:
        self.drop(member)  # one task per member
        task = asyncio.get_running_loop().create_task(work)
        self._tasks[member] = task
        task.add_done_callback(partial(self._ended, member))

    def _ended(self, member: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(member) is task:
            del self._tasks[member]

    async def _opened(self, member: str, opening: Opening) -> None:
        try:
            opened = await opening()
        except Exception as exc:  # noqa: BLE001 - a member that cannot be listened to is left out
            log.warning("virtual endpoint %s: member %s joined but its GET stream could not "
                        "be opened (%s)", self.endpoint, member, type(exc).__name__)
            return
        if opened is not None:
            await self._pump(member, *opened)

    def announce(self, methods: tuple[str, ...] = LIST_CHANGED) -> None:
        """The gateway's own notices (the members changed): queued, never waited for; a
        client too slow to take them loses them rather than holding the registry up."""
        for method in methods:
            try:
                self._queue.put_nowait(_event({"jsonrpc": "2.0", "method": method}))
            except asyncio.QueueFull:
                log.info("/mcp/%s: a GET stream too slow for %s: dropped", self.endpoint, method)

    async def _pump(self, member: str, response: UpstreamAnswer, outgoing: Outgoing) -> None:
        splitter = EventSplitter()
        try:
            async for chunk in response.chunks():
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
        if self.closed:
            raise StopAsyncIteration
        out = await self._queue.get()
        if out is _END or self.closed:
            raise StopAsyncIteration
        return out

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        tasks = list(self._tasks.values())
        self._tasks.clear()
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
    obj = event_object(event)
    if obj is None:
        return None
    if "method" in obj:
        outgoing(obj)
    return _event(obj)


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"
