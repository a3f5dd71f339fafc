"""Live state behind small interfaces: sessions and the in-flight calls that can be cancelled.

One process keeps them in memory; a shared store (Redis) can replace the implementations
without touching the edge.
"""

from proxy.state.inflight import CallHandle, InFlightRegistry, MemoryInFlight
from proxy.state.sessions import MemorySessionStore, Session, SessionStore

__all__ = ["CallHandle", "InFlightRegistry", "MemoryInFlight", "MemorySessionStore", "Session",
           "SessionStore"]
