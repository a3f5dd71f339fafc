"""The live state a gateway shares between requests, built once at start-up from `[state]`.

`open_stores` is the one place a store is made: `url = "memory"` keeps everything in this
process (one gateway process; the default); `redis://` or `rediss://` puts every store in one
Redis that all the gateway processes of a deployment share (`proxy.state.shared`), under
`key_prefix`: each store's Redis twin sits beside its memory one in the store's module, each
decision one atomic command or Lua script, and every Redis failure is
`proxy.errors.StoreUnavailable` (503).

The in-flight registry's handles are always local (a call's task); what Redis shares is the
cancel, published on one channel to the replica that runs the call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.state.approvals import ApprovalStore, MemoryApprovals, RedisApprovals
from proxy.state.browser import BrowserSessions, MemoryBrowserSessions, RedisBrowserSessions
from proxy.state.codes import CodeStore, MemoryCodeStore, RedisCodeStore
from proxy.state.flows import FlowStore, MemoryFlowStore, RedisFlowStore
from proxy.state.inflight import InFlightRegistry, MemoryInFlight, SharedInFlight
from proxy.state.learned import BridgeStore, MemoryBridgeStore, RedisBridgeStore
from proxy.state.leases import LeaseStore, MemoryLeases, RedisLeases
from proxy.state.lockouts import LockoutStore, MemoryLockoutStore, RedisLockoutStore
from proxy.state.ratelimit import MemoryRateLimitStore, RateLimitStore, RedisRateLimitStore
from proxy.state.resumable import MemoryResumable, RedisResumable, ResumableStore
from proxy.state.revocations import MemoryRevocationStore, RedisRevocationStore, RevocationStore
from proxy.state.rotations import MemoryRotationStore, RedisRotationStore, RotationStore
from proxy.state.sessions import MemorySessionStore, RedisSessionStore, SessionStore
from proxy.state.shared import Shared
from proxy.state.tasks import MemoryTaskStore, RedisTaskStore, TaskStore

if TYPE_CHECKING:
    from proxy.config import Config

SCHEMES = ("memory", "redis", "rediss")
FLOW_TTL_S = 600.0  # a sign-in, connect or consent left half done is forgotten after this
REVOCATION_MARGIN_S = 60.0  # clock skew a revoked token's entry outlives its lifetime by
BRIDGE_SESSION_TTL_S = 1800.0  # an upstream session held for a sessionless caller, idle


@dataclass(frozen=True)
class Stores:
    sessions: SessionStore
    inflight: InFlightRegistry
    bridge: BridgeStore
    rate_limits: RateLimitStore
    lockouts: LockoutStore
    browser_sessions: BrowserSessions
    codes: CodeStore
    revocations: RevocationStore
    signin_flows: FlowStore
    connect_flows: FlowStore
    consent_flows: FlowStore
    connect_links: FlowStore  # -32042 connect links, by their digest (proxy.connect.links)
    leases: LeaseStore  # who refreshes a person's upstream token (proxy.connect.manager)
    rotations: RotationStore  # refresh rotations within oauth_server.refresh_grace_s
    resumable: ResumableStore  # resumable calls' contexts (proxy/mcp/resume.py)
    tasks: TaskStore  # who created each MCP task (proxy/mcp/tasks.py)
    approvals: ApprovalStore  # calls held for a person's yes (proxy/approvals.py)
    shared: Shared | None = None  # the Redis connection, when the state is shared

    async def start(self) -> None:
        """Inside the serving loop: listen for cancels (shared state only)."""
        if isinstance(self.inflight, SharedInFlight):
            self.inflight.start()

    async def aclose(self) -> None:
        if self.shared is not None:
            await self.shared.aclose()


def open_stores(cfg: Config, clock: Callable[[], float] = time.monotonic,
                wall_clock: Callable[[], float] = time.time) -> Stores:
    """Every store for `cfg.state.url`; `clock` is for the memory stores (tests move it),
    `wall_clock` for the memory approvals (their times are shown and compared as dates)."""
    url = cfg.state.url
    if url.partition(":")[0] not in SCHEMES:  # the config refuses any other at load time
        raise ValueError(f"state.url is not one of {', '.join(SCHEMES)}")
    oauth = cfg.oauth_server
    if cfg.state.shared:
        return _redis_stores(cfg)
    return Stores(
        sessions=MemorySessionStore(cfg.server.session_idle_timeout_s, cfg.server.max_sessions,
                                    clock),
        inflight=MemoryInFlight(),
        bridge=MemoryBridgeStore(BRIDGE_SESSION_TTL_S, clock=clock),
        rate_limits=MemoryRateLimitStore(max_keys=100_000, clock=clock),
        lockouts=MemoryLockoutStore(cfg.auth.lockout, clock),
        browser_sessions=MemoryBrowserSessions(oauth.browser_session_ttl_s, clock),
        codes=MemoryCodeStore(oauth.code_ttl_s, clock=clock),
        revocations=MemoryRevocationStore(oauth.access_token_ttl_s + REVOCATION_MARGIN_S,
                                          clock=clock),
        signin_flows=MemoryFlowStore(FLOW_TTL_S, 10_000, clock),
        connect_flows=MemoryFlowStore(FLOW_TTL_S, 10_000, clock),
        consent_flows=MemoryFlowStore(FLOW_TTL_S, 100_000, clock),
        connect_links=MemoryFlowStore(cfg.server.connect_link_ttl_s, 100_000, clock),
        leases=MemoryLeases(clock=clock),
        rotations=MemoryRotationStore(oauth.refresh_grace_s, clock=clock),
        resumable=MemoryResumable(clock=clock),
        tasks=MemoryTaskStore(clock=clock),
        approvals=MemoryApprovals(wall_clock),
    )


def _redis_stores(cfg: Config) -> Stores:
    oauth = cfg.oauth_server
    shared = Shared(cfg.state.url, cfg.state.key_prefix, cfg.state.timeout_s)
    return Stores(
        sessions=RedisSessionStore(shared, cfg.server.session_idle_timeout_s),
        inflight=SharedInFlight(shared),
        bridge=RedisBridgeStore(shared, BRIDGE_SESSION_TTL_S),
        rate_limits=RedisRateLimitStore(shared),
        lockouts=RedisLockoutStore(shared, cfg.auth.lockout),
        browser_sessions=RedisBrowserSessions(shared, oauth.browser_session_ttl_s),
        codes=RedisCodeStore(shared, oauth.code_ttl_s),
        revocations=RedisRevocationStore(shared,
                                         oauth.access_token_ttl_s + REVOCATION_MARGIN_S),
        signin_flows=RedisFlowStore(shared, "signin", FLOW_TTL_S),
        connect_flows=RedisFlowStore(shared, "connect", FLOW_TTL_S),
        consent_flows=RedisFlowStore(shared, "consent", FLOW_TTL_S),
        connect_links=RedisFlowStore(shared, "link", cfg.server.connect_link_ttl_s),
        leases=RedisLeases(shared),
        rotations=RedisRotationStore(shared, oauth.refresh_grace_s),
        resumable=RedisResumable(shared),
        tasks=RedisTaskStore(shared),
        approvals=RedisApprovals(shared),
        shared=shared,
    )
