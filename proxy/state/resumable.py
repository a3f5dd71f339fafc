"""What a call's answer needs when it reaches the client on a resumed stream.

An upstream that keeps its SSE events (an event store) lets a client whose POST stream broke
resume it: a GET with `Last-Event-ID`, answered by the upstream with what it sent after that
event, the call's answer included. That GET may land on any replica, after the one that ran the
call has died, so the replica that runs a resumable call leaves what the answer's record needs
here (`Resumable.remember`: the call's method, tool, ids, note; never an argument) before the
client holds an event id to resume with, and marks it once the call's own record is written
(`settled`). The replica that sees the answer on a resumed stream `claim`s the entry: an open
one is its to record (once, across replicas), a settled one was recorded by the call's own
replica, and none at all is a call nobody can vouch for (its answer is withheld).

An entry is a state byte and the context's JSON: `0` open, `1` answered and recorded, `2` ended
unanswered (cancelled or failed) and recorded. A Redis store keeps `ra:<digest of the call
key>` (SET PX); `claim` is one Lua script (GET; an open entry is marked answered in place,
its expiry kept); `settled` one script setting the state byte of an entry that is there
(SETRANGE: its expiry kept).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from cachetools import TTLCache

if TYPE_CHECKING:
    from proxy.state.shared import Shared

OPEN, ANSWERED, UNANSWERED = b"0", b"1", b"2"


@dataclass(frozen=True, slots=True)
class Claimed:
    """What `claim` found: the call's context, and whether this claim is the one that must
    record the answer (`open`), or it was recorded already as answered (`state` ANSWERED) or
    as ended without an answer (UNANSWERED)."""

    context: dict[str, Any]
    state: bytes

    @property
    def open(self) -> bool:
        return self.state == OPEN


class ResumableStore(Protocol):
    async def remember(self, key: str, context: dict[str, Any], ttl_s: float) -> None:
        """Keep a call's context, open, for `ttl_s`."""

    def settled(self, key: str, answered: bool) -> None:
        """The call's own record is written: answered or not. Sent without waiting (a lost
        mark leaves the entry open, and the answer at most recorded twice)."""

    async def claim(self, key: str) -> Claimed | None:
        """The entry, marked answered if it was open (at most one claim finds it open);
        None when there is none."""


class MemoryResumable:
    """Entries in one process: no await between the read and the mark, so a claim is whole."""

    def __init__(self, max_entries: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        # per-entry expiry: the entry's own deadline, checked on read
        self._entries: TTLCache[str, tuple[float, bytes, dict[str, Any]]] = TTLCache(
            maxsize=max_entries, ttl=86_400.0, timer=clock)
        self._clock = clock

    async def remember(self, key: str, context: dict[str, Any], ttl_s: float) -> None:
        self._entries[key] = (self._clock() + ttl_s, OPEN, context)

    def settled(self, key: str, answered: bool) -> None:
        held = self._entries.get(key)
        if held is not None:
            self._entries[key] = (held[0], ANSWERED if answered else UNANSWERED, held[2])

    async def claim(self, key: str) -> Claimed | None:
        held = self._entries.get(key)
        if held is None or held[0] <= self._clock():
            return None
        if held[1] == OPEN:
            self._entries[key] = (held[0], ANSWERED, held[2])
        return Claimed(held[2], held[1])


_CLAIM = """
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, 1) == '0' then
  redis.call('SETRANGE', KEYS[1], 0, '1')
end
return held
"""


_SETTLE = "if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('SETRANGE', KEYS[1], 0, " \
    "ARGV[1]) end"


class RedisResumable:
    """Entries every replica sees: the replica that serves the resumed stream is rarely the
    one that ran the call."""

    STORE = "resumable"

    def __init__(self, shared: Shared) -> None:
        self._shared = shared
        self._prefix = shared.key("ra:")
        self._claim = shared.script(_CLAIM, self.STORE)

    def _key(self, key: str) -> str:
        return self._prefix + hashlib.sha256(key.encode()).hexdigest()[:32]

    async def remember(self, key: str, context: dict[str, Any], ttl_s: float) -> None:
        await self._shared.command(self.STORE, "SET", self._key(key),
                                   OPEN + orjson.dumps(context), "PX",
                                   max(1, round(ttl_s * 1000)))

    def settled(self, key: str, answered: bool) -> None:
        # (EVAL of a few bytes, not EVALSHA: nobody reads the reply, so a NOSCRIPT would go
        # unseen)
        self._shared.ask(self.STORE, "EVAL", _SETTLE, 1, self._key(key),
                         ANSWERED if answered else UNANSWERED).drop()

    async def claim(self, key: str) -> Claimed | None:
        held = await self._claim([self._key(key)])
        if not held:
            return None
        return Claimed(orjson.loads(held[1:]), held[:1])
