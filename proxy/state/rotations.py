"""Refresh-token rotations, kept for a short grace period so that a refresh token presented
again by the client that rotated it (its calls in flight at expiry each refresh once) gets the
same new tokens instead of revoking them all as a reuse.

The first presentation `claim`s the old token's key with its answer, sealed (the store never
holds a usable token: proxy.oauth.grace seals it under a key only the old refresh token gives);
the key is claimed before the database marks the token used, so a presentation that finds it
used finds the claim too (`get`). Every replica shares the claims through one store.

A Redis store keeps `rg:<sha256 of the token>` (SET PX grace); `claim` is one Lua script, GET
or else SET, so two replicas claiming at once: one keeps its answer, the other gets it. The
memory store's `claim` has no await, so it runs whole.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from cachetools import TTLCache

if TYPE_CHECKING:
    from proxy.state.shared import Shared


class RotationStore(Protocol):
    async def claim(self, key: str, sealed: bytes) -> bytes | None:
        """Keep `sealed` under `key` for the grace period, unless a claim is kept there: None
        when this one was kept, else the one kept first."""

    async def get(self, key: str) -> bytes | None:
        """The claim kept under `key`, while the grace period lasts."""


class MemoryRotationStore:
    def __init__(self, grace_s: float, max_entries: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._kept: TTLCache[str, bytes] = TTLCache(maxsize=max_entries, ttl=max(grace_s, 0.001),
                                                    timer=clock)

    async def claim(self, key: str, sealed: bytes) -> bytes | None:
        held = self._kept.get(key)
        if held is None:
            self._kept[key] = sealed
        return held

    async def get(self, key: str) -> bytes | None:
        return self._kept.get(key)


_CLAIM = """
local held = redis.call('GET', KEYS[1])
if held then
  return held
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
"""


class RedisRotationStore:
    def __init__(self, shared: Shared, grace_s: float) -> None:
        self._shared = shared
        self._prefix = shared.key("rg:")
        self._ttl_ms = max(1, round(grace_s * 1000))
        self._claim = shared.script(_CLAIM, "refresh-grace")

    async def claim(self, key: str, sealed: bytes) -> bytes | None:
        held = await self._claim([self._prefix + key], [sealed, self._ttl_ms])
        return bytes(held) if held else None

    async def get(self, key: str) -> bytes | None:
        held = await self._shared.command("refresh-grace", "GET", self._prefix + key)
        return bytes(held) if held else None
