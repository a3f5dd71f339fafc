"""The refresh-rotation store's contract (proxy.state.rotations), on each backend: the first
claim of a key is kept for the grace period, every later one (at once, or from another
replica) gets it back, and the period's end forgets it."""

from __future__ import annotations

import asyncio

from tests.state.conftest import Backend


async def test_the_first_claim_is_kept_and_handed_to_every_later_one(backend: Backend) -> None:
    store = backend.rotations(grace_s=10)
    assert await store.claim("k", b"first") is None
    assert await store.claim("k", b"second") == b"first"
    assert await store.get("k") == b"first"
    assert await store.get("other") is None


async def test_claims_at_once_keep_exactly_one(backend: Backend) -> None:
    store = backend.rotations(grace_s=10)
    results = await asyncio.gather(*(store.claim("k", str(i).encode()) for i in range(30)))
    kept = [r for r in results if r is not None]
    assert results.count(None) == 1 and len(set(kept)) == 1 and len(kept) == 29
    assert await store.get("k") == kept[0]


async def test_a_claim_is_forgotten_when_the_grace_period_ends(backend: Backend) -> None:
    store = backend.rotations(grace_s=10)
    assert await store.claim("k", b"first") is None
    await backend.advance(9)
    assert await store.get("k") == b"first"
    await backend.advance(1.5)
    assert await store.get("k") is None
    assert await store.claim("k", b"later") is None
