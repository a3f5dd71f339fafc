"""One fixture, `backend`, builds every kind of store on one clock: the contract tests in this
package run against each backend in `BACKENDS` alike. A shared backend (Redis) joins by adding
a class with the same methods, each store under a fresh key prefix; its `advance` cannot move
Redis's clock, so it builds its stores with short lifetimes and waits them out, or gives its
scripts a test offset."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config import LockoutConfig
from proxy.state.browser import BrowserSessions, MemoryBrowserSessions
from proxy.state.codes import CodeStore, MemoryCodeStore
from proxy.state.flows import FlowStore, MemoryFlowStore
from proxy.state.lockouts import LockoutStore, MemoryLockoutStore
from proxy.state.ratelimit import MemoryRateLimitStore, RateLimitStore
from proxy.state.revocations import MemoryRevocationStore, RevocationStore
from tests.helpers import Clock


class MemoryBackend:
    """The memory stores, all on one fake clock that `advance` moves."""

    def __init__(self) -> None:
        self.clock = Clock()

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

    def flows(self, ttl_s: float) -> FlowStore:
        return MemoryFlowStore(ttl_s, clock=self.clock)

    def rate_limits(self) -> RateLimitStore:
        return MemoryRateLimitStore(clock=self.clock)


BACKENDS = {"memory": MemoryBackend}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> MemoryBackend:
    return BACKENDS[request.param]()

