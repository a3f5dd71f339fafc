"""The audit writer's side of the exports: each record that lands in the audit table is queued
for every export (`audit_export_outbox`, one row per export) in the batch's own transaction,
so an export gets exactly the records the audit log holds, whatever retries and replays the
batch went through (`proxy.audit.commit.Committer` calls `add` with the records that land).

A record's event id (`event_id`) is a UUID made from the SHA-256 of its audit row: the same
for every export and every delivery of it, so a receiver deduplicates on it. An export whose
backlog is full (its worker says so: `full`) is not given new rows; those records are counted
as dropped (the export's `dropped` total, a metric and a log line) and stay in the audit log.
Everything here runs on the audit writer's thread.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from proxy.storage import db

log = logging.getLogger("tollhouse.audit.export")

OUTBOX_COLUMNS = ("export", "event_id", "record", "created_at")
# SQLite: rows go in as multi-row INSERTs of these many rows each, largest first (as the
# audit rows do: proxy.audit.commit)
_CHUNKS = (128, 32, 8, 1)
_MAX_VARIABLES = 32766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999
DROP_LOG_EVERY_S = 60.0  # a full export's "dropped" line, at most this often


def event_id(row: tuple[Any, ...]) -> str:
    """A record's event id: the SHA-256 of its audit row (every column, as stored), its first
    128 bits shown as a UUID (version 8, the RFC 9562 custom kind)."""
    digest = bytearray(hashlib.sha256(orjson.dumps(row)).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x80
    digest[8] = (digest[8] & 0x3F) | 0x80
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def native(columns: Sequence[str], row: tuple[Any, ...], eid: str) -> dict[str, Any]:
    """A record as /api/v1/audit shows it (the audit row's columns, as stored), with its
    event id; not the table's row id, which is not known before the row is written."""
    out = dict(zip(columns, row, strict=True))
    out["event_id"] = eid
    return out


class ExportQueue:
    """The exports a writer queues records for (`names`, the config's), and which of them are
    full (`full`, set by their workers from any thread). `on_queued` is called after a commit that queued rows (the workers are woken)."""

    def __init__(self, database: db.Database, names: Sequence[str],
                 on_queued: Callable[[], None] | None = None,
                 on_dropped: Callable[[str, int], None] | None = None) -> None:
        self.names = tuple(names)
        self.full: frozenset[str] = frozenset()
        self.on_queued = on_queued
        self.on_dropped = on_dropped  # (export, count): a metric, once the drop is committed
        self._postgresql = database.postgresql
        self._insert = database.insert_ignore("audit_export_outbox", OUTBOX_COLUMNS)
        self._dropped_sql = database.sql(
            "UPDATE audit_exports SET dropped = dropped + ? WHERE name = ?")
        self._ensure_sql = database.insert_ignore("audit_exports", ("name",))
        row = f"({', '.join('?' for _ in OUTBOX_COLUMNS)})"
        self._many = {n: f"INSERT INTO audit_export_outbox ({', '.join(OUTBOX_COLUMNS)}) VALUES "
                         f"{', '.join([row] * n)} ON CONFLICT DO NOTHING"
                      for n in _CHUNKS if n * len(OUTBOX_COLUMNS) <= _MAX_VARIABLES}
        self._pending: dict[str, int] = {}  # dropped in the transaction under way
        self._queued = False
        self.dropped: dict[str, int] = {}  # committed drops, this process
        self._logged_at: dict[str, float] = {}

    def add(self, cur: db.Cursor, rows: list[tuple[Any, ...]], columns: Sequence[str]
            ) -> None:
        """Queue `rows` (audit rows, of `columns`, that land in this transaction) for every
        export not full; count them as dropped for each that is. In the caller's
        transaction."""
        self._pending = {}
        self._queued = False
        if not rows or not self.names:
            return
        full = self.full
        open_ = [name for name in self.names if name not in full]
        if open_:
            now = time.time()
            texts = []
            for row in rows:
                eid = event_id(row)
                texts.append((eid, orjson.dumps(native(columns, row, eid)).decode()))
            out = [(name, eid, text, now) for name in open_ for eid, text in texts]
            self._write(cur, out)
            self._queued = True
        for name in self.names:
            if name in full:
                self._pending[name] = len(rows)
                cur.execute(self._ensure_sql, (name,))
                cur.execute(self._dropped_sql, (len(rows), name))

    def committed(self) -> None:
        """The transaction of the last `add` committed: its drops are counted, its workers
        woken."""
        for name, count in self._pending.items():
            self.dropped[name] = self.dropped.get(name, 0) + count
            if self.on_dropped is not None:
                self.on_dropped(name, count)
            now = time.monotonic()
            if now - self._logged_at.get(name, -DROP_LOG_EVERY_S) >= DROP_LOG_EVERY_S:
                self._logged_at[name] = now
                log.error("audit export %s: its backlog is full: %d records not queued for it "
                          "(%d so far by this process); they stay in the audit log", name,
                          count, self.dropped[name])
        self._pending = {}
        if self._queued and self.on_queued is not None:
            self.on_queued()
        self._queued = False

    def _write(self, cur: db.Cursor, out: list[tuple[Any, ...]]) -> None:
        if self._postgresql:
            cur.executemany(self._insert, out)
            return
        at, left = 0, len(out)
        for size, statement in self._many.items():  # largest first
            while left >= size:
                cur.execute(statement, [v for row in out[at:at + size] for v in row])
                at += size
                left -= size
