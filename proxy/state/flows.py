"""Pending browser flows: an OIDC sign-in between the redirect to the provider and its
callback, a per-user connect flow between the redirect to the upstream's authorization server
and its callback, and a consent form between showing it and its answer. Each is put under a
random key with the binding of the browser (or person) that started it, and taken once by the
same binding before it expires; a take by another binding is refused and leaves the flow for
its owner. One interface serves all three; each kind has its own store (and, in memory, its
own bound), so a flood of one cannot push out the others.

A Redis store keeps `fl:<kind>:<key>` as a hash {binding, value (JSON)} with PEXPIRE ttl
(`put`: one MULTI); `take` is one Lua script: HGET the binding; none: nil; another: "foreign";
the same: DEL and return the value. Callers pass bindings that are digests, never a cookie.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from typing import Protocol

from cachetools import TTLCache


class ForeignFlow(Exception):
    """The flow exists, but another browser or person started it; it is left in place."""


class FlowStore(Protocol):
    async def put(self, key: str, binding: str, value: dict[str, str]) -> None:
        """Keep a new flow for the store's lifetime."""

    async def take(self, key: str, binding: str) -> dict[str, str] | None:
        """The flow's value, used up; None if it is unknown, expired or used. Raises
        ForeignFlow, and keeps the flow, when `binding` is not the one it was put with."""


class MemoryFlowStore:
    """Flows in one process, `ttl_s` each, at most `max_flows` (then the least recently put goes). `take`
    has no await, so it runs whole: a flow is taken once."""

    def __init__(self, ttl_s: float = 600.0, max_flows: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._flows: TTLCache[str, tuple[str, dict[str, str]]] = TTLCache(
            maxsize=max_flows, ttl=ttl_s, timer=clock)

    async def put(self, key: str, binding: str, value: dict[str, str]) -> None:
        self._flows[key] = (binding, value)

    async def take(self, key: str, binding: str) -> dict[str, str] | None:
        held = self._flows.get(key)
        if held is None:
            return None
        if not hmac.compare_digest(held[0].encode(), binding.encode()):
            raise ForeignFlow(key)
        del self._flows[key]
        return held[1]

    def __len__(self) -> int:
        return len(self._flows)
