"""The lockout store and the one helper every surface uses (proxy.auth.lockout.Attempt)."""

from __future__ import annotations

import asyncio

import pytest

from proxy.auth.lockout import Attempt
from proxy.config import LockoutConfig
from proxy.errors import LockedOut
from proxy.state.lockouts import MemoryLockoutStore
from tests.state.conftest import Backend, within

LIMITS = {"max_failures": 3, "window_s": 60.0, "lockout_s": 120.0}


async def test_the_failure_that_reaches_the_limit_is_told_then_every_attempt_is_locked(
        backend: Backend) -> None:
    store = backend.lockouts(**LIMITS)
    for _ in range(3):
        assert await store.locked(["ip:a"]) is None
        assert await store.attempt(["ip:a"], failed=True) is None  # a plain failure answer
    assert await store.locked(["ip:a"]) == within(backend, 120.0)
    # while locked, even a good credential's outcome is held back, and nothing more counts
    assert await store.attempt(["ip:a"], failed=False) == within(backend, 120.0)
    await backend.advance(119.0)
    assert await store.attempt(["ip:a"], failed=True) == within(backend, 1.0)
    await backend.advance(1.0)
    assert await store.locked(["ip:a"]) is None
    assert await store.attempt(["ip:a"], failed=False) is None


async def test_successes_count_nothing_and_failures_count_within_the_window(
        backend: Backend) -> None:
    store = backend.lockouts(**LIMITS)
    for _ in range(50):
        assert await store.attempt(["ip:a"], failed=False) is None
    await store.attempt(["ip:a"], failed=True)
    await store.attempt(["ip:a"], failed=True)
    await backend.advance(60.0)  # the window has passed: the count starts again
    await store.attempt(["ip:a"], failed=True)
    await store.attempt(["ip:a"], failed=True)
    assert await store.locked(["ip:a"]) is None
    await store.attempt(["ip:a"], failed=True)
    assert await store.locked(["ip:a"]) is not None


async def test_each_key_counts_apart_and_any_locked_key_locks_the_attempt(
        backend: Backend) -> None:
    store = backend.lockouts(**LIMITS)
    for i in range(3):  # three names from one address: only the address reaches the limit
        await store.attempt(["ip:a", f"user:n{i}"], failed=True)
    assert await store.locked(["ip:a"]) is not None
    assert await store.locked(["user:n0"]) is None
    assert await store.locked(["ip:b", "user:n0"]) is None
    assert await store.locked(["ip:b", "ip:a"]) is not None
    assert await store.locked([]) is None


async def test_parallel_wrong_guesses_get_at_most_the_limit_of_answers(
        backend: Backend) -> None:
    """N guesses that all pass the first look before any is settled (the case a check and a
    count two steps apart let through, every one of them): at most `max_failures` are told
    they failed; the rest, and a right guess after them, are told they are locked out."""
    store = backend.lockouts(**LIMITS)
    n, entered, everyone_in = 20, [], asyncio.Event()

    async def guess() -> str:
        try:
            async with Attempt(store, ("ip:a",)) as attempt:
                entered.append(attempt)
                if len(entered) == n:
                    everyone_in.set()
                await everyone_in.wait()  # every guess is past the first look by now
                attempt.failed = True
                return "wrong"
        except LockedOut:
            return "locked"

    answers = await asyncio.gather(*(guess() for _ in range(n)))
    assert len(entered) == n  # none was refused before it was checked
    assert answers.count("wrong") == 3 and answers.count("locked") == n - 3
    with pytest.raises(LockedOut) as right:
        async with Attempt(store, ("ip:a",)):
            pass  # a right guess: refused before it is checked
    assert right.value.retry_after_s == within(backend, 120.0)


