"""Live state behind small async interfaces, one module per kind: MCP sessions, the in-flight
calls that can be cancelled, the legacy sessions the bridge holds, rate-limit buckets,
auth-failure lockouts, browser sessions, OAuth codes, revocations and refresh rotations,
pending browser flows, token-refresh leases, and resumable calls' contexts.

Every store is built once at start-up by `open_stores` from `[state] url`; no other module
keeps shared live state of its own. Stores own time: no caller passes a clock reading in.
"""

from proxy.state.inflight import CallHandle, InFlightRegistry, MemoryInFlight
from proxy.state.sessions import MemorySessionStore, Session, SessionStore
from proxy.state.stores import Stores, open_stores

__all__ = ["CallHandle", "InFlightRegistry", "MemoryInFlight", "MemorySessionStore", "Session",
           "SessionStore", "Stores", "open_stores"]
