"""MCP sessions (2025-11-25): the id the client holds, bound to one endpoint and one principal,
mapped to the upstream's session id, which never reaches the client. A Redis store keeps
`ms:<id>` as the session's JSON (SET PX idle timeout; `get` is GETEX PX, so each use restarts
the idle timer; `delete` is DEL). The spine `fetch`es a request's session as the request
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
from cachetools import TTLCache

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
        self._sessions: TTLCache[str, Session] = TTLCache(
            maxsize=max_sessions, ttl=idle_timeout_s, timer=clock or time.monotonic)

    async def create(self, endpoint: str, principal_key: str, upstream_session_id: str | None,
                     protocol_version: str | None,
                     bridged_envelope: dict[str, Any] | None = None,
                     capabilities: dict[str, Any] | None = None) -> Session:
        session = Session.new(endpoint, principal_key, upstream_session_id, protocol_version,
                              bridged_envelope, capabilities)
        self._sessions[session.id] = session
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
        self._sessions.pop(session_id, None)

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


class RedisSessionStore:
    """Sessions shared by every gateway process on one Redis: any replica continues a session
    any other opened. No bound on their number but the idle timeout (Redis's memory)."""

    def __init__(self, shared: Shared, idle_timeout_s: float) -> None:
        self._shared = shared
        self._prefix = shared.key("ms:")
        self._ttl_ms = max(1, round(idle_timeout_s * 1000))

    async def create(self, endpoint: str, principal_key: str, upstream_session_id: str | None,
                     protocol_version: str | None,
                     bridged_envelope: dict[str, Any] | None = None,
                     capabilities: dict[str, Any] | None = None) -> Session:
        session = Session.new(endpoint, principal_key, upstream_session_id, protocol_version,
                              bridged_envelope, capabilities)
        held = orjson.dumps((endpoint, principal_key, upstream_session_id, protocol_version,
                             session.created_at, bridged_envelope, capabilities))
        await self._shared.command("session", "SET", self._prefix + session.id, held,
                                   "PX", self._ttl_ms)
        return session

    async def get(self, session_id: str) -> Session | None:
        return await self.fetch(session_id).session()

    def fetch(self, session_id: str) -> Fetched:
        return _Asked(session_id, self._shared.ask("session", "GETEX", self._prefix + session_id,
                                                   "PX", self._ttl_ms))

    async def delete(self, session_id: str) -> None:
        await self._shared.command("session", "DEL", self._prefix + session_id)

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


class _Asked:
    __slots__ = ("_asked", "_id")

    def __init__(self, session_id: str, asked: Asked) -> None:
        self._id, self._asked = session_id, asked

    async def session(self) -> Session | None:
        raw = await self._asked.reply()
        if raw is None:
            return None
        # a session kept before the capabilities were (six fields) has none
        endpoint, principal_key, upstream_id, version, created, envelope, *rest = \
            orjson.loads(raw)
        return Session(self._id, endpoint, principal_key, upstream_id, version, created,
                       bridged_envelope=envelope, capabilities=rest[0] if rest else None)

    def drop(self) -> None:
        self._asked.drop()
