"""Auth-failure lockouts: too many bad credentials from one address, or for one known key id or
subject, within a window lock it out for a while. The state sits behind a small store interface
(in memory here; a shared store can replace it)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from cachetools import TTLCache

from proxy.config import LockoutConfig


class LockoutStore(Protocol):
    async def locked(self, keys: Sequence[str], now: float) -> float | None:
        """Seconds until the first locked key is free again, or None when none is locked."""

    async def failed(self, keys: Sequence[str], now: float) -> None:
        """Count one failure against each key; lock a key that reached the threshold."""


class _Entry:
    __slots__ = ("count", "locked_until", "window_start")

    def __init__(self, now: float) -> None:
        self.count = 0
        self.window_start = now
        self.locked_until = 0.0


class MemoryLockoutStore:
    def __init__(self, cfg: LockoutConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._cfg = cfg
        ttl = max(cfg.window_s, cfg.lockout_s)
        self._entries: TTLCache[str, _Entry] = TTLCache(cfg.max_tracked, ttl, timer=clock)

    async def locked(self, keys: Sequence[str], now: float) -> float | None:
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None and entry.locked_until > now:
                return entry.locked_until - now
        return None

    async def failed(self, keys: Sequence[str], now: float) -> None:
        for key in keys:
            entry = self._entries.get(key)
            if entry is None or now - entry.window_start >= self._cfg.window_s:
                entry = _Entry(now)
            entry.count += 1
            if entry.count >= self._cfg.max_failures:
                entry.locked_until = now + self._cfg.lockout_s
                entry.count = 0
                entry.window_start = now
            self._entries[key] = entry  # re-set: the TTL restarts from the latest failure
