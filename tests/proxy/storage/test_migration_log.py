"""What the migrations say at start-up: a fresh database's creation in one info line (each
migration at debug), an upgrade of an existing database each migration it applied at info."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from proxy.audit import rollup  # noqa: F401 - registers the rollup tables' migrations
from proxy.storage import migrations
from proxy.storage.db import Database


def _said(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "tollhouse.migrations" and r.levelno == level]


def test_a_fresh_database_is_created_in_one_info_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="tollhouse.migrations")
    with Database.sqlite(str(tmp_path / "g.db")) as database:
        applied = migrations.upgrade(database)
    assert applied and max(applied) == migrations.LATEST
    assert _said(caplog, logging.INFO) == [
        f"database schema created at version {migrations.LATEST}"]
    names = {m.version: m.name for m in migrations.MIGRATIONS}
    assert _said(caplog, logging.DEBUG) == [
        f"database schema: applied migration {v} ({names[v]})" for v in applied]


def test_an_upgrade_names_each_migration_it_applied(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with Database.sqlite(str(tmp_path / "g.db")) as database:
        migrations.upgrade(database, migrations.MIGRATIONS[:3])
        caplog.clear()
        caplog.set_level(logging.INFO, logger="tollhouse.migrations")
        applied = migrations.upgrade(database)
        assert migrations.upgrade(database) == []
    names = {m.version: m.name for m in migrations.MIGRATIONS}
    assert applied == [m.version for m in migrations.MIGRATIONS[3:]]
    assert _said(caplog, logging.INFO) == [
        f"database schema: applied migration {v} ({names[v]})" for v in applied]
