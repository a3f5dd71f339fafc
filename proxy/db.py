"""The embedded database: one SQLite file (WAL) that every persisted table lives in."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def connect(path: str, schema: str = "") -> sqlite3.Connection:
    """A connection usable from any one thread at a time, its tables created if missing."""
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=10, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    if schema:
        conn.executescript(schema)
    return conn
