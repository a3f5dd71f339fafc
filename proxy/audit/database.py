"""The audit sink on the gateway's database (SQLite or PostgreSQL): batched writes from a
writer thread, off the event loop; usage events go to the outbox in the same transaction;
nothing accepted is lost (a refused batch is retried row by row, the rest to a fallback file).
`query` reads records back for `tollhouse audit` and /api/v1/audit."""

from __future__ import annotations

import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import orjson

from proxy import db
from proxy.audit.record import AuditRecord

log = logging.getLogger("tollhouse.audit")

_COLUMNS = ("ts", "request_id", "principal", "endpoint", "method", "tool", "status",
            "denied_reason", "error_message", "duration_ms", "bytes_in", "bytes_out", "era",
            "session_hash", "client_name", "call_id", "note", "egress")

_OUTBOX_COLUMNS = ("call_id", "event", "created_at", "next_attempt_at")
_INSERT = (f"INSERT INTO audit ({', '.join(_COLUMNS)}) "
           f"VALUES ({', '.join('?' for _ in _COLUMNS)})")
_STOP = object()


def connect(target: db.Target) -> db.Connection:
    """The audit writer's own connection, the schema up to date."""
    database = db.resolve(target)
    conn = database.connect()
    if database.dialect == "sqlite":
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints, not per batch
    return conn


class DatabaseAuditSink:
    """Records go onto a queue from the event loop (never blocking it) and a writer thread
    inserts them in batches. `close` drains the queue; if the database cannot be written,
    the records go to a JSON-lines file (beside a SQLite database, else `fallback_path` or
    the working directory) rather than being dropped. SQLite or PostgreSQL,
    whichever `target` names (a Database, a URL, or a SQLite path)."""

    def __init__(self, target: db.Target, batch_size: int = 500, linger_s: float = 0.05,
                 retry_backoff_s: float = 0.05,
                 on_outbox: Callable[[], None] | None = None,
                 fallback_path: str | None = None) -> None:
        self._db = db.resolve(target)
        self._owns_db = self._db is not target
        if fallback_path is None:
            fallback_path = (self._db.path if self._db.dialect == "sqlite" and not self._db.memory
                             else "tollhouse") + ".audit-fallback.jsonl"
        self._fallback = Path(fallback_path)
        self.on_outbox = on_outbox  # called (from the writer thread) after usage events land
        # called (from the writer thread) with the count written to the fallback file (metrics)
        self.on_fallback: Callable[[int], None] | None = None
        self._retry_backoff_s = retry_backoff_s
        self._batch_size = batch_size
        self._linger_s = linger_s
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._insert = self._db.sql(_INSERT)
        self._outbox = self._db.insert_ignore("usage_outbox", _OUTBOX_COLUMNS)
        self._conn: db.Connection | None = connect(self._db)
        self._thread = threading.Thread(target=self._run, name="tollhouse-audit", daemon=True)
        self._thread.start()
        self.written = 0

    def emit(self, record: AuditRecord) -> None:
        self._queue.put(record)

    @property
    def depth(self) -> int:
        """Records accepted and not yet written (approximately: another thread writes)."""
        return self._queue.qsize()

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
        if self._conn is not None:
            self._conn.close()
        if self._owns_db:
            self._db.close()

    def _write(self, batch: list[AuditRecord], final: bool) -> None:
        failure = self._attempt(batch, tries=5)
        if failure is None:
            return
        refused = batch
        if len(batch) > 1 and not isinstance(failure, self._db.unavailable):
            # the database answers but refused the batch (a value it cannot store): one row
            # at a time, so that only the rows it refuses leave it
            refused = [r for r in batch if self._attempt([r], tries=1) is not None]
        if not refused:
            return
        try:
            with self._fallback.open("ab") as fh:
                for record in refused:
                    fh.write(_line(record) + b"\n")
        except OSError as exc:  # the last resort failed too: say so, loudly, with the count
            log.critical("audit: %d records lost: neither the database nor %s could take "
                         "them (%s)", len(refused), self._fallback, exc)
            return
        log.error("audit: %d records written to %s instead of the database",
                  len(refused), self._fallback)
        if self.on_fallback is not None:
            self.on_fallback(len(refused))

    def _attempt(self, batch: list[AuditRecord], tries: int) -> Exception | None:
        """Write the batch (its audit rows and usage events in one transaction), retrying a
        database error with backoff; None when written, else the last failure."""
        failure: Exception | None = None
        for attempt in range(tries):
            try:
                rows = [_row(r) for r in batch]
                usage = [(r.call_id, orjson.dumps(r.usage_event()).decode(), r.ts, r.ts)
                         for r in batch if r.call_id]
                if self._conn is None:  # the last one was lost (a database restart, say)
                    self._conn = connect(self._db)
                cur = self._conn.cursor()
                try:
                    cur.executemany(self._insert, rows)
                    if usage:
                        cur.executemany(self._outbox, usage)
                finally:
                    cur.close()
                self._conn.commit()
            except Exception as exc:  # noqa: BLE001 - a database error, or a value no driver sends
                failure = exc
                log.warning("audit write failed (attempt %d): %s", attempt + 1,
                            type(exc).__name__ if not isinstance(exc, self._db.errors) else exc)
                self._reset()
                if not isinstance(exc, self._db.errors):
                    return failure  # the same rows would fail the same way
                if attempt + 1 < tries:
                    time.sleep(self._retry_backoff_s * 2**attempt)
                continue
            self.written += len(batch)
            if usage and self.on_outbox is not None:
                self.on_outbox()
            return None
        return failure

    def _reset(self) -> None:
        """Roll back the failed batch; drop the connection if it is gone or cannot."""
        if self._conn is None:
            return
        with suppress(Exception):
            self._conn.rollback()
        if db.broken(self._conn):
            with suppress(Exception):
                self._conn.close()
            self._conn = None


