"""MCP sessions (2025-11-25): the id the client holds, bound to one endpoint and one principal,
mapped to the upstream's session id, which never reaches the client. A Redis store keeps
`ms:<id>` as the session's JSON (SET PX idle timeout; `get` is GETEX PX, so each use restarts
the idle timer; `delete` is DEL), and beside it the set `mp:<principal key>` of that caller's
session ids (the index a deprovisioned person's sessions are ended by, `end_for`: SMEMBERS,
DEL each, one Lua script): `create` is one script (SET PX, SADD, PEXPIRE), and each `fetch`
that finds a session pipelines a PEXPIRE of its caller's set after its GETEX (unawaited), so
the set outlives every session in it. The spine `fetch`es a request's session as the request
arrives and reads it once the caller is authenticated: the GETEX is on the wire while the body
is parsed and the credential checked, so its reply is usually there when it is needed and the
call does not sleep on it. (A caller with a session id but a wrong credential thus restarts
that session's idle timer: it is refused all the same, and knowing the id is what it takes.)"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from proxy.state.indexed import Indexed, unindex

if TYPE_CHECKING:
    from proxy.state.shared import Asked, Shared


@dataclass(slots=True)
class Session:
    """A gateway session: the client sees `id`, the upstream sees `upstream_session_id`."""

    id: str
    endpoint: str
    principal_key: str
    upstream_session_id: str | None
    protocol_version: str | None = None
    created_at: float = field(default_factory=time.time)
    id_hash: str = ""
    # set when a legacy client is bridged onto a 2026-07-28-only upstream: what the client
    # declared at initialize, stamped into the envelope of each request the gateway forwards
    bridged_envelope: dict[str, Any] | None = None
    # the capabilities the client declared at initialize (e.g. URL-mode elicitation, which
    # decides how a missing per_user connection is answered: proxy.connect.links)
    capabilities: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.id_hash:
            self.id_hash = session_hash(self.id)

    @classmethod
    def new(cls, endpoint: str, principal_key: str, upstream_session_id: str | None,
            protocol_version: str | None,
            bridged_envelope: dict[str, Any] | None = None,
            capabilities: dict[str, Any] | None = None) -> Session:
        """A session under a fresh random id (what every store's `create` makes)."""
        return cls(secrets.token_urlsafe(24), endpoint, principal_key, upstream_session_id,
                   protocol_version, bridged_envelope=bridged_envelope,
                   capabilities=capabilities)


def session_hash(session_id: str) -> str:
    """What the audit log keeps instead of a session id (which is a bearer-like secret)."""
    return hashlib.sha256(session_id.encode()).hexdigest()[:16]


class SessionStore(Protocol):
    async def create(self, endpoint: str, principal_key: str, upstream_session_id: str | None,
                     protocol_version: str | None,
                     bridged_envelope: dict[str, Any] | None = None,
                     capabilities: dict[str, Any] | None = None) -> Session: ...

    async def get(self, session_id: str) -> Session | None:
        """The live session with that id, its idle timer restarted; None if dead or unknown."""

    def fetch(self, session_id: str) -> Fetched:
        """`get`, asked now and read later: the spine asks as a request arrives and reads once
        the caller is authenticated, so a shared store's round trip overlaps that work."""

    async def delete(self, session_id: str) -> None: ...

    async def by_endpoint(self) -> dict[str, int]:
        """Live sessions per endpoint (every process's on a shared store)."""

    async def end_for(self, principal_key: str) -> int:
        """End every session of one caller (a person deprovisioned: their next request with
        one is 404 "session not found"); how many ended."""

    async def of(self, principal_key: str) -> list[Session]:
        """The live sessions of one caller, oldest first (a person's page lists them; their
        idle timers are left as they are)."""


class Fetched(Protocol):
    async def session(self) -> Session | None: ...

    def drop(self) -> None:
        """Not needed after all (the request failed first); harmless once read."""


class _Found:
    __slots__ = ("_session",)

    def __init__(self, session: Session | None) -> None:
        self._session = session

    async def session(self) -> Session | None:
        return self._session

    def drop(self) -> None:
        pass


class MemorySessionStore:
    """Sessions in one process, expiring after `idle_timeout_s` without use."""

    def __init__(self, idle_timeout_s: float, max_sessions: int,
                 clock: Callable[[], float] | None = None) -> None:
        self._by_principal: dict[str, set[str]] = {}
        self._sessions: Indexed[Session] = Indexed(
            max_sessions, idle_timeout_s, clock or time.monotonic, self._by_principal,
            lambda session: session.principal_key)

    async def create(self, endpoint: str, principal_key: str, upstream_session_id: str | None,
                     protocol_version: str | None,
                     bridged_envelope: dict[str, Any] | None = None,
                     capabilities: dict[str, Any] | None = None) -> Session:
        session = Session.new(endpoint, principal_key, upstream_session_id, protocol_version,
                              bridged_envelope, capabilities)
        self._sessions[session.id] = session  # may expire or evict others: they unindex
        self._by_principal.setdefault(principal_key, set()).add(session.id)
        return session

    async def get(self, session_id: str) -> Session | None:
        return self._get(session_id)

    def fetch(self, session_id: str) -> Fetched:
        return _Found(self._get(session_id))

    def _get(self, session_id: str) -> Session | None:
        session = self._sessions.get(session_id)
        if session is not None:
            self._sessions[session_id] = session  # restart the idle timer
        return session

    async def delete(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            unindex(self._by_principal, session.principal_key, session_id)

    async def end_for(self, principal_key: str) -> int:
        ended = 0
        for session_id in self._by_principal.pop(principal_key, set()):
            if self._sessions.pop(session_id, None) is not None:
                ended += 1
        return ended

    async def of(self, principal_key: str) -> list[Session]:
        self._sessions.expire()
        found = [self._sessions.get(i) for i in self._by_principal.get(principal_key, ())]
        return sorted((s for s in found if s is not None), key=lambda s: s.created_at)

    def __len__(self) -> int:
        return len(self._sessions)

    async def count(self) -> int:
        """Live sessions (for metrics)."""
        self._sessions.expire()
        return len(self._sessions)

    async def by_endpoint(self) -> dict[str, int]:
        """Live sessions per endpoint (for /api/v1/sessions): this process's."""
        self._sessions.expire()
        return dict(Counter(s.endpoint for s in list(self._sessions.values())))


_CREATE = """
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 0
"""

_END_FOR = """
local ids = redis.call('SMEMBERS', KEYS[1])
local ended = 0
for _, id in ipairs(ids) do
  ended = ended + redis.call('DEL', ARGV[1] .. id)
end
redis.call('DEL', KEYS[1])
return ended
"""


class RedisSessionStore:
    """Sessions shared by every gateway process on one Redis: any replica continues a session
    any other opened. No bound on their number but the idle timeout (Redis's memory)."""

    def __init__(self, shared: Shared, idle_timeout_s: float) -> None:
        self._shared = shared
        self._prefix = shared.key("ms:")
        self._callers = shared.key("mp:")
        self._ttl_ms = max(1, round(idle_timeout_s * 1000))
        self._create = shared.script(_CREATE, "session")
        self._end_for = shared.script(_END_FOR, "session")

    async def create(self, endpoint: str, principal_key: str, upstream_session_id: str | None,
                     protocol_version: str | None,
                     bridged_envelope: dict[str, Any] | None = None,
                     capabilities: dict[str, Any] | None = None) -> Session:
        session = Session.new(endpoint, principal_key, upstream_session_id, protocol_version,
                              bridged_envelope, capabilities)
        held = orjson.dumps((endpoint, principal_key, upstream_session_id, protocol_version,
                             session.created_at, bridged_envelope, capabilities))
        await self._create([self._prefix + session.id, self._callers + principal_key],
                           [held, session.id, self._ttl_ms])
        return session

    async def get(self, session_id: str) -> Session | None:
        return await self.fetch(session_id).session()

    def fetch(self, session_id: str) -> Fetched:
        return _Asked(session_id, self._shared.ask("session", "GETEX", self._prefix + session_id,
                                                   "PX", self._ttl_ms), self._kept)

    def _kept(self, principal_key: str) -> None:
        """A session of this caller was used: their set lives as long as it (unawaited)."""
        self._shared.ask("session", "PEXPIRE", self._callers + principal_key,
                         self._ttl_ms).drop()

    async def delete(self, session_id: str) -> None:
        # its id stays in its caller's set until the set expires: deleting it again is harmless
        await self._shared.command("session", "DEL", self._prefix + session_id)

    async def end_for(self, principal_key: str) -> int:
        return int(await self._end_for([self._callers + principal_key], [self._prefix]))

    async def of(self, principal_key: str) -> list[Session]:
        """SMEMBERS of the caller's set, then MGET of those sessions (GET, not GETEX: reading
        them restarts no idle timer); an id whose session expired is left out."""
        ids = await self._shared.command("session", "SMEMBERS", self._callers + principal_key)
        if not ids:
            return []
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in ids]
        raws = await self._shared.command("session", "MGET", *[self._prefix + i for i in ids])
        found = [_session(i, raw) for i, raw in zip(ids, raws, strict=True) if raw is not None]
        return sorted(found, key=lambda s: s.created_at)

    async def count(self) -> int:
        """Live sessions of every process (for metrics)."""
        return await self._shared.count("session", self._prefix)

    async def by_endpoint(self) -> dict[str, int]:
        """Live sessions per endpoint, of every process (for /api/v1/sessions): SCAN, then
        the sessions read a batch at a time (an administrator's question, never a call's)."""
        found: Counter[str] = Counter()
        for keys in [k async for k in self._shared.scan("session", self._prefix)]:
            for raw in await self._shared.command("session", "MGET", *keys):
                if raw is not None:  # expired between the SCAN and the read
                    found[orjson.loads(raw)[0]] += 1
        return dict(found)


def _session(session_id: str, raw: bytes) -> Session:
    """A session as the Redis store keeps it (`ms:<id>`)."""
    # a session kept before the capabilities were (six fields) has none
    endpoint, principal_key, upstream_id, version, created, envelope, *rest = orjson.loads(raw)
    return Session(session_id, endpoint, principal_key, upstream_id, version, created,
                   bridged_envelope=envelope, capabilities=rest[0] if rest else None)


class _Asked:
    __slots__ = ("_asked", "_id", "_kept")

    def __init__(self, session_id: str, asked: Asked, kept: Callable[[str], None]) -> None:
        self._id, self._asked, self._kept = session_id, asked, kept

    async def session(self) -> Session | None:
        raw = await self._asked.reply()
        if raw is None:
            return None
        session = _session(self._id, raw)
        self._kept(session.principal_key)
        return session

    def drop(self) -> None:
        self._asked.drop()
