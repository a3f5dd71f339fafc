"""People: local accounts and federated ones (their browser sessions are live state, in
`proxy.state.browser`, re-exported here).

A user is one principal whichever way they arrive: a browser cookie, a token Tollhouse issued,
or an external JWT with the same (issuer, subject). Local accounts have issuer `tollhouse:local`
and subject `local:<name>`; federated ones keep their identity provider's issuer and `sub`.
Passwords are hashed with scrypt (memory-hard, in the standard library) and never logged.

Roles: every user holds the built-in role `user`, administrators `admin` too (`is_admin`), and
auditors the built-in role `auditor` (`is_auditor`: they read the audit log, usage, policies and
the audit evidence's status through /api/v1 and the console, and change nothing). The auditor
role is a row of `user_roles` under a name no custom role can have (`AUDITOR_ROW`: a role's name
has no ':'), so it needs no column of its own and is never one of the user's groups.
Custom roles (the `roles` table, made through the management API) are held through
`user_roles` and act as groups: `User.groups` is the identity provider's groups (the `groups`
column, which each federated sign-in overwrites) together with the user's custom roles (which it
never touches). Access rules (`allow_groups`) and tool profiles (`group_tools`) see both.
Groups mapped to roles (`[[auth.group_roles]]` and /api/v1/group-roles, proxy.auth.group_roles)
apply wherever a user is read here: a mapped custom role is added to their groups, a mapped
`admin` or `auditor` makes them one (`is_admin`, `is_auditor`; the `is_admin` column keeps
what was given directly, so taking the mapping away takes the role away). A
browser session reads the user afresh on every request; an access token this gateway issues
carries the groups of its issue, so a role change reaches a token-holding client with its next
access token (a refresh reads the user again).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

import orjson

from proxy.auth import group_roles
from proxy.auth.principal import Principal
from proxy.storage import db

LOCAL_ISSUER = "tollhouse:local"
SCIM_ISSUER = "tollhouse:scim"  # a person provisioned through SCIM who has not signed in yet
# what a sign-in or a token names a provisioned person by (proxy.people.directory's rule)
LINK_CLAIMS = ("sub", "preferred_username", "email", "upn")
_SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32, "maxmem": 64 * 1024 * 1024}

# every user's name, local or federated: one URL path segment as it stands, never `.` or `..`
USER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"
_NAME_MAX = 64
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_.@-]+")
_NAME_START = re.compile(r"^[^A-Za-z0-9]+")
FEDERATED_FALLBACK = "user"  # a chosen name with nothing of the rule in it

AUDITOR = "auditor"
BUILTIN_ROLES = {"admin": "manages the gateway through /api/v1",
                 "user": "uses the endpoints their access rules allow",
                 AUDITOR: "reads the audit log, usage, policies and the audit evidence's "
                          "status; changes nothing"}
# the auditor role as `user_roles` (and, for its foreign key, `roles`) hold it: not a name a
# custom role can have, so a custom role named `auditor` made before the role was built in
# stays a group and gives no auditor rights
AUDITOR_ROW = "tollhouse:auditor"


@dataclass(frozen=True, slots=True)
class User:
    id: str
    name: str
    issuer: str
    subject: str
    is_admin: bool
    groups: frozenset[str]  # the identity provider's groups and the custom roles
    roles: frozenset[str] = frozenset()  # the custom roles alone
    # what a per-caller upstream URL may be filled from (proxy.config.template), sorted
    attributes: tuple[tuple[str, str], ...] = ()
    is_auditor: bool = False  # holds the built-in role `auditor`
    active: bool = True  # false: deprovisioned (SCIM `active: false`), every credential refused

    @property
    def local(self) -> bool:
        return self.issuer == LOCAL_ISSUER

    @property
    def reads_only(self) -> bool:
        """An auditor who is not an administrator: refused every change through /api/v1 and
        the console."""
        return self.is_auditor and not self.is_admin

    def principal(self) -> Principal:
        return Principal(subject=self.subject, issuer=self.issuer, display_name=self.name,
                         groups=self.groups, kind="jwt", role="admin" if self.is_admin else "")


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, **_SCRYPT)
    return f"scrypt${_SCRYPT['n']}${salt.hex()}${digest.hex()}"


def check_password(password: str, stored: str) -> bool:
    try:
        scheme, n, salt, digest = stored.split("$")
    except ValueError:
        return False
    if scheme != "scrypt":
        return False
    params = {**_SCRYPT, "n": int(n)}
    candidate = hashlib.scrypt(password.encode(), salt=bytes.fromhex(salt),
                               **params)
    return hmac.compare_digest(candidate.hex(), digest)


# a hash to check against when the user does not exist, so both cases cost the same
_DUMMY = hash_password(secrets.token_hex(8))


_COLUMNS = "id, name, issuer, subject, is_admin, groups, attributes, active"


def _user(row: tuple[object, ...], held: frozenset[str] = frozenset(),
          scim: frozenset[str] = frozenset()) -> User:
    """A user from its row, its `user_roles` rows (the auditor role's among them) and the SCIM
    groups it is in."""
    roles = held - {AUDITOR_ROW}
    groups = str(row[5] or "")
    try:
        stored = orjson.loads(str(row[6] or "{}"))
    except orjson.JSONDecodeError:
        stored = {}
    attributes = tuple(sorted((str(k), str(v)) for k, v in stored.items())) \
        if isinstance(stored, dict) else ()
    return User(str(row[0]), str(row[1]), str(row[2]), str(row[3]), bool(row[4]),
                frozenset(g for g in groups.split("\n") if g) | roles | scim, roles, attributes,
                AUDITOR_ROW in held, row[7] is None or bool(row[7]))


def _mapping(conn: db.Connection, database: db.Database,
             configured: tuple[tuple[str, str], ...]) -> group_roles.Mapping:
    return group_roles.Mapping.of((*configured, *group_roles.read_rows(conn, database)))


def _read_user(conn: db.Connection, database: db.Database, row: tuple[object, ...],
               configured: tuple[tuple[str, str], ...]) -> User:
    """The user of `row` with their `user_roles` rows, the displayNames of the SCIM groups they
    are in, and what their groups are mapped to."""
    sql, uid = database.sql, str(row[0])
    held = conn.execute(sql("SELECT role FROM user_roles WHERE user_id = ?"), (uid,)).fetchall()
    scim = conn.execute(sql("SELECT g.display_name FROM scim_members m JOIN scim_groups g ON "
                            "g.id = m.group_id WHERE m.user_id = ?"), (uid,)).fetchall()
    return _granted(_user(row, frozenset(str(r[0]) for r in held),
                          frozenset(str(r[0]) for r in scim)), _mapping(conn, database, configured))


def _granted(user: User, mapping: group_roles.Mapping) -> User:
    """The user with what their groups are mapped to (proxy.auth.group_roles)."""
    got = mapping.grant(user.groups)
    if not (got.groups - user.groups) and user.is_admin >= got.admin and \
            user.is_auditor >= got.auditor:
        return user
    return replace(user, groups=user.groups | got.groups, is_admin=user.is_admin or got.admin,
                   is_auditor=user.is_auditor or got.auditor)


@dataclass(frozen=True, slots=True)
class Role:
    name: str
    description: str
    builtin: bool


class UserExists(Exception):
    pass


class NotLocal(Exception):
    """A password for a user whose identity provider is not this gateway."""


class UnknownRoles(Exception):
    """Roles named for a user that are not custom roles (in the order given)."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(", ".join(names))
        self.names = names


class RoleExists(Exception):
    pass


class RoleInUse(Exception):
    def __init__(self, name: str, holders: int) -> None:
        super().__init__(name)
        self.holders = holders


class BuiltinRole(Exception):
    pass


class LastAdmin(Exception):
    """The change would leave no administrator among the users."""


class Accounts:
    """The users and roles tables. Every call is blocking database work: the gateway runs them
    in a thread (`asyncio.to_thread`); the CLI calls them directly. `target` is the app's
    Database, a database URL, or a SQLite path."""

    def __init__(self, target: db.Target, group_roles: Iterable[tuple[str, str]] = ()) -> None:
        self._db = db.resolve(target)
        self._owns_db = self._db is not target
        self._db.ensure_schema()
        self.configured_group_roles = tuple(group_roles)  # [[auth.group_roles]]
        # bumped by every change to a user made through this object: LiveUsers drops what
        # it read before (an int bumped under the GIL: any change makes it differ)
        self.generation = 0

    @property
    def errors(self) -> tuple[type[Exception], ...]:
        return self._db.errors

    def _changed(self) -> None:
        self.generation += 1

    def group_roles_changed(self) -> None:
        self._changed()  # /api/v1/group-roles: what was read of a user before is stale

    def _full(self, conn: db.Connection, row: tuple[object, ...]) -> User:
        return _read_user(conn, self._db, row, self.configured_group_roles)

    def _mapping(self, conn: db.Connection) -> group_roles.Mapping:
        return _mapping(conn, self._db, self.configured_group_roles)

    def close(self) -> None:
        """Close the connections of a Database made here (the app closes its own)."""
        if self._owns_db:
            self._db.close()

    # -- users ---------------------------------------------------------------------------------

    def create_local(self, name: str, password: str, admin: bool = False,
                     roles: Iterable[str] = (),
                     attributes: Mapping[str, str] | None = None) -> User:
        """A local account; UserExists if the name is taken, UnknownRoles if a role is not a
        custom role nor `auditor`."""
        held = _unique(roles)
        custom = frozenset(held) - {AUDITOR}
        attrs = dict(sorted((attributes or {}).items()))
        user = User(secrets.token_hex(8), name, LOCAL_ISSUER, f"local:{name}", admin,
                    custom, custom, tuple(attrs.items()), AUDITOR in held)
        hashed = hash_password(password)
        try:
            with self._db.transaction() as conn:
                conn.execute(self._db.sql("INSERT INTO users (id, name, issuer, subject, "
                                          "password_hash, is_admin, created_at, attributes) "
                                          "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"),
                             (user.id, name, user.issuer, user.subject, hashed, int(admin),
                              time.time(), orjson.dumps(attrs).decode()))
                conn.execute(self._db.sql("DELETE FROM deprovisioned WHERE key = ?"),
                             (f"sub:{user.issuer}|{user.subject}",))
                self._set_roles(conn, user.id, held)
        except self._db.integrity_errors:
            raise UserExists(name) from None
        self._changed()
        return user

    def verify_local(self, name: str, password: str) -> User | None:
        with self._db.transaction() as conn:
            row = conn.execute(self._db.sql(f"SELECT {_COLUMNS}, password_hash FROM users "
                                            "WHERE name = ? AND issuer = ?"),
                               (name, LOCAL_ISSUER)).fetchone()
            user = self._full(conn, row) if row is not None else None
        if row is None or not row[8]:
            check_password(password, _DUMMY)
            return None
        return user if check_password(password, str(row[8])) else None

    def upsert_federated(self, issuer: str, subject: str, name: str,
                         groups: frozenset[str] | None, admin: bool) -> User:
        """A federated user, created on first sign-in; groups and admin follow the provider
        (None: the token has no groups claim, and what is held is kept). Custom roles given
        through the API and SCIM groups are kept. A deprovisioned person comes back inactive
        (the caller refuses them)."""
        sql = self._db.sql
        joined = "\n".join(sorted(groups or ()))
        with self._db.transaction() as conn:
            row = conn.execute(sql(f"SELECT {_COLUMNS} FROM users WHERE issuer = ? AND "
                                   "subject = ?"), (issuer, subject)).fetchone()
            if row is None:
                uid = secrets.token_hex(8)
                display = next(n for n in _candidates(federated_name(name), uid)
                               if not conn.execute(sql("SELECT 1 FROM users WHERE name = ?"),
                                                   (n,)).fetchone())
                conn.execute(sql("INSERT INTO users (id, name, issuer, subject, is_admin, "
                                 "groups, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)"),
                             (uid, display, issuer, subject, int(admin), joined, time.time()))
                # a person deleted through the API who signs in again is a new person
                conn.execute(sql("DELETE FROM deprovisioned WHERE key = ?"),
                             (f"sub:{issuer}|{subject}",))
                user = _granted(User(uid, display, issuer, subject, admin,
                                     groups or frozenset()), self._mapping(conn))
            else:
                if groups is not None:
                    conn.execute(sql("UPDATE users SET is_admin = ?, groups = ? WHERE id = ?"),
                                 (int(admin), joined, row[0]))
                row = conn.execute(sql(f"SELECT {_COLUMNS} FROM users WHERE id = ?"),
                                   (row[0],)).fetchone()
                user = self._full(conn, row)
        self._changed()
        return user

    def link(self, issuer: str, subject: str, values: Iterable[str]) -> str | None:
        """The provisioned person a sign-in's `values` (its sub, preferred_username, email,
        upn) name, moved to `issuer` and `subject` on their first sign-in: their users id, or
        None. A person already linked to another subject is not taken over."""
        wanted = {v.lower() for v in values if v}
        if not wanted:
            return None
        sql = self._db.sql
        with self._db.transaction() as conn:
            rows = conn.execute(sql("SELECT s.user_id, s.user_name, s.external_id, s.emails, "
                                    "u.issuer, u.subject FROM scim_users s JOIN users u ON "
                                    "u.id = s.user_id"), ()).fetchall()
            found = [r for r in rows
                     if wanted & {str(r[1]), str(r[2] or "").lower(),
                                  *str(r[3] or "").split("\n")} - {""}]
            if len(found) != 1:
                return None  # nobody, or ambiguous: never guess who someone is
            user_id, held_issuer, held_subject = str(found[0][0]), found[0][4], found[0][5]
            if held_issuer == SCIM_ISSUER:
                conn.execute(sql("UPDATE users SET issuer = ?, subject = ? WHERE id = ?"),
                             (issuer, subject, user_id))
            elif (held_issuer, held_subject) != (issuer, subject):
                return None
        return user_id


    def get(self, user_id: str) -> User | None:
        return self._one("id", user_id)

    def by_name(self, name: str) -> User | None:
        return self._one("name", name)

    def by_subject(self, issuer: str, subject: str) -> User | None:
        return self._one("issuer = ? AND subject", issuer, subject)

    def _one(self, column: str, *values: str) -> User | None:
        with self._db.transaction() as conn:
            row = conn.execute(self._db.sql(f"SELECT {_COLUMNS} FROM users WHERE {column} = ?"),
                               values).fetchone()
            if row is None:
                return None
            return self._full(conn, row)

    def update(self, name: str, *, admin: bool | None = None, password: str | None = None,
               roles: Iterable[str] | None = None,
               attributes: Mapping[str, str] | None = None) -> User | None:
        """Change what is given of a user's admin flag, password and custom roles (all of
        them replaced), in one transaction; None if there is no such user. NotLocal for a
        password of a federated user, UnknownRoles for a role that is not a custom role."""
        sql = self._db.sql
        with self._db.transaction() as conn:
            self._write_lock(conn)
            row = conn.execute(sql("SELECT id, issuer, is_admin FROM users WHERE name = ?"),
                               (name,)).fetchone()
            if row is None:
                return None
            user_id, issuer = str(row[0]), str(row[1])
            if password is not None and issuer != LOCAL_ISSUER:
                raise NotLocal(name)
            if admin is False and row[2]:
                self._not_the_last_admin(conn)
            if admin is not None:
                conn.execute(sql("UPDATE users SET is_admin = ? WHERE id = ?"),
                             (int(admin), user_id))
            if password is not None:
                conn.execute(sql("UPDATE users SET password_hash = ? WHERE id = ?"),
                             (hash_password(password), user_id))
            if roles is not None:
                self._set_roles(conn, user_id, _unique(roles))
            if attributes is not None:
                conn.execute(sql("UPDATE users SET attributes = ? WHERE id = ?"),
                             (orjson.dumps(dict(sorted(attributes.items()))).decode(), user_id))
        self._changed()
        return self.by_name(name)

    def delete(self, name: str) -> User | None:
        """Delete a user, their roles and their upstream tokens (a later user of the same name
        must not inherit the accounts they connected); the user deleted, or None. LastAdmin if
        they are the last administrator."""
        sql = self._db.sql
        with self._db.transaction() as conn:
            self._write_lock(conn)
            row = conn.execute(sql(f"SELECT {_COLUMNS} FROM users WHERE name = ?"),
                               (name,)).fetchone()
            if row is None:
                return None
            user = _user(row, frozenset())
            if user.is_admin:
                self._not_the_last_admin(conn)
            conn.execute(sql("DELETE FROM user_roles WHERE user_id = ?"), (user.id,))
            conn.execute(sql("DELETE FROM scim_members WHERE user_id = ?"), (user.id,))
            conn.execute(sql("DELETE FROM scim_users WHERE user_id = ?"), (user.id,))
            conn.execute(sql("DELETE FROM upstream_tokens WHERE principal = ?"),
                         (user.principal().key,))
            conn.execute(sql("DELETE FROM users WHERE id = ?"), (user.id,))
        self._changed()
        return user

    def _write_lock(self, conn: db.Connection) -> None:
        """Serialize changes to who is an administrator: SQLite takes its write lock now; on
        PostgreSQL the administrators' rows are locked by `_not_the_last_admin`."""
        if not self._db.postgresql:
            conn.execute("BEGIN IMMEDIATE")

    def _not_the_last_admin(self, conn: db.Connection) -> None:
        lock = " FOR UPDATE" if self._db.postgresql else ""
        admins = conn.execute(self._db.sql(f"SELECT id FROM users WHERE is_admin <> 0{lock}"),
                              ()).fetchall()
        if len(admins) <= 1:
            raise LastAdmin()

    def list(self) -> list[User]:
        with self._db.transaction() as conn:
            rows = conn.execute(self._db.sql(f"SELECT {_COLUMNS} FROM users ORDER BY name"),
                                ()).fetchall()
            held: dict[str, set[str]] = {}
            for user_id, role in conn.execute(self._db.sql("SELECT user_id, role FROM "
                                                           "user_roles"), ()).fetchall():
                held.setdefault(str(user_id), set()).add(str(role))
            scim: dict[str, set[str]] = {}
            for user_id, group in conn.execute(self._db.sql(
                    "SELECT m.user_id, g.display_name FROM scim_members m JOIN scim_groups g "
                    "ON g.id = m.group_id"), ()).fetchall():
                scim.setdefault(str(user_id), set()).add(str(group))
            mapping = self._mapping(conn)
        return [_granted(_user(r, frozenset(held.get(str(r[0]), ())),
                               frozenset(scim.get(str(r[0]), ()))), mapping) for r in rows]

    def _set_roles(self, conn: db.Connection, user_id: str, roles: tuple[str, ...]
                   ) -> None:
        """Replace the user's custom roles and the auditor role (inside the caller's
        transaction, which the UnknownRoles raised here rolls back). Each row is written only if
        its role exists, in one statement; on PostgreSQL the foreign key also stops a role
        deleted meanwhile. The auditor role's row in `roles` is written the first time a user
        is given it."""
        sql = self._db.sql
        conn.execute(sql("DELETE FROM user_roles WHERE user_id = ?"), (user_id,))
        unknown = {r for r in roles if r in BUILTIN_ROLES and r != AUDITOR}
        if AUDITOR in roles:
            now = time.time()
            conn.execute(sql("INSERT INTO roles (name, description, created_at, updated_at) "
                             "VALUES (?, ?, ?, ?) ON CONFLICT (name) DO NOTHING"),
                         (AUDITOR_ROW, BUILTIN_ROLES[AUDITOR], now, now))
        for role in roles:
            if role in BUILTIN_ROLES and role != AUDITOR:
                continue
            stored = AUDITOR_ROW if role == AUDITOR else role
            try:
                cur = conn.execute(sql("INSERT INTO user_roles (user_id, role) SELECT ?, name "
                                       "FROM roles WHERE name = ?"), (user_id, stored))
            except self._db.integrity_errors:
                raise UnknownRoles([role]) from None
            if cur.rowcount != 1:
                unknown.add(role)
        if unknown:
            raise UnknownRoles([r for r in roles if r in unknown])

    # -- roles ---------------------------------------------------------------------------------

    def roles(self) -> tuple[Role, ...]:
        """The built-in roles, then the custom ones by name."""
        with self._db.transaction() as conn:
            rows = conn.execute(self._db.sql("SELECT name, description FROM roles WHERE "
                                             "name <> ? ORDER BY name"), (AUDITOR_ROW,)
                                ).fetchall()
        return (*(Role(n, d, True) for n, d in BUILTIN_ROLES.items()),
                *(Role(str(n), str(d), False) for n, d in rows))

    def role(self, name: str) -> Role | None:
        if name in BUILTIN_ROLES:
            return Role(name, BUILTIN_ROLES[name], True)
        with self._db.transaction() as conn:
            row = conn.execute(self._db.sql("SELECT name, description FROM roles WHERE "
                                            "name = ?"), (name,)).fetchone()
        return Role(str(row[0]), str(row[1]), False) if row else None

    def create_role(self, name: str, description: str = "") -> Role:
        """A custom role; RoleExists if the name is taken (a built-in name, in any case,
        counts as taken)."""
        if name.lower() in BUILTIN_ROLES:
            raise RoleExists(name)
        now = time.time()
        try:
            with self._db.transaction() as conn:
                conn.execute(self._db.sql("INSERT INTO roles (name, description, created_at, "
                                          "updated_at) VALUES (?, ?, ?, ?)"),
                             (name, description, now, now))
        except self._db.integrity_errors:
            raise RoleExists(name) from None
        return Role(name, description, False)

    def update_role(self, name: str, description: str) -> Role | None:
        """Change a custom role's description; None if there is none by that name,
        BuiltinRole for admin and user."""
        if name in BUILTIN_ROLES:
            raise BuiltinRole(name)
        with self._db.transaction() as conn:
            cur = conn.execute(self._db.sql("UPDATE roles SET description = ?, updated_at = ? "
                                            "WHERE name = ?"), (description, time.time(), name))
        return Role(name, description, False) if cur.rowcount == 1 else None

    def _legacy_auditor(self) -> Role | None:
        """A custom role named `auditor` made before the built-in one (a group, no rights)."""
        with self._db.transaction() as conn:
            row = conn.execute(self._db.sql("SELECT description FROM roles WHERE name = ?"),
                               (AUDITOR,)).fetchone()
        return Role(AUDITOR, str(row[0]), False) if row else None

    def delete_role(self, name: str) -> bool:
        """Delete a custom role no user holds; False if there is none by that name,
        RoleInUse (with the number of holders) if someone holds it, BuiltinRole for a built-in
        role (but a custom role named `auditor` made before that role was built in, which
        can be deleted as any custom role). The check and the delete are one statement."""
        sql = self._db.sql
        if name in BUILTIN_ROLES and (name != AUDITOR or self._legacy_auditor() is None):
            raise BuiltinRole(name)
        holders = ("SELECT count(*) FROM user_roles ur JOIN users u ON u.id = ur.user_id "
                   "WHERE ur.role = ?")
        try:
            with self._db.transaction() as conn:
                cur = conn.execute(sql("DELETE FROM roles WHERE name = ? AND NOT EXISTS ("
                                       "SELECT 1 FROM user_roles ur JOIN users u ON "
                                       "u.id = ur.user_id WHERE ur.role = ?)"), (name, name))
                if cur.rowcount == 1:
                    # SQLite: rows left by a user deleted while being given the role
                    conn.execute(sql("DELETE FROM user_roles WHERE role = ?"), (name,))
                    return True
                row = conn.execute(sql("SELECT 1 FROM roles WHERE name = ?"), (name,)
                                   ).fetchone()
                if row is None:
                    return False
                count = int(conn.execute(sql(holders), (name,)).fetchone()[0])
        except self._db.integrity_errors:  # PostgreSQL: given to someone meanwhile
            with self._db.transaction() as conn:
                count = int(conn.execute(sql(holders), (name,)).fetchone()[0])
        raise RoleInUse(name, max(count, 1))


def federated_name(chosen: str) -> str:
    """A federated person's own choice of name (`preferred_username`, an email: any printable
    text) within the local name rule: accents dropped (NFKD), every run of other characters
    one `_`, a leading non-alphanumeric run removed, cut to the rule's length."""
    ascii_only = unicodedata.normalize("NFKD", chosen).encode("ascii", "ignore").decode()
    mapped = _NAME_START.sub("", _NOT_IN_NAME.sub("_", ascii_only))[:_NAME_MAX]
    return mapped or FEDERATED_FALLBACK


def _candidates(base: str, uid: str) -> Iterator[str]:
    """`base`, then `base-<6 hex>` (the new user's id first, then random ones) for a name
    that is taken: each within the rule, none a prefix trick (`-` is a name character)."""
    yield base
    yield f"{base[:_NAME_MAX - 7]}-{uid[:6]}"
    while True:
        yield f"{base[:_NAME_MAX - 7]}-{secrets.token_hex(3)}"


def name_candidates(base: str, uid: str) -> Iterator[str]:
    """The names a new person of chosen name `base` may have, in the order to try them."""
    return _candidates(base, uid)


def _unique(names: Iterable[str]) -> tuple[str, ...]:
    """The names in their first order, each once."""
    return tuple(dict.fromkeys(names))
