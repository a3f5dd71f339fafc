"""API keys for machines: `th_<id>_<secret>`, shown once, stored as SHA-256 of the secret.

The key id and prefix are public (listed, audited); the secret is 256 random bits, so a fast
hash is enough and it is compared in constant time. The gateway keeps the table in memory and
reloads it when it changed: a revoked key fails on its very next request. On SQLite the sign is
`PRAGMA data_version` (another connection, such as the `tollhouse keys` CLI, committed): read
from shared memory, no query of the table. On PostgreSQL it is the `api_keys_version` counter,
which a trigger bumps with every change to `api_keys`: each lookup needs a read of it that began
after the lookup did, and lookups arriving together share one such read.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.mirror import Mirrors
from proxy.storage import db
from proxy.storage.own import CounterReader

PREFIX = "th_"
_FORMAT = re.compile(r"^th_([a-z0-9]{10})_([A-Za-z0-9_-]{43})$")

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


def _row(row: tuple[Any, ...]) -> ApiKey:
    return ApiKey(row[0], row[1], row[2], frozenset(orjson.loads(row[3])), row[4], row[5],
                  row[6], row[7])


_COLUMNS = "id, name, secret_sha256, endpoints, role, created_at, expires_at, revoked_at"
_COUNTER = "SELECT version FROM api_keys_version WHERE id = ?"


# -- the CLI and management API side: create, list, get, update, revoke ------------------------

def create(target: db.Target, name: str, endpoints: list[str], role: str = "",
           expires_in_days: float | None = None) -> tuple[ApiKey, str]:
    """Store a new key; return it and its full secret token, which is never stored."""
    key_id = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(10))
    secret = secrets.token_urlsafe(32)
    now = time.time()
    expires = now + expires_in_days * 86400 if expires_in_days is not None else None
    key = ApiKey(key_id, name, _digest(secret), frozenset(endpoints), role, now, expires, None)
    with db.using(target) as database, database.transaction() as conn:
        conn.execute(database.sql(f"INSERT INTO api_keys ({_COLUMNS}) "
                                  "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"),
                     (key.id, key.name, key.secret_sha256,
                      orjson.dumps(sorted(endpoints)).decode(), role, now, expires, None))
    return key, f"{PREFIX}{key_id}_{secret}"


def list_keys(target: db.Target, *, name_prefix: str | None = None, limit: int | None = None,
              offset: int = 0) -> list[ApiKey]:
    """Oldest first; of the keys whose name starts with `name_prefix` if given, `limit` of
    them from `offset` if given (a page)."""
    where, args = "", []
    if name_prefix is not None:
        # not LIKE: a prefix may hold % or _; the name's first characters are compared
        where, args = "WHERE substr(name, 1, ?) = ?", [len(name_prefix), name_prefix]
    page = ""
    if limit is not None:
        page, args = " LIMIT ? OFFSET ?", [*args, limit, offset]
    with db.using(target) as database, database.transaction() as conn:
        rows = conn.execute(database.sql(f"SELECT {_COLUMNS} FROM api_keys {where} "
                                         f"ORDER BY created_at, id{page}"), args).fetchall()
    return [_row(r) for r in rows]


def get(target: db.Target, key_id: str) -> ApiKey | None:
    with db.using(target) as database, database.transaction() as conn:
        row = conn.execute(database.sql(f"SELECT {_COLUMNS} FROM api_keys WHERE id = ?"),
                           (key_id,)).fetchone()
    return _row(row) if row else None


class KeyNotFound(Exception):
    pass


class KeyRevoked(Exception):
    """A revoked key is final: it cannot be changed (nor brought back)."""


_KEEP: Any = object()  # update(): leave this field as it is


def update(target: db.Target, key_id: str, *, name: str = _KEEP,
           endpoints: list[str] = _KEEP, role: str = _KEEP,
           expires_at: float | None = _KEEP) -> ApiKey:
    """Change what is given of a key's name, endpoints, role and expiry (`expires_at`: a Unix
    time, or None for never); the secret stays. KeyNotFound, or KeyRevoked for a revoked key
    (also one revoked while this ran). Like every write to api_keys it moves the change counter
    (and SQLite's data_version), so the gateway's KeyIndex sees it on its next lookup."""
    with db.using(target) as database, database.transaction() as conn:
        row = conn.execute(database.sql(f"SELECT {_COLUMNS} FROM api_keys WHERE id = ?"),
                           (key_id,)).fetchone()
        if row is None:
            raise KeyNotFound(key_id)
        key = _row(row)
        if key.revoked_at is not None:
            raise KeyRevoked(key_id)
        changed = ApiKey(
            key.id, key.name if name is _KEEP else name, key.secret_sha256,
            key.endpoints if endpoints is _KEEP else frozenset(endpoints),
            key.role if role is _KEEP else role, key.created_at,
            key.expires_at if expires_at is _KEEP else expires_at, None)
        cur = conn.execute(database.sql("UPDATE api_keys SET name = ?, endpoints = ?, role = ?, "
                                        "expires_at = ? WHERE id = ? AND revoked_at IS NULL"),
                           (changed.name, orjson.dumps(sorted(changed.endpoints)).decode(),
                            changed.role, changed.expires_at, key_id))
        if cur.rowcount != 1:
            raise KeyRevoked(key_id)
    return changed


def revoke(target: db.Target, key_id: str) -> bool:
    with db.using(target) as database, database.transaction() as conn:
        cur = conn.execute(database.sql("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND "
                                        "revoked_at IS NULL"), (time.time(), key_id))
        return cur.rowcount == 1


# -- the gateway side --------------------------------------------------------------------------

class KeyIndex:
    """Every key, in memory: a mirror (proxy.mirror) of the table, looked at before each
    lookup, never polled. Without `mirrors` it has its own, which `close` closes."""

    def __init__(self, target: db.Target, mirrors: Mirrors | None = None) -> None:
        self._db = db.resolve(target)
        self._owns_db = self._db is not target
        self._db.ensure_schema()
        self._own = mirrors is None
        self._mirrors = Mirrors() if mirrors is None else mirrors
        # SQLite file: PRAGMA data_version on a connection of our own that never writes
        self._watch: db.Connection | None = (
            self._db.connect() if self._db.dialect == "sqlite" and not self._db.memory
            else None)
        self._counter = CounterReader(self._db, _COUNTER)
        self._mirror = self._mirrors.mirror(
            "API keys", self._counter, self._read_all, self._apply, errors=self._db.errors,
            polled=False, instant=self._data_version if self._watch is not None else None)
        self._keys: dict[str, ApiKey] = {}
        self._apply(self._mirror.load_now())

    def _apply(self, keys: dict[str, ApiKey]) -> None:
        self._keys = keys

    def _data_version(self) -> int:
        # Reads the WAL index in shared memory: no disk I/O, microseconds.
        assert self._watch is not None
        return int(self._watch.execute("PRAGMA data_version").fetchone()[0])

    def _read_all(self) -> tuple[int, dict[str, ApiKey]]:
        """(the counter, every key): the counter is read first, so a write between it and the
        rows only causes one more reload. (On a SQLite file the mirror goes by data_version,
        read before this.)"""
        with self._db.transaction() as conn:
            row = conn.execute(self._db.sql(_COUNTER), (1,)).fetchone()
            rows = conn.execute(self._db.sql(f"SELECT {_COLUMNS} FROM api_keys"), ()).fetchall()
        return (int(row[0]) if row else 0), {r[0]: _row(r) for r in rows}

    async def lookup(self, token: str) -> ApiKey | None:
        """The active key this token proves, or None (unknown, wrong secret, revoked, expired)."""
        parts = split(token)
        if parts is None:
            return None
        await self._mirror.sync()  # a revoked key fails on its very next request
        key = self._keys.get(parts[0])
        if key is None:
            return None
        if not hmac.compare_digest(key.secret_sha256, _digest(parts[1])):
            return None
        if key.status(time.time()) != "active":
            return None
        return key

    def close(self) -> None:
        if self._own:
            self._mirrors.close()
        if self._watch is not None:
            self._watch.close()
        self._counter.close()
        if self._owns_db:
            self._db.close()
