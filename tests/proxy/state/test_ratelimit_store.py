import asyncio

import pytest

from proxy.state.ratelimit import Limit, MemoryRateLimitStore, Refused
from tests.helpers import Clock

SECOND = 1_000_000


class Store:
    """A memory store and its clock: `take(limits, at_us)` sets the clock, then takes."""

    def __init__(self, **kwargs: int) -> None:
        self.clock = Clock(0.0)
        self.store = MemoryRateLimitStore(clock=self.clock, **kwargs)

    async def take(self, limits: list[Limit], at_us: int) -> Refused | None:
        self.clock.now = at_us / SECOND
        return await self.store.take(limits)

    def __len__(self) -> int:
        return len(self.store)


def per_second(key: str, count: int, burst: int) -> Limit:
    interval = SECOND // count
    return Limit(key, interval, (burst - 1) * interval)


async def admitted(store: Store, limits: list[Limit], now: int, n: int) -> int:
    return sum([await store.take(limits, now) is None for _ in range(n)])


async def test_a_burst_is_admitted_then_the_wait_is_one_interval() -> None:
    store = Store()
    limit = per_second("k", 10, 3)
    assert await admitted(store, [limit], 0, 3) == 3
    assert await store.take([limit], 0) == Refused(0, 0.1)
    assert await store.take([limit], SECOND // 10 - 1) is not None
    assert await store.take([limit], SECOND // 10) is None  # exactly one interval later


async def test_a_refusal_charges_no_limit() -> None:
    store = Store()
    roomy, tight = per_second("roomy", 1, 5), per_second("tight", 1, 1)
    assert await store.take([roomy, tight], 0) is None
    for _ in range(50):
        assert await store.take([roomy, tight], 0) == Refused(1, 1.0)
    assert await admitted(store, [roomy], 0, 10) == 4  # 5 - the one call that passed


async def test_a_refusal_creates_no_entry() -> None:
    store = Store()
    tight = per_second("tight", 1, 1)
    await store.take([tight], 0)
    assert await store.take([per_second("new", 1, 1), tight], 0) is not None
    assert len(store) == 1


async def test_the_refusal_names_the_longest_wait_and_retry_after_covers_all() -> None:
    store = Store()
    short, long = per_second("short", 10, 1), per_second("long", 1, 1)
    await store.take([short, long], 0)
    assert await store.take([short, long], 0) == Refused(1, 1.0)
    assert await store.take([short, long], SECOND) is None


async def test_entries_expire_when_they_no_longer_constrain() -> None:
    store = Store()
    await store.take([per_second("a", 10, 1)], 0)  # a's arrival time is 0.1 s
    assert len(store) == 1
    await store.take([per_second("b", 10, 1)], SECOND // 10 - 1)
    assert len(store) == 2
    await store.take([per_second("c", 10, 1)], SECOND // 10)
    assert len(store) == 2  # a is gone: from now on it would admit like a missing entry


async def test_the_number_of_keys_is_bounded_least_recently_used_first() -> None:
    store = Store(max_keys=3)
    for key in "abcd":
        await store.take([per_second(key, 1, 1)], 0)
    assert len(store) == 3
    assert await store.take([per_second("a", 1, 1)], 0) is None  # a was forgotten
    assert await store.take([per_second("d", 1, 1)], 0) is not None


async def test_the_store_owns_time() -> None:
    store = Store()
    limit = per_second("k", 1, 1)
    assert await store.take([limit], 5 * SECOND) is None
    assert await store.take([limit], 5 * SECOND + SECOND // 2) == Refused(0, 0.5)
    assert await store.take([limit], 6 * SECOND) is None  # its clock moved on, no caller's


async def test_time_never_runs_backwards() -> None:
    store = Store()
    limit = per_second("k", 1, 1)
    await store.take([limit], 10 * SECOND)
    assert await store.take([limit], 0) == Refused(0, 1.0)


async def test_concurrent_takes_admit_exactly_the_burst() -> None:
    store = Store()
    limits = [per_second("a", 10, 100), per_second("b", 3, 250)]
    results = await asyncio.gather(*(store.store.take(limits) for _ in range(1000)))
    assert sum(r is None for r in results) == 100


def test_max_keys_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_keys"):
        MemoryRateLimitStore(max_keys=0)


async def test_memory_stays_bounded_when_one_key_is_charged_far_ahead() -> None:
    """Each charge leaves an expiry behind; a key charged again and again, far ahead of now (a
    large burst), must not pile them up: the store keeps a bound on them."""
    store = Store()
    generous = per_second("k", 1000, 1_000_000)  # arrival times run up to 1000 s ahead
    assert await admitted(store, [generous], 0, 20_000) == 20_000
    assert len(store) == 1
    assert len(store.store._expiries) <= 2 * 1 + 1024 + 1


async def test_a_key_charged_again_is_not_forgotten_by_its_earlier_expiry() -> None:
    store = Store()
    limit = per_second("k", 10, 2)
    await store.take([limit], 0)  # arrival 0.1 s
    await store.take([limit], SECOND // 20)  # arrival 0.2 s: the 0.1 s expiry is stale
    await store.take([per_second("other", 10, 1)], SECOND // 10)  # past 0.1 s
    # remembered (arrival 0.2 s): one more fits the burst now, not a fresh burst of two
    assert await store.take([limit], SECOND // 10) is None
    assert await store.take([limit], SECOND // 10) == Refused(0, 0.1)
