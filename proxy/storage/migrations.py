"""Versioned schema migrations, on SQLite and PostgreSQL alike.

Every persisted table is defined here. `schema_migrations` records each applied version;
`upgrade` applies the missing ones in order, all in one transaction, at start-up (the first
time a `Database` hands out a connection) or through `tollhouse db upgrade`. Two processes
starting at once are safe: on PostgreSQL the upgrade holds a transaction-scoped advisory lock,
on SQLite a write transaction (BEGIN IMMEDIATE); the second one then finds nothing to do.

A step is portable DDL (types as `{id}`, `{real}`, `{bigint}`, see `Database.ddl`), DDL for
one dialect only, or a column to add if missing. Creation is `IF NOT EXISTS` throughout, and
columns are added only when absent, so a SQLite file written before migrations existed is
adopted as it stands: each step finds what is already there and leaves it alone.

Never edit a released migration; add a new one.
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TextIO

from proxy.storage.sql import Connection, Dialect, ddl, sql

if TYPE_CHECKING:
    from proxy.storage.db import Database

log = logging.getLogger("tollhouse.migrations")

# pg_advisory_xact_lock key: "tollhouse" folded into a signed 64-bit integer
_LOCK_KEY = int.from_bytes(b"tollhse!", "big") - 2**63


@dataclass(frozen=True)
class Sql:
    """Portable DDL (column types in braces)."""

    text: str


@dataclass(frozen=True)
class Only:
    """DDL for one dialect."""

    dialect: Dialect
    text: str


@dataclass(frozen=True)
class AddColumn:
    """ALTER TABLE ... ADD COLUMN, skipped when the column exists."""

    table: str
    column: str
    type: str


Step = Sql | Only | AddColumn


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    steps: tuple[Step, ...] | Owned


def _change_counter(table: str, each: Literal["ROW", "STATEMENT"]) -> tuple[Step, ...]:
    """`<table>_version`, a one-row counter that triggers bump in the transaction of every
    insert, update or delete of `table` (PostgreSQL: once per row or per statement; SQLite:
    per row), whoever writes: what a gateway polls to learn that the table changed."""
    return (
        Sql(f"""CREATE TABLE IF NOT EXISTS {table}_version (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            version {{bigint}} NOT NULL
        )"""),
        Sql(f"INSERT INTO {table}_version (id, version) VALUES (1, 0) ON CONFLICT DO NOTHING"),
        Only("postgresql", f"""CREATE OR REPLACE FUNCTION tollhouse_{table}_changed()
            RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                UPDATE {table}_version SET version = version + 1 WHERE id = 1;
                RETURN NULL;
            END $$"""),
        Only("postgresql", f"CREATE TRIGGER {table}_changed AFTER INSERT OR UPDATE OR DELETE "
                           f"ON {table} FOR EACH {each} EXECUTE FUNCTION "
                           f"tollhouse_{table}_changed()"),
        *(Only("sqlite", f"CREATE TRIGGER IF NOT EXISTS {table}_changed_{event.lower()} "
                         f"AFTER {event} ON {table} BEGIN UPDATE {table}_version "
                         "SET version = version + 1 WHERE id = 1; END")
          for event in ("INSERT", "UPDATE", "DELETE")),
    )


@dataclass(frozen=True)
class Owned:
    """A migration of tables a feature owns: the number and name are handed out here, in order
    with the rest, and the feature registers the steps (`register`), so storage imports no
    feature. The audit rollups' two (20 and 21) are registered by `proxy.audit.rollup`."""

    owner: str  # the module that registers the steps


_REGISTERED: dict[int, tuple[Step, ...]] = {}


def register(version: int, steps: tuple[Step, ...]) -> None:
    """The steps of migration `version`, declared here as `Owned` by the caller's module."""
    _REGISTERED[version] = steps