def _line(record: AuditRecord) -> bytes:
    """One JSON line of the fallback file; any value, even one orjson cannot encode."""
    try:
        return orjson.dumps(record.as_dict())
    except TypeError:
        return json.dumps(record.as_dict(), default=str).encode()


def _text(value: str | None) -> str | None:
    """A client-given string as stored: a NUL (which PostgreSQL's text refuses, and which
    would fail the whole batch) is written as the six characters `\\u0000`, on both backends."""
    return value.replace("\x00", "\\u0000") if value and "\x00" in value else value


def _row(r: AuditRecord) -> tuple[Any, ...]:
    return (r.ts, _text(r.request_id), _text(r.principal), r.endpoint, _text(r.method),
            _text(r.tool), r.status, _text(r.denied_reason), _text(r.error_message),
            round(r.duration_ms, 3), r.bytes_in, r.bytes_out, r.era, r.session_hash,
            _text(r.client_name), r.call_id, _text(r.note),
            orjson.dumps(r.egress).decode() if r.egress else None)


def _read(target: db.Target, text: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]] | None:
    """Rows of one read-only query; None when there is no database or no such table yet. A
    SQLite file is opened read-only (never created); nothing is migrated."""
    with db.using(target) as database:
        if database.dialect == "sqlite" and not database.memory:
            if not Path(database.path).exists():
                return None
            conn = sqlite3.connect(f"file:{database.path}?mode=ro", uri=True, timeout=10)
            try:
                return conn.execute(text, args).fetchall()
            except sqlite3.OperationalError:
                return None
            finally:
                conn.close()
        with database.lease() as lent:
            try:
                return lent.execute(database.sql(text), args).fetchall()
            except database.missing_table:
                return None
            finally:
                lent.rollback()


def query(target: db.Target, *, status: str | None = None, endpoint: str | None = None,
          since: float | None = None, limit: int = 50, principal: str | None = None,
          tool: str | None = None, until: float | None = None,
          before: tuple[float, int] | None = None, with_id: bool = False
          ) -> list[dict[str, Any]]:
    """Newest first, for `tollhouse audit` and the management API. `before` is a (ts, id)
    cursor: only records older than it; `with_id` adds each record's id (for such cursors)."""
    clauses: list[str] = []
    args: list[object] = []
    for column, value in (("status", status or None), ("endpoint", endpoint or None),
                          ("principal", principal), ("tool", tool)):
        if value is not None:
            clauses.append(f"{column} = ?")
            args.append(value)
    if since is not None:
        clauses.append("ts >= ?")
        args.append(since)
    if until is not None:
        clauses.append("ts < ?")
        args.append(until)
    if before is not None:
        clauses.append("(ts < ? OR (ts = ? AND id < ?))")
        args.extend([before[0], before[0], before[1]])
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    columns = ("id", *_COLUMNS) if with_id else _COLUMNS
    rows = _read(target, f"SELECT {', '.join(columns)} FROM audit {where} "
                         "ORDER BY ts DESC, id DESC LIMIT ?", (*args, limit))
    return [dict(zip(columns, row)) for row in rows or ()]


_USAGE_NAMES = ("principal", "endpoint", "tool", "calls", "ok", "denied", "error",
                "cancelled", "bytes_in", "bytes_out", "duration_ms")


def usage(target: db.Target, *, since: float, until: float | None = None,
          endpoint: str | None = None, principal: str | None = None) -> list[dict[str, Any]]:
    """tools/call totals per principal, endpoint and tool from `since` to before `until`
    (default: now), of one endpoint or principal if given, busiest first."""
    counts = ", ".join(f"sum(CASE WHEN status = '{s}' THEN 1 ELSE 0 END)"
                       for s in ("ok", "denied", "error", "cancelled"))
    where = ["method = 'tools/call'", "ts >= ?"]
    args: list[float | str] = [since]
    for clause, value in (("ts < ?", until), ("endpoint = ?", endpoint),
                          ("principal = ?", principal)):
        if value is not None:
            where.append(clause)
            args.append(value)
    rows = _read(target,
                 f"SELECT principal, endpoint, tool, count(*), {counts}, sum(bytes_in), "
                 f"sum(bytes_out), sum(duration_ms) FROM audit WHERE {' AND '.join(where)} "
                 "GROUP BY principal, endpoint, tool ORDER BY count(*) DESC, principal",
                 tuple(args))
    out = []
    for row in rows or ():
        # PostgreSQL sums integers as numeric (Decimal here): every total is an int again
        values = [*row[:3], *(int(v or 0) for v in row[3:10]), round(float(row[10] or 0), 3)]
        out.append(dict(zip(_USAGE_NAMES, values)))
    return out
