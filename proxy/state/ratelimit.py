"""Rate-limit state: one theoretical arrival time (GCRA) per bucket key, behind one operation.

`take` decides and updates every bucket a call touches in one step, so that a store shared by
several gateway processes can do the same with one Redis Lua script: GET each key, refuse if any
is ahead of its tolerance, otherwise SET each new value with PEXPIRE = new value - now. Nothing
reads a bucket in one step and writes it in another, which is where concurrent calls would lose
or double-count tokens.

Times are integer microseconds, so boundary decisions are exact (a burst of 100 admits 100
calls, never 99 through rounding) and fit the 2^53 integers of Lua numbers. The store owns the
clock: a caller's monotonic reading means nothing to another process, so a Redis store takes
`now` from `redis.call("TIME")` inside the script, and the memory store from its own clock.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from proxy.config.rates import US  # the clock's ticks, which the config's rate check knows

if TYPE_CHECKING:
    from proxy.state.shared import Shared


class Limit(NamedTuple):
    """One bucket a call takes from: GCRA's emission interval (the time one call 'costs') and
    tolerance (how far ahead of now the bucket may run: (burst - 1) intervals)."""

    key: str
    interval_us: int
    tolerance_us: int


class Refused(NamedTuple):
    """The call was refused: `position` is the limit that holds it back longest, and after
    `retry_after_s` every limit would admit it (absent other traffic)."""

    position: int
    retry_after_s: float


class RateLimitStore(Protocol):
    async def take(self, limits: Sequence[Limit]) -> Refused | None:
        """Admit the call now against every limit, or refuse it and change nothing.

        All or nothing: a limit that refuses means no other limit is charged either. "Now" is
        the store's clock (Redis: the script's TIME), so every process sharing it agrees."""


class MemoryRateLimitStore:
    """Buckets in one process, at most `max_keys` of them.

    `take` has no await, so within one event loop it runs whole before any other call's
    `take`: that is what makes it atomic. Each entry expires at its own arrival time, the moment
    from which it admits as much as a missing entry would; when `max_keys` live entries exist,
    the least recently used is forgotten (its caller gets a fresh burst), so size it well
    above the number of active callers."""

    def __init__(self, max_keys: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self._clock = clock
        self._now = 0
        self._max_keys = max_keys
        # key -> arrival time, least recently charged first (a charge moves a key to the end)
        self._tats: dict[str, int] = {}
        # (arrival time, key) of every charge, soonest first: what expires next. A pair whose
        # key has moved on since is stale and skipped; compacted when stale pairs pile up.
        self._expiries: list[tuple[int, str]] = []

    async def take(self, limits: Sequence[Limit]) -> Refused | None:
        # the store's clock never runs backwards
        self._now = now_us = max(self._now, round(self._clock() * US))
        tats = self._tats
        new_tats: list[int] = []
        refused: Refused | None = None
        for i, (key, interval_us, tolerance_us) in enumerate(limits):
            tat = tats.get(key, now_us)
            tat = max(tat, now_us)
            wait_us = tat - tolerance_us - now_us
            if wait_us > 0 and (refused is None or wait_us / US > refused.retry_after_s):
                refused = Refused(i, wait_us / US)
            new_tats.append(tat + interval_us)
        if refused is not None:
            return refused
        expiries = self._expiries
        for (key, _, _), tat in zip(limits, new_tats, strict=True):
            tats.pop(key, None)
            tats[key] = tat
            heapq.heappush(expiries, (tat, key))
        self._forget(now_us)
        return None

    def _forget(self, now_us: int) -> None:
        """Entries that no longer constrain (their arrival time has come: from now on they
        admit like a missing entry) go first; then, past `max_keys`, the least recently
        charged."""
        tats, expiries = self._tats, self._expiries
        while expiries and expiries[0][0] <= now_us:
            tat, key = heapq.heappop(expiries)
            if tats.get(key) == tat:
                del tats[key]
        while len(tats) > self._max_keys:
            del tats[next(iter(tats))]
        if len(expiries) > 2 * len(tats) + 1024:  # mostly stale pairs: rebuild, amortized O(1)
            self._expiries = [(tat, key) for key, tat in tats.items()]
            heapq.heapify(self._expiries)

    def __len__(self) -> int:
        return len(self._tats)


# KEYS: the buckets; ARGV: interval, tolerance (µs) per bucket. Returns -1 (admitted, every
# bucket charged) or {position, wait µs} (refused, nothing charged). Numbers go back to Redis
# through string.format('%d'): Lua's own number-to-string would round a µs time to 14 digits.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tats = {}
local worst, longest = -1, 0
for i = 1, #KEYS do
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
  if tat < now then tat = now end
  local wait = tat - tonumber(ARGV[2 * i]) - now
  if wait > longest then worst, longest = i - 1, wait end
  tats[i] = tat + tonumber(ARGV[2 * i - 1])
end
if worst >= 0 then return {worst, string.format('%d', longest)} end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], string.format('%d', tats[i]),
             'PX', string.format('%d', math.ceil((tats[i] - now) / 1000)))
end
return -1
"""


class RedisRateLimitStore:
    """Buckets shared by every process: one script per decision, on Redis's clock (TIME), so
    replicas together admit exactly what one process would. While Redis is away no call is
    admitted (StoreUnavailable, 503): a limit is never lifted, and never multiplied by the
    number of replicas, by an outage."""

    def __init__(self, shared: Shared) -> None:
        # the policy's keys start "rl:" themselves (policies.rate_limit): that kind is claimed
        self._prefix = shared.key("rl:").removesuffix("rl:")
        self._take = shared.script(_TAKE, "rate-limit")

    async def take(self, limits: Sequence[Limit]) -> Refused | None:
        if not limits:
            return None
        keys: list[str] = []
        args: list[int] = []
        for key, interval_us, tolerance_us in limits:
            keys.append(self._prefix + key)
            args += (interval_us, tolerance_us)
        verdict = await self._take(keys, args)
        if verdict == -1:
            return None
        position, wait_us = verdict
        return Refused(int(position), int(wait_us) / US)
