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
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from cachetools import TTLCache

from proxy import db
from proxy.auth.principal import Principal

LOCAL_ISSUER = "tollhouse:local"
_SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32, "maxmem": 64 * 1024 * 1024}

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


_COLUMNS = "id, name, issuer, subject, is_admin, groups"


def _user(row: tuple[object, ...]) -> User:
    groups = str(row[5] or "")
    return User(str(row[0]), str(row[1]), str(row[2]), str(row[3]), bool(row[4]),
                frozenset(g for g in groups.split("\n") if g))


class UserExists(Exception):
    pass


class Accounts:
    """The users table. Every call is blocking database work: the gateway runs them in a
    thread (`asyncio.to_thread`); the CLI calls them directly. `target` is the app's Database,
    a database URL, or a SQLite path."""

    def __init__(self, target: db.Target) -> None:
        self._db = db.resolve(target)
        self._owns_db = self._db is not target
        self._db.ensure_schema()

    def close(self) -> None:
        """Close the connections of a Database made here (the app closes its own)."""
        if self._owns_db:
            self._db.close()

    def create_local(self, name: str, password: str, admin: bool = False) -> User:
        user = User(secrets.token_hex(8), name, LOCAL_ISSUER, f"local:{name}", admin,
                    frozenset())
        hashed = hash_password(password)
        try:
            with self._db.transaction() as conn:
                conn.execute(self._db.sql("INSERT INTO users (id, name, issuer, subject, "
                                          "password_hash, is_admin, created_at) "
                                          "VALUES (?, ?, ?, ?, ?, ?, ?)"),
                             (user.id, name, user.issuer, user.subject, hashed, int(admin),
                              time.time()))
        except self._db.integrity_errors:
            raise UserExists(name) from None
        return user

    def verify_local(self, name: str, password: str) -> User | None:
        with self._db.transaction() as conn:
            row = conn.execute(self._db.sql(f"SELECT {_COLUMNS}, password_hash FROM users "
                                            "WHERE name = ? AND issuer = ?"),
                               (name, LOCAL_ISSUER)).fetchone()
        if row is None or not row[6]:
            check_password(password, _DUMMY)
            return None
        return _user(row) if check_password(password, str(row[6])) else None

    def upsert_federated(self, issuer: str, subject: str, name: str, groups: frozenset[str],
                         admin: bool) -> User:
        """A federated user, created on first sign-in; groups and admin follow the provider."""
        sql = self._db.sql
        joined = "\n".join(sorted(groups))
        with self._db.transaction() as conn:
            row = conn.execute(sql(f"SELECT {_COLUMNS} FROM users WHERE issuer = ? AND "
                                   "subject = ?"), (issuer, subject)).fetchone()
            if row is None:
                uid = secrets.token_hex(8)
                display = name
                if conn.execute(sql("SELECT 1 FROM users WHERE name = ?"), (name,)).fetchone():
                    display = f"{name}#{uid[:6]}"
                conn.execute(sql("INSERT INTO users (id, name, issuer, subject, is_admin, "
                                 "groups, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)"),
                             (uid, display, issuer, subject, int(admin), joined, time.time()))
                return User(uid, display, issuer, subject, admin, groups)
            conn.execute(sql("UPDATE users SET is_admin = ?, groups = ? WHERE id = ?"),
                         (int(admin), joined, row[0]))
            return User(str(row[0]), str(row[1]), issuer, subject, admin, groups)

    def get(self, user_id: str) -> User | None:
        with self._db.transaction() as conn:
            row = conn.execute(self._db.sql(f"SELECT {_COLUMNS} FROM users WHERE id = ?"),
                               (user_id,)).fetchone()
        return _user(row) if row else None

    def by_name(self, name: str) -> User | None:
        with self._db.transaction() as conn:
            row = conn.execute(self._db.sql(f"SELECT {_COLUMNS} FROM users WHERE name = ?"),
                               (name,)).fetchone()
        return _user(row) if row else None

    def update(self, name: str, *, admin: bool | None = None, password: str | None = None
               ) -> User | None:
        """Change a user's role or (local accounts) password; None if there is no such user."""
        with self._db.transaction() as conn:
            if admin is not None:
                conn.execute(self._db.sql("UPDATE users SET is_admin = ? WHERE name = ?"),
                             (int(admin), name))
            if password is not None:
                conn.execute(self._db.sql("UPDATE users SET password_hash = ? WHERE name = ? "
                                          "AND issuer = ?"),
                             (hash_password(password), name, LOCAL_ISSUER))
        return self.by_name(name)

    def delete(self, name: str) -> bool:
        with self._db.transaction() as conn:
            cur = conn.execute(self._db.sql("DELETE FROM users WHERE name = ?"), (name,))
        return bool(cur.rowcount)

    def list(self) -> list[User]:
        with self._db.transaction() as conn:
            rows = conn.execute(self._db.sql(f"SELECT {_COLUMNS} FROM users ORDER BY name"),
                                ()).fetchall()
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

