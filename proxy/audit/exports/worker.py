"""An export's worker: it sends the records queued for one export (`audit_export_outbox`) to
its receiver, in order, a batch at a time, at least once.

Every gateway on the database runs a worker per export; the one holding the export's lease
(proxy.audit.exports.table) sends, the others look every POLL_S whether it is still held (and
take it over once a dead gateway's lease ends, or at once when a gateway that stops hands it
back). A batch the receiver took leaves the outbox; one it did not stays at the head, and the
whole export waits (1 s, 2 s, 4 s... up to `retry_max_s`) before it is tried again, so nothing
overtakes it. A batch sent whose removal was lost with the process (kill -9) is sent again on
the next start: a receiver deduplicates on the event id. Every database step runs on the
worker's own thread, off the event loop; the calls never wait for any of this.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from typing import Any, TypeVar

import orjson

from proxy.audit.exports import senders
from proxy.audit.exports.event import Event, payload
from proxy.audit.exports.queue import ExportQueue
from proxy.audit.exports.table import ExportTable, Row, State
from proxy.bounded import within
from proxy.config.tables import ExportConfig
from proxy.observability.metrics import Metrics
from proxy.storage import db

log = logging.getLogger("tollhouse.audit.export")
T = TypeVar("T")


class ExportWorker:
    """Sends one export's records while this gateway holds its lease. `sent` and `failed`
    count this worker's records (delivered; in sends that failed)."""

    LEASE_S = 15.0  # at least; and twice a send's limit, so a live sender never loses it
    POLL_S = 1.0  # idle: how often the outbox is looked at (another gateway's records)
    MEASURE_S = 2.0  # how often the holder counts the backlog (the bound, lag, the console)

    def __init__(self, database: db.Database, cfg: ExportConfig, queue: ExportQueue,
                 metrics: Metrics | None = None, sender: senders.Sender | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self._database = database
        self._queue = queue
        self._metrics = metrics
        self._sender = sender if sender is not None else senders.build(cfg)
        self._clock = clock
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._lease_s = max(self.LEASE_S, 2 * cfg.timeout_s + 5)
        self._loop = asyncio.get_running_loop()
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tollhouse-export")
        self._table = ExportTable(database, cfg.name, clock)  # used on that thread only
        self._wake = asyncio.Event()
        self._measured_at = -math.inf
        self.state = State()
        self.sent = 0
        self.failed = 0

    async def _in_db(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._loop.run_in_executor(self._db, fn, *args)

    def wake_threadsafe(self) -> None:
        """From the audit writer's thread: records were queued."""
        self._loop.call_soon_threadsafe(self._wake.set)

    async def run(self) -> None:
        failures = 0
        try:
            while True:
                self._wake.clear()
                try:
                    pause, wakeable = await self._round()
                    failures = 0
                except self._database.errors as exc:  # the records wait in the database
                    failures += 1
                    pause, wakeable = min(30.0, 0.5 * 2 ** min(failures, 6)), False
                    log.warning("audit export %s: database error (%s); retry in %.1fs",
                                self.name, exc, pause)
                if pause > 0:
                    await self._sleep(pause, wakeable)
        finally:
            await self._stop()

    async def _round(self) -> tuple[float, bool]:
        """Take or renew the lease and send the next batch; how long to wait before the next
        round (0: at once), and whether records queued here may cut the wait short (only for
        the holder with nothing to retry: any other round would find nothing to send)."""
        held, state, rows = await self._in_db(self._table.round, self.holder, self._lease_s,
                                              self.cfg.batch)
        self._seen(state)
        if not held:
            return self.POLL_S, False
        now = self._clock()
        if now - self._measured_at >= self.MEASURE_S or (not rows and state.backlog):
            self._measured_at = now
            backlog, oldest_at = await self._in_db(self._table.measure, self.cfg.max_backlog)
            self._seen(State(**{**state.__dict__, "backlog": backlog, "oldest_at": oldest_at,
                                "is_full": backlog >= self.cfg.max_backlog}))
        if state.next_attempt_at > now:  # a failed send's backoff (the lease kept meanwhile)
            return min(state.next_attempt_at - now, self._lease_s / 3), False
        if not rows:
            return self.POLL_S, True
        return await self._send(rows, state), False

    async def _send(self, rows: list[Row], state: State) -> float:
        try:
            events = [Event(eid, record, payload(self.cfg.format, record))
                      for _, eid, text, _ in rows for record in (orjson.loads(text),)]
            await within(self._sender.send(events), 2 * self.cfg.timeout_s + 1)
        except Exception as exc:  # noqa: BLE001 - any failure: the batch is tried again
            delay = min(self.cfg.retry_max_s, 0.5 * 2.0 ** min(state.failures + 1, 30))
            error = senders.safe_error(exc, self.cfg)
            await self._in_db(self._table.failed, len(rows), error, self._clock() + delay)
            self.failed += len(rows)
            if self._metrics is not None:
                self._metrics.export_failed.labels(self.name).inc(len(rows))
            log.warning("audit export %s: %d records not delivered (%s); retry in %.1fs",
                        self.name, len(rows), error, delay)
            return min(delay, self._lease_s / 3)
        await self._in_db(self._table.delivered, [row[0] for row in rows])
        self.sent += len(rows)
        if self._metrics is not None:
            self._metrics.export_sent.labels(self.name).inc(len(rows))
        if state.failures:
            log.info("audit export %s: delivering again after %d failed sends", self.name,
                     state.failures)
        return 0.0

    def _seen(self, state: State) -> None:
        """The export's state as last read: whether the writers queue for it, the gauges."""
        self.state = state
        full = self._queue.full
        if state.is_full and self.name not in full:
            self._queue.full = full | {self.name}
        elif not state.is_full and self.name in full:
            self._queue.full = full - {self.name}
        if self._metrics is not None:
            lag = 0.0 if state.oldest_at is None or not state.backlog \
                else max(0.0, self._clock() - state.oldest_at)
            self._metrics.export_backlog.labels(self.name).set(state.backlog)
            self._metrics.export_lag.labels(self.name).set(lag)

    async def _sleep(self, timeout: float, wakeable: bool) -> None:
        """`timeout`, or until woken if `wakeable` (not asyncio.wait_for: see
        OutboxWorker._sleep)."""
        if not wakeable:
            await asyncio.sleep(timeout)
            return
        waiter = self._loop.create_task(self._wake.wait())
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        finally:
            waiter.cancel()

    async def _stop(self) -> None:
        """Hand the lease back (another gateway sends at once), close the sender, then the
        database thread, after any step still running on it."""
        with suppress(Exception):
            await self._sender.close()
        self._db.submit(self._table.release, self.holder)
        self._db.submit(self._table.drop)
        self._db.shutdown(wait=False)
