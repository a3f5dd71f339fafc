"""Browser sessions: the cookie holds only a random id; the store maps it to a person, with an
index by person, so ending a person's sessions (a new password, a deleted user) touches only
theirs and scans nothing.

A Redis store keeps `bs:<id>` = the person (SET PX ttl) and the set `bs:u:<person>` of their
ids (SADD, PEXPIRE ttl, so a quiet person's set goes with their last session): `create` is one
MULTI, `user_id` a GET, `delete` and `end_for` one Lua script each (GET the owner, DEL, SREM;
SMEMBERS, DEL each but `keep`, rebuild the set). An id left in a set after its session expired
is harmless: deleting it again deletes nothing.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any, Protocol

from cachetools import TTLCache


class BrowserSessions(Protocol):
    async def create(self, user_id: str) -> str:
        """A new session for the person; its id (the cookie's value)."""

    async def user_id(self, session_id: str) -> str | None:
        """The person a live session belongs to; None if it ended, expired or never was."""

    async def delete(self, session_id: str) -> None: ...

    async def end_for(self, user_id: str, keep: str | None = None) -> int:
        """End every session of a person but `keep`; how many ended."""


class _Sessions(TTLCache[str, str]):
    """The TTL cache that tells its index whenever it lets an entry go by itself (expiry, or
    the least recently used one when full); explicit removals update the index themselves."""

    def __init__(self, maxsize: int, ttl: float, timer: Callable[[], float],
                 index: dict[str, set[str]]) -> None:
        super().__init__(maxsize=maxsize, ttl=ttl, timer=timer)
        self._index = index

    def expire(self, time: Any = None) -> list[tuple[str, str]]:
        expired = list(super().expire(time))
        for session_id, user_id in expired:
            _unindex(self._index, user_id, session_id)
        return expired

    def popitem(self) -> tuple[str, str]:
        session_id, user_id = super().popitem()
        _unindex(self._index, user_id, session_id)
        return session_id, user_id


def _unindex(index: dict[str, set[str]], user_id: str, session_id: str) -> None:
    ids = index.get(user_id)
    if ids is not None:
        ids.discard(session_id)
        if not ids:
            del index[user_id]


class MemoryBrowserSessions:
    """Browser sessions in one process, `ttl_s` from sign-in (not sliding)."""

    def __init__(self, ttl_s: float = 8 * 3600, clock: Callable[[], float] = time.monotonic,
                 max_sessions: int = 100_000) -> None:
        self._by_user: dict[str, set[str]] = {}
        self._sessions = _Sessions(max_sessions, ttl_s, clock, self._by_user)

    async def create(self, user_id: str) -> str:
        session_id = secrets.token_urlsafe(32)
        self._sessions[session_id] = user_id  # may expire or evict others: they unindex
        self._by_user.setdefault(user_id, set()).add(session_id)
        return session_id

    async def user_id(self, session_id: str) -> str | None:
        return self._sessions.get(session_id)

    async def delete(self, session_id: str) -> None:
        user_id = self._sessions.pop(session_id, None)
        if user_id is not None:
            _unindex(self._by_user, user_id, session_id)

    async def end_for(self, user_id: str, keep: str | None = None) -> int:
        ids = self._by_user.pop(user_id, set())
        ended = 0
        for session_id in ids:
            if session_id == keep:
                continue
            if self._sessions.pop(session_id, None) is not None:
                ended += 1
        if keep is not None and keep in ids and keep in self._sessions:
            self._by_user[user_id] = {keep}
        return ended

    def __len__(self) -> int:
        return len(self._sessions)
