"""Helpers every test package shares: a hand-driven clock for call deadlines, and a waiter
that polls a condition with a deadline instead of sleeping a fixed time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

DEADLINE_S = 10.0


@dataclass
class Timer:
    seconds: float
    fire: Callable[[], object]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class Deadlines:
    """A call-deadline clock (`create_app(later=...)`) that fires only when a test says so:
    a total-timeout test needs no short real timeout and no race with the machine's load."""

    def __init__(self) -> None:
        self.timers: list[Timer] = []
        self.armed = asyncio.Event()

    def __call__(self, seconds: float, fire: Callable[[], object]) -> Timer:
        timer = Timer(seconds, fire)
        self.timers.append(timer)
        self.armed.set()
        return timer

    def expire(self) -> int:
        """Fire every deadline still armed; how many fired."""
        live = [t for t in self.timers if not t.cancelled]
        for timer in live:
            timer.cancelled = True
            timer.fire()
        return len(live)

    @property
    def live(self) -> int:
        return sum(not t.cancelled for t in self.timers)


async def until(check: Callable[[], bool | Awaitable[bool]], deadline_s: float = DEADLINE_S,
                what: str = "the condition") -> None:
    """Return once `check()` holds, polling; fail the test past the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        assert time.monotonic() < end, f"{what} did not hold within {deadline_s} s"
        await asyncio.sleep(0.01)
