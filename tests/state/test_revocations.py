from __future__ import annotations

from proxy.state.revocations import MemoryRevocationStore
from tests.state.conftest import Backend


async def test_a_token_or_its_family_revoked(backend: Backend) -> None:
    store = backend.revocations(ttl_s=660)
    assert not await store.revoked("jti-1", "fam-1")
    await store.revoke_token("jti-1")
    assert await store.revoked("jti-1", "fam-1")
    assert not await store.revoked("jti-2", "fam-1")
    await store.revoke_family("fam-1")
    assert await store.revoked("jti-2", "fam-1")
    assert not await store.revoked("fam-1", "jti-1")  # the two kinds do not mix
    assert not await store.revoked("jti-3", "fam-2")


async def test_an_entry_outlives_the_tokens_it_refuses_then_goes(backend: Backend) -> None:
    store = backend.revocations(ttl_s=660)
    await store.revoke_token("jti-1")
    await store.revoke_family("fam-1")
    await backend.advance(659)
    assert await store.revoked("jti-1", "x") and await store.revoked("x", "fam-1")
    await backend.advance(1)
    assert not await store.revoked("jti-1", "fam-1")


async def test_the_memory_store_holds_at_most_max_entries() -> None:
    now = [0.0]
    store = MemoryRevocationStore(10.0, max_entries=2, clock=lambda: now[0])
    await store.revoke_token("a")
    await store.revoke_token("b")
    now[0] = 5.0
    await store.revoke_token("c")  # over the bound: the oldest goes
    assert [await store.revoked(j, "-") for j in "abc"] == [False, True, True]
    now[0] = 10.0
    await store.revoke_token("d")  # b has run out: it goes, c stays
    assert [await store.revoked(j, "-") for j in "bcd"] == [False, True, True]
