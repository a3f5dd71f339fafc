"""What the mirrors publish for the policies to read: the access rules and the egress
destinations of the servers and virtual endpoints added through the management API.

Each owner (the server registry, the virtual endpoints) replaces its own rows whole, and the
merged table is a new mapping each time, swapped in one assignment: a reader takes `current`
once and nothing changes it under it. A policy is given the table when it is built, so a
config reload, which builds new policies, hands them the same one and nothing is installed
again. A row unchanged since the last publication keeps what was made of it (an access rule
set's cached verdicts); `on_change` hears the names whose rows changed or went (a cache of
its own keyed by name, such as the egress pins, drops them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class Published(Generic[V]):
    def __init__(self, make: Callable[[Any], V]) -> None:
        self.current: Mapping[str, V] = {}
        self._make = make
        self._owners: dict[str, dict[str, tuple[Any, V]]] = {}
        self.on_change: list[Callable[[set[str]], None]] = []

    def publish(self, owner: str, rows: Mapping[str, Any]) -> None:
        """`owner`'s rows are now exactly `rows` (name -> what `make` is made from)."""
        before = self._owners.get(owner, {})
        made: dict[str, tuple[Any, V]] = {}
        for name, row in rows.items():
            old = before.get(name)
            made[name] = old if old is not None and old[0] == row else (row, self._make(row))
        changed = {n for n in before.keys() | made.keys() if before.get(n) is not made.get(n)}
        self._owners[owner] = made
        self.current = {name: value for rows_ in self._owners.values()
                        for name, (_, value) in rows_.items()}
        if changed:
            for listener in self.on_change:
                listener(changed)
