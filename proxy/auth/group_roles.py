"""Groups mapped to roles (issue 42 item 3): the people in a group hold a role. The mapping is
`[[auth.group_roles]]` (the config's, fixed until a reload) together with the rows of the
`group_roles` table (migration 29) that `/api/v1/group-roles` writes.

A group is a SCIM group's displayName, a name in an identity provider's groups claim (a token
of `[[auth.issuers]]` or the ID token of a sign-in) or a custom role a person holds. A role is a
built-in one (`admin`, `auditor`; `user`, which everyone holds, grants nothing more) or a custom
role's name, which is added to the person's groups: access rules (`allow_groups`), tool
profiles (`group_tools`) and Cedar policies (`principal.groups`) see it as they see any group.

Two readers: `proxy.people.accounts` reads the table in the transaction that reads a person
(`read_rows`), so a person read anywhere (a browser session, a token this gateway issued, the
management API) holds what the mapping gives now, on every replica; and the MCP edge, which
must not read the database per call, asks `GroupRoles` (the table mirrored in memory,
`proxy.mirror`, polled every second on its change counter and read again at once after a
change made through this process)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from proxy.mirror import Mirror, Mirrors
from proxy.storage import db

ADMIN, USER, AUDITOR = "admin", "user", "auditor"
BUILTIN = (ADMIN, USER, AUDITOR)
_COUNTER = "SELECT version FROM group_roles_version WHERE id = ?"


@dataclass(frozen=True, slots=True)
class Granted:
    """What a person's groups give them through the mapping."""

    groups: frozenset[str] = frozenset()  # custom roles, held as groups
    admin: bool = False
    auditor: bool = False


@dataclass(frozen=True, slots=True)
class Mapping:
    """Group -> roles, the config's and the table's together."""

    by_group: dict[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, pairs: Iterable[tuple[str, str]]) -> Mapping:
        by_group: dict[str, set[str]] = {}
        for group, role in pairs:
            by_group.setdefault(group, set()).add(role)
        return cls({g: frozenset(r) for g, r in by_group.items()})

    def grant(self, groups: Iterable[str]) -> Granted:
        if not self.by_group:
            return _NOTHING
        roles: set[str] = set()
        for group in groups:
            roles |= self.by_group.get(group, frozenset())
        if not roles:
            return _NOTHING
        return Granted(frozenset(roles - set(BUILTIN)), ADMIN in roles, AUDITOR in roles)


_NOTHING = Granted()


def read_rows(conn: db.Connection, database: db.Database) -> list[tuple[str, str]]:
    """The table's mappings, inside the caller's transaction."""
    rows = conn.execute(database.sql("SELECT group_name, role FROM group_roles ORDER BY "
                                     "group_name, role"), ()).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


class GroupRoles:
    """The mapping as the MCP edge reads it: in memory, never a database read per call."""

    def __init__(self, target: db.Target, mirrors: Mirrors,
                 configured: Iterable[tuple[str, str]] = ()) -> None:
        self._db = db.resolve(target)
        self._owns_db = self._db is not target
        self._db.ensure_schema()
        self._configured = tuple(configured)
        self._mirrors = mirrors
        self.mapping = Mapping.of(self._configured)
        self._mirror: Mirror[list[tuple[str, str]]] = mirrors.mirror(
            "group roles", self._counter, self._read_all, self._apply, errors=self._db.errors)
        self._apply(self._mirror.load_now())

    def _apply(self, rows: list[tuple[str, str]]) -> None:
        self.mapping = Mapping.of((*self._configured, *rows))

    def _counter(self) -> int:
        with self._db.transaction() as conn:
            row = conn.execute(self._db.sql(_COUNTER), (1,)).fetchone()
        return int(row[0]) if row else 0

    def _read_all(self) -> tuple[int, list[tuple[str, str]]]:
        with self._db.transaction() as conn:
            row = conn.execute(self._db.sql(_COUNTER), (1,)).fetchone()
            rows = read_rows(conn, self._db)
        return (int(row[0]) if row else 0), rows

    def grant(self, groups: Iterable[str]) -> Granted:
        return self.mapping.grant(groups)

    @property
    def configured(self) -> tuple[tuple[str, str], ...]:
        """`[[auth.group_roles]]`, in the config's order."""
        return self._configured

    async def stored(self) -> list[tuple[str, str]]:
        """The table's mappings, read now."""
        return (await self._mirrors.run(self._read_all))[1]

    async def add(self, group: str, role: str) -> bool:
        """Map `group` to `role`; False if it already was. Every gateway sees it within a
        poll, this one at once."""
        added = await self._mirrors.run(self._write, "INSERT INTO group_roles (group_name, "
                                        "role, created_at) VALUES (?, ?, ?) ON CONFLICT DO "
                                        "NOTHING", (group, role, time.time()))
        await self._mirror.reload()
        return added

    async def remove(self, group: str, role: str) -> bool:
        """Take the mapping away; False if the table had none."""
        removed = await self._mirrors.run(self._write, "DELETE FROM group_roles WHERE "
                                          "group_name = ? AND role = ?", (group, role))
        await self._mirror.reload()
        return removed

    def _write(self, statement: str, args: tuple[object, ...]) -> bool:
        with self._db.transaction() as conn:
            return bool(conn.execute(self._db.sql(statement), args).rowcount == 1)

    def close(self) -> None:
        if self._owns_db:
            self._db.close()
