"""Every persisted store on the run's database backend (SQLite, or PostgreSQL with
TOLLHOUSE_TEST_DATABASE=postgresql; `make test` runs both): migrations, audit and usage, the
outbox, API keys, accounts, the authorization server's tables and the token vault."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.audit import AuditRecord
from proxy.audit import summary as audit_summary
from proxy.audit.database import DatabaseAuditSink, query, usage
from proxy.audit.outbox import OutboxWorker
from proxy.audit.outbox_table import OutboxTable
from proxy.auth import keys as api_keys
from proxy.connect.vault import Vault
from proxy.oauth.keys import KeyRing
from proxy.oauth.server import AuthorizationServer, Client, OAuthError, s256
from proxy.people.accounts import LOCAL_ISSUER, USER_NAME, Accounts, User, UserExists
from proxy.state.codes import MemoryCodeStore
from proxy.state.flows import MemoryFlowStore
from proxy.state.revocations import MemoryRevocationStore
from proxy.storage import db, migrations
from proxy.storage.db import Database
from tests.conftest import make_config
from tests.helpers import DEADLINE_S, until

VERSIONS = [m.version for m in migrations.MIGRATIONS]  # every one this build knows
OTHER_SESSIONS = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                  "AND pid <> pg_backend_pid()")


def terminated(conn: Any, sessions: str, params: tuple[Any, ...] = ()) -> bool:
    """End the PostgreSQL sessions whose pids `sessions` selects, each call returning once its
    backend has exited (pg_terminate_backend's timeout form): no sleep waits for it."""
    ends = conn.execute("SELECT pg_terminate_backend(s.pid::integer, %s::bigint) "
                        f"FROM ({sessions}) AS s",
                        (int(DEADLINE_S * 1000), *params)).fetchall()
    return all(ended for (ended,) in ends)

TABLES = {"audit", "usage_outbox", "api_keys", "api_keys_version", "users", "oauth_keys",
          "oauth_clients", "oauth_refresh", "upstream_tokens", "servers", "servers_version",
          "roles", "user_roles", "upstream_clients", "schema_migrations", "endpoints",
          "endpoints_version", "rollup_calls", "rollup_endpoints", "rollup_tools",
          "rollup_denials", "rollup_usage", "usage_keys"}


def rows(database: Database, text: str, *args: Any) -> list[tuple[Any, ...]]:
    with database.transaction() as conn:
        return [tuple(r) for r in conn.execute(database.sql(text), args).fetchall()]


def tables(database: Database) -> set[str]:
    if database.postgresql:
        found = rows(database, "SELECT table_name FROM information_schema.tables "
                               "WHERE table_schema = current_schema()")
    else:
        found = rows(database, "SELECT name FROM sqlite_master WHERE type = 'table'")
    return {r[0] for r in found}


# -- the dialect layer ---------------------------------------------------------------------------

def test_placeholders_are_spelt_per_dialect() -> None:
    pg, lite = Database("postgresql://u@h/d"), Database("sqlite:///x.db")
    text = "SELECT '?', \"a?\" FROM t WHERE a = ? AND b LIKE 'x%' AND c = ?"
    assert lite.sql(text) == text
    assert pg.sql(text) == ("SELECT '?', \"a?\" FROM t WHERE a = %s AND b LIKE 'x%%' "
                            "AND c = %s")
    assert pg.upsert("t", ("a", "b", "c"), ("a",)) == (
        "INSERT INTO t (a, b, c) VALUES (%s, %s, %s) ON CONFLICT (a) DO UPDATE SET "
        "b = excluded.b, c = excluded.c")
    assert lite.insert_ignore("t", ("a", "b")) == ("INSERT INTO t (a, b) VALUES (?, ?) "
                                                   "ON CONFLICT DO NOTHING")
    assert pg.ddl("x {real}, y {bigint}") == "x DOUBLE PRECISION, y BIGINT"
    assert "AUTOINCREMENT" in lite.id_column and "IDENTITY" in pg.id_column
    assert lite.path == "x.db" and Database("sqlite:///").memory
    assert "secret" not in repr(Database("postgresql://u:secret@h:5433/d"))
    with pytest.raises(ValueError):
        Database("mysql://x")


def test_a_path_a_url_and_a_database_all_resolve(tmp_path: Path) -> None:
    path = str(tmp_path / "a.db")
    assert db.resolve(path).url == f"sqlite:///{path}"
    assert db.resolve(f"sqlite:///{path}").path == path
    made = Database(f"sqlite:///{path}")
    assert db.resolve(made) is made


def test_a_transaction_commits_or_rolls_back(database: Database) -> None:
    database.ensure_schema()
    with pytest.raises(RuntimeError), database.transaction() as conn:
        conn.execute(database.sql("INSERT INTO servers (name, spec, created_at, updated_at) "
                                  "VALUES (?, ?, ?, ?)"), ("a", "{}", 1.0, 1.0))
        raise RuntimeError("no")
    assert rows(database, "SELECT name FROM servers") == []
    with database.transaction() as conn:
        conn.execute(database.sql("INSERT INTO servers (name, spec, created_at, updated_at) "
                                  "VALUES (?, ?, ?, ?)"), ("b", "{}", 1.0, 1.0))
    assert rows(database, "SELECT name FROM servers") == [("b",)]
    with pytest.raises(database.integrity_errors), database.transaction() as conn:
        conn.execute(database.sql("INSERT INTO servers (name, spec, created_at, updated_at) "
                                  "VALUES (?, ?, ?, ?)"), ("b", "{}", 1.0, 1.0))
    # the pool still works after a failure
    assert rows(database, "SELECT count(*) FROM servers") == [(1,)]


def test_a_connection_the_server_dropped_is_not_lent_again(database: Database) -> None:
    if not database.postgresql:
        pytest.skip("PostgreSQL sessions only")
    database.ensure_schema()
    with database.transaction() as conn:
        pid = conn.execute("SELECT pg_backend_pid()", ()).fetchone()[0]
    other = Database(database.url)
    try:
        with other.transaction() as conn:
            assert terminated(conn, "SELECT %s AS pid", (pid,))
    finally:
        other.close()
    with database.transaction() as conn:  # a new session, not the dead one
        assert conn.execute("SELECT pg_backend_pid()", ()).fetchone()[0] != pid


def test_an_in_memory_database_is_one_database(tmp_path: Path) -> None:
    memory = Database("sqlite:///")
    accounts = Accounts(memory)
    accounts.create_local("alice", "correct-horse")
    key, _ = api_keys.create(memory, "bot", [])
    assert [u.name for u in Accounts(memory).list()] == ["alice"]
    assert [k.id for k in api_keys.list_keys(memory)] == [key.id]
    memory.close()


# -- migrations ----------------------------------------------------------------------------------

def test_migrations_create_every_table_and_are_idempotent(database: Database) -> None:
    assert migrations.current(database) == 0
    assert migrations.upgrade(database) == VERSIONS
    assert migrations.upgrade(database) == []
    with Database(database.url) as another:
        assert migrations.upgrade(another) == []
    assert migrations.current(database) == migrations.LATEST
    assert TABLES <= tables(database)
    versions = rows(database, "SELECT version FROM schema_migrations ORDER BY version")
    assert [v[0] for v in versions] == VERSIONS


def test_migrations_started_at_once_apply_once(database_url: str) -> None:
    results: list[list[int]] = []
    failures: list[BaseException] = []
    start = threading.Barrier(6)

    def run() -> None:
        mine = Database(database_url)
        try:
            start.wait()
            results.append(migrations.upgrade(mine))
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        finally:
            mine.close()

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert sorted(results, key=len) == [[]] * 5 + [VERSIONS]
    check = Database(database_url)
    try:
        assert rows(check, "SELECT count(*), count(DISTINCT version) FROM schema_migrations"
                    ) == [(len(VERSIONS), len(VERSIONS))]
    finally:
        check.close()


def test_processes_started_at_once_migrate_once(database_url: str) -> None:
    code = ("import sys; from proxy.audit import rollup; from proxy.storage import migrations; "
            "from proxy.storage.db import Database; "
            "sys.exit(migrations.command(Database(sys.argv[1])))")
    procs = [subprocess.Popen([sys.executable, "-c", code, database_url],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outs
    said = sorted((out for out, _ in outs), key=lambda out: "->" in out)
    assert said[:3] == [f"schema version {migrations.LATEST}: up to date\n"] * 3
    assert said[3].endswith(f"schema version 0 -> {migrations.LATEST}\n")


def test_a_later_migration_is_applied_to_a_migrated_database(database: Database) -> None:
    migrations.upgrade(database)
    extra = migrations.Migration(migrations.LATEST + 1, "a test column", (
        migrations.AddColumn("servers", "note", "TEXT"),
        migrations.Only("postgresql", "CREATE INDEX servers_note ON servers (note)"),
        migrations.Only("sqlite", "CREATE INDEX servers_note ON servers (note)"),
    ))
    assert migrations.upgrade(database, (*migrations.MIGRATIONS, extra)) == [extra.version]
    assert migrations.upgrade(database, (*migrations.MIGRATIONS, extra)) == []
    with database.transaction() as conn:
        conn.execute(database.sql("INSERT INTO servers (name, spec, created_at, updated_at, "
                                  "note) VALUES (?, ?, ?, ?, ?)"), ("n", "{}", 1.0, 1.0, "hi"))
    # an older release starting on the newer schema carries on
    with Database(database.url) as older:
        assert migrations.upgrade(older) == []


def test_a_sqlite_file_from_before_migrations_is_adopted(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript("""
        CREATE TABLE audit (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL,
            request_id TEXT, principal TEXT NOT NULL, endpoint TEXT NOT NULL, method TEXT,
            tool TEXT, status TEXT NOT NULL, denied_reason TEXT, error_message TEXT,
            duration_ms REAL NOT NULL, bytes_in INTEGER NOT NULL, bytes_out INTEGER NOT NULL,
            era TEXT NOT NULL, session_hash TEXT, client_name TEXT);
        INSERT INTO audit (ts, principal, endpoint, status, duration_ms, bytes_in, bytes_out,
            era) VALUES (1.0, 'alice', 'e', 'ok', 1.5, 1, 2, 'legacy');
        CREATE TABLE api_keys (id TEXT PRIMARY KEY, name TEXT NOT NULL,
            secret_sha256 TEXT NOT NULL, endpoints TEXT NOT NULL DEFAULT '[]',
            role TEXT NOT NULL DEFAULT '', created_at REAL NOT NULL, expires_at REAL,
            revoked_at REAL);
    """)
    old.close()
    database = Database.sqlite(str(path))
    assert migrations.upgrade(database) == VERSIONS
    (record,) = query(database)
    assert record["principal"] == "alice" and record["call_id"] is None
    columns = {r[1] for r in rows(database, "PRAGMA table_info(audit)")}
    assert {"client_name", "call_id", "note", "egress"} <= columns
    database.close()


def test_the_upgrade_command(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with Database(database_url) as database:
        assert migrations.command(database) == 0
    out = capsys.readouterr().out
    assert f"schema version 0 -> {migrations.LATEST}" in out and "applied 1: audit log" in out
    with Database(database_url) as database:
        assert migrations.command(database) == 0
    assert capsys.readouterr().out == f"schema version {migrations.LATEST}: up to date\n"


# -- the audit log and usage ---------------------------------------------------------------------

def record(i: int, **kw: Any) -> AuditRecord:
    kw.setdefault("ts", 1_000_000.0 + i)
    return AuditRecord(endpoint=kw.pop("endpoint", "e"), method="tools/call", request_id=str(i),
                       principal=kw.pop("principal", "alice"), tool="echo", **kw)


async def test_audit_writes_queries_and_sums_usage(database: Database) -> None:
    sink = DatabaseAuditSink(database, batch_size=7)
    for i in range(40):
        sink.emit(record(i, status=("ok", "denied", "error", "cancelled")[i % 4],
                         bytes_in=10, bytes_out=100, duration_ms=1.25,
                         endpoint="f" if i >= 30 else "e",
                         egress={"zone": "remote"} if i == 39 else None))
    await sink.close()
    assert sink.written == 40
    newest = query(database, limit=5)
    assert [r["request_id"] for r in newest] == ["39", "38", "37", "36", "35"]
    assert orjson.loads(newest[0]["egress"]) == {"zone": "remote"}
    assert isinstance(newest[0]["ts"], float) and newest[0]["ts"] == 1_000_039.0
    assert [r["request_id"] for r in query(database, status="denied", endpoint="f")] == [
        "37", "33"]
    assert len(query(database, since=1_000_030.0, limit=100)) == 10
    assert [r["request_id"] for r in query(database, until=1_000_002.0)] == ["1", "0"]
    page = query(database, limit=3, with_id=True)
    after = query(database, limit=2, with_id=True, before=(page[-1]["ts"], page[-1]["id"]))
    assert [r["request_id"] for r in after] == ["36", "35"]
    totals = {r["endpoint"]: r for r in usage(database, since=0)}
    assert totals["e"] == {"principal": "alice", "endpoint": "e", "tool": "echo", "calls": 30,
                           "ok": 8, "denied": 8, "error": 7, "cancelled": 7, "bytes_in": 300,
                           "bytes_out": 3000, "duration_ms": 37.5}
    assert all(type(v) is int for k, v in totals["f"].items()
               if k not in ("principal", "endpoint", "tool", "duration_ms"))
    assert usage(database, since=2_000_000.0) == []
    # the URL alone reads the same rows (the CLI's way)
    assert [r["request_id"] for r in query(database.url, limit=1)] == ["39"]


async def test_the_audit_writer_reconnects_after_a_lost_session(database: Database) -> None:
    if not database.postgresql:
        pytest.skip("PostgreSQL sessions only")
    sink = DatabaseAuditSink(database, retry_backoff_s=0.01)
    sink.emit(record(1))
    await until(lambda: sink.written >= 1, what="the first record written")
    with Database(database.url) as admin, admin.transaction() as conn:
        assert terminated(conn, OTHER_SESSIONS)
    sink.emit(record(2))
    await sink.close()
    assert sink.written == 2
    assert [r["request_id"] for r in query(database)] == ["2", "1"]


def test_reading_a_database_never_written_finds_nothing(database_url: str, tmp_path: Path
                                                        ) -> None:
    assert query(database_url) == [] and usage(database_url, since=0) == []
    assert query(str(tmp_path / "missing.db")) == []
    assert not (tmp_path / "missing.db").exists()


async def test_usage_events_land_once_and_are_marked_delivered(database: Database) -> None:
    sink = DatabaseAuditSink(database)
    sink.emit(record(1, call_id="c1"))
    sink.emit(record(2, call_id="c2"))
    sink.emit(record(3))  # not metered: no usage event
    await sink.close()
    again = DatabaseAuditSink(database)
    again.emit(record(1, call_id="c1"))  # the same call id: the outbox keeps the first
    await again.close()
    assert rows(database, "SELECT call_id, attempts, delivered_at FROM usage_outbox "
                          "ORDER BY call_id") == [("c1", 0, None), ("c2", 0, None)]

    class Receiver:
        def __init__(self) -> None:
            self.events: list[dict[str, Any]] = []
            self.fail = {"c2"}

        async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
            return {"allow": True}

        async def record(self, event: dict[str, Any]) -> None:
            if event["call_id"] in self.fail:
                self.fail.discard(event["call_id"])
                raise ValueError("receiver down")
            self.events.append(event)

    receiver = Receiver()
    worker = OutboxWorker(database, receiver, retry_max_s=0.05)
    task = asyncio.get_running_loop().create_task(worker.run())
    try:
        await until(lambda: worker.delivered == 2, what="both events delivered")
    finally:
        task.cancel()
        await asyncio.wait({task}, timeout=5)
    assert sorted(e["call_id"] for e in receiver.events) == ["c1", "c2"]
    marks = rows(database, "SELECT call_id, attempts, delivered_at IS NOT NULL FROM "
                           "usage_outbox ORDER BY call_id")
    assert [(c, a, bool(d)) for c, a, d in marks] == [("c1", 0, True), ("c2", 1, True)]


async def test_a_drain_flushes_the_usage_outbox(database: Database) -> None:
    """`flush` delivers what is due now, though nothing woke the worker: at a drain the
    events do not wait for the next start."""
    receiver = CountingReceiver()
    worker = OutboxWorker(database, receiver, retry_max_s=0.05)
    task = asyncio.get_running_loop().create_task(worker.run())
    try:
        assert await worker.flush(DEADLINE_S)  # nothing due: caught up at once
        sink = DatabaseAuditSink(database)  # no on_outbox: the worker sleeps on (30 s)
        sink.emit(record(1, call_id="f1"))
        sink.emit(record(2, call_id="f2"))
        await sink.close()
        assert worker.delivered == 0
        assert await worker.flush(DEADLINE_S)
        assert worker.delivered == 2 and receiver.seen == {"f1": 1, "f2": 1}
    finally:
        task.cancel()
        await asyncio.wait({task}, timeout=5)
    assert rows(database, "SELECT count(*) FROM usage_outbox WHERE delivered_at IS NULL") \
        == [(0,)]


async def test_delivered_usage_events_are_pruned_after_their_keep(database: Database) -> None:
    """A delivered event stays `keep_delivered_s`, then the worker deletes it; one still to be
    delivered stays however old it is, and the summary's backlog counts only those."""
    now = [2_000_000.0]

    class Receiver:
        async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
            return {"allow": True}

        async def record(self, event: dict[str, Any]) -> None:
            if event["call_id"] == "stuck":
                raise ValueError("receiver refuses this one")

    sink = DatabaseAuditSink(database)
    for i, call_id in enumerate(("p1", "p2", "p3", "stuck")):
        sink.emit(record(i, call_id=call_id))
    await sink.close()
    worker = OutboxWorker(database, Receiver(), retry_max_s=10_000, clock=lambda: now[0],
                          keep_delivered_s=3600)
    task = asyncio.get_running_loop().create_task(worker.run())
    try:
        assert await worker.flush(DEADLINE_S)
        assert worker.delivered == 3 and worker.pruned == 0  # delivered just now: kept
        assert audit_summary.summary(database, since=0)["outbox_backlog"] == 1
        now[0] += 3600 + OutboxWorker.PRUNE_EVERY_S + 1  # past the keep and the sweep's pause
        assert await worker.flush(DEADLINE_S)
        assert worker.pruned == 3
    finally:
        task.cancel()
        await asyncio.wait({task}, timeout=5)
    assert rows(database, "SELECT call_id, delivered_at IS NULL FROM usage_outbox") \
        == [("stuck", True)]
    assert audit_summary.summary(database, since=0)["outbox_backlog"] == 1


class CountingReceiver:
    """Counts deliveries per call id; each delivery yields to the loop so workers interleave.
    `hold` keeps deliveries waiting until set."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}
        self.hold = asyncio.Event()
        self.hold.set()
        self.started = asyncio.Event()
        self.waiting = 0  # deliveries held at once

    async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"allow": True}

    async def record(self, event: dict[str, Any]) -> None:
        self.started.set()
        self.waiting += 1
        await self.hold.wait()
        self.waiting -= 1
        await asyncio.sleep(0)  # the fake yields to the loop here, so the two workers interleave
        self.seen[event["call_id"]] = self.seen.get(event["call_id"], 0) + 1


async def test_a_claims_outcomes_are_written_with_the_next_claim(
        database: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """One transaction a round: what a claim's deliveries came to is written by the claim
    after it (which finds nothing more due here), never in a transaction of its own."""
    sink = DatabaseAuditSink(database)
    for i in range(5):
        sink.emit(record(i, call_id=f"n{i}"))
    await sink.close()
    alone: list[object] = []
    monkeypatch.setattr(OutboxTable, "mark", lambda self, marks: alone.append(marks))
    receiver = CountingReceiver()
    worker = OutboxWorker(database, receiver, retry_max_s=0.05)
    task = asyncio.get_running_loop().create_task(worker.run())
    try:
        assert await worker.flush(DEADLINE_S)
        assert worker.delivered == 5 and receiver.seen == {f"n{i}": 1 for i in range(5)}
        assert rows(database, "SELECT count(*) FROM usage_outbox WHERE delivered_at IS NULL"
                    ) == [(0,)]
    finally:
        task.cancel()
        await asyncio.wait({task}, timeout=5)
    assert alone == []  # nothing was left to write on its own, at the end either


async def test_a_claim_failing_as_the_worker_stops_keeps_the_outcomes_it_carried(
        database: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """The claim that carries the last claim's outcomes fails while the worker is being
    stopped: the outcomes are written on their own as it stops, not dropped (the receiver
    would be sent those events again at the next start)."""
    sink = DatabaseAuditSink(database)
    for i in range(3):
        sink.emit(record(i, call_id=f"s{i}"))
    await sink.close()
    real = OutboxTable.claim
    carried: list[Any] = []
    second, fail = threading.Event(), threading.Event()

    def claim(self: OutboxTable, now: float, outcomes: Any) -> Any:
        carried.append(outcomes)
        if len(carried) == 1:
            return real(self, now, outcomes)
        second.set()
        fail.wait(DEADLINE_S)
        raise database.errors[0]("the database went away mid-claim")

    monkeypatch.setattr(OutboxTable, "claim", claim)
    receiver = CountingReceiver()
    worker = OutboxWorker(database, receiver, retry_max_s=0.05)
    task = asyncio.get_running_loop().create_task(worker.run())
    try:
        await until(second.is_set, what="the claim after the first under way")
        assert [len(done) for done, _ in carried] == [0, 3]  # it carries three deliveries
        task.cancel()  # (the worker learns it before the claim's failure comes back)
    finally:
        fail.set()
        await asyncio.wait({task}, timeout=DEADLINE_S)
    assert task.done()
    assert receiver.seen == {f"s{i}": 1 for i in range(3)}
    assert rows(database, "SELECT count(*) FROM usage_outbox WHERE delivered_at IS NULL"
                ) == [(0,)]


async def test_two_workers_on_one_database_send_each_event_once(database: Database) -> None:
    sink = DatabaseAuditSink(database)
    for i in range(120):
        sink.emit(record(i, call_id=f"c{i:03d}"))
    await sink.close()
    receiver = CountingReceiver()
    receiver.hold.clear()  # each worker's first delivery waits: both hold a claim at once
    # two gateways' workers, each with its own connections to the one database
    others = Database(database.url)
    workers = [OutboxWorker(database, receiver, retry_max_s=0.05),
               OutboxWorker(others, receiver, retry_max_s=0.05)]
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(w.run()) for w in workers]
    try:
        await until(lambda: receiver.waiting == 2)
        receiver.hold.set()
        await until(lambda: sum(w.delivered for w in workers) >= 120)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=5)
        others.close()
    assert len(receiver.seen) == 120 and set(receiver.seen.values()) == {1}
    assert all(w.delivered > 0 for w in workers)  # both took part
    assert rows(database, "SELECT count(*) FROM usage_outbox WHERE delivered_at IS NULL"
                ) == [(0,)]


async def test_a_stopped_worker_hands_back_what_it_claimed(database: Database) -> None:
    sink = DatabaseAuditSink(database)
    for i in range(5):
        sink.emit(record(i, call_id=f"c{i}"))
    await sink.close()
    receiver = CountingReceiver()
    receiver.hold.clear()  # the first delivery waits: the worker holds a claim of five
    first = OutboxWorker(database, receiver, retry_max_s=0.05)
    task = asyncio.get_running_loop().create_task(first.run())
    await asyncio.wait_for(receiver.started.wait(), 10)
    task.cancel()
    receiver.hold.set()  # the delivery under way finishes and is marked
    await asyncio.wait({task}, timeout=5)
    assert receiver.seen == {"c0": 1}
    # the other four are due now, not when the lease would have ended
    assert rows(database, "SELECT count(*) FROM usage_outbox WHERE delivered_at IS NULL "
                          "AND next_attempt_at <= ?", time.time()) == [(4,)]
    second = OutboxWorker(database, receiver, retry_max_s=0.05)
    task = asyncio.get_running_loop().create_task(second.run())
    try:
        await until(lambda: second.delivered == 4)
    finally:
        task.cancel()
        await asyncio.wait({task}, timeout=5)
    assert receiver.seen == {f"c{i}": 1 for i in range(5)}


# -- API keys ------------------------------------------------------------------------------------

async def test_api_keys_create_list_revoke_and_lookup(database: Database) -> None:
    key, secret = api_keys.create(database, "ci-bot", ["b", "a"], role="admin")
    assert secret.startswith(f"th_{key.id}_")
    (listed,) = api_keys.list_keys(database.url)  # as the CLI does: by URL
    assert listed.public()["endpoints"] == ["a", "b"] and listed.role == "admin"
    index = api_keys.KeyIndex(database)
    try:
        found = await index.lookup(secret)
        assert found is not None and found.id == key.id
        assert await index.lookup(secret[:-1] + ("A" if secret[-1] != "A" else "B")) is None
        assert await index.lookup("th_nope") is None
        # another process revokes it: refused on the very next lookup, by every lookup
        assert api_keys.revoke(database.url, key.id)
        assert not api_keys.revoke(database.url, key.id)
        assert await index.lookup(secret) is None
        later, later_secret = api_keys.create(database.url, "later", [])
        results = await asyncio.gather(*(index.lookup(s) for s in [secret, later_secret] * 20))
        assert {r.id if r else None for r in results} == {None, later.id}
        assert all(r is None for r in results[::2]) and all(results[1::2])
        _, expired_secret = api_keys.create(database, "old", [], expires_in_days=-1)
        assert await index.lookup(expired_secret) is None
        statuses = {k.name: k.status(time.time()) for k in api_keys.list_keys(database)}
        assert statuses == {"ci-bot": "revoked", "later": "active", "old": "expired"}
    finally:
        index.close()


async def test_key_lookups_outlive_lost_sessions(database: Database) -> None:
    if not database.postgresql:
        pytest.skip("PostgreSQL sessions only")
    key, secret = api_keys.create(database, "bot", [])
    index = api_keys.KeyIndex(database)
    try:
        assert await index.lookup(secret) is not None
        with Database(database.url) as admin, admin.transaction() as conn:
            assert terminated(conn, OTHER_SESSIONS)
        assert await index.lookup(secret) is not None
        assert api_keys.revoke(database, key.id)
        assert await index.lookup(secret) is None
    finally:
        index.close()


# -- people --------------------------------------------------------------------------------------

def test_accounts_create_verify_and_upsert_federated(database: Database) -> None:
    accounts = Accounts(database)
    alice = accounts.create_local("alice", "correct-horse", admin=True)
    assert alice.issuer == LOCAL_ISSUER and alice.is_admin
    with pytest.raises(UserExists):
        accounts.create_local("alice", "another-one")
    assert accounts.verify_local("alice", "correct-horse") == alice
    assert accounts.verify_local("alice", "wrong-horse") is None
    assert accounts.verify_local("nobody", "correct-horse") is None
    idp = "https://idp.example"
    bob = accounts.upsert_federated(idp, "sub-1", "bob", frozenset({"dev", "ops"}), False)
    again = accounts.upsert_federated(idp, "sub-1", "bob", frozenset({"dev"}), True)
    assert again.id == bob.id and again.is_admin and again.groups == {"dev"}
    assert accounts.get(bob.id) == again
    # a federated name that is taken gets a suffix within the name rule: `-` and six hex digits
    other = accounts.upsert_federated(idp, "sub-2", "alice", frozenset(), False)
    assert re.fullmatch(r"alice-[0-9a-f]{6}", other.name) and other.id != alice.id
    assert [u.name for u in accounts.list()] == sorted(["alice", "bob", other.name])
    assert accounts.get("missing") is None


def test_federated_names_keep_the_local_name_rule(database: Database) -> None:
    """A person chooses their own name at their identity provider: it is stored within the
    local rule (one URL path segment as it stands), a taken one with a `-<hex>` suffix."""
    accounts = Accounts(database)
    accounts.create_local("alice", "correct-horse", admin=True)
    idp = "https://idp.example"
    chosen = {"x/../../servers/prod": "x_.._.._servers_prod", "alice#5715d2": "alice_5715d2",
              "José Müller": "Jose_Muller", "bob@example.com": "bob@example.com",
              "../etc": "etc", ".hidden%2Fx": "hidden_2Fx", "Иван": "user", "a" * 80: "a" * 64}
    for n, (name, stored) in enumerate(chosen.items()):
        user = accounts.upsert_federated(idp, f"s{n}", name, frozenset(), False)
        assert re.fullmatch(USER_NAME, user.name) and user.name == stored, name
    twice = [accounts.upsert_federated(idp, f"t{n}", "alice", frozenset(), False).name
             for n in range(3)]  # each taken name and suffix is passed over
    assert len({"alice", *twice}) == 4
    assert all(re.fullmatch(r"alice-[0-9a-f]{6}", name) for name in twice)
    long = accounts.upsert_federated(idp, "t-long", "a" * 80, frozenset(), False)
    assert re.fullmatch(r"a{57}-[0-9a-f]{6}", long.name)
    assert all(re.fullmatch(USER_NAME, u.name) for u in accounts.list())


# -- the authorization server --------------------------------------------------------------------

def oauth_server(database: Database) -> AuthorizationServer:
    cfg = make_config(auth={"mode": "jwt"}, oauth_server={"enabled": True})
    ring = KeyRing(database, "test-secret", cfg.oauth_server.key_rotation_s,
                   cfg.oauth_server.access_token_ttl_s)
    return AuthorizationServer(
        cfg, database, ring, codes=MemoryCodeStore(cfg.oauth_server.code_ttl_s),
        revocations=MemoryRevocationStore(cfg.oauth_server.access_token_ttl_s + 60),
        consents=MemoryFlowStore())


CALLBACK = "http://127.0.0.1:3000/cb"


async def granted(server: AuthorizationServer, client: Client, user: User,
                  resource: str) -> dict[str, Any]:
    """Tokens as a client gets them: a code for `user`, exchanged with its PKCE verifier."""
    verifier = "v" * 50
    code = await server.issue_code(client, CALLBACK, {"code_challenge": s256(verifier)}, user,
                                   resource)
    return await server.exchange_code(client, {"code": code, "code_verifier": verifier,
                                               "redirect_uri": CALLBACK})


async def test_an_access_token_is_verified_once_but_expiry_and_revocation_every_time(
        database: Database) -> None:
    import jwt

    server = oauth_server(database)
    resource = f"{server.issuer}/mcp/e"
    user = Accounts(database).create_local("ann", "ann-password")
    client = server.client(server.register({"redirect_uris": [CALLBACK]})["client_id"])
    assert client is not None
    token = (await granted(server, client, user, resource))["access_token"]
    assert (await server.verify_access(token, resource))["sub"] == user.subject
    assert (token, resource) in server._verified  # the signature is not checked again
    with pytest.raises(jwt.InvalidAudienceError):  # another endpoint: checked afresh
        await server.verify_access(token, f"{server.issuer}/mcp/other")
    server._verified[(token, resource)] = {**server._verified[(token, resource)],
                                           "exp": time.time() - 60}
    with pytest.raises(jwt.ExpiredSignatureError):  # expiry is read on every call
        await server.verify_access(token, resource)
    fresh = await granted(server, client, user, resource)  # another grant, another family
    assert await server.verify_access(fresh["access_token"], resource)
    await server.revoke(client, fresh["refresh_token"])  # the family is revoked
    with pytest.raises(jwt.InvalidTokenError, match="revoked"):  # revocation too
        await server.verify_access(fresh["access_token"], resource)


async def test_oauth_clients_refresh_rotation_and_family_revocation(database: Database) -> None:
    server = oauth_server(database)
    resource = f"{server.issuer}/mcp/e"  # make_config's one endpoint
    assert server.endpoint_of(resource) == "e" and server.endpoint_of(resource + "x") is None
    registered = server.register({"redirect_uris": ["http://127.0.0.1:3000/cb"],
                                  "client_name": "Test", "token_endpoint_auth_method":
                                  "client_secret_post"})
    client = server.authenticate_client(registered["client_id"], registered["client_secret"])
    assert client.name == "Test" and client.redirect_uris == ("http://127.0.0.1:3000/cb",)
    with pytest.raises(OAuthError):
        server.authenticate_client(registered["client_id"], "wrong")
    # a second server on the same database (another process) knows the client and the key
    twin = oauth_server(database)
    assert twin.client(client.client_id) == client
    assert twin.keys.current.kid == server.keys.current.kid

    alice = Accounts(database).create_local("alice", "correct-horse")
    verifier = "v" * 50
    code = await server.issue_code(client, "http://127.0.0.1:3000/cb",
                             {"code_challenge": s256(verifier)}, alice, resource)
    tokens = await server.exchange_code(client, {"code": code, "code_verifier": verifier,
                                           "redirect_uri": "http://127.0.0.1:3000/cb"})
    claims = await server.verify_access(tokens["access_token"], resource)
    assert claims["sub"] == alice.subject

    def lookup(user_id: str) -> Any:
        return Accounts(database).get(user_id)

    rotated = await server.refresh(client, {"refresh_token": tokens["refresh_token"]}, lookup)
    assert rotated["refresh_token"] != tokens["refresh_token"]
    # the old refresh token used again: the whole family is revoked, the new one too
    with pytest.raises(OAuthError, match="reused"):
        await server.refresh(client, {"refresh_token": tokens["refresh_token"]}, lookup)
    with pytest.raises(OAuthError, match="revoked"):
        await twin.refresh(client, {"refresh_token": rotated["refresh_token"]}, lookup)
    assert rows(database, "SELECT count(*) FROM oauth_refresh WHERE revoked_at IS NULL"
                ) == [(0,)]
    with pytest.raises(OAuthError, match="unknown"):
        await server.refresh(client, {"refresh_token": "nope"}, lookup)


# -- the token vault -----------------------------------------------------------------------------

def test_vault_put_get_and_key_rotation(database: Database) -> None:
    old = Vault(database, {"k1": b"\x01" * 32})
    old.put("gh", "p|alice", {"access_token": "A", "refresh_token": "R", "expires_at": 5.0})
    old.put("gl", "p|alice", {"access_token": "B"})
    got = old.get("gh", "p|alice")
    assert got is not None and got.status == "connected" and got.expires_at == 5.0
    old.mark("gl", "p|alice", "needs_reconnect")
    assert old.statuses("p|alice") == {"gh": "connected", "gl": "needs_reconnect"}
    assert old.get("gh", "p|bob") is None
    # a row copied to another person does not decrypt
    with database.transaction() as conn:
        conn.execute(database.sql(
            "INSERT INTO upstream_tokens SELECT upstream, 'p|mallory', kid, sealed, status, "
            "expires_at, updated_at FROM upstream_tokens WHERE principal = ? AND upstream = ?"),
            ("p|alice", "gh"))
    stolen = old.get("gh", "p|mallory")
    assert stolen is not None and stolen.status == "needs_reconnect" and stolen.tokens == {}
    # rotation: resealed under the new key when read; the old key can then go
    rotated = Vault(database.url, {"k2": b"\x02" * 32, "k1": b"\x01" * 32})
    again = rotated.get("gh", "p|alice")
    assert again is not None and again.tokens["access_token"] == "A"
    rotated.close()
    assert rows(database, "SELECT kid FROM upstream_tokens WHERE principal = ? AND "
                          "upstream = ?", "p|alice", "gh") == [("k2",)]
    only_new = Vault(database, {"k2": b"\x02" * 32})
    latest = only_new.get("gh", "p|alice")
    assert latest is not None and latest.tokens["refresh_token"] == "R"
    only_new.put("gh", "p|alice", {"access_token": "C"})  # an upsert, not a second row
    assert rows(database, "SELECT count(*) FROM upstream_tokens WHERE principal = ?",
                "p|alice") == [(2,)]
    only_new.delete("gh", "p|alice")
    assert only_new.statuses("p|alice") == {"gl": "needs_reconnect"}


# -- the gateway on each backend -----------------------------------------------------------------

async def test_the_gateway_keys_and_audit_on_each_backend(database_url: str) -> None:
    """API keys checked and every call audited in the configured database (the config is
    built for SQLite and pointed at this database, whatever the config check allows)."""
    import dataclasses

    from proxy.config import Config, DatabaseConfig, from_dict
    from proxy.demo import demo_app
    from tests.conftest import MCP_HEADERS
    from tests.stack import Urls, gateway_client

    def config(urls: Urls) -> Config:
        cfg = from_dict({"auth": {"mode": "jwt"},
                         "upstreams": [{"name": "e", "url": f"{urls.upstream}/mcp"}]}, env={})
        return dataclasses.replace(cfg, database=DatabaseConfig(url=database_url))

    key, secret = api_keys.create(database_url, "ci-bot", [])
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": "echo", "arguments": {"text": "hi"}}})
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {secret}"}
    async with gateway_client(config, upstream=demo_app()) as client:
        ok = await client.post("/mcp/e", content=body, headers=headers)
        assert ok.status_code == 200, ok.text
        assert api_keys.revoke(database_url, key.id)
        refused = await client.post("/mcp/e", content=body, headers=headers)
        assert refused.status_code == 401
    records = query(database_url)  # the audit writer drained when the app stopped
    assert [(r["status"], r["principal"].endswith(key.id)) for r in records
            if r["tool"] == "echo"] == [("ok", True)]
    assert any(r["status"] == "denied" for r in records)
