"""What identity asks of the people this gateway signs in: who the subject of a token it issued
is now (`People.current`), or `StoreDown` when that cannot be known. `proxy.people.live.LiveUsers`
implements it; identity imports no module of `proxy.people`."""

from __future__ import annotations

from typing import Protocol


class StoreDown(Exception):
    """The users table could not be read."""


class Person(Protocol):
    """A user as identity needs them: their id (a token carries it), name and groups."""

    @property
    def id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def groups(self) -> frozenset[str]: ...


class People(Protocol):
    async def current(self, issuer: str, subject: str) -> Person | None:
        """The person now, None if there is none (deleted); StoreDown if out of reach."""
        ...
