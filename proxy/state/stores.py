"""The live state a gateway shares between requests, built once at start-up from `[state]`.

`open_stores` is the one place a store is made: `url = "memory"` keeps everything in this
process (one gateway process; the default). A shared backend (`redis://...`, a later step)
implements the same interfaces, each decision in one atomic command or script, and maps its
client's errors to `proxy.errors.StoreUnavailable` at its edge.

The in-flight registry's handles are always local (a call's task); what a shared backend
shares is the cancel, published to the replica that runs the call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.state.bridge import BridgeStore, MemoryBridgeStore
from proxy.state.browser import BrowserSessions, MemoryBrowserSessions
from proxy.state.codes import CodeStore, MemoryCodeStore
from proxy.state.flows import FlowStore, MemoryFlowStore
from proxy.state.inflight import InFlightRegistry, MemoryInFlight
from proxy.state.lockouts import LockoutStore, MemoryLockoutStore
from proxy.state.ratelimit import MemoryRateLimitStore, RateLimitStore
from proxy.state.revocations import MemoryRevocationStore, RevocationStore
from proxy.state.sessions import MemorySessionStore, SessionStore

if TYPE_CHECKING:
    from proxy.config import Config

SCHEMES = ("memory",)
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


def open_stores(cfg: Config, clock: Callable[[], float] = time.monotonic) -> Stores:
    """Every store for `cfg.state.url`; `clock` is for the memory stores (tests move it)."""
    url = cfg.state.url
    if url != "memory":  # the config refuses any other at load time
        raise ValueError(f"state.url {url!r} is not one of {', '.join(SCHEMES)}")
    oauth = cfg.oauth_server
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
    )
