"""The audit sink on the gateway's database (SQLite or PostgreSQL): group commits from a writer
thread, off the event loop, that the gateway's answers wait for; usage events go to the outbox
in the same transaction. Nothing answered is lost to a crash: a record is committed (or, with
the database out of reach, appended to a local fallback file that the next start replays)
before its call's answer leaves. `query` reads records back for `tollhouse audit` and
/api/v1/audit. A batch's transaction (its rows, usage events and rollup counts, the retries)
is the `Committer`'s (proxy.audit.commit); the sink owns the queue, the writer thread, the
journal and the fallback file.

Group commit: the writer takes every record queued when it is free and commits them in one
transaction, then the next lot; a lone record commits at once (there is no waiting window),
and records only share a commit when they arrive while the one before is being written. With
the journal on (no answer waits for a commit) the writer waits `commit_window_s` after a
record arrives before it commits whatever has gathered, so that a busy gateway makes one
commit per window rather than one per call.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import queue
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import orjson

from proxy.audit import journal as journals
from proxy.audit import rollup
from proxy.audit.checkpoint import Checkpoints
from proxy.audit.commit import COLUMNS, Committer
from proxy.audit.exports.queue import ExportQueue
from proxy.audit.record import AuditRecord
from proxy.storage import db

log = logging.getLogger("tollhouse.audit")

_STOP = object()
_RETIRE = object()  # (_RETIRE, segment): every record before it is in; the segment may go
_SETTLED = object()  # (_SETTLED, waiter): woken once every record before it is written
Waiter = asyncio.Future[bool]


class DatabaseAuditSink:
    """`write` queues a record from the event loop (never blocking it) and returns a future
    that the writer thread settles once the record is durable: True when it is committed (or
    in the fallback file), False when it could be kept nowhere. `emit` queues one without
    a future. If the database cannot take a record after `tries` attempts, it goes to a
    JSON-lines file (beside a SQLite database, else `fallback_path` or the working directory)
    rather than being dropped; the next sink on that file (the next start) puts what the file
    holds into the database, then removes it. SQLite or PostgreSQL, whichever `target` names
    (a Database, a URL, or a SQLite path). At most `batch_size` records share a commit.
    With `checkpoints` (the hash chain on, proxy.audit.chain), every record is linked into
    this writer's chain as it is committed, and the writer thread signs a checkpoint of its
    head whenever one falls due (and at close)."""

    def __init__(self, target: db.Target, batch_size: int = 500,
                 retry_backoff_s: float = 0.05,
                 on_outbox: Callable[[], None] | None = None,
                 fallback_path: str | None = None, tries: int = 5,
                 journal: str | Path | None = None,
                 journal_rotate_bytes: int = journals.ROTATE_BYTES,
                 commit_window_s: float = 0.0,
                 deliver: Callable[[AuditRecord], bool] | None = None,
                 on_fallback: Callable[[int], None] | None = None,
                 checkpoints: Checkpoints | None = None,
                 exports: ExportQueue | None = None) -> None:
        self._db = db.resolve(target)
        self._owns_db = self._db is not target
        if fallback_path is None:
            fallback_path = (self._db.path if self._db.dialect == "sqlite" and not self._db.memory
                             else "tollhouse") + ".audit-fallback.jsonl"
        self._fallback = Path(fallback_path)
        # an in-process metering hook's delivery at once (OutboxWorker.deliver_now), called on
        # the event loop once a metered record is in the journal: True if the hook took it
        self.deliver = deliver
        # called (from the writer thread) with the count written to the fallback file (metrics)
        self.on_fallback = on_fallback
        self._batch_size = batch_size
        self._tries = tries
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # the batches' transactions, on the writer's own connection; `on_outbox` is called
        # (from the writer thread) after usage events land
        self._checkpoints = checkpoints
        self._committer = Committer(self._db, retry_backoff_s, on_outbox,
                                    checkpoints.chain if checkpoints is not None else None)
        # the audit exports' queue (proxy.audit.exports): each record that lands is queued for
        # every export in its batch's transaction
        self._committer.exports = exports
        self._in_file = 0  # records written to the fallback file
        self.replayed = 0  # records taken from a fallback file into the database
        # the write-ahead journal (proxy/audit/journal.py), when on: answers wait for its
        # append, not for a commit
        self._journal_base = Path(journal) if journal is not None else None
        self._journal = (journals.Journal(journal, journal_rotate_bytes)
                         if journal is not None else None)
        self._kept_only_in_journal = False  # a record of the live segment the database lacks
        # with the journal on nobody waits for a commit, so the writer lets records gather for
        # this long after the first before it commits them all (one commit, one wake-up and one
        # statement run for the lot, instead of one each); a record someone does wait for (the
        # journal could not take it) or a stop cuts the wait short
        self._window = commit_window_s if self._journal is not None else 0.0
        self._urgent = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tollhouse-audit", daemon=True)
        self._thread.start()

    def emit(self, record: AuditRecord) -> None:
        if not self._journaled(record):
            self._queue.put((record, None))
            self._urgent.set()  # only in the database will it be kept: commit it at once

    def write(self, record: AuditRecord) -> Waiter:
        waiter: Waiter = asyncio.get_running_loop().create_future()
        if self._journaled(record):
            waiter.set_result(True)  # durable already: the journal holds it
        else:
            self._queue.put((record, waiter))
            self._urgent.set()
        return waiter

    def _journaled(self, record: AuditRecord) -> bool:
        """Appended to the journal and queued for the database; False without a journal or
        when the append failed (the record then takes the commit-and-wait path)."""
        journal = self._journal
        if journal is None or not journal.append(_line(record, newline=True)):
            return False
        # durable now: an in-process hook may take its usage event at once, before the writer
        # sees the record (its outbox row then goes in delivered, not claimed and marked later)
        if record.call_id is not None and self.deliver is not None and self.deliver(record):
            record.delivered_at = time.time()
        self._queue.put((record, None))
        full = journal.full()
        if full is not None:
            self._queue.put((_RETIRE, full))
        return True

    async def settled(self) -> None:
        """Return once every record this process accepted before the call is in the database
        (or could be kept nowhere): what an audit query then reads includes them. Records
        gathering for the commit window are committed at once; with nothing queued this is
        one pass of the writer thread."""
        if not self._thread.is_alive():  # closed: everything it took is written
            return
        waiter: Waiter = asyncio.get_running_loop().create_future()
        self._queue.put((_SETTLED, waiter))
        self._urgent.set()
        await waiter

    @property
    def written(self) -> int:
        """Records committed, or in the fallback file."""
        return self._committer.committed + self._in_file

    @property
    def commits(self) -> int:
        """Transactions committed."""
        return self._committer.commits

    @property
    def depth(self) -> int:
        """Records accepted and not yet written (approximately: another thread writes)."""
        return self._queue.qsize()

    async def close(self) -> None:
        self._queue.put(_STOP)
        self._urgent.set()
        await asyncio.to_thread(self._thread.join)

    # -- the writer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        self._replay()  # what an earlier run could only put in the fallback file, first
        stop = False
        while not stop:
            item = self._next()  # a lone record is written at once: no waiting window
            if item is None:  # a checkpoint fell due while nothing arrived: written
                continue
            if self._window and not self._urgent.is_set():  # unless the journal holds it
                self._urgent.wait(self._window)
            self._urgent.clear()
            batch: list[tuple[AuditRecord, Waiter | None]] = []
            retired: journals.Segment | None = None
            settled: list[tuple[Any, Waiter | None]] = []  # woken once the batch is written
            while True:  # and everything that queued up meanwhile shares its commit
                if item is _STOP:
                    stop = True
                    break
                if item[0] is _RETIRE:  # behind its segment's last record
                    retired = item[1]
                    break
                if item[0] is _SETTLED:
                    settled.append(item)
                else:
                    batch.append(item)
                if len(batch) >= self._batch_size:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                lost = self._write([record for record, _ in batch])
                if lost and self._journal is not None:
                    self._kept_only_in_journal = True
                _settle(batch, lost)
            _settle(settled, _NOTHING)
            if retired is not None:
                self._retire(retired)
        if self._journal is not None:  # everything before the stop is in: the last one goes
            self._retire(self._journal.segment)
        if self._checkpoints is not None and self._checkpoints.due_in() is not None:
            self._committer.checkpoint(self._checkpoints)  # the head at a clean stop
        self._committer.close()
        if self._owns_db:
            self._db.close()

    def _next(self) -> Any:
        """The next item of the queue. With the chain on, a checkpoint is written first when
        one is due, and the wait for an item ends when the next falls due (None: one was
        written, nothing arrived)."""
        checkpoints = self._checkpoints
        if checkpoints is None:
            return self._queue.get()
        due = checkpoints.due_in()
        if due == 0:
            self._committer.checkpoint(checkpoints)
            due = checkpoints.due_in()
        try:
            return self._queue.get(timeout=due)
        except queue.Empty:
            self._committer.checkpoint(checkpoints)
            return None

    def _retire(self, segment: journals.Segment) -> None:
        """A segment whose records are all written: removed, unless one of them could be kept
        nowhere else (then the next start replays it)."""
        segment.close(remove=not self._kept_only_in_journal)
        if self._kept_only_in_journal:
            log.error("audit: %s kept for the next start: records in it are not in the "
                      "database", segment.path)
        self._kept_only_in_journal = False

    def _write(self, batch: list[AuditRecord], replay: bool = False) -> set[int]:
        """Write the batch; the ids of the records that could be kept nowhere (none, nearly
        always)."""
        failure = self._committer.attempt(batch, self._tries, replay)
        if failure is None:
            return _NOTHING
        refused = batch
        if len(batch) > 1 and not isinstance(failure, self._db.unavailable):
            # the database answers but refused the batch (a value it cannot store): one row
            # at a time, so that only the rows it refuses leave it
            refused = [r for r in batch
                       if self._committer.attempt([r], 1, True) is not None]
        if not refused:
            return _NOTHING
        if replay:
            return {id(r) for r in refused}
        try:
            _append(self._fallback, b"".join(_line(r) + b"\n" for r in refused))
        except OSError as exc:  # the last resort failed too: say so, loudly, with the count
            log.critical("audit: %d records lost: neither the database nor %s could take "
                         "them (%s)", len(refused), self._fallback, exc)
            return {id(r) for r in refused}
        self._in_file += len(refused)
        log.error("audit: %d records written to %s instead of the database",
                  len(refused), self._fallback)
        if self.on_fallback is not None:
            self.on_fallback(len(refused))
        return _NOTHING

    # -- the fallback file, replayed ----------------------------------------------------------

    def _replay(self) -> None:
        """Put the records of the fallback file (and of any replay a crash interrupted) into
        the database, each once: a record there already is skipped. A file is first renamed
        to a name of this replay's own, so records appended meanwhile go to a new file, and
        a second process starting on the same file takes none of it. Removed when done; kept
        (for the next start) if the database cannot take it now. Then the same for every
        journal segment no live process holds (a crashed run's)."""
        for path in self._claim_fallbacks():
            try:
                records, bad = _read_fallback(path)
            except OSError as exc:
                log.error("audit: cannot read %s (%s): left for the next start", path, exc)
                continue
            if self._replayed(path, records, bad):
                with suppress(OSError):
                    path.unlink()
        if self._journal_base is None:
            return
        for path, fd in journals.orphans(self._journal_base):
            try:
                records, bad = _parse(journals.read_all(fd).splitlines())
            except OSError as exc:
                log.error("audit: cannot read %s (%s): left for the next start", path, exc)
                journals.release(path, fd, remove=False)
                continue
            journals.release(path, fd, remove=self._replayed(path, records, bad))

    def _replayed(self, path: Path, records: list[AuditRecord], bad: int) -> bool:
        """The records of one file into the database, each once; False if some could not go
        (the file is then kept for the next start)."""
        failed = 0
        for start in range(0, len(records), self._batch_size):
            chunk = records[start:start + self._batch_size]
            failed += len(self._write(chunk, replay=True))
        if failed:
            log.error("audit: %d of %d records in %s could not go into the database: "
                      "the file is kept for the next start", failed, len(records), path)
            return False
        self.replayed += len(records)
        if records or bad:
            log.warning("audit: %d records from %s replayed into the database (any there already "
                        "skipped)%s", len(records),
                        path, f" ({bad} unreadable lines dropped)" if bad else "")
        return True

    def _claim_fallbacks(self) -> Iterator[Path]:
        directory = self._fallback.parent
        prefix = f"{self._fallback.name}.replay-"
        candidates = [self._fallback]
        with suppress(OSError):
            candidates += sorted(p for p in directory.iterdir() if p.name.startswith(prefix))
        for path in candidates:
            if not path.is_file():  # (not there; or not a file at all, never ours to move)
                continue
            mine = directory / f"{prefix}{os.getpid()}-{secrets.token_hex(4)}"
            try:
                os.rename(path, mine)
            except OSError:  # not there, or another process took it first
                continue
            yield mine


_NOTHING: set[int] = set()
_FIELDS = frozenset(AuditRecord.__dataclass_fields__) - {"accepted"}


def _settle(batch: list[tuple[AuditRecord, Waiter | None]], lost: set[int]) -> None:
    """Wake the waiters of a batch on their loop: one wake-up per batch, not per record."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Waiter, bool]]] = {}
    for record, waiter in batch:
        if waiter is not None:
            by_loop.setdefault(waiter.get_loop(), []).append((waiter, id(record) not in lost))
    for loop, settled in by_loop.items():
        with suppress(RuntimeError):  # that loop has closed: nobody waits any more
            loop.call_soon_threadsafe(_wake, settled)


def _wake(settled: list[tuple[Waiter, bool]]) -> None:
    for waiter, kept in settled:
        if not waiter.done():
            waiter.set_result(kept)


def _append(path: Path, data: bytes) -> None:
    """Append to the fallback file under its lock, so that a replay that takes the file (by
    renaming it) never loses an append under way: one that finds the file taken from under
    it appends to the new one."""
    while True:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if os.fstat(fd).st_ino != os.stat(path).st_ino:
                    continue
            except FileNotFoundError:
                continue
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            return
        finally:
            os.close(fd)  # (and the lock with it)


def _read_fallback(path: Path) -> tuple[list[AuditRecord], int]:
    """The records of a fallback file (after any append under way), and how many lines
    could not be read (a line a crash cut short)."""
    with path.open("rb") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        lines = fh.read().splitlines()
    return _parse(lines)


def _parse(lines: list[bytes]) -> tuple[list[AuditRecord], int]:
    records: list[AuditRecord] = []
    bad = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            fields = orjson.loads(line)
            records.append(AuditRecord(**{k: v for k, v in fields.items() if k in _FIELDS}))
        except (orjson.JSONDecodeError, TypeError, AttributeError):
            bad += 1
    return records, bad


def _line(record: AuditRecord, newline: bool = False) -> bytes:
    """One JSON line of the fallback file or the journal; any value, even one orjson cannot
    encode."""
    try:
        return orjson.dumps(record.as_dict(), option=orjson.OPT_APPEND_NEWLINE if newline else 0)
    except TypeError:
        return json.dumps(record.as_dict(), default=str).encode() + (b"\n" if newline else b"")


def read_rows(target: db.Target, text: str, args: tuple[Any, ...], serial: bool = False
          ) -> list[tuple[Any, ...]] | None:
    """Rows of one read-only query; None when there is no database or no such table yet. A
    SQLite file is opened read-only (never created); nothing is migrated. `serial`: no
    parallel workers on PostgreSQL (for a GROUP BY whose every worker would see nearly every
    group: gathering their partial sums costs more than splitting the rows saves)."""
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
                if serial:  # (for this transaction only)
                    lent.execute("SET LOCAL max_parallel_workers_per_gather = 0")
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
    columns = ("id", *COLUMNS) if with_id else COLUMNS
    rows = read_rows(target, f"SELECT {', '.join(columns)} FROM audit {where} "
                         "ORDER BY ts DESC, id DESC LIMIT ?", (*args, limit))
    return [dict(zip(columns, row)) for row in rows or ()]


def usage(target: db.Target, *, since: float, until: float | None = None,
          endpoint: str | None = None, principal: str | None = None,
          limit: int | None = None) -> list[dict[str, Any]]:
    """tools/call totals per principal, endpoint and tool from `since` to before `until`
    (default: now), of one endpoint or principal if given, busiest first (the first `limit`
    of them, if given: the same rows as the first of all of them). The whole minutes
    of the period are read from the usage rollup (proxy.audit.rollup), summed per key id and
    named from usage_keys; the rest (parts of a minute at either edge) from the records, by
    name, added to those totals: one statement."""
    where = "".join(f" AND {column} = ?" for column, value in (("endpoint", endpoint),
                                                                ("principal", principal))
                    if value is not None)
    args = [v for v in (endpoint, principal) if v is not None]
    with db.using(target) as database:
        bigint = database.ddl("{bigint}")
    segments = rollup.plan(since, until, time.time())
    rolled = [s for s in segments if s[0]]
    raw = [s for s in segments if not s[0]]
    columns = ("n", *rollup.STATUSES, "bytes_in", "bytes_out", "duration_us")
    # (PostgreSQL sums a bigint as numeric: cast back, an int each rather than a Decimal)
    sums = ", ".join(f"CAST(sum({c}) AS {bigint}) AS {c}" for c in columns)
    text = ""
    text_args: list[Any] = []
    if rolled:
        union, text_args = rollup.union(
            # (a row of a segment taken away counts negated; one added as it is)
            rolled, f"SELECT key_id, {', '.join(f'{{neg}}{c} AS {c}' for c in columns)} FROM "
                    f"rollup_usage WHERE {{at}} AND kind > 0{where}", args, "", ())
        # (CROSS JOIN: SQLite reads the totals, then each one's names by id)
        text = (f"SELECT k.principal, k.endpoint, k.kind, k.tool, "
                f"{', '.join(f't.{c}' for c in columns)} FROM (SELECT key_id, {sums} FROM "
                f"({union}) AS u GROUP BY key_id{'' if raw else ' HAVING sum(n) > 0'}) "
                f"AS t CROSS JOIN {rollup.KEYS} AS k WHERE k.id = t.key_id")
        if not raw:
            text += " ORDER BY t.n DESC, k.principal, k.endpoint, k.kind, k.tool"
            text += "" if limit is None else " LIMIT ?"
    if raw:
        statuses = ", ".join(f"{{sign}} * CASE WHEN status = '{s}' THEN 1 ELSE 0 END AS {s}"
                             for s in rollup.STATUSES)
        edges, edge_args = rollup.union(
            raw, "", (), "SELECT principal, endpoint, CASE WHEN tool IS NULL THEN 2 ELSE 1 END "
                         f"AS kind, coalesce(tool, '') AS tool, {{sign}} AS n, {statuses}, "
                         "{sign} * bytes_in AS bytes_in, {sign} * bytes_out AS bytes_out, "
                         f"{{sign}} * CAST(round(duration_ms * 1000) AS {bigint}) AS "
                         f"duration_us FROM audit WHERE {{at}} AND method = 'tools/call'{where}",
            args)
        totals = ", ".join(f"CAST(sum({c}) AS {bigint})" for c in columns[1:])
        text = (f"SELECT principal, endpoint, kind, tool, CAST(sum(n) AS {bigint}) AS calls, "
                f"{totals} FROM "
                f"({f'{text} UNION ALL ' if text else ''}{edges}) AS u GROUP BY principal, "
                "endpoint, kind, tool HAVING sum(n) > 0 ORDER BY calls DESC, principal, "
                f"endpoint, kind, tool{'' if limit is None else ' LIMIT ?'}")
        text_args = [*text_args, *edge_args]
    if limit is not None:
        text_args.append(limit)
    # (every sum an int: a group holds a row, and PostgreSQL's are cast; a dict display per
    # row is a third of the time dict(zip(...)) took for the console's 7,500)
    return [{"principal": p, "endpoint": e, "tool": None if kind == 2 else tool, "calls": n,
             "ok": ok, "denied": denied, "error": error, "cancelled": cancelled,
             "bytes_in": bytes_in, "bytes_out": bytes_out, "duration_ms": round(us / 1000, 3)}
            for p, e, kind, tool, n, ok, denied, error, cancelled, bytes_in, bytes_out, us
            in read_rows(target, text, tuple(text_args), serial=True) or ()]
