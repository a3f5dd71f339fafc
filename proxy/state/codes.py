"""OAuth authorization codes: each taken once, and a code presented again is recognised as
reused for a while after, so what its first use produced can be revoked (RFC 9700).

A Redis store keeps `oc:<code>` (a hash of the grant's JSON and its tag, SET PX code TTL) and
`oc:u:<code>` (the tag, once taken). `put` is one HSET + PEXPIRE in a MULTI; `take` one Lua
script: HGETALL the code; if it is there, DEL it, SET the used marker PX used TTL and return
the grant; else return GET of the used marker. Two replicas exchanging one code at once: one
gets the grant, the other the tag.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from cachetools import TTLCache


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
