"""Revoked access tokens (by `jti`) and refresh-token families, which the MCP edge checks on
every call with a token this gateway issued. An entry only has to outlive the tokens it
refuses (the access-token lifetime, plus a margin for clock skew), so the store forgets it
then.

A Redis store keeps `rv:t:<jti>` and `rv:f:<family>` (SET 1 PX ttl); `revoked` is one
`EXISTS rv:t:<jti> rv:f:<family>`, so a revocation made on one replica holds on every other
from its next call. The memory store's `revoked` is two dictionary lookups.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from proxy.state.shared import Shared


class RevocationStore(Protocol):
    async def revoke_token(self, jti: str) -> None: ...

    async def revoke_family(self, family: str) -> None: ...

    async def revoked(self, jti: str, family: str) -> bool:
        """Whether the token `jti`, or its whole `family`, was revoked."""


class MemoryRevocationStore:
    """Revocations in one process: two plain dictionaries of expiry times, so the check on
    every call is two lookups (and a clock reading only for an id that is there). Each holds
    at most `max_entries`; past that, expired entries go, then the oldest."""

    def __init__(self, ttl_s: float, max_entries: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._clock = clock
        self._tokens: dict[str, float] = {}
        self._families: dict[str, float] = {}

    async def revoke_token(self, jti: str) -> None:
        self._add(self._tokens, jti)

    async def revoke_family(self, family: str) -> None:
        self._add(self._families, family)

    async def revoked(self, jti: str, family: str) -> bool:
        if jti not in self._tokens and family not in self._families:
            return False  # the usual case
        return self._live(jti, family)

    def _live(self, jti: str, family: str) -> bool:
        """Whether either entry found is still in force; one that ran out goes."""
        now = self._clock()
        hit = False
        for table, key in ((self._tokens, jti), (self._families, family)):
            until = table.get(key)
            if until is not None:
                if until > now:
                    hit = True
                else:
                    del table[key]
        return hit

    def _add(self, table: dict[str, float], key: str) -> None:
        now = self._clock()
        table.pop(key, None)  # re-inserted last: the dictionary stays in revocation order
        table[key] = now + self._ttl_s
        if len(table) > self._max_entries:
            for stale in [k for k, until in table.items() if until <= now]:
                del table[stale]
            while len(table) > self._max_entries:
                del table[next(iter(table))]


class RedisRevocationStore:
    """Revocations every process sees from its next call: one EXISTS per check."""

    def __init__(self, shared: Shared, ttl_s: float) -> None:
        self._shared = shared
        self._tokens = shared.key("rv:t:")
        self._families = shared.key("rv:f:")
        self._ttl_ms = max(1, round(ttl_s * 1000))

    async def revoke_token(self, jti: str) -> None:
        await self._shared.command("revocation", "SET", self._tokens + jti, b"1",
                                   "PX", self._ttl_ms)

    async def revoke_family(self, family: str) -> None:
        await self._shared.command("revocation", "SET", self._families + family, b"1",
                                   "PX", self._ttl_ms)

    async def revoked(self, jti: str, family: str) -> bool:
        found = await self._shared.command("revocation", "EXISTS", self._tokens + jti,
                                           self._families + family)
        return bool(found)
