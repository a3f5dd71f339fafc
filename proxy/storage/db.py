"""The database: one SQLite file (WAL) or a PostgreSQL database, behind a tiny dialect layer.

`database.url` is `sqlite:///PATH` (`sqlite:///` alone: in memory) or `postgresql://...`.
Owners write their SQL once, with `?` placeholders and the clauses both engines share
(`ON CONFLICT ... DO UPDATE`/`DO NOTHING`), and let `Database.sql` spell it for the backend.
The schema belongs to `proxy.storage.migrations`; a `Database` brings it up to date the first time it
hands out a connection.

Connections are DB-API ones (sqlite3 or psycopg 3) with autocommit off. `transaction()` lends
one from a small pool, commits when the block ends (rolls back if it raises) and takes it back;
a connection the server dropped is discarded, not reused. Reads go through `transaction()` too:
on PostgreSQL every statement opens a transaction, and a connection must not sit idle in one.
`connect()` gives a connection of the caller's own (the audit writer keeps one). An in-memory
SQLite database (`sqlite:///`) is one connection that every user of the Database shares.

Whoever takes a Database, a URL or a bare SQLite path (`Target`) resolves it with `resolve`;
a Database made that way from a string belongs to the taker, who closes it.
"""

from __future__ import annotations

import os
import select
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Self, cast

from proxy.storage import migrations
from proxy.storage.sql import Connection, Cursor, Dialect, ddl, sql

# the dialect layer (proxy.storage.sql) is reached through here too: db.sql, db.Dialect, ...
__all__ = ["PRIVATE", "SIDE_FILES", "Connection", "Cursor", "Database", "Dialect", "Target", "broken", "ddl", "is_unavailable", "private_file", "resolve", "sql", "unavailable", "using"]

_IDLE_PING_S = 30.0  # a pooled PostgreSQL connection idle this long is checked before use


def broken(conn: Connection) -> bool:
    """True for a psycopg connection that is closed or lost; sqlite3 ones never are."""
    return bool(getattr(conn, "closed", False))


def _spoke_while_idle(conn: Connection) -> bool:
    """A PostgreSQL connection whose socket turned readable while it sat idle in the pool: the
    server said goodbye (a restart, pg_terminate_backend, an idle timeout); nothing else talks
    to a connection that is not listening."""
    try:
        readable, _, _ = select.select([cast(Any, conn).fileno()], [], [], 0)
    except (OSError, ValueError, AttributeError):
        return True
    return bool(readable)


