"""Who is deprovisioned, as every credential check needs it: the `deprovisioned` table
(migration 27) mirrored in memory (proxy.mirror) and looked at before each lookup, never
polled, as the API keys are (proxy.auth.keys).

A row is a key a deactivated or deleted person's credentials are refused by, and the person's
users id: `sub:<issuer>|<subject>` (who a token names, their sign-in's issuer and subject) and
`id:<value>` (their SCIM userName, externalId and emails, lowercased: what the link rule of
docs/provisioning.md finds a person by, so a token of a configured issuer whose `sub`,
`preferred_username`, `email` or `upn` names them is refused even before their first sign-in).
Rows are written by `proxy.people.deprovision` before a SCIM or API call that deprovisions
answers, and deleted when the person is active again or someone new takes the keys.

The sign that the table changed is the `deprovisioned_version` counter its trigger bumps. On a
SQLite file, SQLite's `PRAGMA data_version` (shared memory, no query) is looked at first and the
counter read only when the database changed at all; on PostgreSQL (and an in-memory SQLite)
each lookup needs a read of the counter begun after it, which lookups arriving together share
(`Mirror.sync`). The table is read again only when the counter moved."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from proxy.mirror import Mirror, Mirrors
from proxy.storage import db
from proxy.storage.own import CounterReader

_COUNTER = "SELECT version FROM deprovisioned_version WHERE id = ?"


@dataclass(frozen=True, slots=True)
class Refused:
    keys: frozenset[str] = frozenset()
    users: frozenset[str] = frozenset()  # the users ids of the people refused


def subject_key(issuer: str, subject: str) -> str:
    return f"sub:{issuer}|{subject}"


def link_keys(values: Iterable[str]) -> set[str]:
    return {f"id:{v.lower()}" for v in values if v}


class Deprovisioned:
    """The mirror. `refuses` is what the authenticator asks on every call it decides."""

    def __init__(self, target: db.Target, mirrors: Mirrors) -> None:
        self._db = db.resolve(target)
        self._owns_db = self._db is not target
        self._db.ensure_schema()
        self._watch: db.Connection | None = (
            self._db.connect() if self._db.dialect == "sqlite" and not self._db.memory
            else None)
        self._seen_data = -1  # the data_version the last sync began at
        self._counter = CounterReader(self._db, _COUNTER)
        self._mirror: Mirror[Refused] = mirrors.mirror(
            "deprovisioned people", self._counter, self._read_all, self._apply,
            errors=self._db.errors, polled=False)
        self.refused = Refused()
        self._apply(self._mirror.load_now())

    def _apply(self, refused: Refused) -> None:
        self.refused = refused

    def _read_all(self) -> tuple[int, Refused]:
        with self._db.transaction() as conn:
            row = conn.execute(self._db.sql(_COUNTER), (1,)).fetchone()
            rows = conn.execute(self._db.sql("SELECT key, user_id FROM deprovisioned"),
                                ()).fetchall()
        return (int(row[0]) if row else 0), Refused(frozenset(str(r[0]) for r in rows),
                                                    frozenset(str(r[1]) for r in rows))

    async def sync(self) -> None:
        """Catch up with what any gateway wrote before this call began."""
        if self._watch is None:
            await self._mirror.sync()
            return
        # a SQLite file: nothing committed anywhere since the last sync, nothing to read
        data = int(self._watch.execute("PRAGMA data_version").fetchone()[0])
        if data == self._seen_data:
            return
        await self._mirror.sync()
        self._seen_data = data

    async def refuses(self, keys: Iterable[str], user_id: str | None = None) -> bool:
        """Whether any of `keys` (or the users id) is a deprovisioned person's."""
        await self.sync()
        refused = self.refused
        if not refused.keys:
            return False
        return (user_id is not None and user_id in refused.users) or \
            any(k in refused.keys for k in keys)

    async def changed(self) -> None:
        """This process wrote the table: read it now (the next lookup would anyway)."""
        await self._mirror.reload()

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
        self._counter.close()
        if self._owns_db:
            self._db.close()
