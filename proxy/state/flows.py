"""Pending browser flows: an OIDC sign-in between the redirect to the provider and its
callback, a per-user connect flow between the redirect to the upstream's authorization server
and its callback, and a consent form between showing it and its answer. Each is put under a
random key with the binding of the browser (or person) that started it, and taken once by the
same binding before it expires; a take by another binding is refused and leaves the flow for
its owner (`peek` reads a flow without using it up). One interface serves all three (and
the connect links of proxy.connect.links); each kind has its own store (and, in memory, its
own bound), so a flood of one cannot push out the others.

A Redis store keeps `fl:<kind>:<key>` as the JSON of [binding, value] (SET PX ttl); `take` is
one Lua script: GET it; none: nil; another binding: "foreign" (the flow stays); the same: DEL
and return the value. Callers pass bindings that are digests, never a cookie.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from cachetools import TTLCache

if TYPE_CHECKING:
    from proxy.state.shared import Shared


class ForeignFlow(Exception):
    """The flow exists, but another browser or person started it; it is left in place."""


class FlowStore(Protocol):
    async def put(self, key: str, binding: str, value: dict[str, str]) -> None:
        """Keep a new flow for the store's lifetime."""

    async def take(self, key: str, binding: str) -> dict[str, str] | None:
        """The flow's value, used up; None if it is unknown, expired or used. Raises
        ForeignFlow, and keeps the flow, when `binding` is not the one it was put with."""

    async def peek(self, key: str, binding: str) -> dict[str, str] | None:
        """`take` without using the flow up (a page that shows what a link will do before
        the person goes on)."""


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

    async def peek(self, key: str, binding: str) -> dict[str, str] | None:
        held = self._flows.get(key)
        if held is None:
            return None
        if not hmac.compare_digest(held[0].encode(), binding.encode()):
            raise ForeignFlow(key)
        return held[1]

    def __len__(self) -> int:
        return len(self._flows)


_TAKE = """
local held = redis.call('GET', KEYS[1])
if not held then return 0 end
if cjson.decode(held)[1] ~= ARGV[1] then return 1 end
redis.call('DEL', KEYS[1])
return held
"""
_PEEK = """
local held = redis.call('GET', KEYS[1])
if not held then return 0 end
if cjson.decode(held)[1] ~= ARGV[1] then return 1 end
return held
"""


class RedisFlowStore:
    """Flows shared by every process: a flow started on one replica completes on any other.
    The bindings are digests, compared inside the script (no secret is compared there)."""

    def __init__(self, shared: Shared, kind: str, ttl_s: float = 600.0) -> None:
        self._shared = shared
        self._kind = kind
        self._prefix = shared.key(f"fl:{kind}:")
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._take = shared.script(_TAKE, f"{kind}-flow")
        self._peek = shared.script(_PEEK, f"{kind}-flow")

    async def put(self, key: str, binding: str, value: dict[str, str]) -> None:
        await self._shared.command(f"{self._kind}-flow", "SET", self._prefix + key,
                                   orjson.dumps((binding, value)), "PX", self._ttl_ms)

    async def take(self, key: str, binding: str) -> dict[str, str] | None:
        return self._held(key, await self._take([self._prefix + key], [binding]))

    async def peek(self, key: str, binding: str) -> dict[str, str] | None:
        return self._held(key, await self._peek([self._prefix + key], [binding]))

    @staticmethod
    def _held(key: str, held: Any) -> dict[str, str] | None:
        if held == 0:
            return None
        if held == 1:
            raise ForeignFlow(key)
        value: dict[str, str] = orjson.loads(held)[1]
        return value
