"""A time bound that costs nothing when the awaited work never has to wait.

`asyncio.timeout` arms a timer on the event loop (a handle in its heap, then a cancel) on every
use. The metering hook's authorize and the outbox's delivery run under one on every metered
call, and an in-process hook (`metering.hook`) usually answers without ever suspending: the
timer was then pure cost. `within` runs the coroutine's first step at once; if that finishes
it, there was nothing to wait for and no timer is made. If it suspends, the rest runs under
`asyncio.timeout(timeout_s)` from that moment (the first step ran on the CPU, without
waiting on anything the bound is for).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")


async def within(coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """`await coro` bounded by `timeout_s` (TimeoutError past it, the coroutine cancelled),
    with no timer when it finishes without suspending."""
    try:
        first = coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    async with asyncio.timeout(timeout_s):
        answer: T = await _Resumed(coro, first)
    return answer


class _Resumed:
    """Awaiting this continues `coro`, which has already handed `first` (what it waits on)
    to its caller: `yield from coro` for a coroutine whose first step has been taken."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any) -> None:
        self._coro = coro
        self._first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, pending = self._coro, self._first
        while True:
            try:
                sent = yield pending
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - a cancellation (the timeout's too), to the work
                try:
                    pending = coro.throw(exc)
                except StopIteration as done:
                    return done.value
                continue
            try:
                pending = coro.send(sent)
            except StopIteration as done:
                return done.value
