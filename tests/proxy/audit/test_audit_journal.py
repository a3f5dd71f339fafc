"""The audit journal (proxy/audit/journal.py): with it on, an answer waits for one append to a
local file, not for a commit; what a crashed process journaled goes into the database (the
run's backend) at the next start, once; a live process's journal is never taken; full segments
go once their records are committed, and the last one at a clean stop."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from proxy.audit import DatabaseAuditSink, commit, query
from proxy.audit.database import _line
from proxy.config import DatabaseConfig
from tests import db_backends
from tests.helpers import DEADLINE_S, until
from tests.proxy.audit.test_audit import record


def segments(tmp_path: Path) -> list[Path]:
    return sorted(p for p in tmp_path.iterdir() if ".audit-journal." in p.name)


async def test_an_answer_waits_for_the_append_and_the_record_is_committed_later(
        tmp_path: Path) -> None:
    db = db_backends.url()
    base = tmp_path / "t.audit-journal"
    sink = DatabaseAuditSink(db, journal=base)
    try:
        with db_backends.tables_held(db, "audit", "usage_outbox"):  # no commit can happen
            kept = sink.write(record(1, call_id="c1"))
            assert kept.done() and kept.result() is True  # durable: the journal holds it
            (live,) = segments(tmp_path)
            assert b'"call_id":"c1"' in live.read_bytes()
    finally:
        await sink.close()
    assert [r["request_id"] for r in query(db)] == ["1"]
    assert db_backends.rows(db, "SELECT call_id FROM usage_outbox") == [("c1",)]
    assert segments(tmp_path) == []  # a clean stop leaves no journal behind


async def test_a_crashed_runs_journal_goes_into_the_database_once(tmp_path: Path) -> None:
    db = db_backends.url()
    base = tmp_path / "t.audit-journal"
    landed = record(1)  # journaled and committed before the crash: not written again
    first = DatabaseAuditSink(db)
    first.emit(landed)
    first.emit(record(2, call_id="c2"))
    await first.close()
    orphan = tmp_path / "t.audit-journal.4242-dead.3.jsonl"  # no process holds it
    orphan.write_bytes(b"".join(_line(r, newline=True) for r in (
        landed, record(2, call_id="c2"), record(3, call_id="c3"), record(4)))
        + b'{"ts": 1')  # a line the crash cut short
    again = DatabaseAuditSink(db, journal=base)
    await again.close()
    assert again.replayed == 4
    assert segments(tmp_path) == []
    assert sorted(r["request_id"] for r in query(db)) == ["1", "2", "3", "4"]
    assert db_backends.rows(db, "SELECT call_id FROM usage_outbox ORDER BY call_id") == [
        ("c2",), ("c3",)]


HOLDER = textwrap.dedent("""
    import sys
    from proxy.audit.journal import Journal
    journal = Journal(sys.argv[1])
    journal.append(sys.argv[2].encode() + b"\\n")
    print(journal.segment.path, flush=True)
    sys.stdin.read()  # until the test closes stdin or kills this process
