"""The targets the policies are validated and decided against, as the gateway learns them: the
tools and prompts each endpoint lists (name, `inputSchema`, annotations), kept across reloads.

A `TargetBook` starts from what was stored (the tools as last seen, `proxy.seen`) and learns
from every `tools/list` and `prompts/list` answer the Cedar gate filters. A change (a tool
added, removed, or its schema or hints changed) moves `version`, and each gate rebuilds its
catalog and revalidates its policies against it once, on the next call that reads it. Learning
is per endpoint and whole: a list answer replaces what the endpoint listed before (a first
page adds to it: cursors page long lists). Framework-free; its owner persists it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from policies.cedar.schema import Target

MAX_TARGETS = 2000  # of one endpoint and kind: the rest is not learned
_KINDS = {"tools/list": ("tools", "Tool"), "prompts/list": ("prompts", "Prompt")}


def _key(target: Target) -> tuple[Any, ...]:
    """What makes two sightings of a target the same (its schema and hints, not the order)."""
    return (target.kind, target.uid, repr(sorted((target.input_schema or {}).items())),
            repr(sorted(target.annotations.items())))


class TargetBook:
    """The learned targets; thread-safe for the one writer a process has (the event loop)
    and the readers building catalogs. `on_change(endpoint, kind, targets)` hears each
    change (the runtime stores it)."""

    def __init__(self, targets: Iterable[Target] = (),
                 on_change: Callable[[str, str, list[Target]], None] | None = None) -> None:
        self._by: dict[tuple[str, str], dict[str, Target]] = {}
        for target in targets:
            self._by.setdefault((target.endpoint, target.kind), {})[target.name] = target
        self._lock = threading.Lock()
        self._on_change = on_change
        self.version = 0

    def targets(self) -> list[Target]:
        with self._lock:
            return [t for names in self._by.values() for t in names.values()]

    def knows(self, kind: str, endpoint: str, name: str) -> bool:
        names = self._by.get((endpoint, kind))
        return names is not None and name in names

    def learn(self, method: str, endpoint: str, result: Mapping[str, Any],
              first_page: bool) -> bool:
        """Take one list answer (`method` tools/list or prompts/list); True when it changed
        what is known."""
        found = _KINDS.get(method)
        items = result.get(found[0]) if found else None
        if found is None or not isinstance(items, list):
            return False
        kind = found[1]
        seen: dict[str, Target] = {}
        for item in items:
            if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
                continue
            target = Target.tool(endpoint, item) if kind == "Tool" else Target.prompt(
                endpoint, item)
            seen[target.name] = target
            if len(seen) >= MAX_TARGETS:
                break
        with self._lock:
            before = self._by.get((endpoint, kind), {})
            after = seen if first_page else {**before, **seen}
            if sorted(map(_key, before.values())) == sorted(map(_key, after.values())):
                return False
            self._by[(endpoint, kind)] = after
            self.version += 1
        if self._on_change is not None:
            self._on_change(endpoint, kind, list(after.values()))
        return True
