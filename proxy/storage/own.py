"""A background worker's own database connection (`OwnConnection`): the usage outbox's and each
audit export's, apart from the audit writer's and the request path's pool.

On SQLite the connection commits with synchronous=NORMAL, as the audit writer's does: a commit
that synced the WAL (FULL) would hold the write lock through an fsync, and the audit commits
that answers wait for would queue behind it. A transaction that writes may take SQLite's
write lock from its start (`immediate`: BEGIN IMMEDIATE), so that what it reads is not
changed by another writer before it writes. A failure rolls back; a connection found broken is
closed, and the next transaction opens a new one. On an in-memory database (tests) the
database's one shared connection is used.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any, cast

from proxy.storage import db


class OwnConnection:
    """One worker's connection to `database`, opened on first use."""

    def __init__(self, database: db.Database) -> None:
        self._database = database
        self._conn: db.Connection | None = None

    @contextmanager
    def transaction(self, immediate: bool = False) -> Iterator[db.Connection]:
        """One transaction; `immediate`: on SQLite, with the write lock from its start."""
        if self._database.memory:
            with self._database.transaction() as shared:
                yield shared
            return
        if self._conn is None:
            self._conn = self._database.connect()
            if not self._database.postgresql:
                self._conn.execute("PRAGMA synchronous=NORMAL")
        conn = self._conn
        try:
            if immediate and not self._database.postgresql \
                    and not getattr(conn, "in_transaction", False):
                conn.execute("BEGIN IMMEDIATE")
            yield conn
            conn.commit()
        except BaseException:
            with suppress(Exception):
                conn.rollback()
            if db.broken(conn):
                self.close()
            raise

    def close(self) -> None:
        """Close the connection (a lost one, or the worker stopping)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(Exception):
                conn.close()


class CounterReader:
    """A change counter's value (a row a table's triggers bump), read for a mirror
    (proxy.mirror) on its pool: on PostgreSQL one round trip on a connection of our own in
    autocommit, reopened once if it was lost; on SQLite in a short transaction."""

    def __init__(self, database: db.Database, sql: str) -> None:
        self._database = database
        self._sql = database.sql(sql)
        self._conn: db.Connection | None = None

    def __call__(self) -> int:
        database = self._database
        if not database.postgresql:
            with database.transaction() as conn:
                row = conn.execute(self._sql, (1,)).fetchone()
            return int(row[0]) if row else 0
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = database.connect()
                cast(Any, self._conn).autocommit = True
            try:
                row = self._conn.execute(self._sql, (1,)).fetchone()
                return int(row[0]) if row else 0
            except database.errors:
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(Exception):
                conn.close()
