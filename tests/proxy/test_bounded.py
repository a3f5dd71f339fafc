"""proxy.bounded.within: `await` under a time bound, with no timer when nothing waits."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy import bounded
from proxy.bounded import within
from tests.helpers import DEADLINE_S


@pytest.fixture
def timers(monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """The bounds `within` armed a timer for."""
    armed: list[float | None] = []
    real = asyncio.timeout

    def counting(delay: float | None) -> Any:
        armed.append(delay)
        return real(delay)

    monkeypatch.setattr(bounded.asyncio, "timeout", counting)
    return armed


async def test_an_answer_without_waiting_arms_no_timer(timers: list[float | None]) -> None:
    async def at_once() -> str:
        return "allowed"

    assert await within(at_once(), 1.0) == "allowed"
    assert timers == []


async def test_a_failure_without_waiting_is_raised_as_it_is(timers: list[float | None]) -> None:
    async def broken() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        await within(broken(), 1.0)
    assert timers == []


async def test_an_answer_after_waiting_runs_under_the_bound(timers: list[float | None]) -> None:
    gate = asyncio.Event()

    async def later() -> int:
        await gate.wait()
        await asyncio.sleep(0)  # a bare yield to the loop, then more waiting
        await gate.wait()
        return 7

    waiting = asyncio.create_task(within(later(), DEADLINE_S))
    await asyncio.sleep(0)
    assert not waiting.done()
    gate.set()
    assert await asyncio.wait_for(waiting, DEADLINE_S) == 7
    assert timers == [DEADLINE_S]


async def test_past_the_bound_the_work_is_cancelled_and_timeout_error_raised() -> None:
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = asyncio.create_task(within(forever(), 0.01))
    done, _ = await asyncio.wait({task}, timeout=DEADLINE_S)  # ended by its own bound
    assert task in done
    assert isinstance(task.exception(), TimeoutError)
    assert cancelled.is_set()


async def test_a_failure_after_waiting_is_raised_as_it_is() -> None:
    async def fails_later() -> None:
        await asyncio.sleep(0)
        raise KeyError("gone")

    with pytest.raises(KeyError, match="gone"):
        await within(fails_later(), DEADLINE_S)


async def test_a_cancellation_from_outside_reaches_the_work_and_is_not_a_timeout() -> None:
    entered, cancelled = asyncio.Event(), asyncio.Event()

    async def forever() -> None:
        entered.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    task = asyncio.create_task(within(forever(), DEADLINE_S))
    await asyncio.wait_for(entered.wait(), DEADLINE_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.is_set()


async def test_work_that_handles_a_cancellation_may_still_answer() -> None:
    entered = asyncio.Event()

    async def stubborn() -> str:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "kept"
        return "unreachable"

    task = asyncio.create_task(within(stubborn(), DEADLINE_S))
    await asyncio.wait_for(entered.wait(), DEADLINE_S)
    task.cancel()
    assert await task == "kept"
