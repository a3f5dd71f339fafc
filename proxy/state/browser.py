"""Browser sessions: the cookie holds only a random id; the store maps it to a person, with an
index by person, so ending a person's sessions (a new password, a deleted user) touches only
theirs and scans nothing.

A Redis store keeps `br:s:<id>` = the person (SET PX ttl) and the set `br:u:<person>` of their
ids (SADD, PEXPIRE ttl, so a quiet person's set goes with their last session): `user_id` is a
GET, `create`, `delete` and `end_for` one Lua script each (SET PX, SADD, PEXPIRE; GET the
owner, DEL, SREM; SMEMBERS, DEL each but `keep`, rebuild the set). An id left in a set after its session expired
is harmless: deleting it again deletes nothing.

A cookie that is not of the form `create` issues (`issued`) is no session, on either backend,
before anything is looked up: whatever a browser sends never reaches another kind of key, and
never costs a Redis round trip.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from proxy.state.indexed import Indexed, unindex

if TYPE_CHECKING:
    from proxy.state.shared import Shared


SESSION_BYTES = 32
_ISSUED = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(SESSION_BYTES)


def _new_id() -> str:
    return secrets.token_urlsafe(SESSION_BYTES)


def issued(session_id: str) -> bool:
    """Whether `session_id` has the form of an id `create` makes."""
    return _ISSUED.fullmatch(session_id) is not None


class BrowserSessions(Protocol):
    async def create(self, user_id: str) -> str:
        """A new session for the person; its id (the cookie's value)."""

    async def user_id(self, session_id: str) -> str | None:
        """The person a live session belongs to; None if it ended, expired or never was."""

    async def delete(self, session_id: str) -> None: ...

    async def end_for(self, user_id: str, keep: str | None = None) -> int:
        """End every session of a person but `keep`; how many ended."""

    async def count_for(self, user_id: str) -> int:
        """How many live sessions the person has (their ids, secrets, are never shown)."""


class MemoryBrowserSessions:
    """Browser sessions in one process, `ttl_s` from sign-in (not sliding)."""

    def __init__(self, ttl_s: float = 8 * 3600, clock: Callable[[], float] = time.monotonic,
                 max_sessions: int = 100_000) -> None:
        self._by_user: dict[str, set[str]] = {}
        self._sessions: Indexed[str] = Indexed(max_sessions, ttl_s, clock, self._by_user, str)

    async def create(self, user_id: str) -> str:
        session_id = _new_id()
        self._sessions[session_id] = user_id  # may expire or evict others: they unindex
        self._by_user.setdefault(user_id, set()).add(session_id)
        return session_id

    async def user_id(self, session_id: str) -> str | None:
        return self._sessions.get(session_id) if issued(session_id) else None

    async def delete(self, session_id: str) -> None:
        user_id = self._sessions.pop(session_id, None) if issued(session_id) else None
        if user_id is not None:
            unindex(self._by_user, user_id, session_id)

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

    async def count_for(self, user_id: str) -> int:
        self._sessions.expire()
        return len(self._by_user.get(user_id, ()))

    def __len__(self) -> int:
        return len(self._sessions)


_CREATE = """
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 0
"""

_DELETE = """
local owner = redis.call('GET', KEYS[1])
if owner then
  redis.call('DEL', KEYS[1])
  redis.call('SREM', ARGV[1] .. owner, ARGV[2])
end
return 0
"""

_END_FOR = """
local ids = redis.call('SMEMBERS', KEYS[1])
local ended, kept = 0, false
for _, id in ipairs(ids) do
  if id == ARGV[2] then
    kept = redis.call('EXISTS', ARGV[1] .. id) == 1
  else
    ended = ended + redis.call('DEL', ARGV[1] .. id)
  end
end
redis.call('DEL', KEYS[1])
if kept then
  redis.call('SADD', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return ended
"""


class RedisBrowserSessions:
    """Browser sessions shared by every process: signed in on one replica, known on all."""

    def __init__(self, shared: Shared, ttl_s: float = 8 * 3600) -> None:
        self._shared = shared
        self._sessions = shared.key("br:s:")
        self._people = shared.key("br:u:")
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._create = shared.script(_CREATE, "browser-session")
        self._delete = shared.script(_DELETE, "browser-session")
        self._end_for = shared.script(_END_FOR, "browser-session")

    async def create(self, user_id: str) -> str:
        session_id = _new_id()
        await self._create([self._sessions + session_id, self._people + user_id],
                           [user_id, session_id, self._ttl_ms])
        return session_id

    async def user_id(self, session_id: str) -> str | None:
        if not issued(session_id):
            return None
        raw = await self._shared.command("browser-session", "GET", self._sessions + session_id)
        if raw is None:
            return None
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    async def delete(self, session_id: str) -> None:
        if not issued(session_id):
            return
        await self._delete([self._sessions + session_id], [self._people, session_id])

    async def end_for(self, user_id: str, keep: str | None = None) -> int:
        ended = await self._end_for([self._people + user_id],
                                    [self._sessions, keep or "", self._ttl_ms])
        return int(ended)

    async def count_for(self, user_id: str) -> int:
        """SMEMBERS of the person's set, then one EXISTS of those sessions (an id whose
        session expired counts nothing)."""
        ids = await self._shared.command("browser-session", "SMEMBERS", self._people + user_id)
        if not ids:
            return 0
        keys = [self._sessions + (i.decode() if isinstance(i, bytes) else str(i)) for i in ids]
        return int(await self._shared.command("browser-session", "EXISTS", *keys))