def steps_of(migration: Migration) -> tuple[Step, ...]:
    """A migration's steps; an owned one's as its owner registered them (loudly missing when
    the owner was never imported: a database must never skip a version)."""
    if not isinstance(migration.steps, Owned):
        return migration.steps
    steps = _REGISTERED.get(migration.version)
    if steps is None:
        raise RuntimeError(f"migration {migration.version} ({migration.name}) has no steps: "
                           f"{migration.steps.owner} registers them and was not imported")
    return steps


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "audit log", (
        Sql("""CREATE TABLE IF NOT EXISTS audit (
            id {id},
            ts {real} NOT NULL,
            request_id TEXT,
            principal TEXT NOT NULL,
            endpoint TEXT NOT NULL,
            method TEXT,
            tool TEXT,
            status TEXT NOT NULL,
            denied_reason TEXT,
            error_message TEXT,
            duration_ms {real} NOT NULL,
            bytes_in {bigint} NOT NULL,
            bytes_out {bigint} NOT NULL,
            era TEXT NOT NULL,
            session_hash TEXT
        )"""),
        Sql("CREATE INDEX IF NOT EXISTS audit_ts ON audit (ts)"),
        Sql("CREATE INDEX IF NOT EXISTS audit_status_ts ON audit (status, ts)"),
        Sql("CREATE INDEX IF NOT EXISTS audit_endpoint_ts ON audit (endpoint, ts)"),
    )),
    Migration(2, "audit: the client's name", (
        AddColumn("audit", "client_name", "TEXT"),
    )),
    Migration(3, "usage events: audit call ids and notes, the outbox", (
        AddColumn("audit", "call_id", "TEXT"),
        AddColumn("audit", "note", "TEXT"),
        Sql("""CREATE TABLE IF NOT EXISTS usage_outbox (
            call_id TEXT PRIMARY KEY,
            event TEXT NOT NULL,
            created_at {real} NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at {real} NOT NULL,
            delivered_at {real}
        )"""),
        Sql("CREATE INDEX IF NOT EXISTS usage_outbox_due ON usage_outbox "
            "(delivered_at, next_attempt_at)"),
    )),
    Migration(4, "audit: egress decisions", (
        AddColumn("audit", "egress", "TEXT"),
    )),
    Migration(5, "API keys", (
        Sql("""CREATE TABLE IF NOT EXISTS api_keys (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            secret_sha256 TEXT NOT NULL,
            endpoints TEXT NOT NULL DEFAULT '[]',
            role TEXT NOT NULL DEFAULT '',
            created_at {real} NOT NULL,
            expires_at {real},
            revoked_at {real}
        )"""),
    )),
    Migration(6, "people and the authorization server", (
        Sql("""CREATE TABLE IF NOT EXISTS users (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            issuer TEXT NOT NULL,
            subject TEXT NOT NULL,
            password_hash TEXT,
            is_admin INTEGER NOT NULL DEFAULT 0,
            groups TEXT NOT NULL DEFAULT '',
            created_at {real} NOT NULL,
            UNIQUE (issuer, subject)
        )"""),
        Sql("""CREATE TABLE IF NOT EXISTS oauth_keys (
            kid TEXT PRIMARY KEY,
            sealed TEXT NOT NULL,
            created_at {real} NOT NULL
        )"""),
        Sql("""CREATE TABLE IF NOT EXISTS oauth_clients (
            client_id TEXT PRIMARY KEY,
            secret_sha256 TEXT,
            name TEXT NOT NULL,
            redirect_uris TEXT NOT NULL,
            auth_method TEXT NOT NULL,
            created_at {real} NOT NULL
        )"""),
        Sql("""CREATE TABLE IF NOT EXISTS oauth_refresh (
            token_sha256 TEXT PRIMARY KEY,
            family TEXT NOT NULL,
            client_id TEXT NOT NULL,
            user_id TEXT NOT NULL,
            resource TEXT NOT NULL,
            scope TEXT NOT NULL,
            expires_at {real} NOT NULL,
            used_at {real},
            revoked_at {real}
        )"""),
        Sql("CREATE INDEX IF NOT EXISTS oauth_refresh_family ON oauth_refresh (family)"),
    )),
    Migration(7, "the token vault", (
        Sql("""CREATE TABLE IF NOT EXISTS upstream_tokens (
            upstream TEXT NOT NULL,
            principal TEXT NOT NULL,
            kid TEXT NOT NULL,
            sealed TEXT NOT NULL,
            status TEXT NOT NULL,
            expires_at {real},
            updated_at {real} NOT NULL,
            PRIMARY KEY (upstream, principal)
        )"""),
    )),
    Migration(8, "API keys: a change counter the gateway polls", (
        # any change to api_keys, by any writer, bumps the counter in the same transaction
        *_change_counter("api_keys", each="ROW"),
    )),
    Migration(9, "upstream servers registered through the management API", (
        Sql("""CREATE TABLE IF NOT EXISTS servers (
            name TEXT PRIMARY KEY,
            spec TEXT NOT NULL,
            created_at {real} NOT NULL,
            updated_at {real} NOT NULL
        )"""),
    )),
    # A custom role is a group its holders are in, beside the groups their identity provider
    # gives (users.groups, which a federated sign-in overwrites): so it lives in a table of its
    # own. The foreign keys hold on PostgreSQL; SQLite parses and ignores them, and
    # proxy.people.accounts writes as if they did not exist (it deletes a user's roles with the user).
    Migration(10, "custom roles and the users who hold them", (
        Sql("""CREATE TABLE IF NOT EXISTS roles (
            name TEXT PRIMARY KEY,
            description TEXT NOT NULL DEFAULT '',
            created_at {real} NOT NULL,
            updated_at {real} NOT NULL
        )"""),
        Sql("""CREATE TABLE IF NOT EXISTS user_roles (
            user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
            role TEXT NOT NULL REFERENCES roles (name),
            PRIMARY KEY (user_id, role)
        )"""),
        Sql("CREATE INDEX IF NOT EXISTS user_roles_role ON user_roles (role)"),
    )),
    # every gateway on the database polls this counter and reloads the servers when it moved
    Migration(11, "servers: a change counter the gateways poll", (
        *_change_counter("servers", each="STATEMENT"),
    )),
    # the gateway's own client at an upstream's authorization server, registered once for
    # every gateway on the database (proxy.connect.vault): a row is written once, never updated
    # but to reseal it, and the secret is sealed like a token
    Migration(12, "clients registered at upstreams' authorization servers", (
        Sql("""CREATE TABLE IF NOT EXISTS upstream_clients (
            upstream TEXT NOT NULL,
            issuer TEXT NOT NULL,
            registration_endpoint TEXT NOT NULL,
            redirect_uri TEXT NOT NULL,
            client_id TEXT NOT NULL,
            kid TEXT NOT NULL,
            sealed TEXT NOT NULL,
            created_at {real} NOT NULL,
            PRIMARY KEY (upstream, issuer, registration_endpoint, redirect_uri)
        )"""),
    )),
    # The audit writer commits before a call is answered: each index is one more page per
    # commit. A call id (a metered call's) is the record's idempotency key, so a retried batch
    # or a replayed fallback line adds no second record; every query (newest first, by time,
    # with filters) walks audit_ts, and the two per-column indexes beside it go.
    Migration(13, "audit: one record per call id, only the index the queries use", (
        Sql("DELETE FROM audit WHERE call_id IS NOT NULL AND id NOT IN "
            "(SELECT min(id) FROM audit WHERE call_id IS NOT NULL GROUP BY call_id)"),
        Sql("CREATE UNIQUE INDEX IF NOT EXISTS audit_call_id ON audit (call_id) "
            "WHERE call_id IS NOT NULL"),
        Sql("DROP INDEX IF EXISTS audit_status_ts"),
        Sql("DROP INDEX IF EXISTS audit_endpoint_ts"),
    )),
    # guardrails: each tool's pinned definition (its SHA-256 and the definition itself, JSON),
    # the changed one waiting for an administrator, and the last one rejected
    Migration(14, "pinned tool definitions", (
        Sql("""CREATE TABLE IF NOT EXISTS tool_pins (
            endpoint TEXT NOT NULL,
            name TEXT NOT NULL,
            approved TEXT NOT NULL,
            definition TEXT NOT NULL,
            pending TEXT,
            pending_definition TEXT,
            rejected TEXT,
            updated_at {real} NOT NULL,
            PRIMARY KEY (endpoint, name)
        )"""),
    )),
    # virtual endpoints created through /api/v1/endpoints (proxy.virtual.registry), and the
    # counter every gateway on the database polls to reload them
    Migration(15, "virtual endpoints registered through the management API", (
        Sql("""CREATE TABLE IF NOT EXISTS endpoints (
            name TEXT PRIMARY KEY,
            spec TEXT NOT NULL,
            created_at {real} NOT NULL,
            updated_at {real} NOT NULL
        )"""),
        *_change_counter("endpoints", each="STATEMENT"),
    )),
    # the pins' change counter: every gateway on the database polls it and reloads the pins
    # when it moved, so an approval on one replica reaches the others within a poll
    Migration(16, "a change counter for the pinned tool definitions", (
        *_change_counter("tool_pins", each="STATEMENT"),
    )),
    # per-caller upstreams (proxy.config.template): a person's attributes fill a URL's
    # placeholders no token claim does, and the audit names the origin a call was sent to
    Migration(17, "per-caller upstreams: users' attributes, the audit's resolved upstream", (
        AddColumn("users", "attributes", "TEXT NOT NULL DEFAULT '{}'"),
        AddColumn("audit", "upstream", "TEXT"),
    )),
    # what the gateway last saw of each upstream server (proxy.seen): the tools of the last
    # tools/list it relayed (trimmed, JSON, with their hash: a list unchanged is not written
    # again) and the protocol version last negotiated; the console's servers pages read it
    Migration(18, "upstream servers: the tools and protocol version last seen", (
        Sql("""CREATE TABLE IF NOT EXISTS server_tools (
            server TEXT PRIMARY KEY,
            tools TEXT,
            tools_hash TEXT,
            tools_seen_at {real},
            era TEXT,
            era_seen_at {real}
        )"""),
    )),
    # Migration 13 left audit_ts alone; a filter on a rare endpoint (with or without a status)
    # then walked audit_ts newest first over nearly every record to find one page (1M records:
    # seconds). This index walks that endpoint's records newest first (id: the cursor's
    # tie-break, in index order on both backends), stopping at a page, for one more index
    # page per commit; a status, principal or tool filter alone still walks audit_ts and
    # stops at a page, which a common value fills at once.
    Migration(19, "audit: an index for filters on an endpoint", (
        Sql("CREATE INDEX IF NOT EXISTS audit_endpoint_ts_id ON audit (endpoint, ts, id)"),
    )),
    # The aggregates (/api/v1/usage, /usage/series, /usage/summary) grouped every raw record
    # of their period (a week of a million: tens of seconds). The audit writer now keeps
    # per-minute, hour and day counts (proxy.audit.rollup) in the transaction of each batch;
    # these are their tables, filled here from the records already there (one pass over the
    # audit table per rollup, then each coarser span from the finer). The statements come
    # from proxy.audit.rollup: a later change to those tables is a new migration there.
    Migration(20, "audit rollups per minute, hour and day", Owned("proxy.audit.rollup")),
    # /api/v1/usage of a week summed some 60,000 usage rollup rows into 7,500 totals, grouped
    # on principal, endpoint, kind and tool: SQLite sorted them on those four (200 ms at the
    # console's size). Each (principal, endpoint, kind, tool) now has an integer id
    # (usage_keys), each usage rollup row its key's `key_id`, and the sum groups on that one
    # integer (bench/README.md, "Web console at size"). The writer reads a new key's id in
    # the batch's transaction; a writer of the release before still adds to the rows there.
    Migration(21, "audit rollups: an integer key per principal, endpoint and tool",
              Owned("proxy.audit.rollup")),
    # the Cedar gate's decision on a call (policies.cedar.gate): the policy version, the
    # decision and its policies, the shadow decision and its policies, as a JSON object
    Migration(22, "audit: policy decisions", (
        AddColumn("audit", "policy", "TEXT"),
    )),
    # Cedar policies created through /api/v1/policies (proxy.policy_store): one policy a row,
    # its version 1 when created and one more on each replace; and the counter every gateway
    # on the database polls to reload them
    Migration(23, "Cedar policies managed through the management API", (
        Sql("""CREATE TABLE IF NOT EXISTS policies (
            id TEXT PRIMARY KEY,
            text TEXT NOT NULL,
            mode TEXT NOT NULL DEFAULT 'enforce',
            version INTEGER NOT NULL,
            created_at {real} NOT NULL,
            updated_at {real} NOT NULL,
            author TEXT
        )"""),
        *_change_counter("policies", each="STATEMENT"),
    )),
    # tamper evidence (proxy.audit.chain, docs/audit-evidence.md): each writer (one process's
    # audit writer thread, from its start) links the records it commits into a chain of its
    # own: `chain_id`, the record's place in it (`chain_seq`, from 1) and the SHA-256 over its
    # predecessor's hash and its canonical form (`chain_hash`, hex); the chain's records are
    # read in order through the unique index. `audit_checkpoints` holds the signed
    # checkpoints of every chain's head, each linked to the one before it; `audit_verifications`
    # each `tollhouse audit verify`'s outcome
    Migration(24, "audit: hash chains per writer, signed checkpoints, verifications", (
        AddColumn("audit", "chain_id", "TEXT"),
        AddColumn("audit", "chain_seq", "BIGINT"),
        AddColumn("audit", "chain_hash", "TEXT"),
        Sql("CREATE UNIQUE INDEX IF NOT EXISTS audit_chain ON audit (chain_id, chain_seq) "
            "WHERE chain_id IS NOT NULL"),
        Sql("""CREATE TABLE IF NOT EXISTS audit_checkpoints (
            seq {bigint} PRIMARY KEY,
            at {real} NOT NULL,
            writer TEXT NOT NULL,
            key_id TEXT NOT NULL,
            body TEXT NOT NULL,
            hash TEXT NOT NULL,
            signature TEXT NOT NULL
        )"""),
        Sql("""CREATE TABLE IF NOT EXISTS audit_verifications (
            id {id},
            at {real} NOT NULL,
            by_name TEXT NOT NULL,
            ok INTEGER NOT NULL,
            detail TEXT NOT NULL,
            since {real},
            records {bigint} NOT NULL,
            checkpoint_seq {bigint},
            checkpoint_at {real},
            checkpoint_hash TEXT
        )"""),
    )),
    # the audit exports (proxy.audit.exports): each record queued for each export in the
    # transaction that writes it (`seq`: the order its writer committed them; one row per
    # export and event id), and each export's lease (which gateway sends), totals, last error
    # and backlog as last measured
    Migration(25, "audit exports: the outbox per export and each export's state", (
        Sql("""CREATE TABLE IF NOT EXISTS audit_export_outbox (
            seq {id},
            export TEXT NOT NULL,
            event_id TEXT NOT NULL,
            record TEXT NOT NULL,
            created_at {real} NOT NULL
        )"""),
        Sql("CREATE UNIQUE INDEX IF NOT EXISTS audit_export_outbox_event ON "
            "audit_export_outbox (export, event_id)"),
        Sql("CREATE INDEX IF NOT EXISTS audit_export_outbox_order ON audit_export_outbox "
            "(export, seq)"),
        Sql("""CREATE TABLE IF NOT EXISTS audit_exports (
            name TEXT PRIMARY KEY,
            holder TEXT,
            lease_until {real} NOT NULL DEFAULT 0,
            sent {bigint} NOT NULL DEFAULT 0,
            failed {bigint} NOT NULL DEFAULT 0,
            dropped {bigint} NOT NULL DEFAULT 0,
            backlog {bigint} NOT NULL DEFAULT 0,
            oldest_at {real},
            is_full INTEGER NOT NULL DEFAULT 0,
            last_error TEXT,
            last_error_at {real},
            last_sent_at {real},
            next_attempt_at {real} NOT NULL DEFAULT 0,
            failures INTEGER NOT NULL DEFAULT 0
        )"""),
    )),
    # the prompts and resources each server last listed, beside its tools (proxy.seen), for
    # the endpoints' server cards (proxy.cards); each list kept trimmed with its hash
    Migration(26, "upstream servers: the prompts and resources last seen", (
        AddColumn("server_tools", "prompts", "TEXT"),
        AddColumn("server_tools", "prompts_hash", "TEXT"),
        AddColumn("server_tools", "prompts_seen_at", "DOUBLE PRECISION"),
        AddColumn("server_tools", "resources", "TEXT"),
        AddColumn("server_tools", "resources_hash", "TEXT"),
        AddColumn("server_tools", "resources_seen_at", "DOUBLE PRECISION"),
    )),
    # SCIM provisioning (proxy.scim, proxy.people.directory, docs/provisioning.md): whether a
    # person is active; each provisioned person's SCIM resource as the identity provider sent
    # it, with the values it is found by (userName and emails lowercased, externalId); the
    # SCIM groups and who is in them; and the keys a deprovisioned person's credentials are
    # refused by on every gateway (the counter a gateway's mirror of them reads)
    Migration(27, "SCIM provisioning: people's resources, groups, members, the deprovisioned", (
        AddColumn("users", "active", "INTEGER NOT NULL DEFAULT 1"),
        Sql("""CREATE TABLE IF NOT EXISTS scim_users (
            user_id TEXT PRIMARY KEY,
            user_name TEXT NOT NULL,
            external_id TEXT,
            emails TEXT NOT NULL DEFAULT '',
            doc TEXT NOT NULL,
            version {bigint} NOT NULL,
            created_at {real} NOT NULL,
            updated_at {real} NOT NULL
        )"""),
        Sql("CREATE UNIQUE INDEX IF NOT EXISTS scim_users_name ON scim_users (user_name)"),
        Sql("""CREATE TABLE IF NOT EXISTS scim_groups (
            id TEXT PRIMARY KEY,
            display_name TEXT NOT NULL,
            external_id TEXT,
            doc TEXT NOT NULL,
            version {bigint} NOT NULL,
            created_at {real} NOT NULL,
            updated_at {real} NOT NULL
        )"""),
        Sql("CREATE UNIQUE INDEX IF NOT EXISTS scim_groups_name ON scim_groups (display_name)"),
        Sql("""CREATE TABLE IF NOT EXISTS scim_members (
            group_id TEXT NOT NULL REFERENCES scim_groups (id) ON DELETE CASCADE,
            user_id TEXT NOT NULL,
            PRIMARY KEY (group_id, user_id)
        )"""),
        Sql("CREATE INDEX IF NOT EXISTS scim_members_user ON scim_members (user_id)"),
        Sql("""CREATE TABLE IF NOT EXISTS deprovisioned (
            key TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            at {real} NOT NULL
        )"""),
        *_change_counter("deprovisioned", each="STATEMENT"),
    )),
    # who acted for the principal of a call (RFC 8693 `act`: an agent client acting for a
    # person with a token from token exchange, proxy.oauth.grants), beside the principal
    Migration(28, "audit: the actor beside the principal", (
        AddColumn("audit", "actor", "TEXT"),
    )),
    # groups mapped to roles through /api/v1/group-roles (proxy.auth.group_roles; the config's
    # [[auth.group_roles]] are not stored): a SCIM group or a token's group -> a role, and the
    # counter every gateway's mirror of them reads
    Migration(29, "group roles: a group's members hold a role", (
        Sql("""CREATE TABLE IF NOT EXISTS group_roles (
            group_name TEXT NOT NULL,
            role TEXT NOT NULL,
            created_at {real} NOT NULL,
            PRIMARY KEY (group_name, role)
        )"""),
        *_change_counter("group_roles", each="STATEMENT"),
    )),
    # A person's console page reads their recent calls (/api/v1/audit?principal=...), and a
    # filter on a principal alone walked audit_ts newest first until a page filled: for a
    # person with few records, the whole log (578 ms at p50 on the 1M-record bench). This
    # index walks that principal's records newest first (id: the cursor's tie-break), for one
    # more index page per commit (bench/README.md, "Web console at size").
    Migration(30, "audit: an index for filters on a principal", (
        Sql("CREATE INDEX IF NOT EXISTS audit_principal_ts_id ON audit (principal, ts, id)"),
    )),
)

