"""Servers' health in bulk (proxy.audit.summary.healths, behind /api/v1/server-status) on the
run's backend: what it answers for a page of servers in one statement equals what `health`
answers for each server alone, on records on and either side of the 5-minute and hour edges,
with ties, denials, long, empty and missing error messages; and what is last seen of a page
of servers (proxy.seen.LastSeen.get_many) is one read that equals `get` of each."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from proxy.audit import AuditRecord, rollup
from proxy.audit import summary as aggregates
from proxy.audit.database import DatabaseAuditSink, read_rows
from proxy.seen import LastSeen
from proxy.storage.db import Database
from tests import db_backends
from tests.builders import message

NOW = 1_700_003_000.25
RECENT_S, HOUR_S = 300.0, 3600.0
EDGES = (NOW - RECENT_S, NOW - HOUR_S)
STATUSES = ("ok", "ok", "denied", "error", "cancelled")
MESSAGES = ("upstream failed", "", None, "x" * 500, "ünïcode 'quoted' %s ?")
ODD = ("a'b", "50%_off", "semi;colon", "?", rollup.MANAGEMENT)  # names as parameters, not SQL


def traffic(seed: int, endpoints: tuple[str, ...]) -> list[AuditRecord]:
    """Records of every status on, and a millisecond either side of, each edge; elsewhere in
    and before the hour and after `NOW`; several errors of one ts (a tie for the last)."""
    rng = random.Random(seed)
    out = []
    for i in range(600):
        edge = rng.choice(EDGES)
        ts = rng.choice((edge, edge - 0.001, edge + 0.001, edge + rng.choice((-1, 1)) * 1e-6,
                         NOW - rng.random() * 2 * HOUR_S, NOW + rng.random(), NOW))
        status = rng.choice(STATUSES)
        out.append(AuditRecord(endpoint=rng.choice(endpoints), method="tools/call",
                               request_id=f"{seed}-{i}", status=status,  # type: ignore[arg-type]
                               error_message=rng.choice(MESSAGES) if status == "error" else None,
                               ts=ts))
    return out


async def write(database: Database, records: list[AuditRecord]) -> None:
    sink = DatabaseAuditSink(database)
    for record in records:
        sink.emit(record)
    await sink.close()


def each(database: Database, names: list[str]) -> dict[str, dict[str, Any]]:
    return {n: aggregates.health(database, endpoint=n, now=NOW, recent_s=RECENT_S,
                                 hour_s=HOUR_S) for n in names}


def bulk(database: Database, names: list[str]) -> dict[str, dict[str, Any]]:
    return aggregates.healths(database, endpoints=names, now=NOW, recent_s=RECENT_S,
                              hour_s=HOUR_S)


@pytest.fixture
def migrated() -> Any:
    with Database(db_backends.url()) as database:
        database.ensure_schema()
        yield database


async def test_bulk_health_equals_each_servers_health(migrated: Database) -> None:
    busy = ("e0", "e1", "e2", *ODD)
    await write(migrated, traffic(1, busy) + [
        AuditRecord(endpoint="only-denied", status="denied", ts=NOW - 10),
        AuditRecord(endpoint="old", status="error", error_message="long ago", ts=NOW - 7200)])
    names = [*busy, "only-denied", "old", "never", "e0"]  # e0 twice: once
    got = bulk(migrated, names)
    assert list(got) == list(dict.fromkeys(names))
    assert got == each(migrated, list(got))
    assert got["e0"]["last_hour"]["calls"] > got["e0"]["last_5m"]["calls"] > 0
    assert any(h["last_error"] for h in got.values())  # not every last error is empty
    idle = {"last_5m": {"calls": 0, "errors": 0, "error_rate": 0.0},
            "last_hour": {"calls": 0, "errors": 0, "error_rate": 0.0},
            "last_ok_at": None, "last_error_at": None, "last_error": None}
    assert got["only-denied"] == got["old"] == got["never"] == idle
    assert bulk(migrated, []) == {}


async def test_the_edges_and_the_last_error_exactly(migrated: Database) -> None:
    """What both answer, by hand: a record on an edge is inside its window, one a
    millisecond older is not; of two errors at one time, the later written is the last."""
    five, hour = EDGES
    await write(migrated, [
        AuditRecord(endpoint="s", status="ok", ts=five),
        AuditRecord(endpoint="s", status="error", error_message="older", ts=five - 0.001),
        AuditRecord(endpoint="s", status="ok", ts=hour),
        AuditRecord(endpoint="s", status="error", error_message="gone", ts=hour - 0.001),
        AuditRecord(endpoint="s", status="denied", ts=NOW - 1),
        AuditRecord(endpoint="s", status="error", error_message="first of two", ts=NOW - 60),
        AuditRecord(endpoint="s", status="error", error_message="y" * 400, ts=NOW - 60),
        AuditRecord(endpoint="t", status="error", error_message=None, ts=NOW - 5)])
    got = bulk(migrated, ["s", "t"])
    assert got == each(migrated, ["s", "t"])
    assert got["s"] == {"last_5m": {"calls": 3, "errors": 2, "error_rate": 0.6667},
                        "last_hour": {"calls": 5, "errors": 3, "error_rate": 0.6},
                        "last_ok_at": five, "last_error_at": NOW - 60, "last_error": "y" * 300}
    assert got["t"]["last_error_at"] == NOW - 5 and got["t"]["last_error"] is None


async def test_a_page_of_servers_is_one_statement(migrated: Database,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    names = [f"s{i}" for i in range(aggregates.MAX_HEALTHS)]
    await write(migrated, traffic(2, tuple(names)))
    statements: list[str] = []

    def counted(target: Any, text: str, args: tuple[Any, ...]) -> Any:
        statements.append(text)
        return read_rows(target, text, args)

    monkeypatch.setattr(aggregates, "read_rows", counted)
    got = bulk(migrated, names)
    assert len(statements) == 1
    assert sum(h["last_hour"]["calls"] for h in got.values()) > 0
    monkeypatch.setattr(aggregates, "read_rows", read_rows)
    assert got == each(migrated, names)
    with pytest.raises(ValueError):
        bulk(migrated, [*names, "one more"])


class Recorded:
    """A database that records each statement run in its transactions, with its arguments
    (the SELECTs are the reads)."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.database, name)

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        with self.database.transaction() as conn:
            yield _Recording(conn, self.statements)

    def reads(self) -> list[tuple[Any, ...]]:
        return [args for text, args in self.statements
                if text.lstrip().upper().startswith("SELECT")]


