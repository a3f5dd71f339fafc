"""OAuth authorization codes: each taken once, and a code presented again is recognised as
reused for a while after, so what its first use produced can be revoked (RFC 9700).

A Redis store keeps `oc:c:<code>` (the grant's JSON and its tag, SET PX code TTL) and
`oc:u:<code>` (the tag, once taken): two kinds neither of which begins the other, so no code a
client sends names a used marker. `put` is one SET; `take` one Lua script: GET the code; if
it is there, DEL it, SET the used marker PX used TTL and return the grant; else return GET of
the used marker. Two replicas exchanging one code at once: one
gets the grant, the other the tag.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import orjson
from cachetools import TTLCache

if TYPE_CHECKING:
    from proxy.state.shared import Shared


class Taken(NamedTuple):
    """What `take` found: the grant when this call took the code; otherwise, when the code
    was taken before (and not long ago), the tag its first taker left."""

    grant: dict[str, Any] | None
    used_tag: str | None = None


class CodeStore(Protocol):
    async def put(self, code: str, grant: dict[str, Any], tag: str) -> None:
        """Keep a fresh code's grant (a JSON object) for the code lifetime; `tag` is what a
        later reuse is told (the token family the code produces)."""

    async def take(self, code: str) -> Taken:
        """The code's grant, at most once across every caller; see `Taken`."""


class MemoryCodeStore:
    """Codes in one process. `take` has no await, so it runs whole: a code is taken once."""

    def __init__(self, ttl_s: float, used_ttl_s: float = 600.0, max_codes: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._codes: TTLCache[str, tuple[dict[str, Any], str]] = TTLCache(
            maxsize=max_codes, ttl=ttl_s, timer=clock)
        self._used: TTLCache[str, str] = TTLCache(maxsize=max_codes, ttl=used_ttl_s, timer=clock)

    async def put(self, code: str, grant: dict[str, Any], tag: str) -> None:
        self._codes[code] = (grant, tag)

    async def take(self, code: str) -> Taken:
        held = self._codes.pop(code, None)
        if held is None:
            return Taken(None, self._used.get(code))
        self._used[code] = held[1]
        return Taken(held[0])


_TAKE = """
local held = redis.call('GET', KEYS[1])
if held then
  redis.call('DEL', KEYS[1])
  local tag = cjson.decode(held)[2]
  redis.call('SET', KEYS[2], tag, 'PX', ARGV[1])
  return {1, held}
end
return {0, redis.call('GET', KEYS[2])}
"""


class RedisCodeStore:
    """Codes shared by every process: a code is taken once across all of them."""

    def __init__(self, shared: Shared, ttl_s: float, used_ttl_s: float = 600.0) -> None:
        self._shared = shared
        self._codes = shared.key("oc:c:")
        self._used = shared.key("oc:u:")
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._used_ttl_ms = max(1, round(used_ttl_s * 1000))
        self._take = shared.script(_TAKE, "authorization-code")

    async def put(self, code: str, grant: dict[str, Any], tag: str) -> None:
        await self._shared.command("authorization-code", "SET", self._codes + code,
                                   orjson.dumps((grant, tag)), "PX", self._ttl_ms)

    async def take(self, code: str) -> Taken:
        took, value = await self._take([self._codes + code, self._used + code],
                                       [self._used_ttl_ms])
        if took:
            return Taken(orjson.loads(value)[0])
        return Taken(None, value.decode() if value else None)
