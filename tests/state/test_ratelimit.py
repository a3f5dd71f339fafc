"""The rate-limit store's contract; the GCRA arithmetic is tests/proxy/state/test_ratelimit_store."""

from __future__ import annotations

import asyncio

from proxy.state.ratelimit import Limit
from tests.state.conftest import Backend, within

SECOND = 1_000_000
TWO_PER_SECOND = Limit("rl:r:alice", SECOND // 2, SECOND // 2)  # burst 2


async def test_a_burst_then_a_refusal_then_time_brings_a_call_back(
        backend: Backend) -> None:
    store = backend.rate_limits()
    assert await store.take([TWO_PER_SECOND]) is None
    assert await store.take([TWO_PER_SECOND]) is None
    refused = await store.take([TWO_PER_SECOND])
    assert refused is not None and refused.position == 0
    assert refused.retry_after_s == within(backend, 0.5)
    await backend.advance(0.5)  # the store's own clock decides
    assert await store.take([TWO_PER_SECOND]) is None


async def test_all_or_nothing_under_concurrency(backend: Backend) -> None:
    store = backend.rate_limits()
    other = Limit("rl:r:endpoint", SECOND, 9 * SECOND)  # burst 10
    results = await asyncio.gather(*(store.take([other, TWO_PER_SECOND]) for _ in range(30)))
    assert sum(r is None for r in results) == 2
    assert all(r.position == 1 and r.retry_after_s == within(backend, 0.5)
               for r in results if r is not None)
    for _ in range(8):  # the refusals charged nothing: 8 of the 10 are left
        assert await store.take([other]) is None
    assert await store.take([other]) is not None