class _Recording:
    def __init__(self, conn: Any, into: list[tuple[str, tuple[Any, ...]]]) -> None:
        self._conn, self._into = conn, into

    def execute(self, text: str, args: tuple[Any, ...] = ()) -> Any:
        self._into.append((text, tuple(args)))
        return self._conn.execute(text, args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


async def test_last_seen_of_several_is_one_read(migrated: Database) -> None:
    recorded = Recorded(migrated)
    seen = LastSeen(recorded, lambda name: True)  # type: ignore[arg-type]
    await seen.start()
    try:
        for server, tools in (("a", [{"name": "x"}]), ("b", [{"name": "y"}, {"name": "z"}])):
            rewrite = seen.results(message("tools/list"),
                                   AuditRecord(endpoint=server), None)
            assert rewrite is not None and rewrite({"tools": tools}) is False
        initialize = seen.results(message("initialize", id=2),
                                  AuditRecord(endpoint="b"), None)
        assert initialize is not None
        initialize({"protocolVersion": "2025-11-25"})
        one = {n: await seen.get(n) for n in ("a", "b", "never")}
        recorded.statements.clear()
        several = await seen.get_many(["b", "never", "a", "b"])
        assert recorded.reads() == [("b", "never", "a")]
        assert several == {"b": one["b"], "never": one["never"], "a": one["a"]}
        assert list(several) == ["b", "never", "a"]
        assert several["b"]["era"] == "2025-11-25" and several["a"]["era"] is None
        assert [t["name"] for t in several["b"]["tools"]] == ["y", "z"]
        assert one["never"] == {"era": None, "era_seen_at": None, "tools": None,
                                "tools_seen_at": None}
        assert await seen.get_many([]) == {} and len(recorded.reads()) == 1  # no read
    finally:
        await seen.aclose()
