"""The lease store's contract, on memory and on Redis alike: one holder of a name at a time,
released only by its own token, free again once its time to live runs out; a Redis that is
away is StoreUnavailable naming the lease store, never the URL."""

from __future__ import annotations

import asyncio
import socket

import pytest

from proxy.errors import StoreUnavailable
from proxy.state.leases import LeaseStore, MemoryLeases, RedisLeases
from proxy.state.shared import Shared
from tests.helpers import Clock
from tests.state.conftest import Backend, RedisBackend


def leases(backend: Backend) -> LeaseStore:
    if isinstance(backend, RedisBackend):
        return RedisLeases(backend.shared)
    return MemoryLeases(clock=backend.clock)


async def test_one_holder_at_a_time_until_it_releases(backend: Backend) -> None:
    store = leases(backend)
    held = await store.acquire("rf:gh:p|alice", 30)
    assert held is not None
    assert await store.acquire("rf:gh:p|alice", 30) is None
    assert await store.acquire("rf:gh:p|bob", 30) is not None  # another name is its own
    await store.release("rf:gh:p|alice", "not-the-token")  # only the holder's token ends it
    assert await store.acquire("rf:gh:p|alice", 30) is None
    await store.release("rf:gh:p|alice", held)
    again = await store.acquire("rf:gh:p|alice", 30)
    assert again is not None and again != held


async def test_concurrent_acquires_have_one_winner(backend: Backend) -> None:
    store = leases(backend)
    got = await asyncio.gather(*(store.acquire("rf:gh:p|alice", 30) for _ in range(50)))
    assert sum(token is not None for token in got) == 1


async def test_a_lease_runs_out_and_its_late_release_does_not_end_the_next(
        backend: Backend) -> None:
    store = leases(backend)
    held = await store.acquire("rf:gh:p|alice", 5)
    assert held is not None
    await backend.advance(4.9)
    assert await store.acquire("rf:gh:p|alice", 5) is None
    await backend.advance(0.2)  # the holder died: its lease ran out
    taken = await store.acquire("rf:gh:p|alice", 5)
    assert taken is not None
    await store.release("rf:gh:p|alice", held)  # the first holder, back late
    assert await store.acquire("rf:gh:p|alice", 5) is None  # the new holder still holds it
    await store.release("rf:gh:p|alice", taken)
    assert await store.acquire("rf:gh:p|alice", 5) is not None


async def test_the_memory_store_stays_bounded() -> None:
    clock = Clock()
    store = MemoryLeases(max_leases=3, clock=clock)
    for name in "abc":
        assert await store.acquire(name, 10) is not None
    clock.advance(11)
    assert await store.acquire("d", 10) is not None  # the ones that ran out went
    assert len(store._held) == 1
    for name in "efg":
        assert await store.acquire(name, 10) is not None
    assert len(store._held) == 3  # past the bound, the oldest live one goes
    assert await store.acquire("d", 10) is not None


async def test_a_redis_that_is_away_is_store_unavailable() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"redis://:a-password@127.0.0.1:{port}/0"
    shared = Shared(url, "tollhouse-test:away:", timeout_s=0.5)
    store = RedisLeases(shared)
    try:
        with pytest.raises(StoreUnavailable, match="the lease store is unavailable") as caught:
            await store.acquire("rf:gh:p|alice", 30)
        assert "a-password" not in str(caught.value) and str(port) not in str(caught.value)
        with pytest.raises(StoreUnavailable, match="lease"):
            await store.release("rf:gh:p|alice", "t")
    finally:
        await shared.aclose()
