"""The exports' two tables as their workers use them (migration 25, proxy.storage.migrations):
`audit_export_outbox`, the records queued for each export in the order their writers
committed them (`seq`), and `audit_exports`, one row per export: who sends for it (a lease),
its totals, its last error and its backlog as last measured. Each method is one transaction
on the worker's own connection, run on the worker's database thread, never on the event loop.

One worker at a time sends for an export, whichever gateway holds its lease: the records
leave in `seq` order, one batch after the other, so a writer's records arrive in the order it
wrote them. A lease not renewed (its gateway died) is taken over once it ends.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.storage import db
from proxy.storage.own import OwnConnection

Row = tuple[int, str, str, float]  # (seq, event id, the record's native JSON, queued at)

_STATE = ("holder", "lease_until", "sent", "failed", "dropped", "backlog", "oldest_at",
          "is_full", "last_error", "last_error_at", "last_sent_at", "next_attempt_at",
          "failures")


@dataclass(frozen=True)
class State:
    """An export's row of `audit_exports`."""

    holder: str | None = None
    lease_until: float = 0.0
    sent: int = 0
    failed: int = 0
    dropped: int = 0
    backlog: int = 0
    oldest_at: float | None = None
    is_full: bool = False
    last_error: str | None = None
    last_error_at: float | None = None
    last_sent_at: float | None = None
    next_attempt_at: float = 0.0
    failures: int = 0  # sends failed in a row (the backoff's exponent)

    @classmethod
    def of(cls, row: tuple[Any, ...] | None) -> State:
        if row is None:
            return cls()
        values = dict(zip(_STATE, row, strict=True))
        values["is_full"] = bool(values["is_full"])
        for key in ("sent", "failed", "dropped", "backlog", "failures"):
            values[key] = int(values[key] or 0)
        for key in ("lease_until", "next_attempt_at"):
            values[key] = float(values[key] or 0.0)
        return cls(**values)


