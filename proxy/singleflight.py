"""One call in flight per key: whoever asks for the same key meanwhile awaits that call's
outcome instead of making their own (an upstream's era probe, a session being opened, a
person's token being refreshed)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SingleFlight(Generic[K, V]):
    """`detached`: the call runs in a task of its own, so no one who asked, not even the first,
    cancels it for the others by going away (a fetch whose outcome is cached for later asks).
    Otherwise the first asker runs it, and its cancellation ends the call."""

    def __init__(self, *, detached: bool = False) -> None:
        self._running: dict[K, asyncio.Future[V]] = {}
        self._detached = detached

    def running(self, key: K) -> bool:
        """Whether a call for `key` is in flight now (a `run` would wait for it)."""
        return key in self._running

    async def run(self, key: K, call: Callable[[], Awaitable[V]]) -> V:
        """`call()`'s result, shared with everyone who asks for `key` while it runs. A
        failure reaches every waiter and is not remembered: the next ask calls again. A
        waiter that is cancelled does not cancel the call (it is shielded)."""
        pending = self._running.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        if self._detached:
            task = asyncio.ensure_future(call())
            self._running[key] = task
            task.add_done_callback(lambda done: self._settled(key, done))
            return await asyncio.shield(task)
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._running[key] = future
        try:
            value = await call()
            future.set_result(value)
            return value
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody waited
            raise
        finally:
            del self._running[key]

    def _settled(self, key: K, task: asyncio.Future[V]) -> None:
        if self._running.get(key) is task:
            del self._running[key]
        if not task.cancelled():
            task.exception()  # retrieved here too, whether or not anyone still waits
