"""The audit log (SQLite or PostgreSQL, the run's backend): written off the request path,
nothing accepted lost on close."""

from __future__ import annotations

import time
from pathlib import Path

import orjson

from proxy.audit import AuditRecord, DatabaseAuditSink, query
from proxy.cli import main, parse_since
from tests import db_backends


def record(i: int, **kw: object) -> AuditRecord:
    kw.setdefault("ts", 1_000_000.0 + i)
    for name, value in (("endpoint", "e"), ("method", "tools/call"), ("request_id", str(i)),
                        ("principal", "alice"), ("tool", "echo")):
        kw.setdefault(name, value)
    return AuditRecord(**kw)  # type: ignore[arg-type]


async def test_every_accepted_record_is_written_by_close(tmp_path: Path) -> None:
    db = db_backends.url()
    sink = DatabaseAuditSink(db, batch_size=7)
    for i in range(1000):
        sink.emit(record(i))
    await sink.close()
    assert db_backends.rows(db, "SELECT count(*) FROM audit") == [(1000,)]
    if not db_backends.on_postgresql():
        assert db_backends.rows(db, "PRAGMA journal_mode") == [("wal",)]


async def test_a_nul_from_a_client_is_stored_escaped_and_loses_no_record() -> None:
    db = db_backends.url()
    sink = DatabaseAuditSink(db)
    sink.emit(record(1, status="ok"))
    sink.emit(record(2, tool="a\x00b", client_name="c\x00", note="n\x00",
                     request_id="\x00", principal="p\x00"))
    await sink.close()
    assert sink.written == 2  # one batch, nothing in the fallback file
    newest = query(db)[0]
    assert (newest["tool"], newest["client_name"], newest["principal"]) == (
        "a\\u0000b", "c\\u0000", "p\\u0000")


async def test_a_row_the_database_refuses_leaves_only_itself_out(tmp_path: Path) -> None:
    db = db_backends.url()
    fallback = tmp_path / "audit-fallback.jsonl"
    sink = DatabaseAuditSink(db, retry_backoff_s=0.001, fallback_path=str(fallback))
    sink.emit(record(1, call_id="c1"))
    sink.emit(record(2, bytes_in=2**70))  # no backend stores it (SQLite: the driver refuses)
    sink.emit(record(3, call_id="c3"))
    await sink.close()
    assert sorted(r["request_id"] for r in query(db)) == ["1", "3"]
    assert db_backends.rows(db, "SELECT call_id FROM usage_outbox ORDER BY call_id") == [
        ("c1",), ("c3",)]
    lines = fallback.read_bytes().splitlines()
    assert [orjson.loads(line)["request_id"] for line in lines] == ["2"]


async def test_filters_newest_first(tmp_path: Path) -> None:
    db = db_backends.url()
    sink = DatabaseAuditSink(db)
    sink.emit(record(1, status="ok"))
    sink.emit(record(2, status="denied", denied_reason="auth: expired", endpoint="f"))
    sink.emit(record(3, status="error", error_message="upstream timed out"))
    await sink.close()
    assert [r["request_id"] for r in query(db)] == ["3", "2", "1"]
    assert [r["request_id"] for r in query(db, status="denied")] == ["2"]
    assert [r["request_id"] for r in query(db, endpoint="e")] == ["3", "1"]
    assert [r["request_id"] for r in query(db, since=1_000_002.0)] == ["3", "2"]
    assert query(str(tmp_path / "missing.db")) == []


async def test_unwritable_database_falls_back_to_a_file(tmp_path: Path) -> None:
    db = db_backends.url()
    if db_backends.on_postgresql():
        fallback = tmp_path / "audit-fallback.jsonl"
        sink = DatabaseAuditSink(db, retry_backoff_s=0.001, fallback_path=str(fallback))
    else:  # beside the database file unless told otherwise
        fallback = Path(db.removeprefix("sqlite:///") + ".audit-fallback.jsonl")
        sink = DatabaseAuditSink(db, retry_backoff_s=0.001)
    assert sink._conn is not None
    sink._conn.execute("DROP TABLE audit")  # every insert now fails
    sink._conn.commit()
    sink.emit(record(1))
    await sink.close()
    lines = fallback.read_bytes().splitlines()
    assert [orjson.loads(line)["request_id"] for line in lines] == ["1"]


async def test_cli_audit(tmp_path: Path, capsys) -> None:
    db = db_backends.url()
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[database]\nurl = "{db}"\n')
    sink = DatabaseAuditSink(db)
    sink.emit(record(1, ts=time.time(), status="denied", denied_reason="auth: expired"))
    sink.emit(record(2, ts=time.time()))
    await sink.close()
    assert main(["audit", "--config", str(cfg), "--json", "--status", "denied"]) == 0
    rows = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["request_id"], r["denied_reason"]) for r in rows] == [("1", "auth: expired")]
    assert main(["audit", "--db", db, "--since", "1h"]) == 0
    table = capsys.readouterr().out
    assert "denied" in table and "auth: expired" in table and "tools/call echo" in table
    assert main(["audit", "--config", str(cfg), "--since", "yesterday"]) == 2
    assert "--since" in capsys.readouterr().err


def test_parse_since() -> None:
    assert parse_since("90s", now=1000.0) == 910.0
    assert parse_since("2h", now=10_000.0) == 2800.0
    assert parse_since("2026-01-01T00:00:00Z") == 1767225600.0


async def test_cli_usage_totals(tmp_path: Path, capsys) -> None:
    db = db_backends.url()
    sink = DatabaseAuditSink(db)
    now = time.time()
    for i, status in enumerate(["ok", "ok", "denied", "error"]):
        sink.emit(record(i, ts=now, status=status, bytes_in=10, bytes_out=100))
    sink.emit(record(9, ts=now, endpoint="f", bytes_in=1, bytes_out=1))
    sink.emit(record(10, ts=now - 7 * 86400))  # outside the period
    await sink.close()
    assert main(["usage", "--db", db, "--since", "1d", "--json"]) == 0
    rows = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["endpoint"], r["calls"], r["ok"], r["denied"], r["error"], r["bytes_out"])
            for r in rows] == [("e", 4, 2, 1, 1, 400), ("f", 1, 1, 0, 0, 1)]
    assert main(["usage", "--db", db]) == 0
    assert "alice" in capsys.readouterr().out
