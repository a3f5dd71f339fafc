"""The databases store tests run on, and a fresh one for each test.

`TOLLHOUSE_TEST_DATABASE` names the backends, comma-separated: `sqlite` (the default),
`postgresql`, or `all`. A test that takes the `database_url` (or `database`) fixture runs once
per backend; a backend not named is skipped. PostgreSQL tests each get a new database,
`CREATE DATABASE tollhouse_test_<random>`, dropped afterwards, on the server that
`TOLLHOUSE_TEST_POSTGRES_URL` reaches (default `postgresql://postgres@127.0.0.1:5432/postgres`;
any database the role may connect to, with the right to create databases).

Use it from a test module by binding the fixtures there:
`from tests import db_backends; database = db_backends.database`.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from proxy.db import Database

BACKENDS = ("sqlite", "postgresql")
ADMIN_URL = os.environ.get("TOLLHOUSE_TEST_POSTGRES_URL",
                           "postgresql://postgres@127.0.0.1:5432/postgres")


def selected() -> set[str]:
    raw = os.environ.get("TOLLHOUSE_TEST_DATABASE", "sqlite").strip().lower()
    names = {n.strip() for n in raw.split(",") if n.strip()}
    if "all" in names:
        return set(BACKENDS)
    unknown = names - set(BACKENDS)
    if unknown:
        raise pytest.UsageError(f"TOLLHOUSE_TEST_DATABASE: unknown backend(s) "
                                f"{', '.join(sorted(unknown))}; use sqlite, postgresql or all")
    return names


def params() -> list[object]:
    """pytest params, one per backend, the unselected ones skipped."""
    chosen = selected()
    return [pytest.param(name, id=name, marks=() if name in chosen else pytest.mark.skip(
        reason=f"set TOLLHOUSE_TEST_DATABASE={name} (or all) to run on {name}"))
        for name in BACKENDS]


def _url_of(name: str) -> str:
    return urlsplit(ADMIN_URL)._replace(path=f"/{name}").geturl()


@contextmanager
def fresh_postgres() -> Iterator[str]:
    """The URL of a new, empty PostgreSQL database, dropped (connections and all) at exit."""
    import psycopg

    name = f"tollhouse_test_{secrets.token_hex(6)}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _url_of(name)
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def fresh_url(backend: str, directory: Path) -> Iterator[str]:
    if backend == "postgresql":
        with fresh_postgres() as url:
            yield url
    else:
        yield f"sqlite:///{directory / 'tollhouse.db'}"


@pytest.fixture(params=params())
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database of each selected backend (never migrated yet)."""
    with fresh_url(request.param, tmp_path) as url:
        yield url


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    """A Database on `database_url`, closed after the test."""
    db = Database(database_url)
    try:
        yield db
    finally:
        db.close()
