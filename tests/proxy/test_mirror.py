"""proxy.mirror: what every mirrored table (servers, virtual endpoints, pins, API keys) relies
on. Lookups asking together share one read of the version, begun after each asked; one that
finds it unmoved reads no table; a sync waits for a write in progress and sees it; a change
marked during a read is read again; a poll that meets a database error keeps polling. The
table here is a counter and rows in memory, read on the mirrors' pool like a database's."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator

import pytest

from proxy.mirror import Mirror, Mirrors
from tests.helpers import until


class Table:
    """A version and rows, as the mirror's blocking calls see them; `hold` keeps a read
    waiting until it is set."""

    def __init__(self) -> None:
        self.version = 1
        self.rows = {"a": 1}
        self.probes = 0
        self.reads = 0
        self.failing = False
        self.hold = threading.Event()
        self.hold.set()
        self.reading = threading.Event()

    def probe(self) -> int:
        self.probes += 1
        if self.failing:
            raise sqlite3.OperationalError("database is locked")
        return self.version

    def read(self) -> tuple[int, dict[str, int]]:
        self.reads += 1
        self.reading.set()
        assert self.hold.wait(10)
        return self.version, dict(self.rows)

    def write(self, name: str, value: int) -> None:
        self.rows[name] = value
        self.version += 1


class Owner:
    def __init__(self, mirrors: Mirrors, table: Table) -> None:
        self.applied: list[dict[str, int]] = []
        self.mirror: Mirror[dict[str, int]] = mirrors.mirror(
            "test table", table.probe, table.read, self.applied.append,
            errors=(sqlite3.OperationalError,))
        self.applied.append(self.mirror.load_now())


@pytest.fixture
async def mirrors() -> AsyncIterator[Mirrors]:
    mirrors = Mirrors(poll_s=0.01)
    yield mirrors
    await mirrors.aclose()


async def test_lookups_together_share_a_version_read_and_read_no_table_unmoved(
        mirrors: Mirrors) -> None:
    table = Table()
    owner = Owner(mirrors, table)
    await asyncio.gather(*(owner.mirror.sync() for _ in range(50)))
    assert table.probes == 1 and table.reads == 1  # the start's read only
    table.write("b", 2)  # another process
    await owner.mirror.sync()
    assert owner.applied[-1] == {"a": 1, "b": 2} and table.reads == 2


async def test_a_sync_waits_for_a_write_in_progress_and_sees_it(mirrors: Mirrors) -> None:
    table = Table()
    owner = Owner(mirrors, table)
    written = asyncio.Event()

    async def write() -> None:
        async with owner.mirror.changing():
            await owner.mirror.run(table.write, "b", 2)
            written.set()
            await owner.mirror.catch_up()

    writing = asyncio.create_task(write())
    await written.wait()
    await owner.mirror.sync()  # the version it reads has moved, or the write holds the lock
    assert owner.applied[-1] == {"a": 1, "b": 2}
    await writing


async def test_a_change_marked_during_a_read_is_read_again(mirrors: Mirrors) -> None:
    table = Table()
    owner = Owner(mirrors, table)
    table.hold.clear()
    table.reading.clear()
    table.write("b", 2)
    syncing = asyncio.create_task(owner.mirror.sync())
    await asyncio.to_thread(table.reading.wait, 10)
    owner.mirror.stale()  # e.g. a pin's write found the row changed meanwhile
    table.hold.set()
    await syncing
    reads = table.reads
    await owner.mirror.sync()
    assert table.reads == reads + 1  # not taken as current


async def test_a_poll_that_meets_a_database_error_keeps_polling(
        mirrors: Mirrors, caplog: pytest.LogCaptureFixture) -> None:
    table = Table()
    owner = Owner(mirrors, table)
    table.failing = True
    with caplog.at_level(logging.WARNING, "tollhouse.mirror"):
        async with mirrors.running():
            await until(lambda: "test table: cannot read the database" in caplog.text,
                        what="the warning")
            table.failing = False
            table.write("b", 2)
            await until(lambda: owner.applied[-1] == {"a": 1, "b": 2}, what="the next poll")
