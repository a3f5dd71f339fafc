"""People: local accounts and federated ones, and their browser sessions.

A user is one principal whichever way they arrive: a browser cookie, a token Tollhouse issued,
or an external JWT with the same (issuer, subject). Local accounts have issuer `tollhouse:local`
and subject `local:<name>`; federated ones keep their identity provider's issuer and `sub`.
Passwords are hashed with scrypt (memory-hard, in the standard library) and never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from cachetools import TTLCache

from proxy import db
from proxy.auth.principal import Principal

LOCAL_ISSUER = "tollhouse:local"
_SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32, "maxmem": 64 * 1024 * 1024}

SCHEMA = """
CREATE TABLE IF NOT EXISTS users (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    issuer TEXT NOT NULL,
    subject TEXT NOT NULL,
    password_hash TEXT,
    is_admin INTEGER NOT NULL DEFAULT 0,
    groups TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    UNIQUE (issuer, subject)
);
"""


@dataclass(frozen=True, slots=True)
class User:
    id: str
    name: str
    issuer: str
    subject: str
    is_admin: bool
    groups: frozenset[str]

    def principal(self) -> Principal:
        return Principal(subject=self.subject, issuer=self.issuer, display_name=self.name,
                         groups=self.groups, kind="jwt", role="admin" if self.is_admin else "")


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, **_SCRYPT)
    return f"scrypt${_SCRYPT['n']}${salt.hex()}${digest.hex()}"


def check_password(password: str, stored: str) -> bool:
    try:
        scheme, n, salt, digest = stored.split("$")
    except ValueError:
        return False
    if scheme != "scrypt":
        return False
    params = {**_SCRYPT, "n": int(n)}
    candidate = hashlib.scrypt(password.encode(), salt=bytes.fromhex(salt),
                               **params)
    return hmac.compare_digest(candidate.hex(), digest)


# a hash to check against when the user does not exist, so both cases cost the same
_DUMMY = hash_password(secrets.token_hex(8))


def connect(path: str) -> sqlite3.Connection:
    return db.connect(path, SCHEMA)


_COLUMNS = "id, name, issuer, subject, is_admin, groups"


def _user(row: tuple[object, ...]) -> User:
    groups = str(row[5] or "")
    return User(str(row[0]), str(row[1]), str(row[2]), str(row[3]), bool(row[4]),
                frozenset(g for g in groups.split("\n") if g))


class UserExists(Exception):
    pass


class Accounts:
    """The users table. Every call is blocking SQLite: the gateway runs them in a thread
    (`asyncio.to_thread`); the CLI calls them directly."""

    def __init__(self, path: str) -> None:
        self._path = path
        connect(path).close()

    def _conn(self) -> sqlite3.Connection:
        return connect(self._path)

    def create_local(self, name: str, password: str, admin: bool = False) -> User:
        user = User(secrets.token_hex(8), name, LOCAL_ISSUER, f"local:{name}", admin,
                    frozenset())
        conn = self._conn()
        try:
            with conn:
                conn.execute("INSERT INTO users (id, name, issuer, subject, password_hash, "
                             "is_admin, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (user.id, name, user.issuer, user.subject, hash_password(password),
                              int(admin), time.time()))
        except sqlite3.IntegrityError:
            raise UserExists(name) from None
        finally:
            conn.close()
        return user

    def verify_local(self, name: str, password: str) -> User | None:
        conn = self._conn()
        try:
            row = conn.execute(f"SELECT {_COLUMNS}, password_hash FROM users WHERE name = ? "
                               "AND issuer = ?", (name, LOCAL_ISSUER)).fetchone()
        finally:
            conn.close()
        if row is None or not row[6]:
            check_password(password, _DUMMY)
            return None
        return _user(row) if check_password(password, str(row[6])) else None

    def upsert_federated(self, issuer: str, subject: str, name: str, groups: frozenset[str],
                         admin: bool) -> User:
        """A federated user, created on first sign-in; groups and admin follow the provider."""
        conn = self._conn()
        try:
            with conn:
                row = conn.execute(f"SELECT {_COLUMNS} FROM users WHERE issuer = ? AND "
                                   "subject = ?", (issuer, subject)).fetchone()
                joined = "\n".join(sorted(groups))
                if row is None:
                    uid = secrets.token_hex(8)
                    display = name
                    if conn.execute("SELECT 1 FROM users WHERE name = ?", (name,)).fetchone():
                        display = f"{name}#{uid[:6]}"
                    conn.execute("INSERT INTO users (id, name, issuer, subject, is_admin, "
                                 "groups, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 (uid, display, issuer, subject, int(admin), joined,
                                  time.time()))
                    return User(uid, display, issuer, subject, admin, groups)
                conn.execute("UPDATE users SET is_admin = ?, groups = ? WHERE id = ?",
                             (int(admin), joined, row[0]))
                return User(str(row[0]), str(row[1]), issuer, subject, admin, groups)
        finally:
            conn.close()

    def get(self, user_id: str) -> User | None:
        conn = self._conn()
        try:
            row = conn.execute(f"SELECT {_COLUMNS} FROM users WHERE id = ?",
                               (user_id,)).fetchone()
        finally:
            conn.close()
        return _user(row) if row else None

    def list(self) -> list[User]:
        conn = self._conn()
        try:
            rows = conn.execute(f"SELECT {_COLUMNS} FROM users ORDER BY name").fetchall()
        finally:
            conn.close()
        return [_user(r) for r in rows]


class BrowserSessions(Protocol):
    async def create(self, user_id: str) -> str: ...

    async def user_id(self, session_id: str) -> str | None: ...

    async def delete(self, session_id: str) -> None: ...


class MemoryBrowserSessions:
    """Server-side browser sessions in the live-state store (memory here); the cookie holds
    only a random id."""

    def __init__(self, ttl_s: float = 8 * 3600, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self._sessions: TTLCache[str, str] = TTLCache(maxsize=100_000, ttl=ttl_s, timer=clock)

    async def create(self, user_id: str) -> str:
        session_id = secrets.token_urlsafe(32)
        self._sessions[session_id] = user_id
        return session_id

    async def user_id(self, session_id: str) -> str | None:
        return self._sessions.get(session_id)

    async def delete(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

