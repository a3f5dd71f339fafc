"""API keys for machines: `th_<id>_<secret>`, shown once, stored as SHA-256 of the secret.

The key id and prefix are public (listed, audited); the secret is 256 random bits, so a fast
hash is enough and it is compared in constant time. The gateway keeps the table in memory and
reloads it when SQLite's `data_version` says another connection (the `tollhouse keys` CLI)
changed it: a revoked key fails on its very next request, with no per-request query of the table.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

import orjson

from proxy import db

PREFIX = "th_"
_FORMAT = re.compile(r"^th_([a-z0-9]{10})_([A-Za-z0-9_-]{43})$")

SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    secret_sha256 TEXT NOT NULL,
    endpoints TEXT NOT NULL DEFAULT '[]',
    role TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    expires_at REAL,
    revoked_at REAL
);
"""


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: str
    name: str
    secret_sha256: str
    endpoints: frozenset[str]
    role: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None

    @property
    def prefix(self) -> str:
        return f"{PREFIX}{self.id}_"

    def status(self, now: float) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return "active"

    def public(self, now: float | None = None) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "prefix": self.prefix,
                "endpoints": sorted(self.endpoints), "role": self.role,
                "created_at": self.created_at, "expires_at": self.expires_at,
                "revoked_at": self.revoked_at, "status": self.status(now or time.time())}


def split(token: str) -> tuple[str, str] | None:
    """(key id, secret) for a token of API-key form, else None."""
    match = _FORMAT.match(token)
    return (match.group(1), match.group(2)) if match else None


def looks_like_key(token: str) -> bool:
    return token.startswith(PREFIX)


def key_id_of(token: str) -> str | None:
    parts = split(token)
    return parts[0] if parts else None


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def connect(path: str) -> sqlite3.Connection:
    return db.connect(path, SCHEMA)


def _row(row: tuple[Any, ...]) -> ApiKey:
    return ApiKey(row[0], row[1], row[2], frozenset(orjson.loads(row[3])), row[4], row[5],
                  row[6], row[7])


_COLUMNS = "id, name, secret_sha256, endpoints, role, created_at, expires_at, revoked_at"


# -- the CLI side: create, list, revoke -------------------------------------------------------

def create(path: str, name: str, endpoints: list[str], role: str = "",
           expires_in_days: float | None = None) -> tuple[ApiKey, str]:
    """Store a new key; return it and its full secret token, which is never stored."""
    key_id = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(10))
    secret = secrets.token_urlsafe(32)
    now = time.time()
    expires = now + expires_in_days * 86400 if expires_in_days is not None else None
    key = ApiKey(key_id, name, _digest(secret), frozenset(endpoints), role, now, expires, None)
    conn = connect(path)
    try:
        with conn:
            conn.execute(f"INSERT INTO api_keys ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (key.id, key.name, key.secret_sha256,
                          orjson.dumps(sorted(endpoints)).decode(), role, now, expires, None))
    finally:
        conn.close()
    return key, f"{PREFIX}{key_id}_{secret}"


def list_keys(path: str) -> list[ApiKey]:
    conn = connect(path)
    try:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM api_keys ORDER BY created_at").fetchall()
    finally:
        conn.close()
    return [_row(r) for r in rows]


def revoke(path: str, key_id: str) -> bool:
    conn = connect(path)
    try:
        with conn:
            cur = conn.execute("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND "
                               "revoked_at IS NULL", (time.time(), key_id))
    finally:
        conn.close()
    return cur.rowcount == 1


# -- the gateway side --------------------------------------------------------------------------

class KeyIndex:
    """Every key, in memory, reloaded in a worker thread when the table changed."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._conn = connect(path)
        self._version = self._data_version()
        self._keys = self._read_all()
        self._lock = asyncio.Lock()

    def _data_version(self) -> int:
        # Reads the WAL index in shared memory: no disk I/O, microseconds.
        return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def _read_all(self) -> dict[str, ApiKey]:
        conn = connect(self._path)
        try:
            rows = conn.execute(f"SELECT {_COLUMNS} FROM api_keys").fetchall()
        finally:
            conn.close()
        return {r[0]: _row(r) for r in rows}

    async def _refresh(self) -> None:
        if self._data_version() == self._version:
            return
        async with self._lock:
            # the version is read before the rows: a write in between only causes one more reload
            version = self._data_version()
            if version != self._version:
                self._keys = await asyncio.to_thread(self._read_all)
                self._version = version

    async def lookup(self, token: str) -> ApiKey | None:
        """The active key this token proves, or None (unknown, wrong secret, revoked, expired)."""
        parts = split(token)
        if parts is None:
            return None
        await self._refresh()
        key = self._keys.get(parts[0])
        if key is None:
            return None
        if not hmac.compare_digest(key.secret_sha256, _digest(parts[1])):
            return None
        if key.status(time.time()) != "active":
            return None
        return key

    def close(self) -> None:
        self._conn.close()
