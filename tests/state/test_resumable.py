"""The resumable calls' contexts (proxy/state/resumable.py), on each backend alike: an open
context is claimed once across every claimer, a settled one says how its call ended, and
an entry is gone after its time."""

from __future__ import annotations

import asyncio

from proxy.state.resumable import ANSWERED, OPEN, UNANSWERED
from tests.state.conftest import Backend

CONTEXT = {"method": "tools/call", "params": {"name": "echo"}, "call_id": "c1"}


async def test_an_open_context_is_claimed_once_under_concurrency(backend: Backend) -> None:
    store = backend.resumable()
    await store.remember("call-1", CONTEXT, 60)
    claims = await asyncio.gather(*(store.claim("call-1") for _ in range(20)))
    assert [c.context for c in claims if c is not None] == [CONTEXT] * 20
    assert sum(c is not None and c.open for c in claims) == 1
    assert {c.state for c in claims if c is not None} == {OPEN, ANSWERED}
    assert await store.claim("call-2") is None


async def test_a_settled_context_says_how_its_call_ended(backend: Backend) -> None:
    store = backend.resumable()
    for key, answered in (("a", True), ("u", False)):
        await store.remember(key, CONTEXT, 60)
        store.settled(key, answered=answered)
    claimed = await store.claim("a")
    assert claimed is not None and (claimed.state, claimed.open) == (ANSWERED, False)
    claimed = await store.claim("u")
    assert claimed is not None and (claimed.state, claimed.context) == (UNANSWERED, CONTEXT)
    store.settled("never-remembered", answered=True)  # nothing to mark: nothing made
    assert await store.claim("never-remembered") is None


async def test_a_context_is_gone_after_its_time(backend: Backend) -> None:
    store = backend.resumable()
    await store.remember("call-1", CONTEXT, 30)
    await backend.advance(29)
    store.settled("call-1", answered=False)  # (keeps the time it had)
    claimed = await store.claim("call-1")
    assert claimed is not None and claimed.state == UNANSWERED
    await backend.advance(2)
    assert await store.claim("call-1") is None
