"""Who the subject of a token this gateway issued is now (roles, admin, deleted or not)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from cachetools import TTLCache

from proxy.auth.people import StoreDown

if TYPE_CHECKING:
    from proxy.people.accounts import User


class UsersTable(Protocol):
    """What LiveUsers needs of proxy.people.accounts.Accounts."""

    @property
    def generation(self) -> int: ...

    @property
    def errors(self) -> tuple[type[Exception], ...]: ...

    def by_subject(self, issuer: str, subject: str) -> User | None: ...


class LiveUsers:
    """Identity's `proxy.auth.people.People`: the person behind a token this gateway issued, as they are now, for each call: a
    change through this process's Accounts (roles, admin, deletion; the management API and
    sign-in use it) applies to their very next call; one made elsewhere (the CLI, another
    gateway on the database) within `ttl_s`. One database read per person per `ttl_s`, in a
    thread; a hit is a dictionary lookup."""

    def __init__(self, accounts: UsersTable, ttl_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._accounts = accounts
        self._cache: TTLCache[tuple[str, str], tuple[int, User | None]] = TTLCache(
            maxsize=100_000, ttl=ttl_s, timer=clock)

    async def current(self, issuer: str, subject: str) -> User | None:
        """The user, None if there is none (deleted); StoreDown if the table is out of reach."""
        key = (issuer, subject)
        generation = self._accounts.generation
        hit = self._cache.get(key)
        if hit is not None and hit[0] == generation:
            return hit[1]
        try:
            user = await asyncio.to_thread(self._accounts.by_subject, issuer, subject)
        except self._accounts.errors as exc:
            raise StoreDown(str(exc)) from None
        self._cache[key] = (generation, user)  # read after `generation`: never newer than it
        return user