""")


async def test_a_live_processs_journal_is_never_taken_and_is_replayed_after_it_dies(
        tmp_path: Path) -> None:
    db = db_backends.url()
    base = tmp_path / "t.audit-journal"
    line = _line(record(7, call_id="c7")).decode()
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLDER, str(base), line, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)
    try:
        assert holder.stdout is not None
        printed = await asyncio.wait_for(holder.stdout.readline(), DEADLINE_S)
        held = Path(printed.decode().strip())
        other = DatabaseAuditSink(db, journal=base)  # starts while the holder lives
        await other.close()
        assert held.exists() and query(db) == []
    finally:
        holder.kill()  # a crash: its lock goes with it, its journal stays
        await asyncio.wait_for(holder.wait(), DEADLINE_S)
    assert held.exists()
    after = DatabaseAuditSink(db, journal=base)
    await after.close()
    assert [r["call_id"] for r in query(db)] == ["c7"] and not held.exists()


async def test_full_segments_go_once_committed(tmp_path: Path) -> None:
    db = db_backends.url()
    sink = DatabaseAuditSink(db, journal=tmp_path / "t.audit-journal",
                             journal_rotate_bytes=600)
    for i in range(40):
        assert sink.write(record(i, call_id=f"c{i}")).result() is True
    await sink.close()
    assert sink._journal is not None and sink._journal._n > 5  # it did rotate
    assert segments(tmp_path) == []
    assert db_backends.rows(db, "SELECT count(*) FROM audit") == [(40,)]


async def test_a_journal_that_cannot_be_appended_to_waits_for_the_commit(
        tmp_path: Path) -> None:
    db = db_backends.url()
    sink = DatabaseAuditSink(db, journal=tmp_path / "t.audit-journal")
    assert sink._journal is not None
    sink._journal.append = lambda line: False  # type: ignore[method-assign]  # a full disk
    try:
        kept = sink.write(record(1))
        assert not kept.done()  # waits for its commit like without a journal
        assert await asyncio.wait_for(kept, DEADLINE_S) is True
        assert [r["request_id"] for r in query(db)] == ["1"]
    finally:
        await sink.close()


@pytest.mark.parametrize(("setting", "sqlite", "expected"), [
    ("auto", "/d/t.db", "/d/t.db.audit-journal"),
    ("auto", None, None),  # PostgreSQL: answers wait for the commit
    ("on", None, "tollhouse.audit-journal"),
    ("off", "/d/t.db", None),
])
def test_where_the_journal_is(setting: str, sqlite: str | None, expected: str | None) -> None:
    assert DatabaseConfig(audit_journal=setting).journal(sqlite) == expected
    if expected is not None:
        assert DatabaseConfig(audit_journal=setting,
                              audit_journal_path="/vol/j").journal(sqlite) == "/vol/j"


async def test_with_a_commit_window_a_burst_shares_one_commit(tmp_path: Path) -> None:
    """With the journal on, the writer lets records gather for `commit_window_s` after the
    first: a burst of answers costs one commit, not one each."""
    db = db_backends.url()
    sink = DatabaseAuditSink(db, journal=tmp_path / "t.audit-journal", commit_window_s=5.0)
    try:
        for i in range(50):  # spread out (the writer is free between two), yet well inside
            assert sink.write(record(i, call_id=f"c{i}")).result() is True  # the window
            await asyncio.sleep(0.002)  # pacing the arrivals, not waiting for anything
    finally:
        await asyncio.wait_for(sink.close(), DEADLINE_S)  # a stop does not wait the window out
    assert sink.commits == 1
    assert db_backends.rows(db, "SELECT count(*) FROM audit") == [(50,)]
    assert db_backends.rows(db, "SELECT count(*) FROM usage_outbox") == [(50,)]


async def test_without_a_commit_window_each_record_commits_when_the_writer_is_free(
        tmp_path: Path) -> None:
    db = db_backends.url()
    sink = DatabaseAuditSink(db, journal=tmp_path / "t.audit-journal", commit_window_s=0.0)
    try:
        sink.write(record(1, call_id="c1"))
        await until(lambda: sink.commits == 1, what="the lone record's commit")
    finally:
        await sink.close()


async def test_a_record_someone_waits_for_is_not_held_by_the_window(tmp_path: Path) -> None:
    """The journal could not take it (a full disk), so its answer waits for the commit: the
    window, however long, does not apply to it."""
    db = db_backends.url()
    sink = DatabaseAuditSink(db, journal=tmp_path / "t.audit-journal", commit_window_s=3600.0)
    assert sink._journal is not None
    try:
        assert sink.write(record(1, call_id="c1")).result() is True  # journaled: may wait
        sink._journal.append = lambda line: False  # type: ignore[method-assign]
        kept = sink.write(record(2, call_id="c2"))
        assert await asyncio.wait_for(kept, DEADLINE_S) is True
        assert sorted(r["request_id"] for r in query(db)) == ["1", "2"]
    finally:
        await asyncio.wait_for(sink.close(), DEADLINE_S)


def test_a_commit_window_without_the_journal_is_ignored() -> None:
    """Answers wait for the commit there: a window would only add latency."""
    sink = DatabaseAuditSink(db_backends.url(), commit_window_s=5.0)
    try:
        assert sink._window == 0.0
    finally:
        asyncio.run(sink.close())


async def test_settled_commits_what_the_window_holds(tmp_path: Path) -> None:
    """An audit query first awaits `settled()`: records gathering for the window are
    committed then, not an hour later; with nothing queued it returns at once."""
    db = db_backends.url()
    sink = DatabaseAuditSink(db, journal=tmp_path / "t.audit-journal", commit_window_s=3600.0)
    try:
        await asyncio.wait_for(sink.settled(), DEADLINE_S)  # nothing queued
        for i in range(3):
            assert sink.write(record(i, call_id=f"c{i}")).result() is True
        await asyncio.wait_for(sink.settled(), DEADLINE_S)
        assert sorted(r["request_id"] for r in query(db)) == ["0", "1", "2"]
        assert sink.commits == 1
    finally:
        await asyncio.wait_for(sink.close(), DEADLINE_S)


class _Cursor:
    def __init__(self) -> None:
        self.sizes: list[int] = []

    def execute(self, sql: str, params: list[Any]) -> None:
        self.sizes.append(len(params) // 2)


def test_a_batch_goes_in_as_few_multi_row_inserts() -> None:
    """One statement per power of two in the batch's size, not one step per row (with the
    event loop busy, each step's GIL hand-back cost the writer ~3 times a row's CPU)."""
    statements = commit._multi_row("t", ("a", "b"))
    cur = _Cursor()
    commit._insert_rows(cur, statements, [(i, i) for i in range(300)])  # type: ignore[arg-type]
    assert cur.sizes == [256, 32, 8, 4]
    assert "VALUES (?, ?), (?, ?) ON CONFLICT DO NOTHING" in statements[2]


async def test_a_large_batch_lands_whole_and_a_landed_record_is_not_doubled(
        tmp_path: Path) -> None:
    db = db_backends.url()
    sink = DatabaseAuditSink(db, journal=tmp_path / "t.audit-journal", commit_window_s=3600.0)
    try:
        for i in range(300):
            assert sink.write(record(i, call_id=f"c{i}")).result() is True
        await asyncio.wait_for(sink.settled(), DEADLINE_S)
        assert sink.commits == 1
        for i in (5, 300):  # one already there (its call id), one new
            assert sink.write(record(i, call_id=f"c{i}")).result() is True
        await asyncio.wait_for(sink.settled(), DEADLINE_S)
    finally:
        await asyncio.wait_for(sink.close(), DEADLINE_S)
    assert db_backends.rows(db, "SELECT count(*) FROM audit") == [(301,)]
    assert db_backends.rows(db, "SELECT count(*) FROM usage_outbox") == [(301,)]