LATEST = MIGRATIONS[-1].version


def _check(migrations: tuple[Migration, ...]) -> None:
    versions = [m.version for m in migrations]
    # 1, 2, 3, ...: a number handed out to a branch ahead of its merge is checked here once
    # everything has landed (a gap means a migration was lost in a merge)
    if versions != list(range(1, len(versions) + 1)):
        raise AssertionError("migration versions must be 1, 2, 3, ... in order")


_check(MIGRATIONS)


def _has_column(conn: Connection, dialect: Dialect, table: str, column: str) -> bool:
    if dialect == "sqlite":
        return any(row[1] == column
                   for row in conn.execute(f"PRAGMA table_info({table})").fetchall())
    row = conn.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = "
                       "current_schema() AND table_name = %s AND column_name = %s",
                       (table, column)).fetchone()
    return row is not None


def _run(conn: Connection, dialect: Dialect, step: Step) -> None:
    if isinstance(step, Sql):
        conn.execute(ddl(step.text, dialect))
    elif isinstance(step, Only):
        if step.dialect == dialect:
            conn.execute(step.text)
    elif not _has_column(conn, dialect, step.table, step.column):
        conn.execute(f"ALTER TABLE {step.table} ADD COLUMN {step.column} {step.type}")


def _applied(conn: Connection) -> set[int]:
    return {int(row[0]) for row in conn.execute("SELECT version FROM schema_migrations"
                                                ).fetchall()}


