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
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from proxy.db import Database

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


def _admin_execute(statement: str) -> None:
    global _admin
    import psycopg

    if _admin is None or _admin.closed:
        _admin = psycopg.connect(ADMIN_URL, autocommit=True)
    _admin.execute(statement)


def _migrated_template() -> str:
    """A database at the latest schema, made on first use and dropped when the run ends:
    copying it (CREATE DATABASE ... TEMPLATE) is cheaper than migrating each test's."""
    global _template
    if _template is None:
        name = f"tollhouse_template_{secrets.token_hex(6)}"
        _admin_execute(f'CREATE DATABASE "{name}"')
        with Database(_url_of(name)) as database:
            database.ensure_schema()
        _template = name
        atexit.register(_admin_execute, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return _template


@contextmanager
def fresh_postgres(migrated: bool = False) -> Iterator[str]:
    """The URL of a new PostgreSQL database, empty or (`migrated`) at the latest schema,
    dropped (connections and all) at exit."""
    name = f"tollhouse_test_{secrets.token_hex(6)}"
    template = f' TEMPLATE "{_migrated_template()}"' if migrated else ""
    _admin_execute(f'CREATE DATABASE "{name}"{template}')
    try:
        yield _url_of(name)
    finally:
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
