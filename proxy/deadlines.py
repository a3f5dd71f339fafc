"""A bounded cache whose entries each carry their own deadline: for values that are good until
a time they state themselves (a verified token, until it expires).

`cachetools.TTLCache` sweeps expired entries on every read and write, through its timer's
context manager and a linked list of expiry links: some 130 bytecodes for a hit, on the path
every authenticated call takes. Here a hit is a dict lookup and one comparison. Entries leave
in the order they came (oldest first) once `maxsize` is passed, and a write drops the oldest
entries that have expired, a few at a time, so a process whose callers come and go does not keep
their entries until the cache is full.
"""

from __future__ import annotations

from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Deadlines(Generic[K, V]):
    __slots__ = ("_entries", "_maxsize")

    SWEEP = 2  # expired entries at the old end dropped by each write, at most

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self._entries: dict[K, tuple[V, float]] = {}
        self._maxsize = maxsize

    def get(self, key: K, now: float) -> V | None:
        """The value under `key` while its deadline is ahead of `now`, else None."""
        entry = self._entries.get(key)
        if entry is None or entry[1] <= now:
            return None
        return entry[0]

    def put(self, key: K, value: V, deadline: float, now: float) -> None:
        """`value` under `key` until `deadline` (a time on the clock `now` is read from)."""
        entries = self._entries
        entries.pop(key, None)  # a rewritten entry is the newest
        entries[key] = (value, deadline)
        for _ in range(self.SWEEP):
            if not entries:  # (the entry just put may have expired already, and gone)
                break
            oldest = next(iter(entries))
            if len(entries) <= self._maxsize and entries[oldest][1] > now:
                break
            del entries[oldest]

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
