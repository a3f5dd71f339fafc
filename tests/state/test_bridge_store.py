"""The bridge store: verdicts are kept as learned; a held session ends after its idle time
unless it is used, and forgetting it ends it at once."""

from __future__ import annotations

from proxy.state.learned import HeldSession, Learned, MemoryBridgeStore
from tests.helpers import Clock


async def test_a_verdict_is_kept_per_route_key() -> None:
    store = MemoryBridgeStore(clock=Clock())
    assert await store.learned("up http://a/mcp") is None
    await store.learn("up http://a/mcp", Learned("modern", discover={"supportedVersions": []}))
    assert (await store.learned("up http://a/mcp")) == Learned(
        "modern", discover={"supportedVersions": []})
    assert await store.learned("up http://b/mcp") is None  # the same name re-pointed


async def test_a_held_session_slides_on_use_and_ends_when_idle_or_forgotten() -> None:
    clock = Clock()
    store = MemoryBridgeStore(session_ttl_s=10, clock=clock)
    held = HeldSession("usid-1", {"protocolVersion": "2025-11-25"})
    await store.hold("r", "alice", held)
    clock.advance(9)
    assert await store.session("r", "alice") == held  # used: the idle timer restarts
    clock.advance(9)
    assert await store.session("r", "alice") == held
    assert await store.session("r", "bob") is None  # never shared between principals
    clock.advance(11)
    assert await store.session("r", "alice") is None
    await store.hold("r", "alice", held)
    await store.forget("r", "alice")
    assert await store.session("r", "alice") is None