def apply(conn: Connection, dialect: Dialect,
          migrations: tuple[Migration, ...] = MIGRATIONS) -> list[int]:
    """Apply the pending migrations on this connection, in one transaction, holding the
    migration lock; returns the versions applied. The connection must be outside a
    transaction; it is left outside one."""
    try:
        if dialect == "postgresql":
            # another gateway's migration, or DDL behind running queries: wait it out
            conn.execute("SET LOCAL lock_timeout = '300s'")
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,)).fetchall()
        else:
            conn.execute("BEGIN IMMEDIATE")
        conn.execute(ddl("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER "
                         "PRIMARY KEY, name TEXT NOT NULL, applied_at {real} NOT NULL)",
                         dialect))
        done = _applied(conn)
        pending = [m for m in migrations if m.version not in done]
        newer = sorted(v for v in done if v > (migrations[-1].version if migrations else 0))
        if newer:
            log.warning("the database has schema versions %s, newer than this Tollhouse knows "
                        "(%d): it was upgraded by a later release", newer,
                        migrations[-1].version if migrations else 0)
        insert = sql("INSERT INTO schema_migrations (version, name, applied_at) "
                     "VALUES (?, ?, ?)", dialect)
        for migration in pending:
            for step in steps_of(migration):
                _run(conn, dialect, step)
            conn.execute(insert, (migration.version, migration.name, time.time()))
        conn.commit()
    except BaseException:
        with suppress(Exception):
            conn.rollback()
        raise
    # a new database's creation is one line; an upgrade names each migration it applied
    if pending and not done:
        log.info("database schema created at version %d", max(m.version for m in pending))
    for migration in pending:
        log.log(logging.DEBUG if not done else logging.INFO,
                "database schema: applied migration %d (%s)", migration.version, migration.name)
    return [m.version for m in pending]


