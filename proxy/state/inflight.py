"""The calls in flight, so that one can be ended from elsewhere: a client's
notifications/cancelled, the total-timeout ceiling.

A call is registered under a string key (`call_key`: endpoint, caller, session and request id,
so `1` and `"1"` differ), and `cancel(key, reason)` needs no answer about where the call runs:
in memory it ends the local handles; a shared store (Redis) publishes the cancel, and each
replica ends the calls it holds under that key. The handle itself (the call's task) is always
local to the process that runs the call.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from proxy.errors import StoreUnavailable

if TYPE_CHECKING:
    from proxy.state.shared import Shared

log = logging.getLogger("tollhouse.state")


class EndReason(enum.StrEnum):
    """Why a call ended before its answer; the value is the wire and audit text."""

    CANCELLED = "cancelled by the client"  # a notifications/cancelled naming it
    TIMEOUT = "total timeout reached"
    DISCONNECTED = "client disconnected"


class Timer(Protocol):
    def cancel(self) -> object: ...


# how a deadline is set: the running loop's call_later, or a test's hand-driven clock
Later = Callable[[float, Callable[[], object]], Timer]


def call_key(endpoint: str, principal_key: str, session_id: str, request_id: Any) -> str:
    """The key a call is registered and cancelled under. Unambiguous for any principal key or
    session id, and typed: request id 1 and "1" are two calls."""
    return orjson.dumps((endpoint, principal_key, session_id, request_id)).decode()


class CallHandle:
    """One in-flight call. `cancel` cancels the call's own task and sets `reason`, which tells
    the call, when it catches the CancelledError, that this was a deliberate end to answer
    with -32800 rather than a client disconnect to clean up after."""

    __slots__ = ("_timer", "reason", "started_at", "task")

    def __init__(self, task: asyncio.Task[object] | None = None) -> None:
        self.task = task or asyncio.current_task()
        self.started_at = time.time()  # wall clock: compared with another replica's cancel
        self.reason: EndReason | None = None
        self._timer: Timer | None = None

    def cancel(self, reason: EndReason) -> bool:
        if self.reason is not None or self.task is None or self.task.done():
            return False
        self.reason = reason
        self.task.cancel()
        return True

    def deadline(self, seconds: float, later: Later | None = None) -> None:
        """End the call after `seconds` (on the running loop's clock unless `later` is given)."""
        schedule = later or asyncio.get_running_loop().call_later
        self._timer = schedule(seconds, self._expire)

    def _expire(self) -> None:
        self.cancel(EndReason.TIMEOUT)

    def absorb(self) -> bool:
        """In the call's except-CancelledError: True if the cancellation was ours (the task
        is then uncancelled and the call answers -32800); False if it must propagate."""
        if self.reason is None or self.task is None:
            return False
        return self.task.uncancel() == 0

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class InFlightRegistry(Protocol):
    """Every call in flight under its `call_key`. Several calls may share one key: a
    principal's sessionless (2026-07-28) clients, or clients sharing an API key, all number
    their requests from 1. Each stays registered until it is discarded, and a cancel reaches
    every call under the key, wherever it runs."""

    def add(self, key: str, handle: CallHandle) -> None: ...

    def discard(self, key: str, handle: CallHandle) -> None: ...

    async def cancel(self, key: str, reason: EndReason) -> None: ...

    def __len__(self) -> int: ...


class MemoryInFlight:
    """One handle per key in the common case; a list only while calls share a key, so the
    hot path allocates nothing beyond the dict entry."""

    def __init__(self) -> None:
        self._calls: dict[str, CallHandle | list[CallHandle]] = {}
        self._count = 0

    def add(self, key: str, handle: CallHandle) -> None:
        held = self._calls.get(key)
        if held is None:
            self._calls[key] = handle
        elif isinstance(held, list):
            held.append(handle)
        else:
            self._calls[key] = [held, handle]
        self._count += 1

    def discard(self, key: str, handle: CallHandle) -> None:
        held = self._calls.get(key)
        if held is handle:
            del self._calls[key]
        elif isinstance(held, list) and handle in held:
            held.remove(handle)
            if len(held) == 1:
                self._calls[key] = held[0]
        else:
            return
        self._count -= 1

    async def cancel(self, key: str, reason: EndReason) -> None:
        """End every call under `key`; a key with none is no error (it may have just ended)."""
        held = self._calls.get(key)
        if held is None:
            return
        if not isinstance(held, list):
            held.cancel(reason)
            return
        for handle in tuple(held):
            handle.cancel(reason)

    def __len__(self) -> int:
        return self._count


class SharedInFlight(MemoryInFlight):
    """The calls this process runs, plus a cancel channel every process of the deployment
    listens on. `cancel` ends the local calls under the key at once, then publishes the key
    once (one PUBLISH, whichever replica runs the call): each other process ends the calls it
    holds under that key and ignores the rest. Registering a call costs no Redis command, and
    nothing is kept in Redis per call, so a replica that dies leaves nothing behind.

    Pub/sub keeps nothing, so a cancel published while a replica's subscription is down (its
    link to Redis broken) would never reach it: each cancel also leaves a mark,
    `cx:<digest of the key>` holding its wall-clock time, for `MARK_S`. Each time a replica's
    subscription is live again it reads the marks of the calls it holds (one pipelined GET
    each) and ends those that started before their mark; a call that started after it is a
    later call that reuses the key (a sessionless caller's ids), and is left alone. (Replicas'
    clocks are compared here: keep them in sync, as any deployment does.)"""

    MARK_S = 900.0

    def __init__(self, shared: Shared) -> None:
        super().__init__()
        self._shared = shared
        self._channel = shared.key("cancel")
        self._marks = shared.key("cx:")
        self._reasons = {reason.value: reason for reason in EndReason}
        self._catching_up: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._shared.subscribe(self._channel, self._heard, self._resubscribed)

    async def cancel(self, key: str, reason: EndReason) -> None:
        await super().cancel(key, reason)
        message = orjson.dumps((self._shared.replica, key, reason.value))
        mark = orjson.dumps((time.time(), reason.value))
        marked = self._shared.ask("in-flight", "SET", self._mark(key), mark,
                                  "PX", round(self.MARK_S * 1000))
        try:  # both on the wire at once: one round trip
            await self._shared.command("in-flight", "PUBLISH", self._channel, message)
            await marked.reply()
        finally:
            marked.drop()

    def _mark(self, key: str) -> str:
        return self._marks + hashlib.sha256(key.encode()).hexdigest()[:32]

    def _heard(self, data: bytes) -> None:
        replica, key, reason = orjson.loads(data)
        if replica == self._shared.replica or not isinstance(key, str):
            return  # ours, already ended locally
        end = self._reasons.get(reason)
        if end is None:
            log.warning("a cancel with an unknown reason was ignored")
            return
        self._end(key, end, None)

    def _end(self, key: str, end: EndReason, before: float | None) -> None:
        held = self._calls.get(key)
        if held is None:
            return
        for handle in (held if isinstance(held, list) else (held,)):
            if before is None or handle.started_at <= before:
                handle.cancel(end)

    def _resubscribed(self) -> None:
        if not self._calls:
            return
        task = asyncio.get_running_loop().create_task(self._catch_up(list(self._calls)))
        self._catching_up.add(task)
        task.add_done_callback(self._catching_up.discard)

    async def _catch_up(self, keys: list[str]) -> None:
        """The cancels published while this replica was not listening, for the calls it
        holds."""
        asked = [(key, self._shared.ask("in-flight", "GET", self._mark(key))) for key in keys]
        try:
            for key, mark in asked:
                raw = await mark.reply()
                if raw is None:
                    continue
                try:
                    at, reason = orjson.loads(raw)
                except (orjson.JSONDecodeError, TypeError, ValueError):
                    continue  # not a mark this code wrote: nothing to end
                end = self._reasons.get(reason) if isinstance(reason, str) else None
                if end is not None and isinstance(at, int | float):
                    self._end(key, end, at)
        except StoreUnavailable:
            log.warning("state store: could not look for cancels missed while unsubscribed")
        finally:
            for _, mark in asked:
                mark.drop()
