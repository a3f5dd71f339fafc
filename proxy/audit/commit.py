"""The audit writer's transactions (`Committer`): a batch of records into the database
(SQLite or PostgreSQL) in one transaction, with its usage events (usage_outbox) and rollup
counts (proxy.audit.rollup), on the writer thread's own connection, retried with backoff. A
batch's first try inserts it as it is; a retry or a replay inserts only the records not there
yet, so a record is counted once however often its batch is tried. On a SQLite file a
checkpointer thread copies the WAL into the database out of the commits' way. Above it,
`DatabaseAuditSink` (proxy.audit.database) owns the queue, the writer thread, the journal and
the fallback file. The audit table's columns (`COLUMNS`) and a record's row (`row_of`) are
here. With the hash chain on (proxy.audit.chain), each row goes in with its chain columns,
linked in the transaction that inserts it; the chain's head moves once that commits.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import orjson

from proxy.audit import rollup
from proxy.audit.chain import CHAIN_COLUMNS, Chain, Head
from proxy.audit.record import AuditRecord
from proxy.storage import db

if TYPE_CHECKING:
    from proxy.audit.checkpoint import Checkpoints
    from proxy.audit.exports.queue import ExportQueue

log = logging.getLogger("tollhouse.audit")

COLUMNS = ("ts", "request_id", "principal", "endpoint", "method", "tool", "status",
           "denied_reason", "error_message", "duration_ms", "bytes_in", "bytes_out", "era",
           "session_hash", "client_name", "call_id", "note", "egress", "upstream", "policy",
           "actor")

_OUTBOX_COLUMNS = ("call_id", "event", "created_at", "next_attempt_at", "delivered_at")
# a call id is the record's idempotency key (a unique index): a retried batch, or a replayed
# fallback line, whose first try did land adds nothing. A batch's first try inserts without
# that clause: the rollups (proxy.audit.rollup) count every row it sends, so a row already
# there must fail the batch (which is then written row by row, counting what lands) rather
# than be passed over silently
def _insert_new(columns: tuple[str, ...]) -> str:
    return (f"INSERT INTO audit ({', '.join(columns)}) "
            f"VALUES ({', '.join('?' for _ in columns)})")


_INSERT_NEW = _insert_new(COLUMNS)
_INSERT = f"{_INSERT_NEW} ON CONFLICT DO NOTHING"
# a record without a call id has no key of its own: before a retry or a replay writes it, is
# it there already? (ts has microseconds: with endpoint, principal and request id, one record)
# SQLite: a batch goes in as a few multi-row INSERTs (VALUES (...), (...), ...) of these many
# rows each, largest first, rather than one executemany step per row: sqlite3 lets the GIL go
# around every step, and with the event loop busy each step then waits to get it back, so a
# row cost the writer ~3 times the CPU it costs on an idle loop (bench/README.md, 2026-12-02)
_CHUNKS = (256, 128, 64, 32, 16, 8, 4, 2, 1)
# the default most `?` a statement may hold (SQLITE_MAX_VARIABLE_NUMBER; 999 before 3.32)
_MAX_VARIABLES = 32766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999
_EXISTS = ("SELECT request_id FROM audit WHERE ts = ? AND endpoint = ? AND principal = ?")
_CALL_EXISTS = "SELECT 1 FROM audit WHERE call_id = ?"
Pairs = list[tuple[AuditRecord, tuple[Any, ...]]]


def connect(target: db.Target) -> db.Connection:
    """The audit writer's own connection, the schema up to date. On SQLite (WAL) with
    synchronous=NORMAL a commit has written its pages to the WAL file, in the OS's keeping,
    when it returns: a crash of the process (kill -9) loses nothing committed. Only
    checkpoints sync to the disk, so a power loss (out of scope) may lose the last commits but
    never corrupts the file; FULL would sync every commit for nothing a crash needs, OFF would
    risk the whole database on a power loss."""
    database = db.resolve(target)
    conn = database.connect()
    if database.dialect == "sqlite":
        conn.execute("PRAGMA synchronous=NORMAL")
    return conn


class Committer:
    """One batch of audit records into the database (`attempt`), from the writer thread
    only, on the connection it keeps (a new one when the last was lost). `on_outbox` is
    called after a commit that held usage events still to deliver. `committed` counts the
    records committed, `commits` the transactions. With a `chain`, every row is linked into
    it (proxy.audit.chain) in the transaction that inserts it."""

    def __init__(self, database: db.Database, retry_backoff_s: float,
                 on_outbox: Callable[[], None] | None, chain: Chain | None = None) -> None:
        self._db = database
        self._retry_backoff_s = retry_backoff_s
        self._on_outbox = on_outbox
        self.chain = chain
        columns = COLUMNS if chain is None else (*COLUMNS, *CHAIN_COLUMNS)
        # the audit exports (proxy.audit.exports), when any: each row that lands is queued
        # for every export in its batch's transaction (`exports.add`), as its usage event is
        self.exports: ExportQueue | None = None
        self._columns = columns
        self._sql_insert = database.sql(_INSERT)
        self._sql_insert_new = database.sql(_insert_new(columns))
        self._sql_insert_returning = database.sql(f"{_INSERT} RETURNING 1")
        self._sql_exists = database.sql(_EXISTS)
        self._sql_call_exists = database.sql(_CALL_EXISTS)
        self._sql_outbox = database.insert_ignore("usage_outbox", _OUTBOX_COLUMNS)
        self._many_insert_new = _multi_row("audit", columns, ignore=False)
        self._many_outbox = _multi_row("usage_outbox", _OUTBOX_COLUMNS)
        self._rollups = rollup.Writer(database.dialect)
        self._conn: db.Connection | None = connect(database)
        self._checkpoints: _Checkpointer | None = None
        if database.dialect == "sqlite" and not database.memory:
            self._checkpoints = _Checkpointer(database)
            self._conn.execute("PRAGMA wal_autocheckpoint=0")  # the checkpointer's job
        self.committed = 0  # records committed
        self.commits = 0  # transactions committed

    def close(self) -> None:
        """The connection and the checkpointer, once the writer has stopped."""
        if self._conn is not None:
            self._conn.close()
        if self._checkpoints is not None:
            self._checkpoints.stop()

    def attempt(self, batch: list[AuditRecord], tries: int, replay: bool = False
                ) -> Exception | None:
        """Write the batch (its audit rows, usage events and rollup counts in one
        transaction), retrying a database error with backoff; None when written, else the
        last failure. A retry (and a replay) leaves out what is there already: a commit whose
        answer was lost may have landed."""
        failure: Exception | None = None
        try:
            pairs = [(r, row_of(r)) for r in batch]
        except Exception as exc:  # noqa: BLE001 - a value no driver could send either
            return exc
        for attempt in range(tries):
            exact = bool(attempt or replay)
            head: Head | None = None
            try:
                if self._conn is None:  # the last one was lost (a database restart, say)
                    self._conn = connect(self._db)
                if self.chain is not None:
                    usage, head = self._commit_linked(self._conn, pairs, exact)
                elif exact:
                    usage = self._commit_exact(self._conn, self._missing(self._conn, pairs))
                else:
                    usage = self._commit(self._conn, pairs)
            except Exception as exc:  # noqa: BLE001 - a database error, or a value no driver sends
                failure = exc
                self._reset()
                if not exact and isinstance(exc, self._db.integrity_errors):
                    # a row there already (its call id): at once, row by row
                    log.info("audit: a batch holds a record written before: writing it row "
                             "by row (%s)", exc)
                    continue
                log.warning("audit write failed (attempt %d): %s", attempt + 1,
                            type(exc).__name__ if not isinstance(exc, self._db.errors) else exc)
                if not isinstance(exc, self._db.errors):
                    return failure  # the same rows would fail the same way
                if attempt + 1 < tries:
                    time.sleep(self._retry_backoff_s * 2**attempt)
                continue
            if head is not None and self.chain is not None:
                self.chain.advance(head)
            self._rollups.committed()  # (the usage key ids it read are kept from now on)
            self.committed += len(batch)
            self.commits += 1
            if self._checkpoints is not None:
                self._checkpoints.committed()
            if usage and self._on_outbox is not None:
                self._on_outbox()
            if self.exports is not None:
                self.exports.committed()
            return None
        return failure

    def checkpoint(self, checkpoints: Checkpoints) -> None:
        """A signed checkpoint of this writer's chain, on its connection, between batches; a
        failure is logged and the checkpoint tried again a little later."""
        try:
            if self._conn is None:
                self._conn = connect(self._db)
            checkpoints.write(self._conn)
        except Exception as exc:  # noqa: BLE001 - a database error, or a lost connection
            self._reset()
            checkpoints.postpone()
            log.warning("audit chain: checkpoint not written (%s): tried again shortly",
                        exc if isinstance(exc, self._db.errors) else type(exc).__name__)

    def _commit_linked(self, conn: db.Connection, pairs: Pairs, exact: bool
                       ) -> tuple[bool, Head]:
        """With the chain on: the rows linked from the chain's head and committed as a first
        try is; a retry or a replay first takes the head from the database (a commit whose
        answer was lost may have moved it) and leaves out every record there already, by its
        call id too, so that each record is linked once and the chain has no gap. Whether it
        held usage events to deliver, and the chain's head once it commits."""
        assert self.chain is not None
        if exact:
            self.chain.resync(conn, self._db)
            pairs = self._missing(conn, pairs, by_call_id=True)
        rows, head = self.chain.link([row for _, row in pairs])
        linked = [(record, row) for (record, _), row in zip(pairs, rows, strict=True)]
        return self._commit(conn, linked), head

    def _commit(self, conn: db.Connection, pairs: list[tuple[AuditRecord, tuple[Any, ...]]]
                ) -> bool:
        """A batch's first try, one transaction: its rows (any of them there already fails
        it), usage events and rollup counts, each statement prepared once and run for every
        row (SQLite steps it in C; psycopg pipelines the rows, the rollups' statement and the
        COMMIT into one round trip). Whether it held usage events still to deliver."""
        rows = [row for _, row in pairs]
        usage = _usage(pairs)
        if self._db.postgresql:
            raw: Any = conn
            with raw.pipeline():
                cur = raw.cursor()
                if rows:
                    cur.executemany(self._sql_insert_new, rows)
                if usage:
                    cur.executemany(self._sql_outbox, usage)
                # a cursor of its own: the rollups read back what their key upsert returns, and
                # in pipeline mode a cursor that ran executemany before may answer a fetch with
                # one of those INSERTs' results ("the last operation didn't produce records")
                self._rollups.add(raw.cursor(), rows)
                if self.exports is not None:
                    self.exports.add(cur, rows, self._columns)
                raw.commit()
            return _to_deliver(usage)
        cur = conn.cursor()
        try:
            _insert_rows(cur, self._many_insert_new, rows)
            _insert_rows(cur, self._many_outbox, usage)
            self._rollups.add(cur, rows)
            if self.exports is not None:
                self.exports.add(cur, rows, self._columns)
        finally:
            cur.close()
        conn.commit()
        return _to_deliver(usage)

    def _commit_exact(self, conn: db.Connection,
                      pairs: list[tuple[AuditRecord, tuple[Any, ...]]]) -> bool:
        """A retry's or a replay's transaction: each row on its own (one already there, by its
        call id, inserts nothing), then the usage events and rollup counts of the rows that
        did go in: a record is counted once however often its batch is tried. Whether it held
        usage events still to deliver."""
        cur = conn.cursor()
        try:
            landed = []
            if self._db.postgresql and pairs:  # each row's answer, in one round trip
                raw: Any = cur
                raw.executemany(self._sql_insert_returning, [row for _, row in pairs],
                                returning=True)
                landed = [pair for pair, _ in zip(pairs, raw.results(), strict=True)
                          if raw.fetchone() is not None]
            else:
                for record, row in pairs:
                    cur.execute(self._sql_insert, row)
                    if cur.rowcount == 1:
                        landed.append((record, row))
            rows = [row for _, row in landed]
            usage = _usage(landed)
            for event in usage:
                cur.execute(self._sql_outbox, event)
            self._rollups.add(cur, rows)
            if self.exports is not None:  # the rows that landed only
                self.exports.add(cur, rows, self._columns)
        finally:
            cur.close()
        conn.commit()
        return _to_deliver(usage)

    def _missing(self, conn: db.Connection, pairs: Pairs, by_call_id: bool = False) -> Pairs:
        """The rows not in the audit log yet. One with a call id is left to the unique index
        (its insert does nothing) unless `by_call_id` (the chain: it is looked for by it);
        one without is looked for by time, endpoint, principal and request id. Only on a
        retry or a replay."""
        out = []
        for record, row in pairs:
            if row[15] is not None:
                if by_call_id and conn.execute(self._sql_call_exists,
                                               (row[15],)).fetchone() is not None:
                    continue
            else:
                found = conn.execute(self._sql_exists, (row[0], row[3], row[2])).fetchall()
                if any(f[0] == row[1] for f in found):
                    continue
            out.append((record, row))
        conn.rollback()  # (reads open a transaction on PostgreSQL)
        return out

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


