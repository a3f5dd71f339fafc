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
  duration (whole microseconds): /api/v1/usage, and a series of one principal. Each row also
  holds its key's integer `key_id` (migration 21): `usage_keys` numbers every (principal,
  endpoint, kind, tool) once, and /api/v1/usage sums a period's rows per key_id (a GROUP BY
  on one integer, where four columns of text and kind cost SQLite a sort twice as long),
  then names the totals from usage_keys.

`kind` tells a NULL from a name, since a key holds no NULL: 0 a method other than tools/call
(tool ''), 1 tools/call naming `tool`, 2 tools/call without a tool name (NULL; tool ''); for
a reason, 1 a reason, 2 none (NULL; reason '').

A period is read exactly (`plan`): whole days, whole hours at the ends, whole minutes at
theirs, and the raw records only for the parts of a minute at either edge; a ragged end is
read instead as the whole bucket it lies in less the rest of that bucket when that reads
fewer rows (a week from 01:01: its first day less an hour and a minute); one that ends now
or later takes today's day bucket whole and takes away what lies after its end (signed rows,
`union`). A series reads the rollup when its buckets start on minutes (`since` and
`bucket_s` multiples of 60), else its raw records.

The writer folds a batch in Python first, one tuple key and four integer adds a record
(`fold`), and sends the folded rows as one JSON parameter to an INSERT ... SELECT ... ON
CONFLICT DO UPDATE a table, which spreads them over the three spans (`Writer`): a handful of
statements a batch, whatever its size, in the batch's transaction; a retried or replayed
batch adds only the records that went in (`proxy.audit.database`). Each folded row carries
its usage key's id, which the writer keeps once a transaction that read it commits. The
migration fills the tables from the records already there with the same projections
(`backfill`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from math import sqrt
from typing import Any

import orjson

from proxy.storage import db, migrations

# latency histogram bounds in ms: a p95 is reported as the bound its bucket ends at
BOUNDS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
MANAGEMENT = "/api/v1"  # the endpoint of the management API's own audit records
SPANS = (86400, 3600, 60)  # coarsest first
STATUSES = ("ok", "denied", "error", "cancelled")
HISTOGRAM = tuple(f"h{i}" for i in range(len(BOUNDS_MS) + 1))

# a folded row: the source every table's projection reads (the writer's JSON, the backfill's
# audit rows)
SOURCE = ("m", "principal", "endpoint", "kind", "tool", "status", "cls", "rkind", "reason",
          "n", "bytes_in", "bytes_out", "us", "key_id")
_TEXT = frozenset({"principal", "endpoint", "tool", "status", "reason"})

_STATUS_COUNTS = tuple((s, f"CASE WHEN v.status = '{s}' THEN v.n ELSE 0 END")
                       for s in STATUSES)


class Table:
    """One rollup table: its key beyond (span, bucket), its values, and the projection of
    a folded row onto them (each value what one folded row adds). `ids` are columns its key
    determines (the usage rollup's `key_id`), set from the folded row, never added up."""

    def __init__(self, name: str, keys: Sequence[tuple[str, str]],
                 values: Sequence[tuple[str, str]], where: str = "1 = 1",
                 ids: Sequence[tuple[str, str]] = ()) -> None:
        self.name = name
        self.keys = tuple(k for k, _ in keys)
        self.key_exprs = tuple(e for _, e in keys)
        self.ids = tuple(i for i, _ in ids)
        self.id_exprs = tuple(e for _, e in ids)
        self.values = tuple(v for v, _ in values)
        self.value_exprs = tuple(e for _, e in values)
        self.where = where

    def columns(self) -> tuple[str, ...]:
        return ("span", "bucket", *self.keys, *self.ids, *self.values)

    def ddl(self, dialect: db.Dialect, name: str | None = None, key: bool = True) -> str:
        """CREATE TABLE (as `name` if given; without its primary key if not `key`: one
        added after a bulk load, PostgreSQL only). An id column may be NULL: a row that a
        release before it inserted has none."""
        columns = ["span INTEGER NOT NULL", "bucket {bigint} NOT NULL",
                   *(f"{k} {'TEXT' if k in _TEXT else 'INTEGER'} NOT NULL" for k in self.keys),
                   *(f"{i} {{bigint}}" for i in self.ids),
                   *(f"{v} {{bigint}} NOT NULL" for v in self.values)]
        if key:
            columns.append(f"PRIMARY KEY ({', '.join(('span', 'bucket', *self.keys))})")
        rowid = " WITHOUT ROWID" if dialect == "sqlite" else ""  # (the key is the table)
        return db.ddl(f"CREATE TABLE IF NOT EXISTS {name or self.name} "
                      f"({', '.join(columns)}){rowid}", dialect)

    def _upsert(self, select: str, group: str | None) -> str:
        """INSERT ... `select` ... ON CONFLICT DO UPDATE, adding (an id is set: a row an
        older release inserted without one gets it). Grouped rows go in key order:
        PostgreSQL's heap then holds a span's buckets together (the backfill's rows would
        otherwise lie in hash order, a page read a row for a range of them), and two writers
        lock the rows they share in one order (no deadlock between replicas)."""
        updates = ", ".join((*(f"{i} = excluded.{i}" for i in self.ids),
                             *(f"{v} = {self.name}.{v} + excluded.{v}" for v in self.values)))
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
        ids = self.id_exprs if not grouped else (f"max({e})" for e in self.id_exprs)
        exprs = ", ".join((*self.key_exprs, *ids, *values))
        select = (f"SELECT s.span, v.m - ((v.m % s.span) + s.span) % s.span, {exprs} "
                  f"FROM {source} CROSS JOIN {spans} WHERE {self.where}")
        return self._upsert(select, ", ".join(str(i) for i in range(1, len(self.keys) + 3))
                            if grouped else None)

    def coarser(self, span: int, finer: int) -> str:
        """INSERT the rows of span `finer` summed into span `span` (the backfill's way)."""
        bucket = f"bucket - ((bucket % {span}) + {span}) % {span}"
        exprs = ", ".join((*self.keys, *(f"max({i})" for i in self.ids),
                           *(f"sum({v})" for v in self.values)))
        select = f"SELECT {span}, {bucket}, {exprs} FROM {self.name} WHERE span = {finer}"
        return self._upsert(select, ", ".join((bucket, *self.keys)))


_COUNTS = (("n", "v.n"), *_STATUS_COUNTS)
_USAGE_KEY = (("principal", "v.principal"), ("endpoint", "v.endpoint"), ("kind", "v.kind"),
              ("tool", "v.tool"))
_USAGE_VALUES = (*_COUNTS, ("bytes_in", "v.bytes_in"), ("bytes_out", "v.bytes_out"),
                 ("duration_us", "v.us"))
_OTHERS = (
    Table("rollup_calls", (), _COUNTS, where=f"v.endpoint <> '{MANAGEMENT}'"),
    Table("rollup_endpoints", (("endpoint", "v.endpoint"),),
          (*_COUNTS, *((h, f"CASE WHEN v.cls = {i} THEN v.n ELSE 0 END")
                       for i, h in enumerate(HISTOGRAM)))),
    Table("rollup_tools", (("endpoint", "v.endpoint"), ("kind", "v.kind"), ("tool", "v.tool")),
          (("n", "v.n"),), where="v.kind > 0"),
    Table("rollup_denials", (("kind", "v.rkind"), ("reason", "v.reason")),
          (("n", "v.n"),), where=f"v.rkind > 0 AND v.endpoint <> '{MANAGEMENT}'"),
)
# the usage rollup with its key's integer (`usage_keys`, migration 21): /api/v1/usage groups
# on that one integer, not on the four columns of text and kind
USAGE = Table("rollup_usage", _USAGE_KEY, _USAGE_VALUES, ids=(("key_id", "v.key_id"),))
TABLES = (*_OTHERS, USAGE)
# the tables as migration 20 made them (its statements never change): the usage rollup
# without key_id
TABLES_20 = (*_OTHERS, Table("rollup_usage", _USAGE_KEY, _USAGE_VALUES))
KEYS = "usage_keys"
_KEY_NAMES = ("principal", "endpoint", "kind", "tool")
KEY_ON = " AND ".join(f"k.{c} = v.{c}" for c in _KEY_NAMES)  # a usage_keys k to a v's names
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


def keyed_source(dialect: db.Dialect) -> str:
    """`audit_source` with each record's `key_id` (the usage rollup's backfill source; run
    `keys_from_audit` first)."""
    return (f"(SELECT v.*, k.id AS key_id FROM {audit_source(dialect)} JOIN {KEYS} AS k ON "
            f"{KEY_ON}) AS v")


def keys_from_audit(dialect: db.Dialect) -> str:
    """INSERT into usage_keys every key of the audit records it lacks: on SQLite a record at
    a time, each a look-up in usage_keys' index (1M records: 0.8 s here, 1.6 grouped first);
    PostgreSQL groups them first (a hash)."""
    group = " GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4" if dialect == "postgresql" else " WHERE true"
    return (f"INSERT INTO {KEYS} ({', '.join(_KEY_NAMES)}) SELECT "
            f"{', '.join(f'v.{c}' for c in _KEY_NAMES)} FROM {audit_source(dialect)}{group} "
            "ON CONFLICT DO NOTHING")


KEYS_CACHED = 100_000  # usage keys a writer remembers the ids of (then it starts again)


class Writer:
    """The audit writer's statements on one dialect, each given the batch's folded rows as
    one JSON parameter. PostgreSQL: one statement, the rows parsed once (a WITH) and one
    INSERT ... ON CONFLICT DO UPDATE a rollup in it. SQLite (no INSERT in a WITH): the rows
    into a temporary table of the writer's connection, which each rollup's upsert reads, a
    row at a time (SQLite adds a row of the statement to one an earlier row inserted, where
    PostgreSQL refuses to touch a row twice and groups them first).

    Each folded row carries its usage key's id (`usage_keys`: principal, endpoint, kind and
    tool). The writer keeps the ids it has seen committed (`keys`); a batch's other keys are
    upserted in its transaction, their ids returned (one statement), and kept once it commits
    (`committed`): an id is never one of a transaction rolled back (SQLite would
    hand its number to the next key), and usage_keys' rows are never deleted or renumbered
    (`rebuild` keeps them), so a kept id stays right for the process's life, whoever else
    writes."""

    TEMP = "rollup_batch"

    def __init__(self, dialect: db.Dialect) -> None:
        self.dialect = dialect
        self.keys: dict[tuple[Any, ...], int] = {}  # committed: names -> id
        self._new: dict[tuple[Any, ...], int] = {}  # read in the transaction under way
        names = ", ".join(_KEY_NAMES)
        json_keys: tuple[str, ...]
        if dialect == "postgresql":
            json_keys = ("jsonb_array_elements(CAST(? AS jsonb)) AS j(value)",
                         "j.value ->> 0", "j.value ->> 1", "(j.value ->> 2)::int",
                         "j.value ->> 3")
        else:
            json_keys = ("json_each(?) AS j", *(f"json_extract(j.value, '$[{i}]')"
                                                for i in range(4)))
        source, *fields = json_keys
        # one statement: each key inserted, or (there already) touched, and its id returned;
        # sorted, so that writers on one PostgreSQL database wait on each other's new keys in
        # one order (a join of the names back to usage_keys instead: a hash of the whole
        # table on PostgreSQL, 1-3 ms a batch at 7,500 keys)
        self.upsert_keys = db.sql(
            f"INSERT INTO {KEYS} ({names}) SELECT {', '.join(fields)} FROM {source} ORDER BY "
            f"1, 2, 3, 4 ON CONFLICT ({names}) DO UPDATE SET kind = excluded.kind RETURNING id, "
            f"{names}", dialect)
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
        self._new = {}  # (what an earlier transaction read and did not commit is not kept)
        if not rows:
            return
        acc, calls, denials = fold(rows)
        ids = self._ids(cur, {k[1:5] for k in acc})
        folded = orjson.dumps([(*k, *v, ids[k[1:5]]) for k, v in acc.items()]).decode()
        if self.dialect == "postgresql":
            cur.execute(self.statement, (folded,))
            return
        cur.execute(self.create)  # (kept for the connection's life; cheap when there)
        cur.execute(self.load, (folded,))
        for statement, need in self.upserts:
            if need == 0 or (need == 1 and calls) or (need == 2 and denials):
                cur.execute(statement)
        cur.execute(self.clear)

    def _ids(self, cur: db.Cursor, names: set[tuple[Any, ...]]) -> dict[tuple[Any, ...], int]:
        """The usage key id of each of `names`: the kept ones, the rest upserted (in the
        batch's transaction; on PostgreSQL an upsert waits for, and returns, a key another
        writer's transaction is putting in meanwhile)."""
        known = self.keys
        out = {n: known[n] for n in names if n in known}
        if len(out) < len(names):
            missing = orjson.dumps(sorted(n for n in names if n not in out)).decode()
            cur.execute(self.upsert_keys, (missing,))
            for key_id, *found in cur.fetchall():
                out[tuple(found)] = self._new[tuple(found)] = int(key_id)
        return out

    def committed(self) -> None:
        """The transaction of the last `add` committed: the key ids it read are kept."""
        if len(self.keys) + len(self._new) > KEYS_CACHED:
            self.keys.clear()
        self.keys.update(self._new)
        self._new = {}


def fold(rows: list[tuple[Any, ...]]) -> tuple[dict[tuple[Any, ...], list[int]], bool, bool]:
    """A batch's audit rows (`proxy.audit.commit.row_of` tuples) folded per minute and
    everything a rollup groups by (each key: minute, principal, endpoint, kind, tool, status,
    histogram class, reason kind, reason; each value: records, bytes in and out, duration in
    µs), and whether any is a tools/call and any a denial."""
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
    return acc, calls, denials


def backfill_statements(dialect: db.Dialect, tables: Sequence[Table] = TABLES) -> list[str]:
    """Fill the rollups from every audit record: per minute from the records, then each
    coarser span from the one below (no parameters; `tables` TABLES_20: migration 20's). On
    SQLite the minutes are upserted a record at a time, in the audit table's order (a third
    faster than grouping them first: 1M records in 15 s here, not 22); PostgreSQL groups
    first (it touches a row once a statement). The usage rollup's keys go into usage_keys
    first (those missing), its rows read each record's key id from there."""
    out = []
    for table in tables:
        source = audit_source(dialect)
        if table.ids:
            out.append(keys_from_audit(dialect))
            source = keyed_source(dialect)
        out.append(table.fold(source, "(SELECT 60 AS span) AS s",
                              grouped=dialect == "postgresql"))
        out.append(table.coarser(3600, 60))
        out.append(table.coarser(86400, 3600))
    return out


def key_statements(dialect: db.Dialect) -> list[str]:
    """Migration 21: usage_keys, one row per (principal, endpoint, kind, tool) of the usage
    rollup, and the usage rollup again with each row's `key_id` (copied into a new table in
    key order, which replaces it: an UPDATE of every row would rewrite each in place, and on
    PostgreSQL leave the table twice its size). Its primary key is as before, so a writer of
    the release before (which names its columns) still adds to it; a row that one inserts
    has no key_id, and is not read until `tollhouse db rollups` rebuilds the rollups."""
    names = ", ".join(_KEY_NAMES)
    new = f"{USAGE.name}_21"
    ident = ("INTEGER PRIMARY KEY" if dialect == "sqlite"
             else "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY")
    columns = ", ".join(f"r.{c}" if c != "key_id" else "k.id" for c in USAGE.columns())
    order = ", ".join(f"r.{c}" for c in ("span", "bucket", *USAGE.keys))
    # (SQLite reads the old table in key order, the new one's too: no ORDER BY, no sort; a
    # LEFT JOIN keeps that order, the old table outside)
    copy = (f"INSERT INTO {new} ({', '.join(USAGE.columns())}) SELECT {columns} FROM "
            f"{USAGE.name} AS r LEFT JOIN {KEYS} AS k ON "
            f"{' AND '.join(f'k.{c} = r.{c}' for c in _KEY_NAMES)}"
            f"{f' ORDER BY {order}' if dialect == 'postgresql' else ''}")
    table = (f"CREATE TABLE IF NOT EXISTS {KEYS} (id {ident}, principal TEXT NOT NULL, "
             "endpoint TEXT NOT NULL, kind INTEGER NOT NULL, tool TEXT NOT NULL)")
    # every key has its day rows (the writer and the backfill fill every span)
    keys = (f"INSERT INTO {KEYS} ({names}) SELECT {names} FROM {USAGE.name} WHERE span = "
            f"86400 GROUP BY {names} ORDER BY {names} ON CONFLICT DO NOTHING")
    out = [table, f"CREATE UNIQUE INDEX IF NOT EXISTS {KEYS}_names ON {KEYS} ({names})", keys,
           USAGE.ddl(dialect, new, key=dialect == "sqlite"), copy,
           f"DROP TABLE {USAGE.name}", f"ALTER TABLE {new} RENAME TO {USAGE.name}"]
    if dialect == "postgresql":  # (built once the rows are in: faster than row by row)
        out += [(f"ALTER TABLE {USAGE.name} ADD PRIMARY KEY "
                 f"({', '.join(('span', 'bucket', *USAGE.keys))})"),
                # (the planner's figures for the new tables now, not at autovacuum's next run)
                f"ANALYZE {USAGE.name}", f"ANALYZE {KEYS}"]
    return out


def backfill(conn: db.Connection, dialect: db.Dialect) -> None:
    """The backfill, for records put in the audit table other than through the writer into
    empty rollups (bench/console.py's seed); usage_keys may hold keys already. The caller
    commits."""
    for statement in backfill_statements(dialect):
        conn.execute(statement)


def rebuild(database: db.Database) -> None:
    """Empty the rollups and fill them again from the audit records as they stand
    (`tollhouse db rollups`): after records went in or out of the audit table other than
    through the writer (an import, a deletion, a release without rollups still writing during
    a rolling upgrade). One transaction; the audit writers wait for it (on PostgreSQL a SHARE
    lock on the audit table; on SQLite the write lock), so none of their records is counted
    twice or left out. usage_keys keeps its rows: the running writers keep their ids."""
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
    finer ones, and raw records for what no whole minute covers. A ragged end is read as the
    whole bucket it lies in less the rest of that bucket (signed rows) when that reads fewer
    rows by `_cost`: a week from 01:00 is a day less an hour, not 23 hours. An open end
    (`until` None) is whole days from the first after `since` on. With `now` given, a period
    ending at or after it is read as one ending on the next whole day, less what lies between
    its end and that day's end (records from the future, next to none): today is one day
    bucket, not its hours, minutes and seconds so far."""
    if not spans:
        return [(0, since, until, 1)]
    top = spans[0]
    if until is None:
        first = -(-since // top) * top
        head, start = _side(since, first, top, spans[1:], before=True)
        return [*head, (top, start, None, 1)]
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
        finer = spans[i + 1:]
        if first < last:
            head, start = _side(lo, first, span, finer, before=True)
            tail, end = _side(last, hi, span, finer, before=False)
            return [*head, (span, start, end, 1), *tail]
        if first == last and first in (lo, hi):  # one end of a bucket, no whole one
            part, bound = _side(lo, hi, span, finer, before=first == hi)
            if bound == first:
                return part
            return [*part, (span, bound, hi, 1)] if first == hi else [(span, lo, bound, 1), *part]
    return [(0, lo, hi, 1)]


def _side(lo: float, hi: float, span: int, finer: Sequence[int], before: bool
          ) -> tuple[list[Segment], float]:
    """[lo, hi), the part of one `span` bucket just before whole ones of it (`before`: that
    bucket ends at `hi`) or just after them (it starts at `lo`): in `finer` spans, or as the
    whole bucket less the rest of it when that costs less; and where the whole buckets
    begin (`before`) or end, then."""
    add = _plan(lo, hi, finer)
    bound = hi if before else lo
    if not add:
        return add, bound
    whole = hi - span if before else lo + span
    rest = _plan(whole, lo, finer) if before else _plan(hi, whole, finer)
    if _cost(rest) + _weight(span) < _cost(add):
        return [(s, a, b, -sign) for s, a, b, sign in rest], whole
    return add, bound


def _weight(span: int) -> float:
    """What reading one bucket of `span` (0: a raw piece under a minute) is taken to cost, in
    minute buckets: the square root of its length in minutes, between a rollup whose keys
    are few (every bucket about as many rows as keys: 1) and one whose every record has a key
    of its own (rows as many as records: the span's minutes). The bench's usage rollup: an
    hour 43 minutes' rows, a day 84."""
    return sqrt(max(span, 60) / 60)


def _cost(segments: list[Segment]) -> float:
    return sum(_weight(span) * ((hi - lo) / span if span and hi is not None else 1)
               for span, lo, hi, _ in segments)


def union(segments: list[Segment], tier: str, tier_args: Sequence[Any], raw: str,
          raw_args: Sequence[Any], tier_head: Sequence[Any] = (),
          raw_head: Sequence[Any] = ()) -> tuple[str, list[Any]]:
    """The UNION ALL of `tier` (a SELECT of a rollup with `{at}` where its span and bucket
    range go) over each rollup segment and `raw` (one of the audit table, `{at}` for its ts
    range) over each raw one, and the arguments: each SELECT's `head` ones (of `?` before
    `{at}`), the range's, then its `args` (of `?` after). `{sign}` in a SELECT is its
    segment's sign (1 or -1), `{neg}` a minus sign in a segment taken away (nothing in one
    added: `{neg}n` costs the rows added nothing): a SELECT with neither takes no segment
    away."""
    parts: list[str] = []
    args: list[Any] = []
    for span, lo, hi, sign in segments:
        template = tier if span else raw
        if sign < 0 and "{sign}" not in template and "{neg}" not in template:
            raise ValueError("a segment to take away, and no {sign} to take it away with")
        if span:
            at = "span = ? AND bucket >= ?" + ("" if hi is None else " AND bucket < ?")
            bounds: list[Any] = [span, int(lo)] if hi is None else [span, int(lo), int(hi)]
            args += [*tier_head, *bounds, *tier_args]
        else:
            at = "ts >= ?" + ("" if hi is None else " AND ts < ?")
            bounds = [lo] if hi is None else [lo, hi]
            args += [*raw_head, *bounds, *raw_args]
        parts.append(template.format(at=at, sign=sign, neg="-" if sign < 0 else ""))
    return " UNION ALL ".join(parts), args


def _tables_20() -> tuple[migrations.Step, ...]:
    """Migration 20: the rollup tables and their backfill, for each dialect."""
    steps: list[migrations.Step] = []
    for dialect in ("sqlite", "postgresql"):
        steps += [migrations.Only(dialect, table.ddl(dialect)) for table in TABLES_20]
        steps += [migrations.Only(dialect, text)
                  for text in backfill_statements(dialect, TABLES_20)]
    return tuple(steps)


# the rollup tables are this module's: their migrations' steps are registered here, under the
# numbers proxy.storage.migrations hands out (storage imports no feature)
migrations.register(20, _tables_20())
migrations.register(21, tuple(migrations.Only(dialect, text)
                              for dialect in ("sqlite", "postgresql")
                              for text in key_statements(dialect)))
