"""The people and groups an identity provider provisions through SCIM (proxy.scim), as the
database holds them: each person is a row of `users` (issuer `tollhouse:scim` until they first
sign in, see `link`) with their SCIM resource beside it in `scim_users`; groups are
`scim_groups`, their members `scim_members`; and `deprovisioned` holds the keys a deactivated or
deleted person's credentials are refused by (proxy.auth.deprovisioned mirrors it).

The link rule (docs/provisioning.md): a provisioned person is found by their `userName`,
`externalId` or any of their emails, compared without regard to case, against a sign-in's or a
token's `sub`, `preferred_username`, `email` or `upn`. A person found is the one who signs in:
their first sign-in moves the row to the identity provider's issuer and subject, so the groups,
roles and attributes provisioned are theirs from then on.

Every method is blocking database work: callers run it in a thread.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.auth.deprovisioned import link_keys
from proxy.people.accounts import SCIM_ISSUER, federated_name, name_candidates
from proxy.storage import db


class Taken(Exception):
    """A unique value (a userName, a group's displayName) another resource holds."""


class Missing(Exception):
    """No such resource (or, for a member, no such person)."""


class Stale(Exception):
    """The resource's version is not the one the request expected."""


@dataclass(frozen=True, slots=True)
class Row:
    """A stored SCIM resource: its id, the document as sent (without id, meta and the
    attributes computed here), its version and times, and what is computed on reading:
    a person's groups or a group's members, as (id, display) pairs."""

    id: str
    doc: dict[str, Any]
    version: int
    created: float
    updated: float
    related: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class PersonFacts:
    """What Tollhouse itself reads of a provisioned person's resource."""

    user_name: str
    external_id: str | None
    emails: tuple[str, ...]
    active: bool
    attributes: dict[str, str]  # the enterprise extension's, flattened

    def keys(self) -> set[str]:
        """The values the person is found by (lowercased)."""
        found = {self.user_name.lower(), *(e.lower() for e in self.emails)}
        if self.external_id:
            found.add(self.external_id.lower())
        return found


class Directory:
    """The SCIM tables over the app's database."""

    def __init__(self, target: db.Target) -> None:
        self._db = db.resolve(target)
        self._db.ensure_schema()

    @property
    def errors(self) -> tuple[type[Exception], ...]:
        return self._db.errors

    # -- people ------------------------------------------------------------------------------

    def people(self) -> list[Row]:
        sql = self._db.sql
        with self._db.transaction() as conn:
            rows = conn.execute(sql("SELECT user_id, doc, version, created_at, updated_at "
                                    "FROM scim_users"), ()).fetchall()
            groups = self._memberships(conn)
        return [_row(r, groups.get(str(r[0]), ())) for r in rows]

    def person(self, user_id: str) -> Row:
        sql = self._db.sql
        with self._db.transaction() as conn:
            row = conn.execute(sql("SELECT user_id, doc, version, created_at, updated_at FROM "
                                   "scim_users WHERE user_id = ?"), (user_id,)).fetchone()
            if row is None:
                raise Missing(user_id)
            groups = self._memberships(conn, user_id)
        return _row(row, groups.get(user_id, ()))

    def create_person(self, doc: dict[str, Any], facts: PersonFacts) -> Row:
        """A person and their users row; Taken if the userName is."""
        sql = self._db.sql
        uid, now = secrets.token_hex(8), time.time()
        try:
            with self._db.transaction() as conn:
                name = next(n for n in name_candidates(federated_name(facts.user_name), uid)
                            if not conn.execute(sql("SELECT 1 FROM users WHERE name = ?"),
                                                (n,)).fetchone())
                conn.execute(sql("INSERT INTO users (id, name, issuer, subject, is_admin, "
                                 "groups, created_at, attributes, active) "
                                 "VALUES (?, ?, ?, ?, 0, '', ?, ?, ?)"),
                             (uid, name, SCIM_ISSUER, f"scim:{uid}", now,
                              orjson.dumps(facts.attributes).decode(), int(facts.active)))
                conn.execute(sql("INSERT INTO scim_users (user_id, user_name, external_id, "
                                 "emails, doc, version, created_at, updated_at) "
                                 "VALUES (?, ?, ?, ?, ?, 1, ?, ?)"),
                             (uid, facts.user_name.lower(), facts.external_id,
                              "\n".join(e.lower() for e in facts.emails),
                              orjson.dumps(doc).decode(), now, now))
                # provisioned again (or anew): what a deprovisioned holder of these keys left
                conn.execute(sql(f"DELETE FROM deprovisioned WHERE key IN "
                                 f"({_marks(len(facts.keys()))})"),
                             tuple(link_keys(facts.keys())))
        except self._db.integrity_errors:
            raise Taken(facts.user_name) from None
        return Row(uid, doc, 1, now, now)

    def replace_person(self, user_id: str, doc: dict[str, Any], facts: PersonFacts,
                       expected: int | None) -> tuple[Row, bool, bool]:
        """The person's resource replaced; (the row, whether they were active before, whether
        they are now). Missing, Stale, Taken."""
        sql = self._db.sql
        now = time.time()
        try:
            with self._db.transaction() as conn:
                row = conn.execute(sql("SELECT s.version, u.active, u.attributes "
                                       "FROM scim_users s JOIN users u ON u.id = s.user_id "
                                       "WHERE s.user_id = ?"), (user_id,)).fetchone()
                if row is None:
                    raise Missing(user_id)
                if expected is not None and int(row[0]) != expected:
                    raise Stale(user_id)
                version, was_active = int(row[0]) + 1, bool(row[1])
                attributes = _merged(row[2], facts.attributes)
                conn.execute(sql("UPDATE scim_users SET user_name = ?, external_id = ?, "
                                 "emails = ?, doc = ?, version = ?, updated_at = ? "
                                 "WHERE user_id = ?"),
                             (facts.user_name.lower(), facts.external_id,
                              "\n".join(e.lower() for e in facts.emails),
                              orjson.dumps(doc).decode(), version, now, user_id))
                conn.execute(sql("UPDATE users SET active = ?, attributes = ? WHERE id = ?"),
                             (int(facts.active), orjson.dumps(attributes).decode(), user_id))
                if facts.active:
                    conn.execute(sql("DELETE FROM deprovisioned WHERE user_id = ?"), (user_id,))
                groups = self._memberships(conn, user_id)
                created = conn.execute(sql("SELECT created_at FROM scim_users WHERE "
                                           "user_id = ?"), (user_id,)).fetchone()
        except self._db.integrity_errors:
            raise Taken(facts.user_name) from None
        return (Row(user_id, doc, version, float(created[0]), now, groups.get(user_id, ())),
                was_active, facts.active)

    def delete_person(self, user_id: str, expected: int | None) -> None:
        """The person's SCIM resource, memberships and users row (their roles and vault rows
        too); Missing, Stale."""
        sql = self._db.sql
        with self._db.transaction() as conn:
            row = conn.execute(sql("SELECT version FROM scim_users WHERE user_id = ?"),
                               (user_id,)).fetchone()
            if row is None:
                raise Missing(user_id)
            if expected is not None and int(row[0]) != expected:
                raise Stale(user_id)
            conn.execute(sql("DELETE FROM scim_members WHERE user_id = ?"), (user_id,))
            conn.execute(sql("DELETE FROM scim_users WHERE user_id = ?"), (user_id,))
            conn.execute(sql("DELETE FROM user_roles WHERE user_id = ?"), (user_id,))
            conn.execute(sql("DELETE FROM users WHERE id = ?"), (user_id,))

    def refuse(self, user_id: str, keys: Iterable[str]) -> None:
        """Record the keys a deprovisioned person's credentials are refused by."""
        sql = self._db.sql
        now = time.time()
        with self._db.transaction() as conn:
            for key in sorted(set(keys)):
                conn.execute(sql("INSERT INTO deprovisioned (key, user_id, at) VALUES (?, ?, ?) "
                                 "ON CONFLICT (key) DO UPDATE SET user_id = excluded.user_id, "
                                 "at = excluded.at"), (key, user_id, now))

    def forgive(self, user_id: str) -> None:
        """A person active again: their keys refuse nothing any more."""
        with self._db.transaction() as conn:
            conn.execute(self._db.sql("DELETE FROM deprovisioned WHERE user_id = ?"), (user_id,))

    def facts(self, user_id: str) -> PersonFacts | None:
        with self._db.transaction() as conn:
            row = conn.execute(self._db.sql("SELECT doc FROM scim_users WHERE user_id = ?"),
                               (user_id,)).fetchone()
        return _facts_of_doc(row[0]) if row else None

    # -- groups ------------------------------------------------------------------------------

    def groups(self) -> list[Row]:
        sql = self._db.sql
        with self._db.transaction() as conn:
            rows = conn.execute(sql("SELECT id, doc, version, created_at, updated_at FROM "
                                    "scim_groups"), ()).fetchall()
            members = self._members(conn)
        return [_row(r, members.get(str(r[0]), ())) for r in rows]

    def group(self, group_id: str) -> Row:
        sql = self._db.sql
        with self._db.transaction() as conn:
            row = conn.execute(sql("SELECT id, doc, version, created_at, updated_at FROM "
                                   "scim_groups WHERE id = ?"), (group_id,)).fetchone()
            if row is None:
                raise Missing(group_id)
            members = self._members(conn, group_id)
        return _row(row, members.get(group_id, ()))

    def create_group(self, doc: dict[str, Any], name: str, external_id: str | None,
                     members: Iterable[str]) -> Row:
        sql = self._db.sql
        gid, now = secrets.token_hex(8), time.time()
        try:
            with self._db.transaction() as conn:
                conn.execute(sql("INSERT INTO scim_groups (id, display_name, external_id, doc, "
                                 "version, created_at, updated_at) VALUES (?, ?, ?, ?, 1, ?, ?)"),
                             (gid, name, external_id, orjson.dumps(doc).decode(), now, now))
                self._set_members(conn, gid, members)
                held = self._members(conn, gid)
        except self._db.integrity_errors:
            raise Taken(name) from None
        return Row(gid, doc, 1, now, now, held.get(gid, ()))

    def replace_group(self, group_id: str, doc: dict[str, Any], name: str,
                      external_id: str | None, members: Iterable[str],
                      expected: int | None) -> Row:
        sql = self._db.sql
        now = time.time()
        try:
            with self._db.transaction() as conn:
                row = conn.execute(sql("SELECT version, created_at FROM scim_groups WHERE "
                                       "id = ?"), (group_id,)).fetchone()
                if row is None:
                    raise Missing(group_id)
                if expected is not None and int(row[0]) != expected:
                    raise Stale(group_id)
                version = int(row[0]) + 1
                conn.execute(sql("UPDATE scim_groups SET display_name = ?, external_id = ?, "
                                 "doc = ?, version = ?, updated_at = ? WHERE id = ?"),
                             (name, external_id, orjson.dumps(doc).decode(), version, now,
                              group_id))
                self._set_members(conn, group_id, members)
                held = self._members(conn, group_id)
        except self._db.integrity_errors:
            raise Taken(name) from None
        return Row(group_id, doc, version, float(row[1]), now, held.get(group_id, ()))

    def delete_group(self, group_id: str, expected: int | None) -> None:
        sql = self._db.sql
        with self._db.transaction() as conn:
            row = conn.execute(sql("SELECT version FROM scim_groups WHERE id = ?"),
                               (group_id,)).fetchone()
            if row is None:
                raise Missing(group_id)
            if expected is not None and int(row[0]) != expected:
                raise Stale(group_id)
            conn.execute(sql("DELETE FROM scim_members WHERE group_id = ?"), (group_id,))
            conn.execute(sql("DELETE FROM scim_groups WHERE id = ?"), (group_id,))

    def _set_members(self, conn: db.Connection, group_id: str, members: Iterable[str]) -> None:
        sql = self._db.sql
        conn.execute(sql("DELETE FROM scim_members WHERE group_id = ?"), (group_id,))
        for user_id in dict.fromkeys(members):
            cur = conn.execute(sql("INSERT INTO scim_members (group_id, user_id) SELECT ?, "
                                   "user_id FROM scim_users WHERE user_id = ?"),
                               (group_id, user_id))
            if cur.rowcount != 1:
                raise Missing(user_id)

    def _members(self, conn: db.Connection, group_id: str | None = None
                 ) -> dict[str, tuple[tuple[str, str], ...]]:
        """Each group's members as (user id, userName)."""
        where, args = ("WHERE m.group_id = ?", (group_id,)) if group_id else ("", ())
        rows = conn.execute(self._db.sql(
            "SELECT m.group_id, m.user_id, s.doc FROM scim_members m JOIN scim_users s ON "
            f"s.user_id = m.user_id {where} ORDER BY m.user_id"), args).fetchall()
        out: dict[str, list[tuple[str, str]]] = {}
        for gid, uid, doc in rows:
            out.setdefault(str(gid), []).append((str(uid), str(_doc(doc).get("userName", ""))))
        return {k: tuple(v) for k, v in out.items()}

    def _memberships(self, conn: db.Connection, user_id: str | None = None
                     ) -> dict[str, tuple[tuple[str, str], ...]]:
        """Each person's groups as (group id, displayName)."""
        where, args = ("WHERE m.user_id = ?", (user_id,)) if user_id else ("", ())
        rows = conn.execute(self._db.sql(
            "SELECT m.user_id, g.id, g.display_name FROM scim_members m JOIN scim_groups g ON "
            f"g.id = m.group_id {where} ORDER BY g.id"), args).fetchall()
        out: dict[str, list[tuple[str, str]]] = {}
        for uid, gid, name in rows:
            out.setdefault(str(uid), []).append((str(gid), str(name)))
        return {k: tuple(v) for k, v in out.items()}


ENTERPRISE = "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"
_ENTERPRISE_KEYS = ("employeeNumber", "costCenter", "organization", "division", "department")
ATTRIBUTE_KEYS = (*_ENTERPRISE_KEYS, "manager")


def facts_of(doc: Mapping[str, Any]) -> PersonFacts:
    """What Tollhouse reads of a person's SCIM document (already validated)."""
    emails = tuple(str(e["value"]) for e in doc.get("emails") or ()
                   if isinstance(e, Mapping) and isinstance(e.get("value"), str))
    extension = doc.get(ENTERPRISE)
    attributes: dict[str, str] = {}
    if isinstance(extension, Mapping):
        for key in _ENTERPRISE_KEYS:
            if isinstance(extension.get(key), str):
                attributes[key] = extension[key]
        manager = extension.get("manager")
        if isinstance(manager, Mapping) and isinstance(manager.get("value"), str):
            attributes["manager"] = manager["value"]
    external = doc.get("externalId")
    return PersonFacts(str(doc.get("userName", "")),
                       external if isinstance(external, str) and external else None, emails,
                       doc.get("active") is not False, attributes)


def _facts_of_doc(raw: object) -> PersonFacts:
    return facts_of(_doc(raw))


def _merged(stored: object, now: Mapping[str, str]) -> dict[str, str]:
    """A person's attributes: those set elsewhere (the management API) kept, the enterprise
    extension's as the identity provider sends them now (one it dropped goes)."""
    try:
        held = orjson.loads(str(stored or "{}"))
    except orjson.JSONDecodeError:
        held = {}
    kept = {str(k): str(v) for k, v in held.items() if k not in ATTRIBUTE_KEYS} \
        if isinstance(held, dict) else {}
    return dict(sorted({**kept, **now}.items()))


def _doc(raw: object) -> dict[str, Any]:
    try:
        value = orjson.loads(str(raw))
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _row(row: tuple[Any, ...], related: tuple[tuple[str, str], ...]) -> Row:
    return Row(str(row[0]), _doc(row[1]), int(row[2]), float(row[3]), float(row[4]), related)


def _marks(n: int) -> str:
    return ", ".join("?" * max(n, 1))


