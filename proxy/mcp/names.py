"""The tools and prompts an upstream has, so that a name it does not have is answered by the
gateway exactly as a name the caller may not use (HTTP 400, -32602, "Unknown tool: x", no
data: policies/access.py's `HiddenTool`), on every endpoint kind. Were an unknown name passed
on, the upstream's own answer (a 200 with an error result, say) would tell a caller which
names are hidden from it.

On a plain endpoint the names are learned from every tools/list and prompts/list the gateway
relays, before any rule filters it (`Forwarder.call` gives the leg a `learn` that reads the
result first), per upstream identity: per upstream state key (a per-caller URL's upstream has
its own), and per caller too where an upstream may list different names to different callers
(a person's own token, a local process, an upstream told who calls). A name is unknown only
when a whole list (every page) was seen and the name is not on it; before that answer, the
name is looked for in a fresh list, at most once per RELIST_S per caller (`Relists`, which a
virtual endpoint uses as well): a tool the upstream adds later is found, and a caller sending
names nobody has costs the upstream one list a while, not one per call. A name that was
listed costs one dict lookup.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from proxy.chain import Rewrite
from proxy.jsonrpc import McpMessage
from proxy.singleflight import SingleFlight

RELIST_S = 2.0  # a caller's missed name is looked for in a fresh list at most this often
MAX_KEYS = 4096  # identities (and callers' last looks) kept; emptied when full
MAX_NAMES = 10_000  # of one upstream's list: a longer one is kept as "cannot tell"
MAX_PAGES = 32  # followed by a fresh list; a longer list is not seen whole

# a method naming a tool or prompt -> (its kind, the list that names them)
CALLS = {"tools/call": ("tool", "tools/list"), "prompts/get": ("prompt", "prompts/list")}
# a list -> (the kind it names, the key in its result)
LISTS = {"tools/list": ("tool", "tools"), "prompts/list": ("prompt", "prompts")}
NOUNS = {"tool": "Unknown tool: ", "prompt": "Unknown prompt: ", "uri": "Resource not found: "}

Identity = tuple[str, str, str]  # (upstream state key, caller or "", kind)


def unknown(kind: str, name: str) -> str:
    """What a name nothing answers to is answered with: the text policies/access.py gives a
    hidden one, so that a caller cannot tell the two apart."""
    return NOUNS[kind] + name


def listed_names(result: dict[str, Any], key: str, field: str = "name") -> list[str] | None:
    """The names a list result gives; None when it is no list (no `key` array)."""
    items = result.get(key)
    if not isinstance(items, list):
        return None
    return [i[field] for i in items if isinstance(i, dict) and isinstance(i.get(field), str)]


class Relists:
    """Whether a caller's missed name may be looked for in a fresh list now: at most once per
    RELIST_S per key (its callers' keys kept at most MAX_KEYS, forgotten all at once)."""

    def __init__(self) -> None:
        self._last: dict[Hashable, float] = {}

    def may(self, key: Hashable, now: float) -> bool:
        last = self._last.get(key)
        if last is not None and now - last < RELIST_S:
            return False
        if len(self._last) >= MAX_KEYS:
            self._last.clear()
        self._last[key] = now
        return True


@dataclass(slots=True)
class _Listed:
    names: set[str]
    whole: bool  # every page of a list was seen: a name not in `names` is unknown


class Names:
    """The names each plain upstream identity listed, and its fresh lists in flight."""

    def __init__(self) -> None:
        self._listed: dict[Identity, _Listed] = {}
        self.relists = Relists()
        # one fresh list per identity at a time, whoever asks meanwhile waits for it; in a
        # task of its own, so the first asker going away ends it for nobody
        self._looking: SingleFlight[Identity, None] = SingleFlight(detached=True)

    @staticmethod
    def identity(state_key: str, caller: str | None, kind: str) -> Identity:
        return state_key, caller or "", kind

    def known(self, identity: Identity, name: str) -> bool | None:
        """True: listed; False: not on a whole list; None: cannot tell (no whole list seen)."""
        listed = self._listed.get(identity)
        if listed is None:
            return None
        if name in listed.names:
            return True
        return False if listed.whole else None

    def learn(self, identity: Identity, names: Iterable[str], *, whole: bool) -> None:
        """A whole list replaces what was known; a page adds to it (a list is not known
        whole from its pages: they may come from different listings)."""
        names = set(names)
        listed = self._listed.get(identity)
        if whole:
            if len(names) > MAX_NAMES:
                self._listed.pop(identity, None)
                return
            if listed is None and len(self._listed) >= MAX_KEYS:
                self._listed.clear()
            self._listed[identity] = _Listed(names, True)
        elif listed is not None:
            if len(listed.names) + len(names) > MAX_NAMES:
                listed.whole = False
            else:
                listed.names |= names

    def reader(self, identity: Identity, msg: McpMessage) -> Rewrite:
        """What a relayed list's result is read with, before any rule filters it: a result
        with no cursor asked or given is the whole list."""
        kind_key = LISTS[msg.method or ""][1]
        paged = bool((msg.params or {}).get("cursor"))

        def read(result: dict[str, Any]) -> bool:
            listed = listed_names(result, kind_key)
            if listed is not None:
                whole = not paged and not result.get("nextCursor")
                self.learn(identity, listed, whole=whole)
            return False

        return read

    def may_look(self, identity: Identity, caller: str, now: float) -> bool:
        """Whether a name `caller` missed is looked for in a fresh list now: one is in flight
        (waited for), or this caller did not look within RELIST_S (counted as looking)."""
        return self._looking.running(identity) or self.relists.may((identity, caller), now)

    async def look(self, identity: Identity, fresh: Callable[[], Awaitable[None]]) -> None:
        """Run `fresh` (a fresh list, learned), or wait for the one in flight."""
        await self._looking.run(identity, fresh)

    async def look_again(self, identity: Identity, caller: str, now: float,
                         fresh: Callable[[], Awaitable[None]]) -> None:
        """`look`, if `may_look`."""
        if self.may_look(identity, caller, now):
            await self.look(identity, fresh)
