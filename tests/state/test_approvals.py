"""The approval store's contract, on memory and on Redis alike: a new approval, the same one
found again for the same binding, a decision once (a second one conflicts), a grant used
once, the bound on a caller's pending approvals, an expiry marked (and so audited) once, a
deprovisioned caller's approvals dropped, and a waiter released by a decision."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from proxy.state.approvals import Approval, ApprovalStore, MemoryApprovals, RedisApprovals, new_id
from proxy.state.shared import Shared
from tests import state_backends


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[ApprovalStore]:
    if request.param == "memory":
        yield MemoryApprovals()
        return
    shared = Shared(state_backends.REDIS_URL, state_backends.fresh_prefix(), timeout_s=5.0)
    made = RedisApprovals(shared)
    made.start()
    await asyncio.wait_for(shared.listening.wait(), 10)
    try:
        yield made
    finally:
        await shared.aclose()


def fresh(binding: str = "b1", caller: str = "iss|bob", expires_s: float = 60.0) -> Approval:
    now = time.time()
    return Approval(id=new_id(), rule="r", caller=caller, subject="bob", endpoint="github",
                    tool="delete_repo", digest="d", version="v", binding=binding,
                    approvers=("group:sre",), wait_s=1.0, expires_s=expires_s, created_at=now,
                    expires_at=now + expires_s, arguments={"name": "x"})


async def until(check: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not await check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not within the deadline"
        await asyncio.sleep(0.02)


async def test_an_approval_is_asked_once_decided_once_and_used_once(store: ApprovalStore
                                                                    ) -> None:
    kind, first = await store.open(fresh(), 5)
    assert kind == "new" and first is not None
    kind, again = await store.open(fresh(), 5)
    assert kind == "pending" and again is not None and again.id == first.id
    assert again.arguments == {"name": "x"} and again.approvers == ("group:sre",)
    assert [a.id for a in await store.pending()] == [first.id]
    decided = await store.decide(first.id, True, "alice", "fine")
    assert decided[0] == "decided" and decided[1] is not None
    assert decided[1].status == "approved" and decided[1].decided_by == "alice"
    assert decided[1].comment == "fine"
    assert (await store.decide(first.id, False, "mallory", ""))[0] == "conflict"
    kind, used = await store.open(fresh(), 5)
    assert kind == "granted" and used is not None and used.id == first.id
    kind, after = await store.open(fresh(), 5)
    assert kind == "new" and after is not None and after.id != first.id
    assert (await store.decide("apr_nope", True, "alice", ""))[0] == "missing"
    assert (await store.decide("not-an-id*", True, "alice", ""))[0] == "missing"


async def test_a_denied_approval_is_not_asked_again(store: ApprovalStore) -> None:
    _, first = await store.open(fresh(), 5)
    assert first is not None
    assert (await store.decide(first.id, False, "alice", "no"))[0] == "decided"
    kind, next_one = await store.open(fresh(), 5)
    assert kind == "new" and next_one is not None and next_one.id != first.id


async def test_a_caller_holds_at_most_the_bound(store: ApprovalStore) -> None:
    for n in range(3):
        assert (await store.open(fresh(f"b{n}"), 3))[0] == "new"
    assert await store.open(fresh("b9"), 3) == ("full", None)
    assert (await store.open(fresh("c9", caller="iss|carol"), 3))[0] == "new"
    dropped = await store.drop("iss|bob")
    assert len(dropped) == 3
    assert (await store.open(fresh("b9"), 3))[0] == "new"


async def test_an_expiry_is_marked_once(store: ApprovalStore) -> None:
    _, short = await store.open(fresh(expires_s=0.2), 5)
    assert short is not None
    found: list[Approval] = []

    async def swept() -> bool:
        found.extend(await store.expire_due())
        return bool(found)

    await until(swept)
    assert [a.id for a in found] == [short.id] and found[0].status == "expired"
    assert await store.expire_due() == []  # once
    assert (await store.decide(short.id, True, "alice", ""))[0] == "expired"
    assert await store.pending() == []


async def test_a_decision_releases_a_waiter(store: ApprovalStore) -> None:
    _, first = await store.open(fresh(), 5)
    assert first is not None
    waiting = asyncio.create_task(store.wait(first.id, 30))
    await asyncio.sleep(0)
    await store.decide(first.id, True, "alice", "")
    released = await asyncio.wait_for(waiting, 10)
    assert released is not None and released.status == "approved"
    undecided = (await store.open(fresh("b2"), 5))[1]
    assert undecided is not None
    assert (await store.wait(undecided.id, 0.05)).status == "pending"  # type: ignore[union-attr]
