"""The task binding store (proxy/state/tasks.py), on memory and Redis alike: a binding is read
back by its endpoint and id only, a caller's tasks are listed per endpoint, a task's end is
marked once, and a binding goes when its time runs out."""

from __future__ import annotations

from proxy.state.tasks import TaskBinding, ttl_of
from tests.state.conftest import Backend

ALICE = TaskBinding("alice-key", "alice", "research", 1000.0)
BOB = TaskBinding("bob-key", "bob", "research", 1001.0, member="m1", upstream_id="u-1")


async def test_a_binding_is_read_back_by_its_endpoint_and_id(backend: Backend) -> None:
    store = backend.tasks()
    await store.bind("ep", "t-1", ALICE, 60)
    await store.bind("ep", "t-2", BOB, 60)
    assert await store.binding("ep", "t-1") == ALICE
    assert await store.binding("ep", "t-2") == BOB
    assert await store.binding("other", "t-1") is None  # another endpoint's id space
    assert await store.binding("ep", "t-3") is None
    # an endpoint's name with a colon does not reach another endpoint's ids
    await store.bind("a:b", "c", ALICE, 60)
    assert await store.binding("a", "b:c") is None


async def test_a_callers_tasks_are_listed_per_endpoint(backend: Backend) -> None:
    store = backend.tasks()
    await store.bind("ep", "t-1", ALICE, 60)
    await store.bind("ep", "t-2", ALICE, 60)
    await store.bind("ep", "t-3", BOB, 60)
    await store.bind("elsewhere", "t-4", ALICE, 60)
    assert await store.owned("ep", "alice-key") == {"t-1": "research", "t-2": "research"}
    assert await store.owned("ep", "bob-key") == {"t-3": "research"}
    assert await store.owned("ep", "carol-key") == {}


async def test_a_tasks_end_is_marked_once(backend: Backend) -> None:
    store = backend.tasks()
    await store.bind("ep", "t-1", ALICE, 60)
    assert await store.finish("ep", "t-1") == ALICE
    assert await store.finish("ep", "t-1") is None
    assert await store.finish("ep", "unbound") is None
    assert await store.binding("ep", "t-1") == ALICE  # still served after its end


async def test_a_binding_goes_when_its_time_runs_out(backend: Backend) -> None:
    store = backend.tasks()
    await store.bind("ep", "t-1", ALICE, 10)
    await backend.advance(9)
    assert await store.binding("ep", "t-1") == ALICE
    await backend.advance(2)
    assert await store.binding("ep", "t-1") is None
    assert await store.finish("ep", "t-1") is None


def test_the_ttl_kept_is_the_tasks_within_bounds() -> None:
    assert ttl_of({"ttl": 60000}) == 60.0
    assert ttl_of({"ttl": None}) == 24 * 3600.0
    assert ttl_of({"ttl": 10**12}) == 7 * 24 * 3600.0
    assert ttl_of({"ttl": True}) == 24 * 3600.0
