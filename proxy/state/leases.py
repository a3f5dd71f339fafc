"""Short leases: one holder at a time of a name, across every gateway process, for a bounded
time. A person's upstream token is refreshed by whoever holds `rf:<upstream>:<principal>`
(proxy.connect.manager), so two replicas never spend the same refresh token twice (an
authorization server that rotates refresh tokens refuses the second use with invalid_grant).

A lease ends when its holder releases it or when its time to live runs out (a holder that died
holds nothing for long). Release is by the token `acquire` returned, so a holder whose lease
ran out and went to someone else cannot end the new holder's.

A Redis store keeps `ls:<name>` = the token (SET NX PX ttl): `acquire` is that one command,
`release` one Lua compare-and-delete. The memory store is a dictionary of (token, expiry): one
process only, where the callers already share one refresh (proxy.singleflight).

`by_one_holder` is the pattern both users follow: the holder does the work and stores its
outcome in the database; everyone else watches the database for it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from proxy.errors import StoreUnavailable

if TYPE_CHECKING:
    from proxy.state.shared import Shared

log = logging.getLogger("tollhouse.state")
T = TypeVar("T")


class LeaseStore(Protocol):
    async def acquire(self, name: str, ttl_s: float) -> str | None:
        """A token when this caller now holds `name` for `ttl_s`; None while another does."""

    async def release(self, name: str, token: str) -> None:
        """End the lease `token` holds on `name`; nothing if it ran out or is another's."""


class MemoryLeases:
    """Leases in one process. `acquire` has no await, so it runs whole. At most `max_leases`
    are held: past that, the ones that ran out go first, then the oldest."""

    def __init__(self, max_leases: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._held: dict[str, tuple[str, float]] = {}
        self._max = max_leases
        self._clock = clock

    async def acquire(self, name: str, ttl_s: float) -> str | None:
        now = self._clock()
        held = self._held.get(name)
        if held is not None and held[1] > now:
            return None
        token = secrets.token_hex(16)
        self._held.pop(name, None)  # re-inserted last: the dictionary stays oldest first
        self._held[name] = (token, now + ttl_s)
        if len(self._held) > self._max:
            for stale in [k for k, (_, until) in self._held.items() if until <= now]:
                del self._held[stale]
            while len(self._held) > self._max:
                del self._held[next(iter(self._held))]
        return token

    async def release(self, name: str, token: str) -> None:
        held = self._held.get(name)
        if held is not None and held[0] == token:
            del self._held[name]


_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class RedisLeases:
    """Leases every process shares: SET NX PX to take one, compare-and-delete to end it."""

    def __init__(self, shared: Shared) -> None:
        self._shared = shared
        self._prefix = shared.key("ls:")
        self._release = shared.script(_RELEASE, "lease")

    async def acquire(self, name: str, ttl_s: float) -> str | None:
        token = secrets.token_hex(16)
        took = await self._shared.command("lease", "SET", self._prefix + name, token, "NX",
                                          "PX", max(1, round(ttl_s * 1000)))
        return token if took else None

    async def release(self, name: str, token: str) -> None:
        await self._release([self._prefix + name], [token])


async def by_one_holder(leases: LeaseStore, name: str, ttl_s: float, poll_s: float, *,
                        work: Callable[[], Awaitable[T]],
                        look: Callable[[], Awaitable[T | None]],
                        gave_up: Callable[[], Exception]) -> T:
    """`work()` done by one process at a time across all of them: whoever holds the lease
    `name` does it (and, first, looks whether someone else has already: `work` checks);
    every other process polls `look()` every `poll_s` until it finds the holder's outcome
    (None: not there yet), and takes the lease itself if the holder lets it go without one
    (or dies, and the lease runs out). `gave_up()` is raised after twice `ttl_s` of holders
    coming and going with no outcome. A lease store that is away raises StoreUnavailable."""
    deadline = time.monotonic() + 2 * ttl_s
    while True:
        held = await leases.acquire(name, ttl_s)
        if held is not None:
            try:
                return await work()
            finally:
                await _release(leases, name, held, ttl_s)
        found = await look()
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            raise gave_up()
        await asyncio.sleep(poll_s)


async def _release(leases: LeaseStore, name: str, held: str, ttl_s: float) -> None:
    """The work is over either way; a lease that cannot be released runs out by itself, so
    its outcome stands."""
    try:
        await leases.release(name, held)
    except StoreUnavailable as exc:
        log.warning("a lease (%s) was not released (%s); it runs out within %.0f s",
                    name.split(":", 1)[0], exc, ttl_s)
