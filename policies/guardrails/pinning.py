"""Pinned tool definitions: the first definition of each tool an upstream lists is trusted and
recorded (a SHA-256 of its name, description and schemas); a later, different definition is
`changed` until an administrator approves it (it becomes the pin) or rejects it (that exact
definition stays hidden, and is not asked about again).

The `Pins` book is the decision and the in-memory view every call reads; it is loaded from,
and writes each change through, a `PinStore` (the database, `proxy.pin_store`), without waiting
for the write: a list answer is never held up by the database. Each change is written as what
it is (`Change`), so that several processes on one database agree: a first definition is
inserted only if no other process recorded one, an approval lands only on the definition the
administrator saw; the store then replaces the view with the database's (`reload`).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import orjson

Verdict = Literal["new", "same", "changed"]
# what a save records: the first definition, a changed one waiting, a change undone by the
# upstream (back to the approved definition), an administrator's approval or rejection
Change = Literal["first", "pending", "settled", "approved", "rejected"]
PINNED_FIELDS = ("name", "description", "inputSchema", "outputSchema")


def definition(item: dict[str, Any]) -> dict[str, Any]:
    return {k: item[k] for k in PINNED_FIELDS if k in item}


def fingerprint(item: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(definition(item), option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass(slots=True)
class Pin:
    endpoint: str
    name: str
    approved: str
    definition: dict[str, Any]
    pending: str | None = None
    pending_definition: dict[str, Any] | None = None
    rejected: str | None = None
    updated_at: float = field(default_factory=time.time)


class PinStore(Protocol):
    def load(self) -> list[Pin]: ...

    def save(self, pin: Pin, change: Change) -> None:
        """Write `change`, which made `pin` (scheduled: the caller does not wait)."""


class Pins:
    def __init__(self, store: PinStore | None = None) -> None:
        self._store = store
        self._pins: dict[tuple[str, str], Pin] = {}
        self._dirty: set[tuple[str, str]] = set()  # changed here since a reload began
        if store is not None:
            self._pins = {(p.endpoint, p.name): p for p in store.load()}

    def verdict(self, endpoint: str, item: dict[str, Any]) -> Verdict:
        name = item.get("name")
        if not isinstance(name, str):
            return "changed"  # nothing to pin it by: never shown as trusted
        digest = fingerprint(item)
        pin = self._pins.get((endpoint, name))
        if pin is None:
            self._save(Pin(endpoint, name, digest, definition(item)), "first")
            return "new"
        if pin.approved == digest:
            if pin.pending is not None:  # changed back to what was approved
                pin.pending = pin.pending_definition = None
                self._save(pin, "settled")
            return "same"
        if digest not in (pin.pending, pin.rejected):
            pin.pending, pin.pending_definition = digest, definition(item)
            self._save(pin, "pending")
        return "changed"

    def pending(self) -> list[Pin]:
        return sorted((p for p in self._pins.values() if p.pending is not None),
                      key=lambda p: (p.endpoint, p.name))

    def get(self, endpoint: str, name: str) -> Pin | None:
        return self._pins.get((endpoint, name))

    def approve(self, endpoint: str, name: str) -> Pin | None:
        """The pending definition becomes the pin; None when nothing is pending."""
        pin = self._pins.get((endpoint, name))
        if pin is None or pin.pending is None or pin.pending_definition is None:
            return None
        pin.approved, pin.definition = pin.pending, pin.pending_definition
        pin.pending = pin.pending_definition = None
        pin.rejected = None
        self._save(pin, "approved")
        return pin

    def reject(self, endpoint: str, name: str) -> Pin | None:
        pin = self._pins.get((endpoint, name))
        if pin is None or pin.pending is None:
            return None
        pin.rejected, pin.pending, pin.pending_definition = pin.pending, None, None
        self._save(pin, "rejected")
        return pin

    def begin_reload(self) -> None:
        """A reload's read of the store starts now: what changes here from now on is kept
        over what it reads (it is written after the read, and the next reload sees it)."""
        self._dirty.clear()

    def reload(self, pins: list[Pin]) -> bool:
        """The view becomes `pins` (the store's, as other processes left it), but for what
        changed here since `begin_reload`; True when something was kept so (the store reads
        again once it is written: the write may not have landed as made here)."""
        fresh = {(p.endpoint, p.name): p for p in pins}
        kept = False
        for key in self._dirty:
            if key in self._pins:
                fresh[key] = self._pins[key]
                kept = True
        self._pins = fresh
        return kept

    def _save(self, pin: Pin, change: Change) -> None:
        pin.updated_at = time.time()
        key = (pin.endpoint, pin.name)
        self._pins[key] = pin
        self._dirty.add(key)
        if self._store is not None:
            self._store.save(pin, change)
