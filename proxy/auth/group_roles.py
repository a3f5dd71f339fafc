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
`proxy.mirror`, polled every second and read again at once after a change made through this
process).

The edge's mirror also holds the SCIM groups of each provisioned person, by the keys a token
of a configured issuer names a person by (`proxy.auth.deprovisioned`: their issuer and subject
once they signed in, and the link rule's userName, externalId and emails), so such a token carries its person's SCIM groups as a sign-in does; a token whose keys name
two people gets none (never guess who someone is). The SCIM tables have no change counter of
their own: the version polled is a fingerprint of them (their rows' count and summed
versions, the provisioned people linked to a sign-in) beside `group_roles_version`."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from proxy.auth.deprovisioned import link_keys, subject_key
from proxy.mirror import Mirror, Mirrors
from proxy.storage import db

ADMIN, USER, AUDITOR = "admin", "user", "auditor"
BUILTIN = (ADMIN, USER, AUDITOR)
_UNLINKED = "tollhouse:scim"  # a provisioned person's issuer until they sign in
_VERSION = (
    "SELECT (SELECT version FROM group_roles_version WHERE id = 1), "
    "(SELECT COUNT(*) FROM scim_members), (SELECT COUNT(*) FROM scim_groups), "
    "(SELECT COALESCE(SUM(version), 0) FROM scim_groups), (SELECT COUNT(*) FROM scim_users), "
    "(SELECT COALESCE(SUM(version), 0) FROM scim_users), "
    "(SELECT COUNT(*) FROM scim_users s JOIN users u ON u.id = s.user_id WHERE u.issuer <> ?)")


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


@dataclass(frozen=True, slots=True)
class People:
    """Provisioned people by the keys a token names them by, and their SCIM groups."""

    by_key: dict[str, str] = field(default_factory=dict)  # key -> users id; "": two people
    groups_of: dict[str, frozenset[str]] = field(default_factory=dict)

    def groups(self, keys: Iterable[str]) -> frozenset[str]:
        if not self.groups_of:
            return frozenset()
        found = {self.by_key[k] for k in keys if k in self.by_key}
        if len(found) != 1 or "" in found:
            return frozenset()
        return self.groups_of.get(found.pop(), frozenset())


def _people(conn: db.Connection, database: db.Database) -> People:
    groups_of: dict[str, set[str]] = {}
    for user_id, name in conn.execute(database.sql(
            "SELECT m.user_id, g.display_name FROM scim_members m JOIN scim_groups g ON "
            "g.id = m.group_id"), ()).fetchall():
        groups_of.setdefault(str(user_id), set()).add(str(name))
    by_key: dict[str, str] = {}
    for user_id, user_name, external_id, emails, issuer, subject in conn.execute(database.sql(
            "SELECT s.user_id, s.user_name, s.external_id, s.emails, u.issuer, u.subject FROM "
            "scim_users s JOIN users u ON u.id = s.user_id"), ()).fetchall():
        keys = link_keys([str(user_name), str(external_id or ""), *str(emails or "").split()])
        if issuer != _UNLINKED:
            keys.add(subject_key(str(issuer), str(subject)))
        for key in keys:
            by_key[key] = "" if by_key.get(key, str(user_id)) != str(user_id) else str(user_id)
    return People(by_key, {u: frozenset(g) for u, g in groups_of.items()})


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
        self.people = People()
        self._mirror: Mirror[tuple[list[tuple[str, str]], People]] = mirrors.mirror(
            "group roles", self._counter, self._read_all, self._apply, errors=self._db.errors)
        self._apply(self._mirror.load_now())

    def _apply(self, read: tuple[list[tuple[str, str]], People]) -> None:
        self.mapping = Mapping.of((*self._configured, *read[0]))
        self.people = read[1]

    def _counter(self) -> int:
        with self._db.transaction() as conn:
            return self._version(conn)

    def _version(self, conn: db.Connection) -> int:
        row = conn.execute(self._db.sql(_VERSION), (_UNLINKED,)).fetchone()
        return hash(tuple(float(v or 0) for v in row)) & 0x7FFF_FFFF_FFFF_FFFF

    def _read_all(self) -> tuple[int, tuple[list[tuple[str, str]], People]]:
        with self._db.transaction() as conn:
            version = self._version(conn)
            rows = read_rows(conn, self._db)
            people = _people(conn, self._db)
        return version, (rows, people)

    def grant(self, groups: Iterable[str]) -> Granted:
        return self.mapping.grant(groups)

    def scim_groups(self, keys: Iterable[str]) -> frozenset[str]:
        """The SCIM groups of the one provisioned person `keys` name; none if no one or two."""
        return self.people.groups(keys)

    @property
    def configured(self) -> tuple[tuple[str, str], ...]:
        """`[[auth.group_roles]]`, in the config's order."""
        return self._configured

    async def stored(self) -> list[tuple[str, str]]:
        """The table's mappings, read now."""
        return (await self._mirrors.run(self._read_all))[1][0]

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
