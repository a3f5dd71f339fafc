"""The audit log rolled up per minute, hour and day (UTC), kept by the audit writer in the
transaction that inserts the records, so that the aggregates (`proxy.audit.summary`, and
`proxy.audit.database.usage` behind /api/v1/usage) read a few thousand rows of counts instead
of grouping every raw record of their period.

Five tables (migration 20), each keyed by `span` (60, 3600 or 86400 seconds) and `bucket` (the
Unix time its span starts at, a multiple of the span) and by what its query groups by:

- `rollup_calls`: MCP traffic (never the management API's own records) per status: the
  series without a filter.
- `rollup_endpoints` per endpoint: calls (`n`), per status, and the latency histogram
  `h0`..`h12` (`BOUNDS_MS`): the summary's endpoints, a series of one endpoint.
- `rollup_tools` per endpoint and tool: tools/call records: the summary's busiest tools.
- `rollup_denials` per reason: MCP denials: the summary's denials.
- `rollup_usage` per principal, endpoint and tool: calls, per status, bytes in and out,
  duration (whole microseconds): /api/v1/usage, and a series of one principal.

`kind` tells a NULL from a name, since a key holds no NULL: 0 a method other than tools/call
(tool ''), 1 tools/call naming `tool`, 2 tools/call without a tool name (NULL; tool ''); for
a reason, 1 a reason, 2 none (NULL; reason '').

A period is read exactly (`plan`): whole days, whole hours at the ends, whole minutes at
theirs, and the raw records only for the parts of a minute at either edge; one that ends now
or later takes today's day bucket whole and takes away what lies after its end (signed rows,
`union`). A series reads the rollup when its buckets start on minutes (`since` and
`bucket_s` multiples of 60), else its raw records.

The writer folds a batch in Python first, one tuple key and four integer adds a record
(`fold`), and sends the folded rows as one JSON parameter to an INSERT ... SELECT ... ON
CONFLICT DO UPDATE a table, which spreads them over the three spans (`Writer`): a handful of
statements a batch, whatever its size, in the batch's transaction; a retried or replayed
batch adds only the records that went in (`proxy.audit.database`). The migration fills the
tables from the records already there with the same projections (`backfill`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

import orjson

from proxy import db

# latency histogram bounds in ms: a p95 is reported as the bound its bucket ends at
BOUNDS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
MANAGEMENT = "/api/v1"  # the endpoint of the management API's own audit records
SPANS = (86400, 3600, 60)  # coarsest first
STATUSES = ("ok", "denied", "error", "cancelled")
HISTOGRAM = tuple(f"h{i}" for i in range(len(BOUNDS_MS) + 1))

# a folded row: the source every table's projection reads (the writer's JSON, the backfill's
# audit rows)
SOURCE = ("m", "principal", "endpoint", "kind", "tool", "status", "cls", "rkind", "reason",
          "n", "bytes_in", "bytes_out", "us")
_TEXT = frozenset({"principal", "endpoint", "tool", "status", "reason"})

_STATUS_COUNTS = tuple((s, f"CASE WHEN v.status = '{s}' THEN v.n ELSE 0 END")
                       for s in STATUSES)


class Table:
    """One rollup table: its key beyond (span, bucket), its values, and the projection of
    a folded row onto them (each value what one folded row adds)."""

    def __init__(self, name: str, keys: Sequence[tuple[str, str]],
                 values: Sequence[tuple[str, str]], where: str = "1 = 1") -> None:
        self.name = name
        self.keys = tuple(k for k, _ in keys)
        self.key_exprs = tuple(e for _, e in keys)
        self.values = tuple(v for v, _ in values)
        self.value_exprs = tuple(e for _, e in values)
        self.where = where

    def columns(self) -> tuple[str, ...]:
        return ("span", "bucket", *self.keys, *self.values)

    def ddl(self, dialect: db.Dialect) -> str:
        columns = ["span INTEGER NOT NULL", "bucket {bigint} NOT NULL",
                   *(f"{k} {'TEXT' if k in _TEXT else 'INTEGER'} NOT NULL" for k in self.keys),
                   *(f"{v} {{bigint}} NOT NULL" for v in self.values)]
        rowid = " WITHOUT ROWID" if dialect == "sqlite" else ""  # (the key is the table)
        return db.ddl(f"CREATE TABLE IF NOT EXISTS {self.name} ({', '.join(columns)}, "
                      f"PRIMARY KEY ({', '.join(('span', 'bucket', *self.keys))})){rowid}",
                      dialect)

    def _upsert(self, select: str, group: str | None) -> str:
        """INSERT ... `select` ... ON CONFLICT DO UPDATE, adding. Grouped rows go in key
        order: PostgreSQL's heap then holds a span's buckets together (the backfill's rows
        would otherwise lie in hash order, a page read a row for a range of them), and two
        writers lock the rows they share in one order (no deadlock between replicas)."""
        updates = ", ".join(f"{v} = {self.name}.{v} + excluded.{v}" for v in self.values)
        return (f"INSERT INTO {self.name} ({', '.join(self.columns())}) {select} "
                f"{f'GROUP BY {group} ORDER BY {group} ' if group else ''}ON CONFLICT "
                f"({', '.join(('span', 'bucket', *self.keys))}) DO UPDATE SET {updates}")

    def fold(self, source: str, spans: str, grouped: bool = True) -> str:
        """INSERT the folded rows of `source` (a subquery named v with the SOURCE columns, per
        minute `m`) into every span of `spans` (a subquery named s with one column, span),
        adding to the counts there. Not `grouped`, each row is an upsert of its own, adding
        to what an earlier row of the statement inserted (SQLite's way; PostgreSQL refuses
        to touch a row twice in one statement)."""
        values = self.value_exprs if not grouped else (f"sum({e})" for e in self.value_exprs)
        exprs = ", ".join((*self.key_exprs, *values))
        select = (f"SELECT s.span, v.m - ((v.m % s.span) + s.span) % s.span, {exprs} "
                  f"FROM {source} CROSS JOIN {spans} WHERE {self.where}")
        return self._upsert(select, ", ".join(str(i) for i in range(1, len(self.keys) + 3))
                            if grouped else None)

    def coarser(self, span: int, finer: int) -> str:
        """INSERT the rows of span `finer` summed into span `span` (the backfill's way)."""
        bucket = f"bucket - ((bucket % {span}) + {span}) % {span}"
        exprs = ", ".join((*self.keys, *(f"sum({v})" for v in self.values)))
        select = f"SELECT {span}, {bucket}, {exprs} FROM {self.name} WHERE span = {finer}"
        return self._upsert(select, ", ".join((bucket, *self.keys)))


_COUNTS = (("n", "v.n"), *_STATUS_COUNTS)
TABLES = (
    Table("rollup_calls", (), _COUNTS, where=f"v.endpoint <> '{MANAGEMENT}'"),
    Table("rollup_endpoints", (("endpoint", "v.endpoint"),),
          (*_COUNTS, *((h, f"CASE WHEN v.cls = {i} THEN v.n ELSE 0 END")
                       for i, h in enumerate(HISTOGRAM)))),
    Table("rollup_tools", (("endpoint", "v.endpoint"), ("kind", "v.kind"), ("tool", "v.tool")),
          (("n", "v.n"),), where="v.kind > 0"),
    Table("rollup_denials", (("kind", "v.rkind"), ("reason", "v.reason")),
          (("n", "v.n"),), where=f"v.rkind > 0 AND v.endpoint <> '{MANAGEMENT}'"),
    Table("rollup_usage", (("principal", "v.principal"), ("endpoint", "v.endpoint"),
                           ("kind", "v.kind"), ("tool", "v.tool")),
          (*_COUNTS, ("bytes_in", "v.bytes_in"), ("bytes_out", "v.bytes_out"),
           ("duration_us", "v.us"))),
)
_ALL_SPANS = " UNION ALL ".join(f"SELECT {s} AS span" for s in reversed(SPANS))
SPANS_SQL = f"({_ALL_SPANS}) AS s"


def _minute(column: str, dialect: db.Dialect) -> str:
    """The minute a Unix time falls in, floored exactly as the writer's `ts - ts % 60` (a
    float quotient that rounds up onto the next minute is taken back)."""
    q = (f"CAST({column} / 60 AS INTEGER)" if dialect == "sqlite"
         else f"CAST(floor({column} / 60) AS BIGINT)")
    return f"({q} * 60 - CASE WHEN {q} * 60 > {column} THEN 60 ELSE 0 END)"


def histogram_class(column: str) -> str:
    """The histogram bucket of a duration in ms (SQL): the first bound it is under."""
    return (f"CASE {' '.join(f'WHEN {column} < {b} THEN {i}' for i, b in enumerate(BOUNDS_MS))}"
            f" ELSE {len(BOUNDS_MS)} END")


def audit_source(dialect: db.Dialect) -> str:
    """The raw records as folded rows of one record each (the backfill's source)."""
    bigint = db.ddl("{bigint}", dialect)
    call = "method = 'tools/call'"
    return (f"(SELECT {_minute('ts', dialect)} AS m, principal, endpoint, "
            f"CASE WHEN {call} THEN CASE WHEN tool IS NULL THEN 2 ELSE 1 END ELSE 0 END "
            f"AS kind, CASE WHEN {call} THEN coalesce(tool, '') ELSE '' END AS tool, status, "
            f"{histogram_class('duration_ms')} AS cls, CASE WHEN status = 'denied' THEN CASE "
            "WHEN denied_reason IS NULL THEN 2 ELSE 1 END ELSE 0 END AS rkind, CASE WHEN "
            "status = 'denied' THEN coalesce(denied_reason, '') ELSE '' END AS reason, 1 AS n, "
            f"bytes_in, bytes_out, CAST(round(duration_ms * 1000) AS {bigint}) AS us "
            "FROM audit) AS v")


class Writer:
    """The audit writer's statements on one dialect, each given the batch's folded rows as
    one JSON parameter. PostgreSQL: one statement, the rows parsed once (a WITH) and one
    INSERT ... ON CONFLICT DO UPDATE a rollup in it. SQLite (no INSERT in a WITH): the rows
    into a temporary table of the writer's connection, which each rollup's upsert reads, a
    row at a time (SQLite adds a row of the statement to one an earlier row inserted, where
    PostgreSQL refuses to touch a row twice and groups them first)."""

    TEMP = "rollup_batch"

    def __init__(self, dialect: db.Dialect) -> None:
        self.dialect = dialect
        if dialect == "postgresql":
            cols = ", ".join(f"(j.value ->> {i}){'' if c in _TEXT else '::bigint'} AS {c}"
                             for i, c in enumerate(SOURCE))
            upserts = ", ".join(f"u{i} AS ({t.fold('v', SPANS_SQL)})"
                                for i, t in enumerate(TABLES))
            self.statement = db.sql(f"WITH v AS (SELECT {cols} FROM jsonb_array_elements("
                                    f"CAST(? AS jsonb)) AS j(value)), {upserts} SELECT 1",
                                    dialect)
            return
        columns = ", ".join(f"{c} {'TEXT' if c in _TEXT else 'INTEGER'}" for c in SOURCE)
        self.create = f"CREATE TEMP TABLE IF NOT EXISTS {self.TEMP} ({columns})"
        cols = ", ".join(f"json_extract(j.value, '$[{i}]')" for i in range(len(SOURCE)))
        self.load = (f"INSERT INTO {self.TEMP} ({', '.join(SOURCE)}) SELECT {cols} "
                     "FROM json_each(?) AS j")
        need = {"rollup_tools": 1, "rollup_denials": 2}  # 0: every batch; 1, 2: see `add`
        self.upserts = tuple((t.fold(f"{self.TEMP} AS v", SPANS_SQL, grouped=False),
                              need.get(t.name, 0)) for t in TABLES)
        self.clear = f"DELETE FROM {self.TEMP}"

    def add(self, cur: db.Cursor, rows: list[tuple[Any, ...]]) -> None:
        """Add a batch's rows to every rollup (inside the batch's transaction)."""
        if not rows:
            return
        folded, calls, denials = fold(rows)
        if self.dialect == "postgresql":
            cur.execute(self.statement, (folded.decode(),))
            return
        cur.execute(self.create)  # (kept for the connection's life; cheap when there)
        cur.execute(self.load, (folded.decode(),))
        for statement, need in self.upserts:
            if need == 0 or (need == 1 and calls) or (need == 2 and denials):
                cur.execute(statement)
        cur.execute(self.clear)


def fold(rows: list[tuple[Any, ...]]) -> tuple[bytes, bool, bool]:
    """A batch's audit rows (`proxy.audit.database._row` tuples) folded per minute and
    everything a rollup groups by; the JSON of the folded rows, and whether any is a
    tools/call and any a denial."""
    acc: dict[tuple[Any, ...], list[int]] = {}
    calls = denials = False
    for row in rows:
        ts, status, ms = row[0], row[6], row[9]
        if row[4] == "tools/call":
            tool = row[5]
            kind = 2 if tool is None else 1
            calls = True
        else:
            tool, kind = "", 0
        if status == "denied":
            reason = row[7]
            rkind = 2 if reason is None else 1
            denials = True
        else:
            reason, rkind = "", 0
        key = (int(ts - ts % 60), row[2], row[3], kind, tool or "", status,
               bisect_right(BOUNDS_MS, ms), rkind, reason or "")
        try:
            us = round(ms * 1000)
        except (ValueError, OverflowError):  # a NaN or infinite duration (PostgreSQL keeps one)
            us = 0
        found = acc.get(key)
        if found is None:
            acc[key] = [1, row[10], row[11], us]
        else:
            found[0] += 1
            found[1] += row[10]
            found[2] += row[11]
            found[3] += us
    return orjson.dumps([(*k, *v) for k, v in acc.items()]), calls, denials


def backfill_statements(dialect: db.Dialect) -> list[str]:
    """Fill the rollups from every audit record: per minute from the records, then each
    coarser span from the one below (migration 20; no parameters). On SQLite the minutes
    are upserted a record at a time, in the audit table's order (a third faster than
    grouping them first: 1M records in 15 s here, not 22); PostgreSQL groups first (it
    touches a row once a statement)."""
    out = []
    for table in TABLES:
        out.append(table.fold(audit_source(dialect), "(SELECT 60 AS span) AS s",
                              grouped=dialect == "postgresql"))
        out.append(table.coarser(3600, 60))
        out.append(table.coarser(86400, 3600))
    return out


def backfill(conn: db.Connection, dialect: db.Dialect) -> None:
    """Migration 20's backfill, for records put in the audit table other than through the
    writer into empty rollups (bench/console.py's seed). The caller commits."""
    for statement in backfill_statements(dialect):
        conn.execute(statement)


def rebuild(database: db.Database) -> None:
    """Empty the rollups and fill them again from the audit records as they stand
    (`tollhouse db rollups`): after records went in or out of the audit table other than
    through the writer (an import, a deletion, a release without rollups still writing during
    a rolling upgrade). One transaction; the audit writers wait for it (on PostgreSQL a SHARE
    lock on the audit table; on SQLite the write lock), so none of their records is counted
    twice or left out."""
    with database.transaction() as conn:
        if database.postgresql:
            conn.execute("SET LOCAL lock_timeout = 0")  # (behind the writers' commits)
            conn.execute("LOCK TABLE audit IN SHARE MODE")
        for table in TABLES:
            conn.execute(f"DELETE FROM {table.name}")
        backfill(conn, database.dialect)


# -- reading ---------------------------------------------------------------------------------

# (span, 0 for raw records; from; to, None: open; +1 to add, -1 to take away)
Segment = tuple[int, float, float | None, int]


def plan(since: float, until: float | None, now: float | None = None,
         spans: Sequence[int] = SPANS) -> list[Segment]:
    """[since, until) as whole buckets of the coarsest span that fits, the ragged ends in
    finer ones, and raw records for what no whole minute covers. An open end (`until` None)
    is whole days from the first after `since` on. With `now` given, a period ending at or
    after it is read as one ending on the next whole day, less what lies between its end and
    that day's end (records from the future, next to none): today is one day bucket, not its
    hours, minutes and seconds so far."""
    if not spans:
        return [(0, since, until, 1)]
    top = spans[0]
    if until is None:
        first = -(-since // top) * top
        return [*_plan(since, first, spans[1:]), (top, first, None, 1)]
    if now is not None and until >= now and until % top:
        end = -(-until // top) * top
        return [*_plan(since, end, spans),
                *((span, lo, hi, -sign) for span, lo, hi, sign in _plan(max(since, until), end,
                                                                        spans))]
    return _plan(since, until, spans) or [(0, since, until, 1)]  # (empty: a range of nothing)


def _plan(lo: float, hi: float, spans: Sequence[int]) -> list[Segment]:
    if lo >= hi:
        return []
    for i, span in enumerate(spans):
        first = -(-lo // span) * span
        last = hi - hi % span
        if first < last:
            finer = spans[i + 1:]
            return [*_plan(lo, first, finer), (span, first, last, 1), *_plan(last, hi, finer)]
    return [(0, lo, hi, 1)]


def union(segments: list[Segment], tier: str, tier_args: Sequence[Any], raw: str,
          raw_args: Sequence[Any], tier_head: Sequence[Any] = (),
          raw_head: Sequence[Any] = ()) -> tuple[str, list[Any]]:
    """The UNION ALL of `tier` (a SELECT of a rollup with `{at}` where its span and bucket
    range go) over each rollup segment and `raw` (one of the audit table, `{at}` for its ts
    range) over each raw one, and the arguments: each SELECT's `head` ones (of `?` before
    `{at}`), the range's, then its `args` (of `?` after). `{sign}` in a SELECT is its
    segment's sign (1 or -1): a SELECT without one takes no segment away."""
    parts: list[str] = []
    args: list[Any] = []
    for span, lo, hi, sign in segments:
        template = tier if span else raw
        if sign < 0 and "{sign}" not in template:
            raise ValueError("a segment to take away, and no {sign} to take it away with")
        if span:
            at = "span = ? AND bucket >= ?" + ("" if hi is None else " AND bucket < ?")
            bounds: list[Any] = [span, int(lo)] if hi is None else [span, int(lo), int(hi)]
            args += [*tier_head, *bounds, *tier_args]
        else:
            at = "ts >= ?" + ("" if hi is None else " AND ts < ?")
            bounds = [lo] if hi is None else [lo, hi]
            args += [*raw_head, *bounds, *raw_args]
        parts.append(template.format(at=at, sign=sign))
    return " UNION ALL ".join(parts), args
