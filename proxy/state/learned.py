"""What the era bridge learns about each upstream, and the legacy sessions it holds for
sessionless callers.

Both are keyed by the route's `state_key` (its name and URL: a server re-pointed is learned
afresh). An upstream's verdict (`Learned`) says which era it speaks and, for a 2026-07-28
upstream, its DiscoverResult and whether it refused a legacy `initialize`. A held session is
the upstream session the gateway opened for one (route, principal), with that upstream's
initialize result; it is dropped after `session_ttl_s` without use.

A Redis store keeps `bv:<route>` (the verdict's JSON, SET; a verdict is a fact about the
upstream, so it needs no expiry, and a re-pointed server has a new key) and
`bh:<route>:<principal>` (the held session's JSON, SET PX ttl; `session` is GETEX PX, so each
use restarts the idle timer; `forget` is DEL). Two replicas that open a session for one caller
at once both open one and the later SET wins: the upstream holds one spare session until it
expires, which costs nothing but a little of its memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import orjson
from cachetools import TTLCache

if TYPE_CHECKING:
    from proxy.state.shared import Shared

Era = Literal["legacy", "modern"]


@dataclass(frozen=True, slots=True)
class Learned:
    era: Era
    discover: dict[str, Any] | None = None  # a 2026-07-28 upstream's DiscoverResult
    modern_only: bool = False  # it refused a legacy initialize after answering discover


@dataclass(frozen=True, slots=True)
class HeldSession:
    upstream_session_id: str | None  # None: the upstream is stateless
    initialize_result: dict[str, Any]


class BridgeStore(Protocol):
    async def learned(self, route: str) -> Learned | None: ...

    async def learn(self, route: str, learned: Learned) -> None: ...

    async def session(self, route: str, principal_key: str) -> HeldSession | None:
        """The session held for this caller at this upstream, its idle timer restarted."""

    async def hold(self, route: str, principal_key: str, session: HeldSession) -> None: ...

    async def forget(self, route: str, principal_key: str) -> None: ...


class MemoryBridgeStore:
    def __init__(self, session_ttl_s: float = 1800.0, max_sessions: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._learned: dict[str, Learned] = {}
        self._sessions: TTLCache[tuple[str, str], HeldSession] = TTLCache(
            maxsize=max_sessions, ttl=session_ttl_s, timer=clock)

    async def learned(self, route: str) -> Learned | None:
        return self._learned.get(route)

    async def learn(self, route: str, learned: Learned) -> None:
        self._learned[route] = learned

    async def session(self, route: str, principal_key: str) -> HeldSession | None:
        key = (route, principal_key)
        held = self._sessions.get(key)
        if held is not None:
            self._sessions[key] = held  # restart the idle timer
        return held

    async def hold(self, route: str, principal_key: str, session: HeldSession) -> None:
        self._sessions[(route, principal_key)] = session

    async def forget(self, route: str, principal_key: str) -> None:
        self._sessions.pop((route, principal_key), None)

    async def count(self) -> int:
        """Upstream sessions held for 2026-07-28 callers (for metrics)."""
        self._sessions.expire()
        return len(self._sessions)


class RedisBridgeStore:
    """The bridge's knowledge shared by every process. A verdict is read on every call, so each
    process keeps the ones it read for `verdict_ttl_s`: a verdict another process changed (an
    upstream found to refuse legacy initialize) is seen here at most that late, and a call
    that meets the change meanwhile learns it again itself."""

    def __init__(self, shared: Shared, session_ttl_s: float = 1800.0,
                 verdict_ttl_s: float = 5.0) -> None:
        self._shared = shared
        self._verdicts = shared.key("bv:")
        self._held = shared.key("bh:")
        self._ttl_ms = max(1, round(session_ttl_s * 1000))
        self._local: TTLCache[str, Learned] = TTLCache(maxsize=10_000, ttl=verdict_ttl_s)

    async def learned(self, route: str) -> Learned | None:
        local = self._local.get(route)
        if local is not None:
            return local
        raw = await self._shared.command("bridge", "GET", self._verdicts + route)
        if raw is None:
            return None
        era, discover, modern_only = orjson.loads(raw)
        learned = Learned(era, discover, modern_only)
        self._local[route] = learned
        return learned

    async def learn(self, route: str, learned: Learned) -> None:
        await self._shared.command(
            "bridge", "SET", self._verdicts + route,
            orjson.dumps((learned.era, learned.discover, learned.modern_only)))
        self._local[route] = learned

    async def session(self, route: str, principal_key: str) -> HeldSession | None:
        raw = await self._shared.command("bridge", "GETEX", self._held_key(route, principal_key),
                                         "PX", self._ttl_ms)
        if raw is None:
            return None
        upstream_id, result = orjson.loads(raw)
        return HeldSession(upstream_id, result)

    async def hold(self, route: str, principal_key: str, session: HeldSession) -> None:
        await self._shared.command(
            "bridge", "SET", self._held_key(route, principal_key),
            orjson.dumps((session.upstream_session_id, session.initialize_result)),
            "PX", self._ttl_ms)

    async def forget(self, route: str, principal_key: str) -> None:
        await self._shared.command("bridge", "DEL", self._held_key(route, principal_key))

    async def count(self) -> int:
        """Upstream sessions held for 2026-07-28 callers, by every process (for metrics)."""
        return await self._shared.count("bridge", self._held)

    def _held_key(self, route: str, principal_key: str) -> str:
        return f"{self._held}{orjson.dumps((route, principal_key)).decode()}"