def _wal(conn: sqlite3.Connection, timeout_s: float = 10.0) -> None:
    """Put the file in WAL mode (it stays so). Switching takes an exclusive lock without
    waiting on the busy timeout: connections opening a new file together retry here."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
            if mode not in ("wal", "memory"):
                conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


PRIVATE = 0o600
SIDE_FILES = ("-wal", "-shm", "-journal")


def private_file(path: str) -> None:
    """Make the SQLite file at `path` readable by this account alone before SQLite opens it:
    it holds password hashes, API-key rows, the audit log and the sealed vault. SQLite gives
    the `-wal`, `-shm` and `-journal` files it makes the database file's own mode, so they
    follow; a file (or side file) an earlier version left readable by others loses those bits,
    whatever the umask."""
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT, PRIVATE))
    for name in (path, *(path + side for side in SIDE_FILES)):
        with suppress(FileNotFoundError):
            st = os.stat(name)
            if st.st_mode & 0o077 and st.st_uid == os.geteuid():  # another's file: theirs
                os.chmod(name, st.st_mode & 0o700)


def _quietly_close(conn: Connection) -> None:
    with suppress(Exception):
        conn.close()


class Database:
    """One database named by a URL: its dialect, its SQL spelling, and pooled connections."""

    def __init__(self, url: str, *, max_idle: int = 4, busy_timeout_s: float = 10.0) -> None:
        self.url = url
        # a lock another writer holds is waited for this long, then the statement fails with
        # an `unavailable` error (SQLite's busy timeout; PostgreSQL's lock_timeout)
        self.busy_timeout_s = busy_timeout_s
        self.dialect: Dialect
        if url.startswith("sqlite:///"):
            self.dialect = "sqlite"
            self.path = url.removeprefix("sqlite:///") or ":memory:"
        elif url.startswith(("postgresql://", "postgres://")):
            self.dialect = "postgresql"
            self.path = ""
        else:
            raise ValueError("a database URL is sqlite:///PATH or postgresql://...")
        self._max_idle = max_idle
        self._idle: list[tuple[Connection, float]] = []
        self._pool_lock = threading.Lock()
        self._ready = False
        self._ready_lock = threading.Lock()
        # an in-memory SQLite database exists only inside its connection: everyone shares one
        self._shared: Connection | None = None
        self._shared_lock = threading.RLock()
        self._pooling = True
        self._private = False  # the SQLite file made or made private (`private_file`)

    @classmethod
    def sqlite(cls, path: str) -> Database:
        return cls(f"sqlite:///{path}")

    @property
    def postgresql(self) -> bool:
        return self.dialect == "postgresql"

    @property
    def memory(self) -> bool:
        return self.dialect == "sqlite" and self.path == ":memory:"

    def __repr__(self) -> str:
        if self.postgresql:
            from psycopg.conninfo import conninfo_to_dict

            try:
                parts = conninfo_to_dict(self.url)
            except Exception:  # noqa: BLE001 - never echo a URL that may hold a password
                return "Database(postgresql://...)"
            return (f"Database(postgresql://{parts.get('user') or ''}@{parts.get('host') or ''}"
                    f":{parts.get('port') or 5432}/{parts.get('dbname') or ''})")
        return f"Database({self.url})"

    # -- spelling ------------------------------------------------------------------------------

    def sql(self, text: str) -> str:
        """A statement written with `?` placeholders, in this backend's paramstyle. Execute
        the result with a parameter tuple, even an empty one."""
        return sql(text, self.dialect)

    def ddl(self, text: str) -> str:
        """Portable DDL (see `ddl`), spelt for this backend."""
        return ddl(text, self.dialect)

    @property
    def id_column(self) -> str:
        return ddl("{id}", self.dialect)

    def insert_ignore(self, table: str, columns: Sequence[str]) -> str:
        """INSERT of one row that does nothing if it collides with a unique key."""
        return self.sql(f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
                        f"({', '.join('?' for _ in columns)}) ON CONFLICT DO NOTHING")

    def upsert(self, table: str, columns: Sequence[str], key: Sequence[str]) -> str:
        """INSERT of one row that, on a collision with `key`, updates the other columns."""
        updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
        return self.sql(f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
                        f"({', '.join('?' for _ in columns)}) ON CONFLICT ({', '.join(key)}) "
                        f"DO UPDATE SET {updates}")

    @property
    def errors(self) -> tuple[type[Exception], ...]:
        """Catch these for any failure of this backend (DB-API `Error`)."""
        if self.postgresql:
            import psycopg

            return (psycopg.Error,)
        return (sqlite3.Error,)

    @property
    def integrity_errors(self) -> tuple[type[Exception], ...]:
        """A unique, foreign-key or not-null constraint refused the write."""
        if self.postgresql:
            import psycopg

            return (psycopg.IntegrityError,)
        return (sqlite3.IntegrityError,)

    @property
    def unavailable(self) -> tuple[type[Exception], ...]:
        """Locked, unreachable or lost (DB-API `OperationalError`): worth a retry shortly."""
        return unavailable(self.dialect)

    @property
    def missing_table(self) -> tuple[type[Exception], ...]:
        """A read of a table that does not exist (yet)."""
        if self.postgresql:
            from psycopg import errors

            return (errors.UndefinedTable,)
        return (sqlite3.OperationalError,)

    # -- connections ---------------------------------------------------------------------------

    def open(self) -> Connection:
        """A new connection, autocommit off, the schema as it is; the caller closes it."""
        if self.postgresql:
            import psycopg
            from psycopg.conninfo import conninfo_to_dict

            given = conninfo_to_dict(self.url)
            extra: dict[str, Any] = {}
            if "connect_timeout" not in given:
                extra["connect_timeout"] = 10
            if "application_name" not in given:
                extra["application_name"] = "tollhouse"
            if "options" not in given:
                extra["options"] = f"-c lock_timeout={int(self.busy_timeout_s * 1000)}"
            return cast(Connection, psycopg.connect(self.url, autocommit=False, **extra))
        if self.path != ":memory:" and not self._private:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            private_file(self.path)
            self._private = True
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, check_same_thread=False)
        _wal(conn)
        return conn

    def connect(self) -> Connection:
        """A new connection of the caller's own (it closes it), the schema up to date. For an
        in-memory database: a private one, as sqlite3 makes it."""
        if self.memory:
            conn = self.open()
            migrations.apply(conn, self.dialect)
            return conn
        self.ensure_schema()
        return self.open()

    def ensure_schema(self) -> None:
        """Apply pending migrations once per Database object (cheap when there are none)."""
        if self._ready:
            return
        with self._ready_lock:
            if not self._ready:
                migrations.upgrade(self)
                self._ready = True

    @contextmanager
    def lease(self) -> Iterator[Connection]:
        """A pooled connection, schema as it is, no transaction handling: for migrations. The
        borrower ends whatever transaction it began."""
        if self.memory:
            with self._shared_lock:
                if self._shared is None:
                    shared = self.open()
                    migrations.apply(shared, self.dialect)
                    self._shared = shared
                yield self._shared
            return
        conn = self._borrow()
        try:
            yield conn
        except BaseException:
            self._discard_or_keep(conn, failed=True)
            raise
        self._discard_or_keep(conn, failed=False)

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A pooled connection inside one transaction: committed when the block ends, rolled
        back if it raises. Fetch results inside the block."""
        self.ensure_schema()
        with self.lease() as conn:
            try:
                yield conn
            except BaseException:
                with suppress(Exception):
                    conn.rollback()
                raise
            conn.commit()

    def _borrow(self) -> Connection:
        while True:
            with self._pool_lock:
                if not self._idle:
                    break
                conn, since = self._idle.pop()
            if broken(conn) or (self.postgresql and _spoke_while_idle(conn)):
                _quietly_close(conn)
                continue
            if self.postgresql and time.monotonic() - since > _IDLE_PING_S:
                try:  # the server may have restarted or dropped an idle session since
                    conn.execute("SELECT 1").fetchall()
                    conn.rollback()
                except Exception:  # noqa: BLE001 - any failure: a fresh connection instead
                    _quietly_close(conn)
                    continue
            return conn
        return self.open()

    def _discard_or_keep(self, conn: Connection, failed: bool) -> None:
        if failed:
            with suppress(Exception):
                conn.rollback()
        if not broken(conn) and not self._in_transaction(conn):
            with self._pool_lock:
                if self._pooling and len(self._idle) < self._max_idle:
                    self._idle.append((conn, time.monotonic()))
                    return
        _quietly_close(conn)

    def _in_transaction(self, conn: Connection) -> bool:
        if self.postgresql:
            from psycopg.pq import TransactionStatus

            status = getattr(getattr(conn, "info", None), "transaction_status", None)
            return status != TransactionStatus.IDLE
        return bool(getattr(conn, "in_transaction", False))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the pooled connections, and those lent out when they come back. A closed
        Database still works, a new connection per use (an in-memory one starts empty)."""
        with self._pool_lock:
            self._pooling = False
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            _quietly_close(conn)
        with self._shared_lock:
            if self._shared is not None:
                _quietly_close(self._shared)
                self._shared = None


Target = Database | str


def unavailable(dialect: Dialect) -> tuple[type[Exception], ...]:
    """`Database.unavailable` of a `dialect`'s database."""
    if dialect == "postgresql":
        import psycopg

        return (psycopg.OperationalError,)
    return (sqlite3.OperationalError,)


def is_unavailable(exc: BaseException) -> bool:
    """Whether `exc` is either database's `unavailable` error (for code that holds no
    Database). A psycopg error exists only once psycopg is loaded: a SQLite gateway never
    loads it for this."""
    return isinstance(exc, unavailable("sqlite")) or (
        "psycopg" in sys.modules and isinstance(exc, unavailable("postgresql")))


def resolve(target: Target) -> Database:
    """A Database for a Database, a database URL, or (older callers) a bare SQLite path."""
    if isinstance(target, Database):
        return target
    if target.startswith(("sqlite:///", "postgresql://", "postgres://")):
        return Database(target)
    return Database.sqlite(target)


@contextmanager
def using(target: Target) -> Iterator[Database]:
    """`resolve`, closing the Database afterwards if it was made here."""
    database = resolve(target)
    try:
        yield database
    finally:
        if database is not target:
            database.close()