class _Checkpointer:
    """Copies the WAL into a SQLite database file from a thread and connection of its own
    (a PASSIVE checkpoint, which never blocks a writer), every `EVERY` commits of the audit
    writer, whose connection does no checkpoint: the fsyncs a checkpoint makes (NORMAL) are
    kept out of the commits that answers wait for."""

    EVERY = 200  # commits (each a few pages): about SQLite's own 1000-page default

    def __init__(self, database: db.Database) -> None:
        self._database = database
        self._due = threading.Event()
        self._stopping = False
        self._since = 0
        self._thread = threading.Thread(target=self._run, name="tollhouse-audit-checkpoint",
                                        daemon=True)
        self._thread.start()

    def committed(self) -> None:
        self._since += 1
        if self._since >= self.EVERY:
            self._since = 0
            self._due.set()

    def stop(self) -> None:
        self._stopping = True
        self._due.set()
        self._thread.join()

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                if conn is None:  # at once: the process's descriptors are steady from the start
                    conn = sqlite3.connect(self._database.path,
                                           timeout=self._database.busy_timeout_s)
                    conn.execute("PRAGMA synchronous=NORMAL")
                self._due.wait()
                self._due.clear()
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:  # the next one copies what this one did not
                    log.warning("audit: WAL checkpoint failed: %s", exc)
                if self._stopping:
                    return
        finally:
            if conn is not None:
                conn.close()


