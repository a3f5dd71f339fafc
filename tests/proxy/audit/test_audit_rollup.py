"""The audit rollups (proxy.audit.rollup) on the run's backend: what /api/v1/usage,
/usage/series and /usage/summary answer from them equals what grouping the raw audit records
gives, for periods on and off minute, hour and day bounds, with every filter; records
written through the real audit writer, a batch whose commit landed but was retried, and a
replayed fallback file count once; the migration fills the rollups from records already
there."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from proxy.audit import AuditRecord, rollup
from proxy.audit import summary as aggregates
from proxy.audit.commit import row_of
from proxy.audit.database import DatabaseAuditSink, _line, read_rows, usage
from proxy.runtime.cli import main
from proxy.storage import migrations
from proxy.storage.db import Database
from tests import db_backends
from tests.helpers import until

DAY = 1_700_006_400.0  # a UTC midnight
STATUSES = ("ok",) * 6 + ("denied", "error", "cancelled")
DURATIONS = (0.0, 4.999, 5.0, 9.5, 10.0, 25.0, 49.9, 100.0, 250.0, 999.999, 1000.0, 2500.0,
             5000.0, 10000.0, 29999.9, 30000.0, 61000.123)


def records(n: int, seed: int, call_ids: str = "c", day: float = DAY) -> list[AuditRecord]:
    """Traffic of every shape over three days around midnight `day`: MCP endpoints and the
    management API's, tools named, empty and missing, denials with and without a reason,
    durations on the histogram's bounds, times on and off minute, hour and day bounds."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        endpoint = rng.choice(("e0", "e1", "e2", "e2", rollup.MANAGEMENT))
        method = rng.choice(("tools/call",) * 4 + ("tools/list", None))
        if endpoint == rollup.MANAGEMENT and rng.random() < 0.8:
            method = "PATCH /api/v1/servers/x"
        status = rng.choice(STATUSES)
        ts = rng.choice((day - 1.5 * 86400 + rng.random() * 3 * 86400,
                         day + rng.randrange(-36, 36) * 3600.0,  # on an hour
                         day + rng.randrange(-2000, 2000) * 60.0,  # on a minute
                         day + rng.randrange(-90, 90) * 60.0 - 1e-6,  # just before one
                         day + rng.random() * 7200))
        out.append(AuditRecord(
            endpoint=endpoint, method=method, request_id=f"{seed}-{i}",
            principal=rng.choice(("p0", "p1", "p2", "")),
            tool=rng.choice(("search", "read", "", None)) if method == "tools/call" else None,
            status=status,  # type: ignore[arg-type]
            denied_reason=rng.choice(("access: hidden", "rate: slow down", "", None))
            if status == "denied" else None,
            duration_ms=rng.choice(DURATIONS), bytes_in=rng.randrange(5000),
            bytes_out=rng.randrange(50000), ts=ts,
            call_id=f"{call_ids}{seed}-{i}" if rng.random() < 0.5 else None))
    return out


# -- the raw computations (what the aggregates answered before the rollups) --------------------

