"""MCP sessions by caller (memory and Redis alike): `end_for` ends every session of one caller
and no other's, a session kept alive by use past its caller's first idle timeout is still
found by it, and a session that ended by itself is not counted; `of` lists one caller's live
sessions (a person's console page)."""

from __future__ import annotations

from typing import Any


async def test_end_for_ends_one_callers_sessions_and_no_others(backend: Any) -> None:
    store = backend.sessions(idle_timeout_s=10)
    mine = [await store.create("up", "idp|ada", None, "2025-11-25") for _ in range(3)]
    theirs = await store.create("up", "idp|bob", None, "2025-11-25")
    await store.delete(mine[2].id)  # ended already: not counted again
    assert await store.end_for("idp|ada") == 2
    assert [await store.get(s.id) for s in mine] == [None, None, None]
    kept = await store.get(theirs.id)
    assert kept is not None and kept.principal_key == "idp|bob"
    assert await store.end_for("idp|ada") == 0  # nothing left, nothing to end


async def test_a_session_used_past_its_callers_first_timeout_is_still_ended(
        backend: Any) -> None:
    store = backend.sessions(idle_timeout_s=10)
    used = await store.create("up", "idp|ada", None, "2025-11-25")
    quiet = await store.create("up", "idp|ada", None, "2025-11-25")
    for _ in range(3):  # 24 s of use, each within the idle timeout: the caller's index too
        await backend.advance(8)
        assert await store.get(used.id) is not None
    assert await store.get(quiet.id) is None  # ended by itself
    assert await store.end_for("idp|ada") == 1
    assert await store.get(used.id) is None


async def test_of_lists_one_callers_live_sessions_oldest_first(backend: Any) -> None:
    """What a person's console page lists: their live sessions, none ended or expired, no
    one else's, and reading them restarts no idle timer."""
    store = backend.sessions(idle_timeout_s=10)
    first = await store.create("up", "idp|ada", None, "2025-11-25")
    await backend.advance(4)
    second = await store.create("other", "idp|ada", None, None)
    gone = await store.create("up", "idp|ada", None, "2025-11-25")
    await store.create("up", "idp|bob", None, "2025-11-25")
    await store.delete(gone.id)
    listed = await store.of("idp|ada")
    assert [(s.id, s.endpoint, s.protocol_version) for s in listed] == [
        (first.id, "up", "2025-11-25"), (second.id, "other", None)]
    assert await store.of("idp|nobody") == []
    await backend.advance(7)  # first's idle timeout passed: listing it did not keep it
    assert [s.id for s in await store.of("idp|ada")] == [second.id]
    await store.end_for("idp|ada")
    assert await store.of("idp|ada") == []
