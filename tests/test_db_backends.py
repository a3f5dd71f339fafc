"""The PostgreSQL test databases: one a test used comes back to the next test as the migrated
template left it (rows the test wrote gone, the migrations' rows back, sequences restarted,
the test's connections ended, under a new name), and one whose schema the test changed is
dropped, never handed on."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests import db_backends

pytestmark = pytest.mark.skipif(not db_backends.on_postgresql(),
                                reason="PostgreSQL's database reuse")


def snapshot(url: str) -> dict[str, Any]:
    """Every table's rows and every sequence's next value."""
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [t for (t,) in conn.execute(db_backends._TABLES).fetchall()]
        rows = {t: sorted(map(repr, conn.execute(f"SELECT * FROM {t}").fetchall()))
                for t in tables}
        sequences = {s: conn.execute("SELECT last_value FROM pg_sequences "
                                     "WHERE sequencename = %s", (s,)).fetchone()
                     for (s,) in conn.execute("SELECT sequencename FROM pg_sequences")}
    return {"rows": rows, "sequences": sequences}


def oid_of(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return int(conn.execute("SELECT oid FROM pg_database WHERE datname = "
                                "current_database()").fetchone()[0])


def test_a_used_database_comes_back_as_the_template_left_it() -> None:
    with db_backends.fresh_postgres(migrated=True) as first:
        pristine, oid = snapshot(first), oid_of(first)
        with psycopg.connect(first, autocommit=True) as conn:
            conn.execute("UPDATE servers_version SET version = version + 7")
            (sequence,) = conn.execute("SELECT schemaname || '.' || sequencename "
                                       "FROM pg_sequences").fetchone()
            conn.execute(f"SELECT nextval('{sequence}') FROM generate_series(1, 5)")
        written = snapshot(first)
        assert written != pristine
        lingering = psycopg.connect(first, autocommit=True)  # a connection the test left open
    try:
        with pytest.raises(psycopg.OperationalError):
            lingering.execute("SELECT 1")  # ended before the database was emptied
    finally:
        lingering.close()
    with db_backends.fresh_postgres(migrated=True) as second:
        assert oid_of(second) == oid  # the same database ...
        assert second != first  # ... under a new name
        assert snapshot(second) == pristine
        with psycopg.connect(second, autocommit=True) as conn:  # and a working one
            conn.execute("UPDATE servers_version SET version = version + 1")
    with psycopg.connect(db_backends.ADMIN_URL, autocommit=True) as admin:
        gone = admin.execute("SELECT count(*) FROM pg_database WHERE datname = %s",
                             (first.rsplit("/", 1)[1],)).fetchone()[0]
    assert gone == 0


@pytest.mark.parametrize("change", [
    "CREATE TABLE extra (id INTEGER)",
    "DROP INDEX audit_ts",
    "ALTER TABLE servers_version ADD COLUMN note TEXT",
    "DELETE FROM schema_migrations WHERE version = (SELECT max(version) FROM schema_migrations)",
])
def test_a_database_whose_schema_changed_is_dropped(change: str) -> None:
    with db_backends.fresh_postgres(migrated=True) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(change)
        before = set(db_backends._reusable)
    assert set(db_backends._reusable) == before  # nothing handed on
    with psycopg.connect(db_backends.ADMIN_URL, autocommit=True) as admin:
        left = admin.execute("SELECT count(*) FROM pg_database WHERE datname = %s",
                             (url.rsplit("/", 1)[1],)).fetchone()[0]
    assert left == 0
