"""The metering hook's two backends, and the outbox worker that delivers usage events.

Usage events are written to the `usage_outbox` table in the same transaction as their audit
record, so an accepted call is never lost; the worker delivers them at least once, with
exponential backoff, across restarts and receiver outages. The receiver settles each `call_id`
once (it is the idempotency key). The webhook's contract is fixed: a JSON POST signed with
`X-Tollhouse-Signature: sha256=<hex HMAC-SHA256 of the body>`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import importlib
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

import httpx
import orjson

from policies.metering import MeteringBackend
from proxy.storage import db
from proxy.audit.record import AuditRecord
from proxy.bounded import within
from proxy.config import MeteringConfig

log = logging.getLogger("tollhouse.metering")
T = TypeVar("T")


class PythonHook:
    """`metering.hook = "module:object"`: an object with async authorize() and record().
    In process: the outbox worker hands it each usage event as its call ends (`deliver_now`)."""

    in_process = True

    def __init__(self, spec: str) -> None:
        module, _, name = spec.partition(":")
        target = getattr(importlib.import_module(module), name)
        for method in ("authorize", "record"):
            if not callable(getattr(target, method, None)):
                raise ValueError(f"metering hook {spec} has no {method}()")  # noqa: TRY004
        self._target = target
        self.record = target.record  # the hook's own: no coroutine of ours around it

    async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
        return dict(await self._target.authorize(request))


class Webhook:
    in_process = False

    def __init__(self, url: str, secret: str, http: httpx.AsyncClient, timeout_s: float) -> None:
        self._url = url
        self._key = secret.encode()
        self._http = http
        self._timeout_s = timeout_s

    def sign(self, body: bytes) -> str:
        return "sha256=" + hmac.new(self._key, body, hashlib.sha256).hexdigest()

    async def _post(self, payload: dict[str, Any], timeout_s: float) -> httpx.Response:
        body = orjson.dumps(payload)
        return await self._http.post(self._url, content=body, timeout=timeout_s, headers={
            "content-type": "application/json", "x-tollhouse-signature": self.sign(body)})

    async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
        response = await self._post({"type": "authorize", **request}, self._timeout_s)
        if response.status_code != 200:
            raise ValueError(f"authorize answered HTTP {response.status_code}")
        answer = response.json()
        if not isinstance(answer, dict):
            raise ValueError("authorize answered no object")  # noqa: TRY004 - a bad answer
        return answer

    async def record(self, event: dict[str, Any]) -> None:
        response = await self._post(event, max(self._timeout_s, 5.0))
        if not 200 <= response.status_code < 300:
            raise ValueError(f"usage answered HTTP {response.status_code}")


def build_backend(cfg: MeteringConfig, http: httpx.AsyncClient) -> MeteringBackend:
    if cfg.hook:
        return PythonHook(cfg.hook)
    return Webhook(cfg.url, cfg.secret, http, cfg.timeout_ms / 1000)


class OutboxWorker:
    """Delivers due usage events; woken when new ones land, otherwise when the next retry is
    due. Every database step runs on one dedicated thread, in order: a step still running
    when the worker is cancelled finishes before the database is let go. `target` is the
    app's Database, a database URL, or a SQLite path.

    Several gateways on one database each run a worker. A worker claims the events it will
    send (a batch at a time, `FOR UPDATE SKIP LOCKED` on PostgreSQL, the write lock on SQLite)
    by moving their next attempt a lease ahead, so two workers never send the same event.
    Claimed events not yet sent when the worker stops are handed back; a worker that dies
    holding a claim leaves its events to the others once the lease ends, and an event whose
    delivery the receiver took but whose mark was lost with the worker is sent again: the
    receiver's idempotency on `call_id` absorbs that. A claim's outcomes (delivered, or due
    again later) are written in the transaction of the claim after it, at most GATHER_S
    later under load, or on their own when the worker stops: one commit a round."""

    CLAIM = 100  # events claimed at a time (the fixed cost of a claim and its mark, shared)
    # A claim holds its events this long, and is renewed while it is being sent whenever less
    # than one delivery's time (RENEW_S) is left: events a dead worker held are due again
    # soon after (a gateway killed and restarted delivers them within LEASE_S), never while a
    # live one still sends them.
    LEASE_S = 15.0
    RENEW_S = 11.0  # > a delivery's 10 s timeout
    GATHER_S = 0.05  # how long a wake-up waits for more events before it claims
    # Delivered events older than `keep_delivered_s` are deleted, at most this often, this many
    # a transaction (so a sweep never holds the write lock long).
    PRUNE_EVERY_S = 60.0
    PRUNE_BATCH = 5000

    def __init__(self, target: db.Target, backend: MeteringBackend, retry_max_s: float,
                 clock: Callable[[], float] = time.time, *,
                 keep_delivered_s: float = 24 * 3600.0) -> None:
        self._database = db.resolve(target)
        self._owns_db = self._database is not target
        self.backend = backend  # a reload may point it at a new one (and `inline` with it)
        self.keep_delivered_s = keep_delivered_s  # and change this
        self._pruned_at: float | None = None  # the last sweep (None: not yet)
        self._stopping = False  # cancelled: the claim being sent stops after its current event
        self.pruned = 0  # delivered events deleted
        self._retry_max_s = retry_max_s
        self._clock = clock
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tollhouse-outbox")
        skip_locked = " FOR UPDATE SKIP LOCKED" if self._database.postgresql else ""
        # Due events longest due first, in the due index's own order: a claim reads CLAIM rows
        # of it, not the whole backlog (ordered by created_at, every claim sorted every event
        # still to deliver, and under load, with deliveries behind, each claim cost more)
        self._sql_claim = self._database.sql(
            "UPDATE usage_outbox SET next_attempt_at = ? WHERE call_id IN (SELECT call_id FROM "
            "usage_outbox WHERE delivered_at IS NULL AND next_attempt_at <= ? ORDER BY "
            f"next_attempt_at LIMIT {self.CLAIM}{skip_locked}) "
            "RETURNING call_id, event, attempts, created_at")
        self._sql_release = self._database.sql(
            "UPDATE usage_outbox SET next_attempt_at = ? WHERE call_id = ? AND "
            "delivered_at IS NULL")
        # SQLite: the claim and the mark each one step, whatever their size (sqlite3 lets the
        # GIL go around every step, and the event loop then waits to get it back: a per-row
        # step of this thread cost every call's socket writes their share of the wait)
        self._sql_pick = self._database.sql(
            "SELECT json_group_array(json_array(call_id, event, attempts, created_at)) FROM "
            "(SELECT call_id, event, attempts, created_at FROM usage_outbox WHERE delivered_at "
            f"IS NULL AND next_attempt_at <= ? ORDER BY next_attempt_at LIMIT {self.CLAIM})")
        self._sql_lease = self._database.sql(
            "UPDATE usage_outbox SET next_attempt_at = ? WHERE call_id IN "
            "(SELECT value FROM json_each(?))")
        # each a JSON array of [time, call_id] pairs
        self._sql_done_all = (
            "UPDATE usage_outbox SET delivered_at = json_extract(j.value, '$[0]') FROM "
            "json_each(?) AS j WHERE usage_outbox.call_id = json_extract(j.value, '$[1]')")
        self._sql_retry_all = (
            "UPDATE usage_outbox SET attempts = attempts + 1, next_attempt_at = "
            "json_extract(j.value, '$[0]') FROM json_each(?) AS j "
            "WHERE usage_outbox.call_id = json_extract(j.value, '$[1]')")
        self._sql_next = self._database.sql(
            "SELECT min(next_attempt_at) FROM usage_outbox WHERE delivered_at IS NULL")
        self._sql_retry = self._database.sql(
            "UPDATE usage_outbox SET attempts = attempts + 1, next_attempt_at = ? "
            "WHERE call_id = ?")
        self._sql_done = self._database.sql(
            "UPDATE usage_outbox SET delivered_at = ? WHERE call_id = ?")
        # the due index (delivered_at, next_attempt_at) is the range this walks
        self._sql_prune = self._database.sql(
            "DELETE FROM usage_outbox WHERE call_id IN (SELECT call_id FROM usage_outbox "
            f"WHERE delivered_at < ? LIMIT {self.PRUNE_BATCH})")
        self._conn: db.Connection | None = None  # the worker's own, used on its thread only
        self.delivered = 0
        self.delivered_inline = 0  # of them, taken by an in-process hook as the call ended
        self._rounds = 0  # claims begun
        self._caught_up = 0  # the last claim that found nothing due
        self._progress = asyncio.Event()

    @property
    def backend(self) -> MeteringBackend:
        return self._backend

    @backend.setter
    def backend(self, backend: MeteringBackend) -> None:
        self._backend = backend
        # an in-process hook is handed each event as its call ends (deliver_now) for as long as
        # its record() answers without waiting
        self.inline = bool(getattr(backend, "in_process", False))

    def follow(self, backend: MeteringBackend, keep_delivered_s: float) -> None:
        """A reload: deliver through `backend` from the next event on, and keep delivered
        events `keep_delivered_s`."""
        self.backend = backend
        self.keep_delivered_s = keep_delivered_s

    def deliver_now(self, record: AuditRecord) -> bool:
        """Hand an in-process hook the usage event of `record` now, on the event loop, as the
        call ends: its record is in the audit journal already (a crash from here on replays it
        and the event is delivered again: at least once, as ever). True when the hook took it:
        its outbox row then goes in delivered, and the worker never claims it. A hook that
        fails gets the event again from the outbox. One whose record() has to wait (it
        suspends: I/O, a lock) is not waited for here: that delivery is abandoned (closed where
        it waits) and left to the outbox, and so is every later one of this backend, the
        deliveries that can wait for their claim."""
        if not self.inline:
            return False
        # whatever the hook does (raise before it returns a coroutine, refuse to be closed), the
        # call's answer and its record's way to the database go on: the outbox has the event
        try:
            work = self._backend.record(record.usage_event())
            work.send(None)
        except StopIteration:
            self.delivered += 1
            self.delivered_inline += 1
            return True
        except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - retried by the outbox
            log.info("usage event %s not delivered (%s); the outbox retries it", record.call_id,
                     type(exc).__name__)
            return False
        self.inline = False
        with suppress(Exception):
            work.close()
        log.warning("metering hook: record() waited (it suspended): usage events go through "
                    "the outbox from now on, the first of them again")
        return False

    @contextmanager
    def _transaction(self) -> Iterator[db.Connection]:
        """One transaction on the worker's own connection (made on first use, on its thread,
        and again after one is lost); an in-memory SQLite database's shared one instead. On
        SQLite the connection commits with synchronous=NORMAL, as the audit writer's does: a
        commit that synced the WAL (FULL) would hold the write lock through an fsync, and the
        audit commits that answers wait for would queue behind it."""
        if self._database.memory:
            with self._database.transaction() as shared:
                yield shared
            return
        if self._conn is None:
            self._conn = self._database.connect()
            if not self._database.postgresql:
                self._conn.execute("PRAGMA synchronous=NORMAL")
        conn = self._conn
        try:
            yield conn
        except BaseException:
            with suppress(Exception):
                conn.rollback()
            if db.broken(conn):
                self._drop()
            raise
        try:
            conn.commit()
        except BaseException:
            with suppress(Exception):
                conn.rollback()
            if db.broken(conn):
                self._drop()
            raise

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(Exception):
                conn.close()

    async def _in_db(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._loop.run_in_executor(self._db, fn, *args)

    def wake_threadsafe(self) -> None:
        self._loop.call_soon_threadsafe(self._wake.set)

    async def flush(self, timeout: float) -> bool:
        """A drain: deliver every event due now (each attempted once more) before the process
        goes, within `timeout`; True when the outbox holds nothing due."""
        target = self._rounds + 1  # a claim that begins after this moment
        self._wake.set()
        try:
            async with asyncio.timeout(timeout):
                while self._caught_up < target:
                    self._progress.clear()
                    await self._progress.wait()
        except TimeoutError:
            return False
        return True

    async def run(self) -> None:
        failures = 0
        sending: asyncio.Task[None] | None = None
        claimed: list[tuple[str, str, int]] = []
        marks = _Marks()
        try:
            while True:
                self._wake.clear()
                self._rounds += 1
                round_ = self._rounds
                try:
                    # the last claim's outcomes are written in this claim's transaction: one
                    # commit (and one wait for SQLite's write lock) a round, not two
                    outcomes = marks.take()
                    claim = asyncio.ensure_future(self._in_db(self._claim, self._clock(),
                                                              outcomes))
                    try:
                        claimed, next_at = await asyncio.shield(claim)
                    except asyncio.CancelledError:  # the claim commits all the same: keep
                        try:                        # what it took, to hand it back below
                            claimed, _ = await claim
                            self.delivered += len(outcomes[0])
                        except Exception:  # noqa: BLE001 - not written: written as it stops
                            marks.put_back(outcomes)
                        raise
                    self.delivered += len(outcomes[0])
                    outcomes = ([], [])  # written
                    due = len(claimed)
                    if claimed:
                        # one task sends the whole claim (not one per event: the loop's cost
                        # of a task and a shield each would be paid by every metered call);
                        # cancelled, the worker lets the delivery under way finish (below)
                        sending = self._loop.create_task(self._send(claimed, marks))
                        await asyncio.shield(sending)
                        sending = None
                    await self._prune_due()
                except self._database.errors as exc:
                    # the database is out of reach (a restart, say): the events wait in it;
                    # the outcomes the failed claim was to write are kept for the next one
                    # (lost with the process, those sent go again: the receiver settles a
                    # call once)
                    marks = _Marks()
                    marks.put_back(outcomes)
                    failures += 1
                    pause = min(30.0, 0.5 * 2 ** min(failures, 6))
                    log.warning("usage outbox: database error (%s); retry in %.1fs", exc, pause)
                    await self._sleep(pause)
                    continue
                failures = 0
                if due >= self.CLAIM:  # more are likely due now: claim again at once
                    continue
                if due:
                    # under steady load events keep landing: let a batch gather before the
                    # next claim instead of claiming the few that landed while this one was
                    # sent (each claim is a commit, whatever its size)
                    await asyncio.sleep(self.GATHER_S)
                    continue
                self._caught_up = round_
                self._progress.set()
                wait = 30.0 if next_at is None else max(0.0, next_at - self._clock())
                if await self._sleep(min(wait, 30.0)):
                    # woken by new events: let more land before claiming, so that a claim
                    # takes a batch rather than one event per call (each claim is a write
                    # the audit writer's commits would queue behind)
                    await asyncio.sleep(self.GATHER_S)
        finally:
            if sending is not None:  # the delivery under way ends and is marked, then it stops
                self._stopping = True
                with suppress(Exception):
                    await sending
            if marks.pending:  # what was sent is marked, what was not is handed back
                with suppress(Exception):
                    await self._in_db(self._mark, marks.take())
                    self.delivered += marks.sent
            if claimed:
                with suppress(Exception):
                    await self._in_db(self._release, [c[0] for c in claimed], None)
            # queued behind any step still running on the thread, whatever cancelled us
            self._db.submit(self._drop)
            if self._owns_db:
                self._db.submit(self._database.close)
            self._db.shutdown(wait=False)

    async def _send(self, claimed: list[tuple[str, str, int]], marks: _Marks) -> None:
        """Deliver a claim's events in order, each added to `marks` and taken off `claimed`
        as it ends (what is left is the worker's to hand back), renewing the claim's lease
        while less than RENEW_S of it is left; it stops early once the worker is stopping. An
        event the receiver took is marked, not sent again next start."""
        lease_until = self._clock() + self.LEASE_S
        while claimed and not self._stopping:
            if self._clock() > lease_until - self.RENEW_S:
                lease_until = self._clock() + self.LEASE_S
                await self._in_db(self._release, [c[0] for c in claimed], lease_until)
            call_id, event, attempts = claimed[0]
            marks.add(await self._deliver(call_id, event, attempts), self._clock())
            claimed.pop(0)

    async def _prune_due(self) -> None:
        """Delete the delivered events older than `keep_delivered_s`, when the last sweep is
        PRUNE_EVERY_S old (or there was none): the outbox holds what is still to be sent and
        a day or so of what was, not every event ever made. Usage totals come from the audit
        log, not from here. A database error here is the next sweep's to retry."""
        now = self._clock()
        if self._pruned_at is not None and now - self._pruned_at < self.PRUNE_EVERY_S:
            return
        self._pruned_at = now
        try:
            while True:
                gone = await self._in_db(self._prune, now - self.keep_delivered_s)
                self.pruned += gone
                if gone < self.PRUNE_BATCH:
                    return
        except self._database.errors as exc:
            log.warning("usage outbox: pruning delivered events failed (%s)", exc)

    def _prune(self, before: float) -> int:
        with self._transaction() as conn:
            cur = conn.execute(self._sql_prune, (before,))
            return max(0, int(cur.rowcount or 0))

    async def _sleep(self, timeout: float) -> bool:
        """Until woken (True) or `timeout` (False). Not asyncio.wait_for: before Python 3.12 it can swallow
        a cancellation that arrives as the wake-up does, and the worker would outlive the
        gateway."""
        waiter = self._loop.create_task(self._wake.wait())
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        finally:
            waiter.cancel()
        return self._wake.is_set()

    def _claim(self, now: float, outcomes: _Outcomes
               ) -> tuple[list[tuple[str, str, int]], float | None]:
        """Write the last claim's `outcomes`, then take up to CLAIM due events, oldest first,
        out of every other worker's reach; one transaction."""
        with self._transaction() as conn:
            if not self._database.postgresql and not getattr(conn, "in_transaction", False):
                conn.execute("BEGIN IMMEDIATE")  # the write lock from the start (below)
            self._write_marks(conn, outcomes)
            if self._database.postgresql:
                rows = conn.execute(self._sql_claim, (now + self.LEASE_S, now)).fetchall()
            else:  # under the write lock from the start: no other worker picks the same
                rows = orjson.loads(conn.execute(self._sql_pick, (now,)).fetchone()[0])
                if rows:
                    conn.execute(self._sql_lease, (now + self.LEASE_S,
                                                   orjson.dumps([r[0] for r in rows]).decode()))
            # when the next event is due matters only to a worker with nothing to send now
            nxt = None if rows else conn.execute(self._sql_next, ()).fetchone()[0]
        rows.sort(key=lambda r: float(r[3]))
        return [(str(r[0]), str(r[1]), int(r[2])) for r in rows], nxt

    def _release(self, call_ids: list[str], until: float | None) -> None:
        """Hand claimed events back (due now), or hold them `until` then (a renewed claim)."""
        with suppress(*self._database.errors), self._transaction() as conn:
            at = self._clock() if until is None else until
            for call_id in call_ids:
                conn.execute(self._sql_release, (at, call_id))

    async def _deliver(self, call_id: str, event: str, attempts: int
                       ) -> tuple[str, float | None]:
        """(call id, None) once the receiver took the event, else (call id, next attempt)."""
        try:
            # (not wait_for: it can swallow a cancellation; no timer when the hook does not wait)
            await within(self.backend.record(orjson.loads(event)), 10.0)
        except Exception as exc:  # noqa: BLE001 - any failure is retried later
            delay = min(self._retry_max_s, 0.5 * 2 ** attempts)
            log.info("usage event %s not delivered (%s); retry in %.1fs", call_id,
                     type(exc).__name__, delay)
            return call_id, self._clock() + delay
        return call_id, None

    def _mark(self, marks: _Outcomes) -> None:
        """A claim's outcomes in a transaction of their own (a worker that stops)."""
        with self._transaction() as conn:
            self._write_marks(conn, marks)

    def _write_marks(self, conn: db.Connection, marks: _Outcomes) -> None:
        """Delivered, or due again later; each statement prepared once for all its rows."""
        done, retry = marks
        if not done and not retry:
            return
        cur = conn.cursor()
        try:
            if not self._database.postgresql:
                if done:
                    cur.execute(self._sql_done_all, (orjson.dumps(done).decode(),))
                if retry:
                    cur.execute(self._sql_retry_all, (orjson.dumps(retry).decode(),))
                return
            if done:
                cur.executemany(self._sql_done, done)
            if retry:
                cur.executemany(self._sql_retry, retry)
        finally:
            cur.close()


# (delivered: [(time, call id)], due again: [(next attempt, call id)])
_Outcomes = tuple[list[tuple[float, str]], list[tuple[float, str]]]


class _Marks:
    """The outcomes of a claim's deliveries, until they are written."""

    __slots__ = ("done", "retry", "sent")

    def __init__(self) -> None:
        self.done: list[tuple[float, str]] = []
        self.retry: list[tuple[float, str]] = []
        self.sent = 0  # delivered, in the last batch taken

    @property
    def pending(self) -> bool:
        return bool(self.done or self.retry)

    def add(self, outcome: tuple[str, float | None], now: float) -> None:
        call_id, next_at = outcome
        if next_at is None:
            self.done.append((now, call_id))
        else:
            self.retry.append((next_at, call_id))

    def put_back(self, outcomes: _Outcomes) -> None:
        """Outcomes taken for a write that did not happen: written with the next one."""
        self.done.extend(outcomes[0])
        self.retry.extend(outcomes[1])

    def take(self) -> _Outcomes:
        taken = (self.done, self.retry)
        self.sent = len(self.done)
        self.done, self.retry = [], []
        return taken