def raw_series(database: Database, *, since: float, until: float, bucket_s: int,
               endpoint: str | None = None, principal: str | None = None
               ) -> list[dict[str, Any]]:
    clauses: list[str] = ["ts >= ?", "ts < ?"]
    args: list[Any] = [since, until]
    for clause, value in (("endpoint = ?", endpoint), ("principal = ?", principal)):
        if value is not None:
            clauses.append(clause)
            args.append(value)
    if endpoint is None:
        clauses.append("endpoint <> ?")
        args.append(rollup.MANAGEMENT)
    index = ("CAST((ts - ?) / ? AS INTEGER)" if database.dialect == "sqlite"
             else "CAST(floor((ts - ?) / ?) AS BIGINT)")
    rows = read_rows(database, f"SELECT {index} AS b, status, count(*) FROM audit WHERE "
                           f"{' AND '.join(clauses)} GROUP BY b, status",
                 (since, bucket_s, *args)) or []
    count = max(1, min(aggregates.MAX_BUCKETS, int(-(-(until - since) // bucket_s))))
    buckets = [{"start": since + i * bucket_s, "ok": 0, "denied": 0, "error": 0,
                "cancelled": 0} for i in range(count)]
    for b, status, n in rows:
        if 0 <= int(b) < count:
            buckets[int(b)][status] += int(n)
    return buckets


def raw_summary(database: Database, *, since: float, until: float | None = None,
                top: int = 10) -> dict[str, Any]:
    where, args = "ts >= ? AND endpoint <> ?", [since, rollup.MANAGEMENT]
    if until is not None:
        where, args = f"{where} AND ts < ?", [*args, until]
    classes = " ".join(f"WHEN duration_ms < {b} THEN {i}"
                       for i, b in enumerate(rollup.BOUNDS_MS))
    rows = read_rows(database, f"SELECT endpoint, status, CASE {classes} ELSE "
                           f"{len(rollup.BOUNDS_MS)} END AS c, count(*) FROM audit WHERE "
                           f"{where} GROUP BY endpoint, status, c", tuple(args)) or []
    endpoints: dict[str, dict[str, Any]] = {}
    histograms: dict[str, list[int]] = {}
    for endpoint, status, cls, n in rows:
        e = endpoints.setdefault(endpoint, {"endpoint": endpoint, "calls": 0, "ok": 0,
                                            "denied": 0, "error": 0, "cancelled": 0})
        e["calls"] += int(n)
        e[status] += int(n)
        histograms.setdefault(endpoint, [0] * (len(rollup.BOUNDS_MS) + 1))[int(cls)] += int(n)
    for name, e in endpoints.items():
        e["error_rate"] = round(e["error"] / e["calls"], 4) if e["calls"] else 0.0
        e["p95_ms"] = aggregates._p95(histograms[name])
    # the same ties broken the same way: calls, then the names (a missing one last)
    tools = read_rows(database, f"SELECT endpoint, tool, count(*) FROM audit WHERE {where} AND "
                            "method = 'tools/call' GROUP BY endpoint, tool ORDER BY count(*) "
                            "DESC, endpoint, tool IS NULL, tool LIMIT ?",
                  (*args, top)) or []
    denials = read_rows(database, f"SELECT denied_reason, count(*) FROM audit WHERE {where} AND "
                              "status = 'denied' GROUP BY denied_reason ORDER BY count(*) DESC, "
                              "coalesce(denied_reason, ''), denied_reason IS NULL LIMIT ?",
                    (*args, top)) or []
    backlog = read_rows(database, "SELECT count(*) FROM usage_outbox WHERE delivered_at IS NULL",
                    ()) or [(0,)]
    return {"since": since, "until": until,
            "endpoints": sorted(endpoints.values(), key=lambda e: (-e["calls"], e["endpoint"])),
            "tools": [{"endpoint": e, "tool": t, "calls": int(n)} for e, t, n in tools],
            "denials": [{"policy": (r or "").split(":", 1)[0], "reason": r or "", "calls": int(n)}
                        for r, n in denials],
            "outbox_backlog": int(backlog[0][0])}


def raw_usage(database: Database, *, since: float, until: float | None = None,
              endpoint: str | None = None, principal: str | None = None
              ) -> list[dict[str, Any]]:
    counts = ", ".join(f"sum(CASE WHEN status = '{s}' THEN 1 ELSE 0 END)"
                       for s in rollup.STATUSES)
    where: list[str] = ["method = 'tools/call'", "ts >= ?"]
    args: list[Any] = [since]
    for clause, value in (("ts < ?", until), ("endpoint = ?", endpoint),
                          ("principal = ?", principal)):
        if value is not None:
            where.append(clause)
            args.append(value)
    rows = read_rows(database, f"SELECT principal, endpoint, tool, count(*), {counts}, "
                           "sum(bytes_in), sum(bytes_out), sum(duration_ms) FROM audit WHERE "
                           f"{' AND '.join(where)} GROUP BY principal, endpoint, tool "
                           "ORDER BY count(*) DESC, principal, endpoint, tool IS NULL, tool",
                 tuple(args)) or []
    names = ("principal", "endpoint", "tool", "calls", "ok", "denied", "error", "cancelled",
             "bytes_in", "bytes_out", "duration_ms")
    return [dict(zip(names, [*row[:3], *(int(v) for v in row[3:10]),
                             pytest.approx(float(row[10]), abs=1e-6)], strict=True))
            for row in rows]


# -- the periods compared -------------------------------------------------------------------

H, M = 3600.0, 60.0
PERIODS: list[tuple[float, float | None]] = [
    (0.0, None), (DAY - 2 * 86400, None), (DAY - 86400 + 123.456, None),
    (DAY - H, None), (DAY + 17.25, None), (DAY + 3 * 86400, None),
    (DAY - 86400, DAY + 86400), (DAY - 86400 - 7 * M, DAY + 5 * H + 31.5),
    (DAY + 0.5, DAY + 59.9), (DAY - 59.5, DAY + 60.25), (DAY - 3 * H - 1e-6, DAY + 2 * H),
    (DAY + 13 * M, DAY + 14 * M), (DAY, DAY), (DAY - 1.25 * 86400, DAY + 1.25 * 86400 + 7.5),
    # read as whole buckets less the rest of them (`plan`'s complements)
    (DAY + 65.5, DAY + 5 * H - 30), (DAY - 86400 + 3 * H + 2 * M, DAY + 20 * H + 58 * M + 12.5),
]
SERIES: list[tuple[float, float, int]] = [
    (DAY - 86400, DAY + 86400, 3600),  # hours on hours
    (DAY - 2 * 86400, DAY + 2 * 86400, 86400),  # days on days
    (DAY - H, DAY + 2 * M + 30, 60),  # minutes, a ragged end
    (DAY - 86400 + 7 * M, DAY + 1000.5, 1440),  # the console's day
    (DAY - 7 * 86400 + 37 * M, DAY + 37 * M, 10080),  # the console's week
    (DAY - 5 * H, DAY + 5 * H, 7200),
    (DAY + 12.5, DAY + H, 60),  # starts off a minute: the raw records
    (DAY - H, DAY + H, 90),  # buckets off minutes: the raw records
    (DAY - 30 * M, DAY + 30 * M, 1),
    (DAY - 5 * H, DAY + 2 * H + 50 * M, 3600),  # the last hour less its last 10 minutes
    (DAY - 2 * 86400, DAY + 20 * H, 86400),  # the last day less its last 4 hours
]
FILTERS: list[dict[str, str]] = [{}, {"endpoint": "e2"}, {"principal": "p1"},
                                 {"endpoint": "e1", "principal": ""},
                                 {"endpoint": rollup.MANAGEMENT},
                                 {"endpoint": rollup.MANAGEMENT, "principal": "p0"},
                                 {"endpoint": "nowhere"}]


def near_now() -> tuple[list[tuple[float, float | None]], list[tuple[float, float, int]]]:
    """Periods ending now or later (the console's: since a minute bound an hour, a day, a
    week ago, to the end of this minute or open), read as whole days less the future."""
    now = time.time()
    end = now - now % 60 + 60
    return ([(end - 3600, None), (end - 86400, None), (end - 7 * 86400, None),
             (now - 86400 + 0.25, None), (now - 3600, now + 1.5), (end - 86400, end),
             (now - 2 * 86400, now + 5 * 3600 + 0.5), (now + 10, now + 7200)],
            [(end - 3600, end, 60), (end - 86400, end, 1440), (end - 7 * 86400, end, 10080),
             (end - 3600, now + 1, 60)])


def test_a_serial_read_runs_no_parallel_workers(database: Database) -> None:
    """PostgreSQL: `read_rows(..., serial=True)` plans without parallel workers (the usage sum:
    each worker would see nearly every key), for that statement's transaction only."""
    if not database.postgresql:
        pytest.skip("PostgreSQL's parallel query")
    setting = "SELECT current_setting('max_parallel_workers_per_gather')"
    default = read_rows(database, setting, ())
    assert default is not None and default != [("0",)]
    assert read_rows(database, setting, (), serial=True) == [("0",)]
    assert read_rows(database, setting, ()) == default  # (the pooled connection as it was)


def test_a_plan_reads_its_period_once() -> None:
    """Whatever the bounds, the signed segments of `plan` cover every instant of the period
    once (the buckets it adds less those it takes away) and nothing outside it; each rollup
    segment is whole buckets of its span."""
    rng = random.Random(11)
    for _ in range(4000):
        since = DAY + rng.choice((rng.uniform(-3, 3) * 86400, rng.randrange(-4000, 4000) * M,
                                  rng.randrange(-80, 80) * H + rng.choice((0, 0.5, 59.75))))
        until = rng.choice((None, since + rng.uniform(0, 4) * 86400,
                            since + rng.randrange(3000) * M, since + rng.uniform(0, 200),
                            DAY + rng.randrange(-80, 80) * H))
        now = rng.choice((None, since + rng.uniform(-1, 3) * 86400))
        spans = rng.choice((rollup.SPANS, (3600, 60), (60,)))
        segments = rollup.plan(since, until, now, spans)
        probes = [since, since - 1e-3, rng.uniform(since - 86400, since + 5 * 86400)]
        for span, lo, hi, sign in segments:
            assert sign in (1, -1) and (span == 0 or span in spans)
            assert span == 0 or hi is None or lo < hi  # (a raw one may be empty)
            if span:
                assert lo % span == 0 and (hi is None or hi % span == 0), (span, lo, hi)
            probes += [lo, lo - 1e-3, lo + 1e-3, *(() if hi is None else (hi, hi - 1e-3))]
        for t in probes:
            inside = since <= t and (until is None or t < until)
            assert sum(sign for _, lo, hi, sign in segments
                       if lo <= t and (hi is None or t < hi)) == inside, (since, until, now, t)


def test_a_week_from_just_after_midnight_reads_a_day_less_an_hour() -> None:
    """A ragged end is read as the whole bucket it lies in less the rest of it when that is
    shorter: the console's week from 01:01 is its first day less an hour and a minute (3
    buckets), not 59 minutes and 22 hours."""
    segments = rollup.plan(DAY + H + M, None, DAY + 7 * 86400 - 23 * H)
    assert sorted(segments) == [(60, DAY + H, DAY + H + M, -1), (3600, DAY, DAY + H, -1),
                                (86400, DAY, None, 1)]
    # and from 12:01 half a day is half a day either way: its hours
    assert [s[0] for s in rollup.plan(DAY + 12 * H + M, None)] == [60, 3600, 86400]


def assert_rollups_answer_as_the_records(database: Database) -> None:
    periods, series = near_now()
    for since, until_ in [*PERIODS, *periods]:
        for top in (3, 100):
            assert aggregates.summary(database, since=since, until=until_, top=top) == \
                raw_summary(database, since=since, until=until_, top=top), (since, until_, top)
        for filters in FILTERS:
            endpoint, principal = filters.get("endpoint"), filters.get("principal")
            every = usage(database, since=since, until=until_, endpoint=endpoint,
                          principal=principal)
            assert every == raw_usage(database, since=since, until=until_, **filters), (
                since, until_, filters)
            # the busiest few: the first of them all
            assert usage(database, since=since, until=until_, endpoint=endpoint,
                         principal=principal, limit=3) == every[:3]
    for since, until_, bucket_s in [*SERIES, *series]:
        for filters in FILTERS:
            assert aggregates.series(database, since=since, until=until_, bucket_s=bucket_s,
                                     **filters) == raw_series(
                database, since=since, until=until_, bucket_s=bucket_s, **filters), (
                since, until_, bucket_s, filters)


def rollups(database: Database) -> dict[str, list[tuple[Any, ...]]]:
    with database.transaction() as conn:
        return {t.name: sorted(tuple(v if isinstance(v, str) else int(v) for v in row)
                               for row in conn.execute(
                                   f"SELECT {', '.join(t.columns())} FROM {t.name}").fetchall())
                for t in rollup.TABLES}


def assert_rollups_are_the_records_folded(database: Database) -> None:
    """What the writer added up equals the backfill of the audit table as it stands: no
    record counted twice, none left out."""
    kept = rollups(database)
    assert sum(n for (*_, n) in kept["rollup_tools"]) > 0
    with database.transaction() as conn:
        for table in rollup.TABLES:
            conn.execute(f"DELETE FROM {table.name}")
        rollup.backfill(conn, database.dialect)
    assert rollups(database) == kept


class LosesACommitsAnswer:
    """The writer's connection, but the `fail_at`th commit lands and then raises, as when
    the database's answer to a COMMIT is lost: the writer must try the batch again."""

    def __init__(self, conn: Any, error: type[Exception], fail_at: int) -> None:
        self._conn = conn
        self._error = error
        self.commits = 0
        self.fail_at = fail_at

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def commit(self) -> None:
        self._conn.commit()
        self.commits += 1
        if self.commits == self.fail_at:
            raise self._error("the answer to COMMIT was lost")


async def test_the_rollups_answer_as_the_raw_records_do(database: Database,
                                                        tmp_path: Path) -> None:
    fallback = tmp_path / "fallback.jsonl"
    sink = DatabaseAuditSink(database, batch_size=37, retry_backoff_s=0.001,
                             fallback_path=str(fallback))
    today = time.time() // 86400 * 86400  # and around today's midnight: some from the future
    for r in [*records(1000, seed=1), *records(500, seed=9, day=today)]:
        sink.emit(r)
    # a batch of twenty whose COMMIT lands but whose answer is lost: tried again, the records
    # already in (with a call id and without) are neither inserted nor counted again
    await until(lambda: sink._queue.empty() and sink.written == 1500, what="the first lot")
    writer = sink._committer  # (the batches' transactions, on the writer's connection)
    conn = writer._conn
    assert conn is not None
    lossy = LosesACommitsAnswer(conn, database.errors[0], fail_at=2)
    writer._conn = lossy
    commits = sink.commits
    retried = records(20, seed=2)
    with db_backends.tables_held(database.url, "audit", "usage_outbox"):
        sink.emit(retried[0])  # (its commit waits for the lock: the rest queue behind it)
        await until(lambda: sink._queue.empty(), what="the writer took the first record")
        for r in retried[1:]:
            sink.emit(r)
    await until(lambda: sink.written == 1520, what="the retried batch")
    assert lossy.commits == 3  # the lone record's, the lost one, the retry's
    assert sink.commits == commits + 2
    await sink.close()
    # the next start replays a fallback file that holds records already in and new ones
    again = records(30, seed=3)
    fallback.write_bytes(b"".join(_line(r) + b"\n" for r in (*retried[:10], *again)))
    replaying = DatabaseAuditSink(database, fallback_path=str(fallback))
    for r in records(200, seed=4):
        replaying.emit(r)
    await replaying.close()
    assert replaying.replayed == 40 and not fallback.exists()
    assert read_rows(database, "SELECT count(*) FROM audit", ()) == [(1750,)]
    assert_rollups_are_the_records_folded(database)
    assert_rollups_answer_as_the_records(database)


async def test_a_batch_holding_a_record_written_before_counts_it_once(
        database: Database) -> None:
    sink = DatabaseAuditSink(database)
    first = records(50, seed=5)
    for r in first:
        sink.emit(r)
    await until(lambda: sink.written == 50, what="the first records")
    # the same call ids again (a duplicate the writer was not told of): the batch's first
    # try fails on the unique index, and row by row only the new records go in, and count
    for r in [*records(50, seed=5), *records(25, seed=6)]:
        sink.emit(r)
    await sink.close()
    call_ids = {r.call_id for r in (*first, *records(25, seed=6)) if r.call_id}
    assert read_rows(database, "SELECT count(*) FROM audit WHERE call_id IS NOT NULL", ()) == [
        (len(call_ids),)]
    assert_rollups_are_the_records_folded(database)
    assert_rollups_answer_as_the_records(database)


async def test_the_migration_fills_the_rollups_from_the_records_there(database_url: str
                                                                     ) -> None:
    database = Database(database_url)
    try:
        assert migrations.upgrade(database, migrations.MIGRATIONS[:19]) == list(range(1, 20))
        # records an older release wrote (no rollups then)
        columns = ("ts", "request_id", "principal", "endpoint", "method", "tool", "status",
                   "denied_reason", "duration_ms", "bytes_in", "bytes_out", "era", "call_id")
        with database.lease() as conn:  # (the schema as it is: not migrated on)
            conn.cursor().executemany(database.sql(
                f"INSERT INTO audit ({', '.join(columns)}) VALUES "
                f"({', '.join('?' for _ in columns)})"),
                [(r.ts, r.request_id, r.principal, r.endpoint, r.method, r.tool, r.status,
                  r.denied_reason, round(r.duration_ms, 3), r.bytes_in, r.bytes_out, r.era,
                  r.call_id) for r in records(1200, seed=7)])
            conn.commit()
        assert migrations.upgrade(database, migrations.MIGRATIONS[:20]) == [20]
        before = usage_rows(database)
        assert len(before) > 100
        # migration 21 on rollups already filled: the same rows, each with its key's id
        assert migrations.upgrade(database, migrations.MIGRATIONS[:21]) == [21]
        keys = {tuple(names): key_id for key_id, *names in read_rows(
            database, "SELECT id, principal, endpoint, kind, tool FROM usage_keys", ()) or []}
        assert len(set(keys.values())) == len(keys) == len({r[2:6] for r in before})
        after = usage_rows(database, with_id=True)
        assert after == [(*r[:6], keys[r[2:6]], *r[6:]) for r in before]
        assert_rollups_are_the_records_folded(database)  # (the backfill's key ids: the same)
        assert_rollups_answer_as_the_records(database)
        # and the writer adds to them from there
        sink = DatabaseAuditSink(database)
        for r in records(300, seed=8, call_ids="d"):
            sink.emit(r)
        await sink.close()
        assert_rollups_are_the_records_folded(database)
        assert_rollups_answer_as_the_records(database)
    finally:
        database.close()


def usage_rows(database: Database, with_id: bool = False) -> list[tuple[Any, ...]]:
    """The usage rollup's rows in key order (with key_id after the key, if asked)."""
    columns = rollup.USAGE.columns() if with_id else rollup.TABLES_20[-1].columns()
    return [tuple(v if isinstance(v, str) or v is None else int(v) for v in row)
            for row in read_rows(database, f"SELECT {', '.join(columns)} FROM rollup_usage ORDER "
                                       "BY span, bucket, principal, endpoint, kind, tool",
                             ()) or []]


def call(ts: float, principal: str, tool: str | None = "read") -> tuple[Any, ...]:
    """One tools/call of endpoint e0 as the audit writer's row."""
    return row_of(AuditRecord(endpoint="e0", method="tools/call", request_id=f"{ts}",
                              principal=principal, tool=tool, status="ok", duration_ms=1.0,
                              bytes_in=5, bytes_out=6, ts=ts))


def test_the_release_before_still_adds_to_the_usage_rollup(database: Database) -> None:
    """Migration 21 keeps the usage rollup's primary key: a writer of the release before
    (its upsert names no key_id) adds to a row there and inserts new ones without an id,
    which the next upsert of that key by this release's writer gives one."""
    writer = rollup.Writer(database.dialect)
    before = rollup.TABLES_20[-1]
    minute = 60 * 29_000_000

    def by_the_release_before(principal: str, n: int) -> str:
        source = (f"(SELECT {minute} AS m, '{principal}' AS principal, 'e0' AS endpoint, 1 AS "
                  f"kind, 'read' AS tool, 'ok' AS status, {n} AS n, 5 AS bytes_in, 6 AS "
                  "bytes_out, 7 AS us) AS v")
        return before.fold(source, rollup.SPANS_SQL, grouped=database.postgresql)

    def ids_and_calls(principal: str) -> list[tuple[Any, ...]]:
        return [r[6:8] for r in usage_rows(database, with_id=True) if r[2] == principal]

    with database.transaction() as conn:
        writer.add(conn.cursor(), [call(minute + 1.5, "p0")])
    writer.committed()
    with database.transaction() as conn:
        conn.execute(by_the_release_before("p0", 2))
        conn.execute(by_the_release_before("p1", 3))
    p0 = writer.keys[("p0", "e0", 1, "read")]
    assert ids_and_calls("p0") == [(p0, 3)] * 3  # (a row per span)
    assert ids_and_calls("p1") == [(None, 3)] * 3
    with database.transaction() as conn:
        writer.add(conn.cursor(), [call(minute + 2.5, "p1")])
    writer.committed()
    p1 = writer.keys[("p1", "e0", 1, "read")]
    assert p1 != p0
    assert ids_and_calls("p1") == [(p1, 4)] * 3
    assert {u["principal"]: u["calls"] for u in usage(database, since=minute,
                                                      until=minute + 60)} == {"p0": 3, "p1": 4}


def test_the_writer_keeps_only_key_ids_its_transactions_committed(database: Database) -> None:
    """A new key's id read in a transaction that rolls back is not kept (SQLite gives its
    number to the next new key; PostgreSQL's is never used): the key is read again."""
    writer = rollup.Writer(database.dialect)
    conn = database.connect()
    try:
        writer.add(conn.cursor(), [call(DAY + 1, "gone")])
        conn.rollback()
        writer.add(conn.cursor(), [call(DAY + 2, "kept")])
        conn.commit()
        writer.committed()
        writer.add(conn.cursor(), [call(DAY + 3, "gone"), call(DAY + 4, "kept", None)])
        conn.commit()
        writer.committed()
    finally:
        conn.close()
    stored = {tuple(names): int(key_id) for key_id, *names in read_rows(
        database, "SELECT id, principal, endpoint, kind, tool FROM usage_keys", ()) or []}
    assert writer.keys == stored and len(stored) == 3
    assert {(u["principal"], u["tool"]): u["calls"] for u in usage(database, since=DAY)} == {
        ("gone", "read"): 1, ("kept", "read"): 1, ("kept", None): 1}


async def test_the_rollups_rebuilt_take_in_records_written_by_other_means(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = db_backends.url()
    database = Database(url)
    try:
        sink = DatabaseAuditSink(database)
        for r in records(600, seed=10):
            sink.emit(r)
        await sink.close()
        # records deleted and others inserted past the writer (as an older release, still
        # writing during a rolling upgrade, does): the rollups no longer say what is there
        with database.transaction() as conn:
            conn.execute(database.sql("DELETE FROM audit WHERE endpoint = ?"), ("e1",))
            conn.execute(database.sql(
                "INSERT INTO audit (ts, principal, endpoint, method, tool, status, "
                "duration_ms, bytes_in, bytes_out, era) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
                (DAY + 30.5, "p9", "e9", "tools/call", "read", "ok", 7.5, 1, 2, "legacy"))
        assert usage(database, since=0) != raw_usage(database, since=0)
        # the seconds no whole minute covers are read from the records by name: that one is
        # there, though its key has no id
        assert usage(database, since=DAY + 30, until=DAY + 31) == raw_usage(
            database, since=DAY + 30, until=DAY + 31) != []
        keys = read_rows(database, "SELECT id, principal, endpoint, kind, tool FROM usage_keys "
                               "ORDER BY id", ()) or []
        cfg = tmp_path / "c.toml"
        cfg.write_text(f'[database]\nurl = "{url}"\n')
        assert main(["db", "rollups", "--config", str(cfg)]) == 0
        assert "audit rollups rebuilt" in capsys.readouterr().out
        # the keys keep their ids (a running writer's are still right), e9's is new
        rebuilt = read_rows(database, "SELECT id, principal, endpoint, kind, tool FROM usage_keys "
                                  "ORDER BY id", ()) or []
        assert rebuilt[:len(keys)] == keys and [r[1:] for r in rebuilt[len(keys):]] == [
            ("p9", "e9", 1, "read")]
        assert_rollups_are_the_records_folded(database)
        assert_rollups_answer_as_the_records(database)
    finally:
        database.close()
