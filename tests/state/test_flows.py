from __future__ import annotations

import asyncio

import pytest

from proxy.state.flows import ForeignFlow
from tests.state.conftest import Backend

VALUE = {"verifier": "v", "next_url": "/signin/done"}


async def test_a_flow_is_taken_once_by_its_binding(backend: Backend) -> None:
    store = backend.flows(ttl_s=600)
    await store.put("state-1", "browser-a", VALUE)
    assert await store.take("state-1", "browser-a") == VALUE
    assert await store.take("state-1", "browser-a") is None
    assert await store.take("unknown", "browser-a") is None


async def test_another_binding_is_refused_and_leaves_the_flow(backend: Backend) -> None:
    store = backend.flows(ttl_s=600)
    await store.put("state-1", "browser-a", VALUE)
    for binding in ("browser-b", "", "browser-a-but-longer"):
        with pytest.raises(ForeignFlow):
            await store.take("state-1", binding)
    assert await store.take("state-1", "browser-a") == VALUE  # its starter can still finish


async def test_a_flow_expires(backend: Backend) -> None:
    store = backend.flows(ttl_s=600)
    await store.put("state-1", "browser-a", VALUE)
    await store.put("state-2", "browser-a", VALUE)
    await backend.advance(599)
    assert await store.take("state-1", "browser-a") == VALUE
    await backend.advance(1)
    assert await store.take("state-2", "browser-a") is None


async def test_a_flow_is_taken_once_under_concurrency(backend: Backend) -> None:
    store = backend.flows(ttl_s=600)
    await store.put("state-1", "browser-a", VALUE)
    results = await asyncio.gather(*(store.take("state-1", "browser-a") for _ in range(20)))
    assert results.count(VALUE) == 1 and results.count(None) == 19
