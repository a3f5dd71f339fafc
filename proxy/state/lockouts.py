"""Auth-failure lockouts: failed credentials counted per key (an address, a user name, a
client id) within a window; a key that reaches the threshold is locked for a while.

The decision that matters is `attempt`, made once a credential has been checked: it says
whether the outcome may be told (no key was locked, by this or a parallel attempt) and counts
a failure, in one step. A check and a count two awaits apart would let N parallel guesses all
read "not locked" before any of them is counted; here at most `max_failures` failures are
answered as such, and every later attempt, right or wrong, is answered "locked". `locked` is
the cheap look before any work, so a locked-out caller costs no verification at all.

A Redis store keeps, per key, `lk:c:<key>` (the count, PEXPIRE window on the first INCR) and
`lk:l:<key>` (the lock, SET PX lockout): `locked` is one PTTL per key in a pipeline (or one
short script), `attempt` one Lua script (PTTL every lock; if none is live and the attempt
failed, INCR each count, PEXPIRE a new one, SET the lock and DEL the count at the
threshold). Redis's own clock runs the expiries, so replicas agree.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from cachetools import TTLCache

if TYPE_CHECKING:
    from proxy.config import LockoutConfig


class LockoutStore(Protocol):
    async def locked(self, keys: Sequence[str]) -> float | None:
        """Seconds until the first locked key is free again, or None when none is locked."""

    async def attempt(self, keys: Sequence[str], *, failed: bool) -> float | None:
        """Settle one attempt, atomically: if a key is locked, the seconds until it is free
        (the attempt's outcome must not be told, and a failure is not counted again);
        otherwise None, after counting a failure against each key when `failed` (a key that
        reaches the threshold is locked from now on)."""


class _Entry:
    __slots__ = ("count", "locked_until", "window_start")

    def __init__(self, now: float) -> None:
        self.count = 0
        self.window_start = now
        self.locked_until = 0.0


class MemoryLockoutStore:
    """Lockouts in one process. Neither method awaits anything, so within one event loop each
    runs whole: that is what makes `attempt` atomic."""

    def __init__(self, cfg: LockoutConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_failures = cfg.max_failures
        self._window_s = cfg.window_s
        self._lockout_s = cfg.lockout_s
        self._clock = clock
        ttl = max(cfg.window_s, cfg.lockout_s)
        self._entries: TTLCache[str, _Entry] = TTLCache(cfg.max_tracked, ttl, timer=clock)

    async def locked(self, keys: Sequence[str]) -> float | None:
        return self._locked(keys, self._clock())

    async def attempt(self, keys: Sequence[str], *, failed: bool) -> float | None:
        now = self._clock()
        retry = self._locked(keys, now)
        if retry is not None or not failed:
            return retry
        for key in keys:
            entry = self._entries.get(key)
            if entry is None or now - entry.window_start >= self._window_s:
                entry = _Entry(now)
            entry.count += 1
            if entry.count >= self._max_failures:
                entry.locked_until = now + self._lockout_s
                entry.count = 0
                entry.window_start = now
            self._entries[key] = entry  # re-set: the TTL restarts from the latest failure
        return None

    def _locked(self, keys: Sequence[str], now: float) -> float | None:
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None and entry.locked_until > now:
                return entry.locked_until - now
        return None
