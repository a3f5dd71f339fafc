"""The audit log (SQLite or PostgreSQL, the run's backend): written off the request path in
group commits that answers wait for, nothing accepted lost on close, the fallback file
replayed at start, and an answer whose record can be kept nowhere withheld."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from pathlib import Path

import httpx
import orjson
import pytest

from proxy.audit import AuditRecord, DatabaseAuditSink, MemoryAuditSink, query
from proxy.audit.database import _line
from proxy.runtime.cli import main, parse_since
from proxy.storage.db import Database
from tests import db_backends
from tests.conftest import MCP_HEADERS
from tests.e2e.conftest import open_stack
from tests.e2e.upstreams import stateful_sse_app, stateless_json_app
from tests.helpers import DEADLINE_S, until


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


def drop_audit_table(url: str) -> None:
    """The audit table gone from under a running sink (by another connection)."""
    outside = Database(url)
    try:
        with outside.transaction() as conn:
            conn.execute("DROP TABLE audit")
    finally:
        outside.close()


async def test_unwritable_database_falls_back_to_a_file(tmp_path: Path) -> None:
    db = db_backends.url()
    if db_backends.on_postgresql():
        fallback = tmp_path / "audit-fallback.jsonl"
        sink = DatabaseAuditSink(db, retry_backoff_s=0.001, fallback_path=str(fallback))
    else:  # beside the database file unless told otherwise
        fallback = Path(db.removeprefix("sqlite:///") + ".audit-fallback.jsonl")
        sink = DatabaseAuditSink(db, retry_backoff_s=0.001)
    drop_audit_table(db)  # every insert now fails
    sink.emit(record(1))
    await sink.close()
    lines = fallback.read_bytes().splitlines()
    assert [orjson.loads(line)["request_id"] for line in lines] == ["1"]


async def test_cli_audit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
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


async def test_cli_usage_totals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
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


# -- group commit: an answer waits for its record, and only for its own commit ----------------

async def test_a_lone_record_commits_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    db = db_backends.url()
    sink = DatabaseAuditSink(db)
    slept: list[float] = []
    monkeypatch.setattr("proxy.audit.commit.time.sleep", slept.append)  # no waiting window
    try:
        assert await asyncio.wait_for(sink.write(record(1, call_id="c1")), DEADLINE_S) is True
        # durable before anything else came along or the sink closed: in its own commit
        assert db_backends.rows(db, "SELECT request_id FROM audit") == [("1",)]
        assert db_backends.rows(db, "SELECT call_id FROM usage_outbox") == [("c1",)]
        assert (sink.commits, slept) == (1, [])
    finally:
        await sink.close()


async def test_records_that_arrive_during_a_commit_share_the_next() -> None:
    db = db_backends.url()
    sink = DatabaseAuditSink(db)
    try:
        with db_backends.tables_held(db, "audit", "usage_outbox"):  # the first commit waits
            first = sink.write(record(0))
            await until(lambda: sink._queue.empty(), what="the writer took the first record")
            rest = [sink.write(record(i, call_id=f"c{i}")) for i in range(1, 21)]
        assert await asyncio.wait_for(asyncio.gather(first, *rest), DEADLINE_S) == [True] * 21
        assert sink.commits == 2  # the lone one, then the twenty that queued behind it
        assert db_backends.rows(db, "SELECT count(*) FROM audit") == [(21,)]
        assert db_backends.rows(db, "SELECT count(*) FROM usage_outbox") == [(20,)]
    finally:
        await sink.close()


async def test_a_record_kept_nowhere_is_not_reported_durable(tmp_path: Path) -> None:
    db = db_backends.url()
    # neither the database (its audit table gone) nor the fallback file (a directory) takes it
    sink = DatabaseAuditSink(db, retry_backoff_s=0.001, fallback_path=str(tmp_path))
    drop_audit_table(db)
    try:
        assert await asyncio.wait_for(sink.write(record(1)), DEADLINE_S) is False
    finally:
        await sink.close()


async def test_the_fallback_file_goes_into_the_database_once_at_start(tmp_path: Path) -> None:
    db = db_backends.url()
    fallback = tmp_path / "audit-fallback.jsonl"
    landed = record(1)  # a record whose commit did land although its writer saw it fail
    sink = DatabaseAuditSink(db, fallback_path=str(fallback))
    sink.emit(landed)
    sink.emit(record(2, call_id="c2"))
    await sink.close()
    fallback.write_bytes(b"".join(_line(r) + b"\n" for r in (
        landed, record(2, call_id="c2"), record(3, call_id="c3"), record(4))) + b'{"ts": 1')
    again = DatabaseAuditSink(db, fallback_path=str(fallback))  # the next start
    await again.close()
    assert again.replayed == 4 and not fallback.exists() and list(tmp_path.iterdir()) == []
    assert sorted(r["request_id"] for r in query(db)) == ["1", "2", "3", "4"]
    assert db_backends.rows(db, "SELECT call_id FROM usage_outbox ORDER BY call_id") == [
        ("c2",), ("c3",)]


class Refusing(MemoryAuditSink):
    """Takes every record but a `tools/call` of `echo`, which it can keep nowhere."""

    def write(self, record: AuditRecord) -> Awaitable[bool]:
        if record.tool != "echo":
            return super().write(record)
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        done.set_result(False)
        return done


def echo_call(request_id: int = 2) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                         "params": {"name": "echo", "arguments": {"text": "hi"}}})


async def test_an_answer_whose_record_is_kept_nowhere_is_withheld(tmp_path: Path) -> None:
    async with open_stack(tmp_path, stateless_json_app, audit=Refusing()) as stack, \
            httpx.AsyncClient(timeout=10) as client:
        response = await client.post(stack.endpoint, content=echo_call(), headers=MCP_HEADERS)
        # the upstream ran the call, but the client must not take an unrecorded call as done
        assert len(stack.probe.tool_calls("echo")) == 1
        assert response.status_code == 503 and response.headers["retry-after"]
        assert response.json() == {"jsonrpc": "2.0", "id": 2, "error": {
            "code": -32000, "message": "Resident runtime unavailable"}}


async def test_a_streamed_answer_whose_record_is_kept_nowhere_is_withheld(tmp_path: Path
                                                                          ) -> None:
    async with open_stack(tmp_path, stateful_sse_app, audit=Refusing()) as stack, \
            httpx.AsyncClient(timeout=10) as client:
        opened = await client.post(stack.endpoint, headers=MCP_HEADERS, content=orjson.dumps({
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}}))
        session = {**MCP_HEADERS, "mcp-session-id": opened.headers["mcp-session-id"]}
        await client.post(stack.endpoint, headers=session, content=orjson.dumps(
            {"jsonrpc": "2.0", "method": "notifications/initialized"}))
        response = await client.post(stack.endpoint, content=echo_call(), headers=session)
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [orjson.loads(line.removeprefix("data: "))
                  for line in response.text.splitlines() if line.startswith("data: ")]
        assert events == [{"jsonrpc": "2.0", "id": 2, "error": {
            "code": -32000, "message": "Resident runtime unavailable"}}]
        assert len(stack.probe.tool_calls("echo")) == 1
