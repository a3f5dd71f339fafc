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
from typing import Protocol

from cachetools import TTLCache


class RevocationStore(Protocol):
    async def revoke_token(self, jti: str) -> None: ...

    async def revoke_family(self, family: str) -> None: ...

    async def revoked(self, jti: str, family: str) -> bool:
        """Whether the token `jti`, or its whole `family`, was revoked."""


class MemoryRevocationStore:
    def __init__(self, ttl_s: float, max_entries: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._tokens: TTLCache[str, bool] = TTLCache(maxsize=max_entries, ttl=ttl_s, timer=clock)
        self._families: TTLCache[str, bool] = TTLCache(maxsize=max_entries, ttl=ttl_s,
                                                       timer=clock)

    async def revoke_token(self, jti: str) -> None:
        self._tokens[jti] = True

    async def revoke_family(self, family: str) -> None:
        self._families[family] = True

    async def revoked(self, jti: str, family: str) -> bool:
        return jti in self._tokens or family in self._families
