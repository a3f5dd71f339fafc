"""The database the test suite runs on, and a fresh one for each test.

`TOLLHOUSE_TEST_DATABASE` names the backend of a run: `sqlite` (the default) or `postgresql`.
`make test` runs the whole suite once on each. Every test that needs a database asks for one
with `db_backends.url()` (or the `database_url` / `database` fixtures, or through
`tests.conftest.make_config`, which fills in `[database]`): it is made on first use and dropped
when the test ends. On PostgreSQL it is a copy of a template migrated once per run (the
`database_url` fixture, and `url(migrated=False)`, give an empty one, never migrated). A test
may ask for several by label (two gateways, say). SQLite databases are files in a new temporary directory; PostgreSQL ones are
`CREATE DATABASE tollhouse_test_<random>` on the server that `TOLLHOUSE_TEST_POSTGRES_URL`
reaches (default `postgresql://postgres@127.0.0.1:5432/postgres`; the role needs the right to
create databases), dropped with their connections afterwards.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from proxy.storage.db import Database

BACKENDS = ("sqlite", "postgresql")
ADMIN_URL = os.environ.get("TOLLHOUSE_TEST_POSTGRES_URL",
                           "postgresql://postgres@127.0.0.1:5432/postgres")


def backend() -> str:
    """The backend of this run."""
    name = os.environ.get("TOLLHOUSE_TEST_DATABASE", "sqlite").strip().lower() or "sqlite"
    if name not in BACKENDS:
        raise pytest.UsageError(f"TOLLHOUSE_TEST_DATABASE={name!r}: use sqlite or postgresql "
                                "(make test runs the suite on each)")
    return name


def on_postgresql() -> bool:
    return backend() == "postgresql"


def _url_of(name: str) -> str:
    return urlsplit(ADMIN_URL)._replace(path=f"/{name}").geturl()


_admin: Any = None  # one autocommit connection to the server for the whole run
_template: str | None = None  # a database migrated once, copied for each test that wants one
_template_print: str | None = None  # its schema's fingerprint (`_FINGERPRINT`)
_template_rows: dict[str, str] = {}  # the rows migrations put in its tables, as JSON, by table
_reusable: list[str] = []  # migrated databases a test has used, emptied again (`_recycle`)
RECYCLE_DEADLINE_S = 5.0  # for a test's connections to go before its database is emptied

# Everything about a database's schema a test could change: tables and columns, indexes,
# constraints, triggers, functions, sequences, views, schemas, the migrations applied and the
# database's own settings. A database whose fingerprint is the template's is emptied and
# reused; any other is dropped.
_FINGERPRINT = """
SELECT md5(coalesce(string_agg(x, '|' ORDER BY x), '')) FROM (
  SELECT 'c:' || table_schema || '.' || table_name || '.' || column_name || ':' || data_type
         || ':' || coalesce(column_default, '') || ':' || is_nullable AS x
    FROM information_schema.columns
   WHERE table_schema NOT IN ('pg_catalog', 'information_schema')
  UNION ALL SELECT 'i:' || indexdef FROM pg_indexes
   WHERE schemaname NOT IN ('pg_catalog', 'information_schema')
  UNION ALL SELECT 'k:' || conrelid::regclass::text || ':' || pg_get_constraintdef(c.oid)
    FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
   WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
  UNION ALL SELECT 't:' || tgrelid::regclass::text || ':' || tgname FROM pg_trigger
   WHERE NOT tgisinternal
  UNION ALL SELECT 'f:' || n.nspname || '.' || p.proname FROM pg_proc p
    JOIN pg_namespace n ON n.oid = p.pronamespace
   WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
  UNION ALL SELECT 's:' || schemaname || '.' || sequencename FROM pg_sequences
  UNION ALL SELECT 'n:' || nspname FROM pg_namespace
   WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'
  UNION ALL SELECT 'm:' || version || ':' || name FROM schema_migrations
  UNION ALL SELECT 'd:' || array_to_string(setconfig, ',') FROM pg_db_role_setting
   WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
) AS f
"""
_TABLES = ("SELECT quote_ident(schemaname) || '.' || quote_ident(tablename) FROM pg_tables "
           "WHERE schemaname NOT IN ('pg_catalog', 'information_schema') "
           "AND tablename <> 'schema_migrations' ORDER BY 1")


def _admin_execute(statement: str, params: Any = None) -> Any:
    global _admin
    import psycopg

    if _admin is None or _admin.closed:
        if _admin is None:
            atexit.register(_close_admin)
        _admin = psycopg.connect(ADMIN_URL, autocommit=True)
    return _admin.execute(statement, params)


def _close_admin() -> None:
    """Closed at exit, after the databases are dropped: not left to the collector, which
    would warn that it was deleted while open."""
    if _admin is not None and not _admin.closed:
        _admin.close()


def _migrated_template() -> str:
    """A database at the latest schema, made on first use and dropped when the run ends:
    copying it (CREATE DATABASE ... TEMPLATE) is cheaper than migrating each test's. Its
    fingerprint and the rows the migrations left in it are kept for `_recycle`."""
    global _template, _template_print
    if _template is None:
        import psycopg

        name = f"tollhouse_template_{secrets.token_hex(6)}"
        _admin_execute(f'CREATE DATABASE "{name}"')
        with Database(_url_of(name)) as database:
            database.ensure_schema()
        with psycopg.connect(_url_of(name), autocommit=True) as conn:
            _template_print = conn.execute(_FINGERPRINT).fetchone()[0]
            for (table,) in conn.execute(_TABLES).fetchall():
                rows = conn.execute(f"SELECT coalesce(json_agg(t), '[]') FROM {table} AS t"
                                    ).fetchone()[0]
                if rows:
                    _template_rows[table] = json.dumps(rows)
        _template = name
        atexit.register(_drop_all)
    return _template


def _drop_all() -> None:
    for name in [*_reusable, _template]:
        if name is not None:
            _admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    _reusable.clear()
    _close_admin()


def _recycle(name: str) -> bool:
    """Make a migrated database a test used as the template left it, under a new name, for
    the next test (a template copy and a drop cost ~0.4 s and up to 1 s each here, this a few
    milliseconds): its connections ended, renamed (a process of the test that outlived it
    and reconnects finds no database), its schema's fingerprint checked against the
    template's, every table emptied and the migrations' rows put back, its sequences
    restarted. False when it cannot be (a connection that would not go, a schema the test
    changed): the caller drops it."""
    import psycopg

    deadline = time.monotonic() + RECYCLE_DEADLINE_S
    while _admin_execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                         "WHERE datname = %s AND pid <> pg_backend_pid()",
                         (name,)).fetchone()[0]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    fresh = f"tollhouse_test_{secrets.token_hex(6)}"
    try:
        _admin_execute(f'ALTER DATABASE "{name}" RENAME TO "{fresh}"')
    except psycopg.Error:  # a connection came back between the two statements
        return False
    try:
        with psycopg.connect(_url_of(fresh)) as conn:
            if conn.execute(_FINGERPRINT).fetchone()[0] != _template_print:
                conn.rollback()
                raise LookupError("the test changed the schema")
            for (table,) in conn.execute(_TABLES).fetchall():
                conn.execute(f"DELETE FROM {table}")
                if table in _template_rows:
                    conn.execute(f"INSERT INTO {table} SELECT * FROM json_populate_recordset("
                                 f"NULL::{table}, %s)", (_template_rows[table],))
            for (sequence,) in conn.execute(
                    "SELECT quote_ident(schemaname) || '.' || quote_ident(sequencename) "
                    "FROM pg_sequences").fetchall():
                conn.execute(f"ALTER SEQUENCE {sequence} RESTART")
            conn.commit()
    except (psycopg.Error, LookupError):
        _admin_execute(f'DROP DATABASE IF EXISTS "{fresh}" WITH (FORCE)')
        return True  # (dropped here already)
    _reusable.append(fresh)
    return True


@contextmanager
def fresh_postgres(migrated: bool = False) -> Iterator[str]:
    """The URL of a new PostgreSQL database, empty or (`migrated`) at the latest schema,
    dropped (connections and all) at exit, or, migrated and with the template's schema still,
    emptied and kept for the next test that wants one (`_recycle`)."""
    if migrated:
        _migrated_template()
        if _reusable:
            name = _reusable.pop()
        else:
            name = f"tollhouse_test_{secrets.token_hex(6)}"
            _admin_execute(f'CREATE DATABASE "{name}" TEMPLATE "{_template}"')
    else:
        name = f"tollhouse_test_{secrets.token_hex(6)}"
        _admin_execute(f'CREATE DATABASE "{name}"')
    try:
        yield _url_of(name)
    finally:
        if not (migrated and _recycle(name)):
            _admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def fresh_sqlite() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="tollhouse-test-")
    try:
        yield f"sqlite:///{directory}/tollhouse.db"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class TestDatabases:
    """The databases one test made, by label, all dropped when it ends."""

    def __init__(self) -> None:
        self._urls: dict[str, str] = {}
        self._stack = ExitStack()

    def url(self, label: str, migrated: bool = True) -> str:
        if label not in self._urls:
            fresh = fresh_postgres(migrated) if on_postgresql() else fresh_sqlite()
            self._urls[label] = self._stack.enter_context(fresh)
        return self._urls[label]

    def open(self, label: str) -> Database:
        database = Database(self.url(label))
        self._stack.callback(database.close)  # closed before the database is dropped
        return database

    def close(self) -> None:
        self._stack.close()


_current: TestDatabases | None = None


def url(label: str = "main", *, migrated: bool = True) -> str:
    """The running test's database called `label`, of this run's backend, made on first use:
    on PostgreSQL already at the latest schema unless `migrated=False` (on SQLite the first
    opening migrates it, as in production)."""
    if _current is None:
        raise RuntimeError("db_backends.url() outside a test (the per-test fixture is not set up)")
    return _current.url(label, migrated)


def open_database(label: str = "main") -> Database:
    """A Database on the running test's database `label`, closed when the test ends."""
    if _current is None:
        raise RuntimeError("db_backends.open_database() outside a test")
    return _current.open(label)