async def test_a_right_password_in_a_burst_is_held_back_an_unguessable_token_is_not(
        backend: Backend) -> None:
    """A password guessed right while parallel wrong guesses lock the address is not told; a
    bearer token (its signature or secret cannot be guessed) is served, and its success asks
    the store nothing: failures alone are settled."""
    store = backend.lockouts(**LIMITS)
    asked: list[bool] = []

    class Watched:
        async def locked(self, keys: object) -> float | None:
            return await store.locked(keys)  # type: ignore[arg-type]

        async def attempt(self, keys: object, *, failed: bool) -> float | None:
            asked.append(failed)
            return await store.attempt(keys, failed=failed)  # type: ignore[arg-type]

    async def right_one(unguessable: bool) -> str:
        try:
            async with Attempt(Watched(), ("ip:a",), unguessable=unguessable):
                for _ in range(3):  # wrong guesses from the same address, settled meanwhile
                    await store.attempt(["ip:a"], failed=True)
                return "told"
        except LockedOut:
            return "locked"

    assert await right_one(unguessable=False) == "locked"
    assert asked == [False]  # the success was settled, and found the lock
    await backend.advance(LIMITS["lockout_s"])
    asked.clear()
    assert await right_one(unguessable=True) == "told"
    assert asked == []  # nothing settled for it
    with pytest.raises(LockedOut):  # and the lock holds for the next attempt, right or wrong
        async with Attempt(store, ("ip:a",), unguessable=True):
            pass


async def test_an_attempt_already_locked_is_refused_before_anything_is_checked(
        backend: Backend) -> None:
    store = backend.lockouts(**LIMITS)
    for _ in range(3):
        await store.attempt(["ip:a"], failed=True)
    checked = []
    with pytest.raises(LockedOut):
        async with Attempt(store, ["ip:a"]):
            checked.append(True)
    assert checked == []


async def test_without_keys_the_store_is_not_asked() -> None:
    class Down:
        async def locked(self, keys: object) -> float | None:
            raise AssertionError("asked")

        async def attempt(self, keys: object, *, failed: bool) -> float | None:
            raise AssertionError("asked")

    async with Attempt(Down(), ()) as attempt:  # type: ignore[arg-type]
        attempt.failed = True


async def test_a_cancelled_attempt_is_not_settled(backend: Backend) -> None:
    store = backend.lockouts(**LIMITS)
    with pytest.raises(asyncio.CancelledError):
        async with Attempt(store, ["ip:a"]) as attempt:
            attempt.failed = True
            raise asyncio.CancelledError
    for _ in range(2):
        await store.attempt(["ip:a"], failed=True)
    assert await store.locked(["ip:a"]) is None  # the cancelled one did not count


async def test_the_memory_store_tracks_at_most_max_tracked_locks() -> None:
    now = [0.0]
    store = MemoryLockoutStore(LockoutConfig(max_failures=1, lockout_s=10.0, max_tracked=2),
                               lambda: now[0])
    for key in ("a", "b"):
        await store.attempt([key], failed=True)
    now[0] = 5.0
    await store.attempt(["c"], failed=True)  # over the bound: the oldest lock is forgotten
    assert [await store.locked([k]) for k in "abc"] == [None, 5.0, 10.0]
    now[0] = 10.0
    await store.attempt(["d"], failed=True)  # b's lock has run out: it goes, c stays
    assert [await store.locked([k]) for k in "bcd"] == [None, 5.0, 10.0]


async def test_a_lock_set_by_one_process_holds_at_the_next_settlement_of_another() -> None:
    """Two Redis stores on one prefix stand for two replicas: the look before the work is
    local, but the settlement (one script) sees the other replica's lock."""
    from proxy.state.lockouts import RedisLockoutStore
    from proxy.state.shared import Shared
    from tests import state_backends

    prefix = state_backends.fresh_prefix()
    one, two = (Shared(state_backends.REDIS_URL, prefix) for _ in range(2))
    try:
        cfg = LockoutConfig(**LIMITS)
        a, b = RedisLockoutStore(one, cfg), RedisLockoutStore(two, cfg)
        for _ in range(LIMITS["max_failures"]):
            assert await a.attempt(["ip:x"], failed=True) is None  # each failure is told
        assert await a.locked(["ip:x"]) is not None  # a met the lock it set
        assert await b.locked(["ip:x"]) is None  # b has not met it yet ...
        assert await b.attempt(["ip:x"], failed=False) == pytest.approx(120.0, abs=0.5)
        assert await b.locked(["ip:x"]) is not None  # ... and now it has
    finally:
        await one.aclose()
        await two.aclose()