class ExportTable:
    """One export's statements, prepared once for the dialect, on the worker's own connection
    (made on first use, on the worker's thread, and again after one is lost; an in-memory
    SQLite database's shared one instead)."""

    def __init__(self, database: db.Database, name: str, clock: Callable[[], float]) -> None:
        self._database = database
        self.name = name
        self._clock = clock
        self._own = OwnConnection(database)
        sql = database.sql
        self._ensure = database.insert_ignore("audit_exports", ("name",))
        self._take = sql("UPDATE audit_exports SET holder = ?, lease_until = ? WHERE name = ? "
                         "AND (holder = ? OR holder IS NULL OR lease_until < ?)")
        self._state = sql(f"SELECT {', '.join(_STATE)} FROM audit_exports WHERE name = ?")
        self._head = sql("SELECT seq, event_id, record, created_at FROM audit_export_outbox "
                         "WHERE export = ? ORDER BY seq LIMIT ?")
        if database.postgresql:
            self._delete = sql("DELETE FROM audit_export_outbox WHERE seq = ANY(?)")
        else:
            self._delete = ("DELETE FROM audit_export_outbox WHERE seq IN "
                            "(SELECT value FROM json_each(?))")
        self._sent = sql("UPDATE audit_exports SET sent = sent + ?, last_sent_at = ?, "
                         "failures = 0, next_attempt_at = 0 WHERE name = ?")
        self._failed = sql("UPDATE audit_exports SET failed = failed + ?, last_error = ?, "
                           "last_error_at = ?, failures = failures + 1, next_attempt_at = ? "
                           "WHERE name = ?")
        self._count = sql("SELECT count(*) FROM (SELECT 1 FROM audit_export_outbox "
                          "WHERE export = ? LIMIT ?) AS q")
        self._oldest = sql("SELECT created_at FROM audit_export_outbox WHERE export = ? "
                           "ORDER BY seq LIMIT 1")
        self._measured = sql("UPDATE audit_exports SET backlog = ?, oldest_at = ?, is_full = ? "
                             "WHERE name = ?")
        self._release = sql("UPDATE audit_exports SET lease_until = 0 WHERE name = ? AND "
                            "holder = ?")

    def _transaction(self, write: bool = True) -> AbstractContextManager[db.Connection]:
        """One transaction on the worker's own connection (a write: with SQLite's write lock
        from its start)."""
        return self._own.transaction(immediate=write)

    def drop(self) -> None:
        """Close the worker's connection (a lost one, or the worker stopping)."""
        self._own.close()

    def round(self, holder: str, lease_s: float, batch: int
              ) -> tuple[bool, State, list[Row]]:
        """Take or renew the export's lease for `holder`; the export's state; and, held and
        no retry pending, the next `batch` records in order."""
        now = self._clock()
        with self._transaction() as conn:
            conn.execute(self._ensure, (self.name,))
            held = conn.execute(self._take, (holder, now + lease_s, self.name, holder,
                                             now)).rowcount == 1
            state = State.of(conn.execute(self._state, (self.name,)).fetchone())
            rows: list[Row] = []
            if held and state.next_attempt_at <= now:
                rows = [(int(r[0]), str(r[1]), str(r[2]), float(r[3]))
                        for r in conn.execute(self._head, (self.name, batch)).fetchall()]
        return held, state, rows

    def delivered(self, seqs: list[int]) -> None:
        """The receiver took these records: they leave the outbox, counted as sent."""
        with self._transaction() as conn:
            conn.execute(self._delete, (seqs if self._database.postgresql
                                        else orjson.dumps(seqs).decode(),))
            conn.execute(self._sent, (len(seqs), self._clock(), self.name))

    def failed(self, count: int, error: str, next_at: float) -> None:
        """A send of `count` records failed: they stay, due again at `next_at`."""
        with self._transaction() as conn:
            conn.execute(self._failed, (count, error, self._clock(), next_at, self.name))

    def measure(self, cap: int) -> tuple[int, float | None]:
        """The backlog (counted up to `cap`, then "at least cap") and the oldest record's
        queueing time, written to the export's row (`is_full` when the backlog is at `cap`)."""
        with self._transaction() as conn:
            backlog = int(conn.execute(self._count, (self.name, cap)).fetchone()[0])
            oldest = conn.execute(self._oldest, (self.name,)).fetchone()
            oldest_at = float(oldest[0]) if oldest else None
            conn.execute(self._measured, (backlog, oldest_at, 1 if backlog >= cap else 0,
                                          self.name))
        return backlog, oldest_at

    def release(self, holder: str) -> None:
        """A worker that stops hands its lease back: another gateway sends at once."""
        with suppress(*self._database.errors), self._transaction() as conn:
            conn.execute(self._release, (self.name, holder))


def read_states(database: db.Database, names: list[str], caps: list[int]
                ) -> list[tuple[State, int, float | None]]:
    """Each named export's state, its backlog counted now (up to its cap) and its oldest
    record's queueing time; an export never seen, or a database not migrated yet, reads as
    empty."""
    sql = database.sql
    state_sql = sql(f"SELECT {', '.join(_STATE)} FROM audit_exports WHERE name = ?")
    count_sql = sql("SELECT count(*) FROM (SELECT 1 FROM audit_export_outbox WHERE export = ? "
                    "LIMIT ?) AS q")
    oldest_sql = sql("SELECT created_at FROM audit_export_outbox WHERE export = ? ORDER BY seq "
                     "LIMIT 1")
    out: list[tuple[State, int, float | None]] = []
    with database.lease() as conn:
        try:
            for name, cap in zip(names, caps, strict=True):
                state = State.of(conn.execute(state_sql, (name,)).fetchone())
                backlog = int(conn.execute(count_sql, (name, cap)).fetchone()[0])
                oldest = conn.execute(oldest_sql, (name,)).fetchone()
                out.append((state, backlog, float(oldest[0]) if oldest else None))
        except database.missing_table:
            return [(State(), 0, None) for _ in names]
        finally:
            with suppress(Exception):
                conn.rollback()
    return out