@pytest.fixture(autouse=True)
def _per_test_databases() -> Iterator[None]:
    """Installed by tests/conftest.py for every test; makes nothing until url() is called."""
    global _current
    _current = TestDatabases()
    # the default database.url, and the audit fallback file of a database that is not a
    # SQLite file, both relative to the working directory
    strays = [Path("tollhouse.db"), Path("tollhouse.audit-fallback.jsonl")]
    there = [p.exists() for p in strays]
    try:
        yield
    finally:
        mine, _current = _current, None
        mine.close()
    made = [p for p, was in zip(strays, there, strict=True) if not was and p.exists()]
    if made:
        for leftover in made:
            leftover.unlink()
        pytest.fail(f"the test wrote {', '.join(map(str, made))} in the working directory: "
                    "give its config db_backends.url() (make_config does) and its audit sink "
                    "a fallback_path")


@pytest.fixture
def database_url() -> str:
    """A fresh, empty database of this run's backend (never migrated yet)."""
    return url(migrated=False)


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    """A Database on `database_url`, closed after the test."""
    db = Database(database_url)
    try:
        yield db
    finally:
        db.close()


@contextmanager
def tables_held(url: str, *tables: str) -> Iterator[None]:
    """Another writer holding `tables` for the block: on PostgreSQL an ACCESS EXCLUSIVE lock
    (reads wait too), on SQLite the database's exclusive lock (WAL: writers wait, readers
    do not). Released by a rollback at the end."""
    holder = Database(url)
    try:
        with holder.lease() as conn:
            if holder.postgresql:
                conn.execute(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE")
            else:
                conn.execute("BEGIN EXCLUSIVE")
            try:
                yield
            finally:
                conn.rollback()
    finally:
        holder.close()


def rows(target: str | Database, text: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows of a query (written with `?` placeholders) on either backend."""
    database = target if isinstance(target, Database) else Database(target)
    try:
        with database.transaction() as conn:
            return [tuple(r) for r in conn.execute(database.sql(text), args).fetchall()]
    finally:
        if database is not target:
            database.close()