def current(database: Database) -> int:
    """The highest applied version; 0 for a database never migrated."""
    with database.lease() as conn:
        try:
            row = conn.execute("SELECT max(version) FROM schema_migrations").fetchone()
        except database.missing_table:
            conn.rollback()
            return 0
        conn.rollback()
    return int(row[0] or 0)


def upgrade(database: Database, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[int]:
    """Bring the schema up to date; returns the versions applied (empty: it was current).
    Safe to call from several processes at once."""
    if not database.memory and not _pending(database, migrations):
        return []  # the common start-up: one read, no lock
    with database.lease() as conn:
        return apply(conn, database.dialect, migrations)


def _pending(database: Database, migrations: tuple[Migration, ...]) -> bool:
    with database.lease() as conn:
        try:
            done = _applied(conn)
        except database.missing_table:
            conn.rollback()
            return True
        conn.rollback()
    return any(m.version not in done for m in migrations)


def command(database: Database, out: TextIO | None = None) -> int:
    """`tollhouse db upgrade`: apply pending migrations, say what was done; exit status."""
    out = out or sys.stdout
    names = {m.version: m.name for m in MIGRATIONS}
    try:
        before = current(database)
        applied = upgrade(database)
        after = current(database)
    except database.errors as exc:
        print(f"tollhouse: db upgrade: {database!r}: {exc}", file=sys.stderr)
        return 1
    for version in applied:
        out.write(f"applied {version}: {names[version]}\n")
    if applied:
        out.write(f"schema version {before} -> {after}\n")
    else:
        out.write(f"schema version {after}: up to date\n")
    return 0
