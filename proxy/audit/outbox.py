"""The outbox worker: it delivers usage events to the metering hook at least once.

Usage events are written to the `usage_outbox` table in the same transaction as their audit
record (`proxy.audit.database`), so an accepted call is never lost; the worker delivers them
with exponential backoff, across restarts and receiver outages, through the configured backend
(`proxy.metering_backends`). The receiver settles each `call_id` once (it is the idempotency
key). The table's statements are `proxy.audit.outbox_table`'s; this module decides when to
claim, send, renew, prune and stop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from typing import Any, TypeVar

import orjson

from policies.metering import MeteringBackend
from proxy.audit.outbox_table import Claimed, Marks, OutboxTable
from proxy.audit.record import AuditRecord
from proxy.bounded import within
from proxy.storage import db

log = logging.getLogger("tollhouse.metering")
T = TypeVar("T")


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
        # used on that thread only
        self._table = OutboxTable(self._database, self.CLAIM, self.LEASE_S, self.PRUNE_BATCH,
                                  clock)
        self._claimed: Claimed = []  # the claim being sent (what is left of it)
        self._sending: asyncio.Task[None] | None = None
        self._marks = Marks()
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
        try:
            while True:
                self._wake.clear()
                self._rounds += 1
                round_ = self._rounds
                try:
                    due, next_at = await self._round()
                    await self._prune_due()
                except self._database.errors as exc:
                    # the database is out of reach (a restart, say): the events wait in it;
                    # the outcomes the failed claim was to write are kept for the next one
                    # (lost with the process, those sent go again: the receiver settles a
                    # call once)
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
            await self._stop()

    async def _round(self) -> tuple[int, float | None]:
        """One claim, and the sending of what it took: how many events were due, and when
        the next one is (None: none, or some were due)."""
        # the last claim's outcomes are written in this claim's transaction: one commit (and
        # one wait for SQLite's write lock) a round, not two
        outcomes = self._marks.take()
        claim = asyncio.ensure_future(self._in_db(self._table.claim, self._clock(), outcomes))
        try:
            try:
                self._claimed, next_at = await asyncio.shield(claim)
            except asyncio.CancelledError:  # the claim commits all the same: keep what it
                try:                        # took, to hand it back as the worker stops
                    self._claimed, _ = await claim
                    self.delivered += len(outcomes[0])
                except Exception:  # noqa: BLE001 - not written: written as it stops
                    self._marks.put_back(outcomes)
                raise
        except self._database.errors:
            self._marks.put_back(outcomes)  # written with the next claim
            raise
        self.delivered += len(outcomes[0])
        due = len(self._claimed)
        if self._claimed:
            # one task sends the whole claim (not one per event: the loop's cost of a task
            # and a shield each would be paid by every metered call); cancelled, the worker
            # lets the delivery under way finish (`_stop`)
            self._sending = self._loop.create_task(self._send(self._claimed, self._marks))
            await asyncio.shield(self._sending)
            self._sending = None
        return due, next_at

    async def _stop(self) -> None:
        """The delivery under way ends and is marked; what was sent is marked, what was not
        handed back; then the database thread closes, after any step still running on it."""
        if self._sending is not None:
            self._stopping = True
            with suppress(Exception):
                await self._sending
        if self._marks.pending:
            with suppress(Exception):
                await self._in_db(self._table.mark, self._marks.take())
                self.delivered += self._marks.sent
        if self._claimed:
            with suppress(Exception):
                await self._in_db(self._table.release, [c[0] for c in self._claimed], None)
        # queued behind any step still running on the thread, whatever cancelled us
        self._db.submit(self._table.drop)
        if self._owns_db:
            self._db.submit(self._database.close)
        self._db.shutdown(wait=False)

    async def _send(self, claimed: Claimed, marks: Marks) -> None:
        """Deliver a claim's events in order, each added to `marks` and taken off `claimed`
        as it ends (what is left is the worker's to hand back), renewing the claim's lease
        while less than RENEW_S of it is left; it stops early once the worker is stopping. An
        event the receiver took is marked, not sent again next start."""
        lease_until = self._clock() + self.LEASE_S
        while claimed and not self._stopping:
            if self._clock() > lease_until - self.RENEW_S:
                lease_until = self._clock() + self.LEASE_S
                await self._in_db(self._table.release, [c[0] for c in claimed], lease_until)
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
                gone = await self._in_db(self._table.prune, now - self.keep_delivered_s)
                self.pruned += gone
                if gone < self.PRUNE_BATCH:
                    return
        except self._database.errors as exc:
            log.warning("usage outbox: pruning delivered events failed (%s)", exc)

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
