from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Protocol


class CallHandle:
    """One in-flight call, cancellable from elsewhere: a client's notifications/cancelled,
    the total-timeout ceiling. The call's own task is cancelled and `reason` tells the call,
    when it catches the CancelledError, that this was a deliberate cancellation to answer
    with -32800 rather than a client disconnect to clean up after."""

    __slots__ = ("_timer", "reason", "task")

    def __init__(self, task: asyncio.Task[object] | None = None) -> None:
        self.task = task or asyncio.current_task()
        self.reason: str | None = None
        self._timer: asyncio.TimerHandle | None = None

    def cancel(self, reason: str) -> bool:
        if self.reason is not None or self.task is None or self.task.done():
            return False
        self.reason = reason
        self.task.cancel()
        return True

    def deadline(self, seconds: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(
            seconds, self.cancel, "total timeout reached")

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
    """Every call in flight under its key (endpoint, principal, session id or "", request id).
    Several calls may share one key: a principal's sessionless (2026-07-28) clients, or
    clients sharing an API key, all number their requests from 1. Each stays registered
    until it is discarded, and a cancel reaches every call under the key."""

    def add(self, key: Hashable, handle: CallHandle) -> None: ...

    def discard(self, key: Hashable, handle: CallHandle) -> None: ...

    async def cancel(self, key: Hashable, reason: str) -> bool: ...


class MemoryInFlight:
    """One handle per key in the common case; a list only while calls share a key, so the
    hot path allocates nothing beyond the dict entry."""

    def __init__(self) -> None:
        self._calls: dict[Hashable, CallHandle | list[CallHandle]] = {}
        self._count = 0

    def add(self, key: Hashable, handle: CallHandle) -> None:
        held = self._calls.get(key)
        if held is None:
            self._calls[key] = handle
        elif isinstance(held, list):
            held.append(handle)
        else:
            self._calls[key] = [held, handle]
        self._count += 1

    def discard(self, key: Hashable, handle: CallHandle) -> None:
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

    async def cancel(self, key: Hashable, reason: str) -> bool:
        """Cancel every call under `key`; True if any was cancelled."""
        held = self._calls.get(key)
        if held is None:
            return False
        if not isinstance(held, list):
            return held.cancel(reason)
        cancelled = False
        for handle in tuple(held):
            cancelled = handle.cancel(reason) or cancelled
        return cancelled

    def __len__(self) -> int:
        return self._count
