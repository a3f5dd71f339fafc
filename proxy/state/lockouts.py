"""Auth-failure lockouts: failed credentials counted per key (an address, a user name, a
client id) within a window; a key that reaches the threshold is locked for a while.

The decision that matters is `attempt`, made once a credential has been checked: it says
whether the outcome may be told (no key was locked, by this or a parallel attempt) and counts
a failure, in one step. A check and a count two awaits apart would let N parallel guesses all
read "not locked" before any of them is counted; here at most `max_failures` failures are
answered as such, and every later attempt, right or wrong, is answered "locked". `locked` is
the cheap look before any work, so a locked-out caller costs no verification at all.

A Redis store keeps, per key, `lk:c:<key>` (the count, PEXPIRE window on the first INCR) and
`lk:l:<key>` (the lock, SET PX lockout): `attempt` is one Lua script (PTTL every lock; if none
is live and the attempt failed, INCR each count, PEXPIRE a new one, SET the lock and DEL the
count at the threshold), on Redis's clock, so replicas agree. Its `locked` asks Redis nothing:
it answers from the locks this process met, which keeps a credential check at one command.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from cachetools import TTLCache

if TYPE_CHECKING:
    from proxy.config import LockoutConfig
    from proxy.state.shared import Shared


class LockoutStore(Protocol):
    async def locked(self, keys: Sequence[str]) -> float | None:
        """Seconds until the first locked key is free again, or None when none is locked."""

    async def attempt(self, keys: Sequence[str], *, failed: bool) -> float | None:
        """Settle one attempt, atomically: if a key is locked, the seconds until it is free
        (the attempt's outcome must not be told, and a failure is not counted again);
        otherwise None, after counting a failure against each key when `failed` (a key that
        reaches the threshold is locked from now on)."""


class _Count:
    __slots__ = ("count", "window_start")

    def __init__(self, now: float) -> None:
        self.count = 0
        self.window_start = now


class MemoryLockoutStore:
    """Lockouts in one process. Neither method awaits anything, so within one event loop each
    runs whole: that is what makes `attempt` atomic. The locks are a plain dictionary, empty
    while nobody is locked out, so the check on every call costs a dictionary lookup; the
    failure counts, touched only on failures, expire a window after the latest one. Each holds
    at most `max_tracked` keys."""

    def __init__(self, cfg: LockoutConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_failures = cfg.max_failures
        self._window_s = cfg.window_s
        self._lockout_s = cfg.lockout_s
        self._max_tracked = cfg.max_tracked
        self._clock = clock
        self._locks: dict[str, float] = {}  # key -> locked until, on `clock`
        self._counts: TTLCache[str, _Count] = TTLCache(cfg.max_tracked, cfg.window_s,
                                                       timer=clock)

    async def locked(self, keys: Sequence[str]) -> float | None:
        return self._locked(keys, self._clock()) if self._locks else None

    async def attempt(self, keys: Sequence[str], *, failed: bool) -> float | None:
        if not failed:
            return self._locked(keys, self._clock()) if self._locks else None
        now = self._clock()
        retry = self._locked(keys, now)
        if retry is not None:
            return retry
        for key in keys:
            entry = self._counts.get(key)
            if entry is None or now - entry.window_start >= self._window_s:
                entry = _Count(now)
            entry.count += 1
            if entry.count >= self._max_failures:
                self._lock(key, now + self._lockout_s)
                self._counts.pop(key, None)  # counting starts again after the lock
            else:
                self._counts[key] = entry  # re-set: it lives a window after this failure
        return None

    def _locked(self, keys: Sequence[str], now: float) -> float | None:
        for key in keys:
            until = self._locks.get(key)
            if until is not None:
                if until > now:
                    return until - now
                del self._locks[key]
        return None

    def _lock(self, key: str, until: float) -> None:
        locks = self._locks
        locks.pop(key, None)  # re-inserted last: the dictionary stays in locking order
        locks[key] = until
        if len(locks) > self._max_tracked:  # forget expired locks, then the oldest
            now = self._clock()
            for stale in [k for k, u in locks.items() if u <= now]:
                del locks[stale]
            while len(locks) > self._max_tracked:
                del locks[next(iter(locks))]


# KEYS: n lock keys, then their n count keys; ARGV: failed (0/1), max failures, window ms,
# lockout ms. Returns {1, i, ms}: key i is locked for ms (the attempt is refused); {0, i, ms}:
# this failure locked key i (it is told, and the lock holds from now); 0: nothing locked.
_ATTEMPT = """
local n = #KEYS / 2
for i = 1, n do
  local ms = redis.call('PTTL', KEYS[i])
  if ms > 0 then return {1, i - 1, ms} end
end
if ARGV[1] == '0' then return 0 end
local set = 0
for i = 1, n do
  local count = redis.call('INCR', KEYS[n + i])
  if count == 1 then redis.call('PEXPIRE', KEYS[n + i], ARGV[3]) end
  if count >= tonumber(ARGV[2]) then
    redis.call('SET', KEYS[i], '1', 'PX', ARGV[4])
    redis.call('DEL', KEYS[n + i])
    set = i
  end
end
if set > 0 then return {0, set - 1, tonumber(ARGV[4])} end
return 0
"""


class RedisLockoutStore:
    """Lockouts shared by every process, each settlement one script on Redis's clock: N
    replicas together answer at most `max_failures` failures per key before the lock.

    `attempt` is the authority and the one Redis command a credential check costs. `locked`,
    the look before any work, asks no one: it answers from the locks this process has met
    (an attempt that found or set one), so a locked-out caller costs this process one
    verification at most, and a lock set elsewhere is met at that caller's next settlement."""

    def __init__(self, shared: Shared, cfg: LockoutConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._locks = shared.key("lk:l:")
        self._counts = shared.key("lk:c:")
        self._args = (cfg.max_failures, max(1, round(cfg.window_s * 1000)),
                      max(1, round(cfg.lockout_s * 1000)))
        self._attempt = shared.script(_ATTEMPT, "lockout")
        self._clock = clock
        self._met: TTLCache[str, float] = TTLCache(cfg.max_tracked, cfg.lockout_s, timer=clock)

    async def locked(self, keys: Sequence[str]) -> float | None:
        if not self._met:
            return None
        now = self._clock()
        for key in keys:
            until = self._met.get(key)
            if until is not None and until > now:
                return until - now
        return None

    async def attempt(self, keys: Sequence[str], *, failed: bool) -> float | None:
        if not keys:
            return None
        verdict = await self._attempt(
            [self._locks + k for k in keys] + [self._counts + k for k in keys],
            [1 if failed else 0, *self._args])
        if verdict == 0:
            return None
        refused, position, ms = verdict
        retry = int(ms) / 1000
        self._met[keys[int(position)]] = self._clock() + retry
        return retry if refused else None
