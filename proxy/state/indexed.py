"""A TTL cache that keeps an index of its keys by owner (`Indexed`): the memory stores'
sessions by caller (proxy.state.sessions) and browser sessions by person (proxy.state.browser),
so that ending everything a person holds needs no scan. The cache tells the index whenever it
lets an entry go by itself (expiry, or the least recently used one when full); removals its
owner makes update the index themselves (`unindex`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from cachetools import TTLCache

V = TypeVar("V")


class Indexed(TTLCache[str, V]):
    """`index` maps an owner (`owner_of(value)`) to the keys of their entries."""

    def __init__(self, maxsize: int, ttl: float, timer: Callable[[], float],
                 index: dict[str, set[str]], owner_of: Callable[[V], str]) -> None:
        super().__init__(maxsize=maxsize, ttl=ttl, timer=timer)
        self._index = index
        self._owner_of = owner_of

    def expire(self, time: Any = None) -> list[tuple[str, V]]:
        expired = list(super().expire(time))
        for key, value in expired:
            unindex(self._index, self._owner_of(value), key)
        return expired

    def popitem(self) -> tuple[str, V]:
        key, value = super().popitem()
        unindex(self._index, self._owner_of(value), key)
        return key, value


def unindex(index: dict[str, set[str]], owner: str, key: str) -> None:
    """`key` no longer one of `owner`'s."""
    ids = index.get(owner)
    if ids is not None:
        ids.discard(key)
        if not ids:
            del index[owner]