def _multi_row(table: str, columns: tuple[str, ...], ignore: bool = True) -> dict[int, str]:
    """The INSERT of each of `_CHUNKS`' row counts (SQLite's `?` placeholders), each doing
    nothing for a row that collides with a unique key (unless not `ignore`: then it fails)."""
    row = f"({', '.join('?' for _ in columns)})"
    return {n: f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
               f"{', '.join([row] * n)}{' ON CONFLICT DO NOTHING' if ignore else ''}"
            for n in _CHUNKS if n * len(columns) <= _MAX_VARIABLES}


def _insert_rows(cur: db.Cursor, statements: dict[int, str], rows: list[tuple[Any, ...]]
                 ) -> None:
    """`rows` in as few statements as `_CHUNKS` allow (each prepared once: sqlite3 keeps them
    in its statement cache)."""
    at, left = 0, len(rows)
    for size, statement in statements.items():  # largest first
        while left >= size:
            cur.execute(statement, [v for row in rows[at:at + size] for v in row])
            at += size
            left -= size


def _usage(pairs: list[tuple[AuditRecord, tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    """The outbox rows of the metered records among `pairs` (`_OUTBOX_COLUMNS`): due at once,
    or delivered already when an in-process hook took the event as the call ended."""
    return [(row[15], orjson.dumps(record.usage_event()).decode(), record.ts, record.ts,
             record.delivered_at) for record, row in pairs if row[15]]


def _to_deliver(usage: list[tuple[Any, ...]]) -> bool:
    """Whether any of these outbox rows is still to be delivered (the worker is woken)."""
    return any(event[4] is None for event in usage)


def _text(value: str | None) -> str | None:
    """A client-given string as stored: a NUL (which PostgreSQL's text refuses, and which
    would fail the whole batch) is written as the six characters `\\u0000`, on both backends."""
    return value.replace("\x00", "\\u0000") if value and "\x00" in value else value


def row_of(r: AuditRecord) -> tuple[Any, ...]:
    """A record as its audit row (`COLUMNS`)."""
    return (r.ts, _text(r.request_id), _text(r.principal), r.endpoint, _text(r.method),
            _text(r.tool), r.status, _text(r.denied_reason), _text(r.error_message),
            round(r.duration_ms, 3), r.bytes_in, r.bytes_out, r.era, r.session_hash,
            _text(r.client_name), r.call_id, _text(r.note),
            orjson.dumps(r.egress).decode() if r.egress else None, r.upstream,
            orjson.dumps(r.policy).decode() if r.policy else None, _text(r.actor))
