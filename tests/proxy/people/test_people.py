"""LiveUsers: who a gateway token's user is now, read once per person per TTL, at once after a
change through the same Accounts, and StoreDown (never a guess) when the table is out of reach."""

from __future__ import annotations

import pytest

from proxy.auth.people import StoreDown
from proxy.people.accounts import Accounts
from proxy.people.live import LiveUsers
from tests import db_backends
from tests.helpers import Clock


class Counting:
    """An Accounts whose reads are counted, and which can be made to fail."""

    def __init__(self, accounts: Accounts) -> None:
        self.inner = accounts
        self.reads = 0
        self.down = False

    @property
    def generation(self) -> int:
        return self.inner.generation

    @property
    def errors(self) -> tuple[type[Exception], ...]:
        return self.inner.errors

    def by_subject(self, issuer: str, subject: str):  # type: ignore[no-untyped-def]
        self.reads += 1
        if self.down:
            raise self.inner.errors[0]("the database went away")
        return self.inner.by_subject(issuer, subject)


async def test_read_once_per_ttl_and_at_once_after_a_change() -> None:
    accounts = Accounts(db_backends.open_database())
    accounts.create_role("ops")
    pat = accounts.create_local("pat", "pat-password")
    table, clock = Counting(accounts), Clock()
    live = LiveUsers(table, ttl_s=30, clock=clock)
    first = await live.current(pat.issuer, pat.subject)
    assert first is not None and first.groups == frozenset()
    assert (await live.current(pat.issuer, pat.subject)) == first and table.reads == 1
    accounts.update("pat", roles=["ops"])  # through the same Accounts: seen at once
    changed = await live.current(pat.issuer, pat.subject)
    assert changed is not None and changed.groups == {"ops"} and table.reads == 2
    clock.advance(31)  # past the TTL: read again (a change made by another process shows here)
    await live.current(pat.issuer, pat.subject)
    assert table.reads == 3
    accounts.delete("pat")
    assert await live.current(pat.issuer, pat.subject) is None
    assert await live.current("tollhouse:local", "local:nobody") is None


async def test_a_table_out_of_reach_is_store_down() -> None:
    accounts = Accounts(db_backends.open_database())
    pat = accounts.create_local("pat", "pat-password")
    table = Counting(accounts)
    table.down = True
    with pytest.raises(StoreDown):
        await LiveUsers(table).current(pat.issuer, pat.subject)
