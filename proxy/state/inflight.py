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
    def add(self, key: Hashable, handle: CallHandle) -> None: ...

    def discard(self, key: Hashable, handle: CallHandle) -> None: ...

    async def cancel(self, key: Hashable, reason: str) -> bool: ...


class MemoryInFlight:
    def __init__(self) -> None:
        self._calls: dict[Hashable, CallHandle] = {}

    def add(self, key: Hashable, handle: CallHandle) -> None:
        self._calls[key] = handle

    def discard(self, key: Hashable, handle: CallHandle) -> None:
        if self._calls.get(key) is handle:
            del self._calls[key]

    async def cancel(self, key: Hashable, reason: str) -> bool:
        handle = self._calls.get(key)
        return handle.cancel(reason) if handle is not None else False

    def __len__(self) -> int:
        return len(self._calls)
