from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from proxy import db
from proxy.audit.record import AuditRecord

log = logging.getLogger("tollhouse.audit")

_COLUMNS = ("ts", "request_id", "principal", "endpoint", "method", "tool", "status",
            "denied_reason", "error_message", "duration_ms", "bytes_in", "bytes_out", "era",
            "session_hash", "client_name", "call_id", "note", "egress")

SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    request_id TEXT,
    principal TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    method TEXT,
    tool TEXT,
    status TEXT NOT NULL,
    denied_reason TEXT,
    error_message TEXT,
    duration_ms REAL NOT NULL,
    bytes_in INTEGER NOT NULL,
    bytes_out INTEGER NOT NULL,
    era TEXT NOT NULL,
    session_hash TEXT,
    client_name TEXT,
    call_id TEXT,
    note TEXT,
    egress TEXT
);
CREATE INDEX IF NOT EXISTS audit_ts ON audit (ts);
CREATE INDEX IF NOT EXISTS audit_status_ts ON audit (status, ts);
CREATE INDEX IF NOT EXISTS audit_endpoint_ts ON audit (endpoint, ts);
CREATE TABLE IF NOT EXISTS usage_outbox (
    call_id TEXT PRIMARY KEY,
    event TEXT NOT NULL,
    created_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    delivered_at REAL
);
CREATE INDEX IF NOT EXISTS usage_outbox_due ON usage_outbox (delivered_at, next_attempt_at);
"""
_OUTBOX = ("INSERT OR IGNORE INTO usage_outbox (call_id, event, created_at, next_attempt_at) "
           "VALUES (?, ?, ?, ?)")
_INSERT = (f"INSERT INTO audit ({', '.join(_COLUMNS)}) "
           f"VALUES ({', '.join('?' for _ in _COLUMNS)})")
_STOP = object()


def connect(path: str) -> sqlite3.Connection:
    conn = db.connect(path)
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.executescript(SCHEMA)
    columns = {row[1] for row in conn.execute("PRAGMA table_info(audit)")}
    for column in ("client_name", "call_id", "note", "egress"):  # logs of earlier versions
        if column not in columns:
            conn.execute(f"ALTER TABLE audit ADD COLUMN {column} TEXT")
    return conn


class SqliteAuditSink:
    """Records go onto a queue from the event loop (never blocking it) and a writer thread
    inserts them in batches. `close` drains the queue; if the database cannot be written,
    the records go to a JSON-lines file beside it rather than being dropped."""

    def __init__(self, path: str, batch_size: int = 500, linger_s: float = 0.05,
                 retry_backoff_s: float = 0.05,
                 on_outbox: Callable[[], None] | None = None) -> None:
        self._path = path
        self.on_outbox = on_outbox  # called (from the writer thread) after usage events land
        self._retry_backoff_s = retry_backoff_s
        self._batch_size = batch_size
        self._linger_s = linger_s
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._conn = connect(path)
        self._thread = threading.Thread(target=self._run, name="tollhouse-audit", daemon=True)
        self._thread.start()
        self.written = 0

    def emit(self, record: AuditRecord) -> None:
        self._queue.put(record)

    async def close(self) -> None:
        import asyncio

        self._queue.put(_STOP)
        await asyncio.to_thread(self._thread.join)

    def _run(self) -> None:
        stop = False
        while not stop:
            item = self._queue.get()
            if item is not _STOP and self._linger_s and self._queue.qsize() < self._batch_size:
                # let a batch gather: one wake-up (and one GIL hand-off) per batch, not per record
                time.sleep(self._linger_s)
            batch: list[AuditRecord] = []
            while True:
                if item is _STOP:
                    stop = True
                else:
                    batch.append(item)
                if len(batch) >= self._batch_size:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._write(batch, final=stop)
        self._conn.close()

    def _write(self, batch: list[AuditRecord], final: bool) -> None:
        rows = [_row(r) for r in batch]
        usage = [(r.call_id, orjson.dumps(r.usage_event()).decode(), r.ts, r.ts)
                 for r in batch if r.call_id]
        for attempt in range(5):
            try:
                with self._conn:  # the audit rows and their usage events in one transaction
                    self._conn.executemany(_INSERT, rows)
                    if usage:
                        self._conn.executemany(_OUTBOX, usage)
                self.written += len(rows)
                if usage and self.on_outbox is not None:
                    self.on_outbox()
                return
            except sqlite3.Error as exc:
                log.warning("audit write failed (attempt %d): %s", attempt + 1, exc)
                time.sleep(self._retry_backoff_s * 2**attempt)
        fallback = Path(self._path + ".audit-fallback.jsonl")
        with fallback.open("ab") as fh:
            for record in batch:
                fh.write(orjson.dumps(record.as_dict()) + b"\n")
        log.error("audit: %d records written to %s instead of the database",
                  len(batch), fallback)


def _row(r: AuditRecord) -> tuple[Any, ...]:
    return (r.ts, r.request_id, r.principal, r.endpoint, r.method, r.tool, r.status,
            r.denied_reason, r.error_message, round(r.duration_ms, 3), r.bytes_in, r.bytes_out,
            r.era, r.session_hash, r.client_name, r.call_id, r.note,
            orjson.dumps(r.egress).decode() if r.egress else None)


def query(path: str, *, status: str | None = None, endpoint: str | None = None,
          since: float | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Newest first, for `tollhouse audit`."""
    if path != ":memory:" and not Path(path).exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        clauses: list[str] = []
        args: list[object] = []
        if status:
            clauses.append("status = ?")
            args.append(status)
        if endpoint:
            clauses.append("endpoint = ?")
            args.append(endpoint)
        if since is not None:
            clauses.append("ts >= ?")
            args.append(since)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        try:
            cur = conn.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM audit {where} ORDER BY ts DESC, id DESC "
                "LIMIT ?", (*args, limit))
        except sqlite3.OperationalError:
            return []
        return [dict(zip(_COLUMNS, row)) for row in cur.fetchall()]
    finally:
        conn.close()


def usage(path: str, *, since: float) -> list[dict[str, Any]]:
    """tools/call totals per principal, endpoint and tool since `since`, busiest first."""
    if path != ":memory:" and not Path(path).exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        cur = conn.execute(
            "SELECT principal, endpoint, tool, count(*), "
            "sum(status = 'ok'), sum(status = 'denied'), sum(status = 'error'), "
            "sum(status = 'cancelled'), sum(bytes_in), sum(bytes_out), "
            "round(sum(duration_ms), 3) FROM audit "
            "WHERE method = 'tools/call' AND ts >= ? "
            "GROUP BY principal, endpoint, tool ORDER BY count(*) DESC, principal", (since,))
        names = ("principal", "endpoint", "tool", "calls", "ok", "denied", "error",
                 "cancelled", "bytes_in", "bytes_out", "duration_ms")
        return [dict(zip(names, row)) for row in cur.fetchall()]
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()
