from __future__ import annotations

import pytest

from proxy.state import open_stores
from proxy.state.browser import MemoryBrowserSessions, issued
from tests import state_backends
from tests.conftest import make_config
from tests.state.conftest import Backend


async def test_create_read_delete(backend: Backend) -> None:
    store = backend.browser_sessions(ttl_s=3600)
    sid = await store.create("u1")
    assert len(sid) >= 32 and sid != await store.create("u1")
    assert await store.user_id(sid) == "u1"
    await store.delete(sid)
    assert await store.user_id(sid) is None
    await store.delete(sid)  # twice is fine
    assert await store.user_id("never") is None


async def test_a_session_ends_at_its_lifetime_however_it_is_used(backend: Backend) -> None:
    store = backend.browser_sessions(ttl_s=100)
    sid = await store.create("u1")
    await backend.advance(99)
    assert await store.user_id(sid) == "u1"  # reading does not extend it
    await backend.advance(1)
    assert await store.user_id(sid) is None


async def test_ending_a_persons_sessions_ends_only_theirs(backend: Backend) -> None:
    store = backend.browser_sessions(ttl_s=3600)
    alice = [await store.create("alice") for _ in range(3)]
    bob = [await store.create("bob") for _ in range(2)]
    assert await store.end_for("alice", keep=alice[0]) == 2
    assert [await store.user_id(s) for s in alice] == ["alice", None, None]
    assert [await store.user_id(s) for s in bob] == ["bob", "bob"]
    assert await store.end_for("alice") == 1  # the kept one goes too, the next time
    assert await store.user_id(alice[0]) is None
    assert await store.end_for("alice") == 0
    assert await store.end_for("nobody", keep=bob[0]) == 0
    assert await store.user_id(bob[0]) == "bob"
    later = await store.create("alice")  # a new session after the end is a live one
    assert await store.user_id(later) == "alice"


async def test_another_persons_session_cannot_be_kept(backend: Backend) -> None:
    store = backend.browser_sessions(ttl_s=3600)
    mine, theirs = await store.create("alice"), await store.create("bob")
    assert await store.end_for("alice", keep=theirs) == 1
    assert await store.user_id(mine) is None and await store.user_id(theirs) == "bob"


async def test_expired_sessions_count_as_ended_already(backend: Backend) -> None:
    store = backend.browser_sessions(ttl_s=100)
    await store.create("alice")
    await backend.advance(100)
    assert await store.end_for("alice") == 0


async def test_the_memory_index_holds_only_live_sessions() -> None:
    """Ending a person's sessions reads their index entry only; it never grows with sessions
    that expired, were evicted, deleted or ended."""
    now = [0.0]
    store = MemoryBrowserSessions(ttl_s=100, clock=lambda: now[0], max_sessions=3)
    old = await store.create("alice")
    now[0] = 100.0
    fresh = await store.create("alice")  # the expired one leaves the index as it goes
    assert store._by_user == {"alice": {fresh}} and await store.user_id(old) is None
    bob = [await store.create("bob") for _ in range(3)]  # full: alice's is evicted
    assert store._by_user == {"bob": set(bob)} and len(store) == 3
    await store.delete(bob[0])
    await store.end_for("bob", keep=bob[1])
    assert store._by_user == {"bob": {bob[1]}}


async def test_an_id_not_of_the_issued_form_is_no_session(backend: Backend) -> None:
    """A cookie naming the index of a person's sessions (`u:<user id>`) or any other key is no
    session, and ending it ends nothing: asked before any store is (#36 item 12)."""
    store = backend.browser_sessions(ttl_s=3600)
    sid = await store.create("alice")
    assert issued(sid) and not issued(sid + "=") and not issued(sid[:-1])
    for forged in ("u:alice", f"u:{sid}", "s:" + sid, sid + "x", sid[:-1], "", "a b" * 20):
        assert not issued(forged)
        assert await store.user_id(forged) is None, forged
        await store.delete(forged)
    assert await store.user_id(sid) == "alice"
    assert await store.end_for("alice") == 1


def test_every_redis_store_keeps_its_own_kinds_of_key() -> None:
    """No key kind of any store begins another's (each kind's keys are read and written only
    as that kind); a store made with an overlapping kind is refused as it is made."""
    cfg = make_config(state={"url": state_backends.REDIS_URL, "key_prefix": "kinds:"},
                      auth={"mode": "jwt"}, oauth_server={"enabled": True})
    stores = open_stores(cfg)  # made, not started: no connection
    assert stores.shared is not None
    kinds = stores.shared._kinds
    assert {"br:s:", "br:u:", "oc:c:", "oc:u:", "rl:"} <= kinds
    assert [(a, b) for a in kinds for b in kinds if a != b and b.startswith(a)] == []
    with pytest.raises(ValueError, match="overlaps"):
        stores.shared.key("br:")
    assert stores.shared.key("br:s:") == "kinds:br:s:"  # the same kind again: another replica's


async def test_count_for_counts_a_persons_live_sessions(backend: Backend) -> None:
    """How many browser sessions a person's console page says they have: live ones only."""
    store = backend.browser_sessions(ttl_s=10)
    alice = [await store.create("alice") for _ in range(2)]
    await backend.advance(6)
    await store.create("alice")
    await store.create("bob")
    assert await store.count_for("alice") == 3 and await store.count_for("nobody") == 0
    await store.delete(alice[1])
    assert await store.count_for("alice") == 2
    await backend.advance(5)  # the first two's time is up
    assert await store.count_for("alice") == 1
    await store.end_for("alice")
    assert await store.count_for("alice") == 0
