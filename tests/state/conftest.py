"""One fixture, `backend`, builds every kind of store on one clock: the contract tests in this
package run against each backend in `BACKENDS` alike, memory and the Redis at 127.0.0.1:6379
(each test under a fresh key prefix). Redis's clock cannot be moved, so the Redis backend's
`advance` moves its keys instead: every key's time to live shortens by that much (a key whose
time runs out is deleted), and a rate-limit bucket's arrival time moves back by as much. Real
time passes too (microseconds per call), so a duration read back from Redis is compared within
`tolerance`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.config import LockoutConfig
from proxy.state.browser import BrowserSessions, MemoryBrowserSessions, RedisBrowserSessions
from proxy.state.codes import CodeStore, MemoryCodeStore, RedisCodeStore
from proxy.state.flows import FlowStore, MemoryFlowStore, RedisFlowStore
from proxy.state.learned import BridgeStore, MemoryBridgeStore, RedisBridgeStore
from proxy.state.lockouts import LockoutStore, MemoryLockoutStore, RedisLockoutStore
from proxy.state.ratelimit import MemoryRateLimitStore, RateLimitStore, RedisRateLimitStore
from proxy.state.resumable import MemoryResumable, RedisResumable, ResumableStore
from proxy.state.revocations import MemoryRevocationStore, RedisRevocationStore, RevocationStore
from proxy.state.rotations import MemoryRotationStore, RedisRotationStore, RotationStore
from proxy.state.sessions import MemorySessionStore, RedisSessionStore, SessionStore
from proxy.state.shared import Shared
from proxy.state.tasks import MemoryTaskStore, RedisTaskStore, TaskStore
from tests import state_backends
from tests.helpers import Clock


class MemoryBackend:
    """The memory stores, all on one fake clock that `advance` moves."""

    tolerance = 1e-9

    def __init__(self) -> None:
        self.clock = Clock()

    async def aclose(self) -> None:
        pass

    def sessions(self, idle_timeout_s: float) -> SessionStore:
        return MemorySessionStore(idle_timeout_s, 1000, self.clock)

    def bridge(self, session_ttl_s: float) -> BridgeStore:
        return MemoryBridgeStore(session_ttl_s, clock=self.clock)

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def lockouts(self, **cfg: Any) -> LockoutStore:
        return MemoryLockoutStore(LockoutConfig(**cfg), self.clock)

    def browser_sessions(self, ttl_s: float) -> BrowserSessions:
        return MemoryBrowserSessions(ttl_s, self.clock)

    def codes(self, ttl_s: float, used_ttl_s: float) -> CodeStore:
        return MemoryCodeStore(ttl_s, used_ttl_s, clock=self.clock)

    def revocations(self, ttl_s: float) -> RevocationStore:
        return MemoryRevocationStore(ttl_s, clock=self.clock)

    def rotations(self, grace_s: float) -> RotationStore:
        return MemoryRotationStore(grace_s, clock=self.clock)

    def flows(self, ttl_s: float) -> FlowStore:
        return MemoryFlowStore(ttl_s, clock=self.clock)

    def rate_limits(self) -> RateLimitStore:
        return MemoryRateLimitStore(clock=self.clock)

    def resumable(self) -> ResumableStore:
        return MemoryResumable(clock=self.clock)

    def tasks(self) -> TaskStore:
        return MemoryTaskStore(clock=self.clock)


# ARGV: the prefix, the milliseconds to move by, the rate-limit buckets' prefix
_TIME_TRAVEL = """
local cursor, moved = '0', tonumber(ARGV[2])
repeat
  local page = redis.call('SCAN', cursor, 'MATCH', ARGV[1] .. '*', 'COUNT', 1000)
  cursor = page[1]
  for _, key in ipairs(page[2]) do
    local ttl = redis.call('PTTL', key)
    if ttl > 0 and ttl <= moved then
      redis.call('DEL', key)
    elseif ttl > 0 and string.sub(key, 1, #ARGV[3]) == ARGV[3] then
      local tat = tonumber(redis.call('GET', key)) - moved * 1000
      redis.call('SET', key, string.format('%d', tat), 'PX', ttl - moved)
    elseif ttl > 0 then
      redis.call('PEXPIRE', key, ttl - moved)
    end
  end
until cursor == '0'
return 0
"""


class RedisBackend:
    """The Redis stores on one connection, under a fresh key prefix."""

    tolerance = 0.05

    def __init__(self) -> None:
        self.prefix = state_backends.fresh_prefix()
        self.shared = Shared(state_backends.REDIS_URL, self.prefix, timeout_s=5.0)
        self.clock = Clock()  # what a store keeps in this process (the locks it met) runs on it
        self._travel = self.shared.script(_TIME_TRAVEL, "test")

    async def aclose(self) -> None:
        await self.shared.aclose()

    async def advance(self, seconds: float) -> None:
        await self._travel((), [self.prefix, round(seconds * 1000), self.prefix + "rl:"])
        self.clock.advance(seconds)

    def sessions(self, idle_timeout_s: float) -> SessionStore:
        return RedisSessionStore(self.shared, idle_timeout_s)

    def bridge(self, session_ttl_s: float) -> BridgeStore:
        return RedisBridgeStore(self.shared, session_ttl_s)

    def lockouts(self, **cfg: Any) -> LockoutStore:
        return RedisLockoutStore(self.shared, LockoutConfig(**cfg), self.clock)

    def browser_sessions(self, ttl_s: float) -> BrowserSessions:
        return RedisBrowserSessions(self.shared, ttl_s)

    def codes(self, ttl_s: float, used_ttl_s: float) -> CodeStore:
        return RedisCodeStore(self.shared, ttl_s, used_ttl_s)

    def revocations(self, ttl_s: float) -> RevocationStore:
        return RedisRevocationStore(self.shared, ttl_s)

    def rotations(self, grace_s: float) -> RotationStore:
        return RedisRotationStore(self.shared, grace_s)

    def flows(self, ttl_s: float) -> FlowStore:
        return RedisFlowStore(self.shared, "test", ttl_s)

    def rate_limits(self) -> RateLimitStore:
        return RedisRateLimitStore(self.shared)

    def resumable(self) -> ResumableStore:
        return RedisResumable(self.shared)

    def tasks(self) -> TaskStore:
        return RedisTaskStore(self.shared)


Backend = MemoryBackend | RedisBackend


def within(backend: Backend, seconds: float) -> Any:
    """`seconds`, as near as the backend's clock can say."""
    return pytest.approx(seconds, abs=backend.tolerance)
BACKENDS: dict[str, type[Backend]] = {"memory": MemoryBackend, "redis": RedisBackend}


@pytest.fixture(params=sorted(BACKENDS))
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    made = BACKENDS[request.param]()
    try:
        yield made
    finally:
        await made.aclose()

