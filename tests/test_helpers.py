"""The shared waiter cannot pass by running out of time: at its deadline it fails the test."""

from __future__ import annotations

import pytest

from tests.helpers import Clock, until


async def test_until_fails_the_test_at_its_deadline() -> None:
    with pytest.raises(AssertionError, match="the never did not hold within 0.05 s"):
        await until(lambda: False, 0.05, what="the never")


async def test_until_returns_once_a_check_holds_sync_or_async() -> None:
    calls: list[int] = []

    async def third_time() -> bool:
        calls.append(1)
        return len(calls) == 3

    await until(third_time)
    await until(lambda: len(calls) == 3)
    assert len(calls) == 3


def test_the_clock_reads_now_and_moves_when_told() -> None:
    clock, stepping = Clock(), Clock(5.0, step=0.5)
    assert clock() == clock() == 1000.0
    clock.advance(2.5)
    assert clock() == 1002.5
    assert [stepping(), stepping()] == [5.0, 5.5]
