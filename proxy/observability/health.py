"""/healthz (the process runs) and /readyz (it can serve: the database answers with its schema
current, and the live-state store answers when it is Redis), and the sampled gauges a scrape
reads (queue depths, session counts, the outbox).

Both probes are cheap: /healthz touches nothing; /readyz answers from the last probe for
`CACHE_S`, and probes run one at a time (a probe storm waits on the one in progress), each
bounded by `PROBE_TIMEOUT_S`. The database probe runs on a thread of its own, off the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from proxy.errors import StoreUnavailable
from proxy.observability.metrics import Metrics
from proxy.state import Stores
from proxy.storage import migrations
from proxy.storage.db import Database

log = logging.getLogger("tollhouse.health")

CACHE_S = 2.0  # a probe result answers every /readyz for this long
SESSIONS_CACHE_S = 15.0  # counting sessions in Redis is a SCAN: at most this often
PROBE_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class Readiness:
    down: tuple[str, ...]  # what is not ready: "database", "migrations", "state_store"
    at: float

    @property
    def ready(self) -> bool:
        return not self.down


@dataclass
class Health:
    database: Database
    stores: Stores
    metrics: Metrics | None = None
    audit: Any = None  # the audit sink (its `depth`, when it has one)
    _last: Readiness | None = None
    _probing: asyncio.Future[Readiness] | None = None
    _sessions_at: float = -SESSIONS_CACHE_S
    _pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="tollhouse-probe"))

    async def readiness(self) -> Readiness:
        """The last probe's verdict if fresh, else a new probe's (one at a time)."""
        last = self._last
        if last is not None and time.monotonic() - last.at < CACHE_S:
            return last
        if self._probing is None:
            self._probing = asyncio.ensure_future(self._probe())
            self._probing.add_done_callback(self._probed)
        return await asyncio.shield(self._probing)

    def _probed(self, fut: asyncio.Future[Readiness]) -> None:
        self._probing = None
        if not fut.cancelled() and fut.exception() is None:
            self._last = fut.result()

    async def _probe(self) -> Readiness:
        down: list[str] = []
        loop = asyncio.get_running_loop()
        try:
            version = await asyncio.wait_for(
                loop.run_in_executor(self._pool, migrations.current, self.database),
                PROBE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - a probe reports what is down, never raises
            log.warning("readiness: the database does not answer: %s", type(exc).__name__)
            down.append("database")
        else:
            if version < migrations.LATEST:
                down.append("migrations")
        shared = self.stores.shared
        if shared is not None:
            try:
                await asyncio.wait_for(shared.ping(), PROBE_TIMEOUT_S)
            except (TimeoutError, StoreUnavailable) as exc:
                log.warning("readiness: the live-state store does not answer: %s",
                            type(exc).__name__)
                down.append("state_store")
        if self.metrics is not None:
            self.metrics.database_up.set(0 if "database" in down else 1)
            self.metrics.state_store_up.set(0 if "state_store" in down else 1)
        return Readiness(tuple(down), time.monotonic())

    async def sample(self) -> None:
        """Before a scrape: the gauges that are read, not counted, brought up to date."""
        metrics = self.metrics
        if metrics is None:
            return
        ready = await self.readiness()
        metrics.audit_depth.set(getattr(self.audit, "depth", 0))
        if "database" not in ready.down:
            loop = asyncio.get_running_loop()
            try:
                depth, oldest = await asyncio.wait_for(
                    loop.run_in_executor(self._pool, self._outbox), PROBE_TIMEOUT_S)
            except Exception:
                log.debug("metrics: the usage outbox could not be read", exc_info=True)
            else:
                metrics.outbox_depth.set(depth)
                metrics.outbox_age.set(max(0.0, time.time() - oldest) if oldest else 0.0)
        if time.monotonic() - self._sessions_at >= SESSIONS_CACHE_S \
                and "state_store" not in ready.down:
            await self._count_sessions(metrics)

    async def _count_sessions(self, metrics: Metrics) -> None:
        try:
            legacy = await _count(self.stores.sessions)
            modern = await _count(self.stores.bridge)
        except Exception:
            log.debug("metrics: sessions could not be counted", exc_info=True)
            return
        self._sessions_at = time.monotonic()
        if legacy is not None:
            metrics.sessions_active.labels("legacy").set(legacy)
        if modern is not None:
            metrics.sessions_active.labels("modern").set(modern)

    def _outbox(self) -> tuple[int, float | None]:
        with self.database.lease() as conn:
            row = conn.execute("SELECT count(*), min(created_at) FROM usage_outbox "
                               "WHERE delivered_at IS NULL").fetchone()
            conn.rollback()
        return int(row[0] or 0), (float(row[1]) if row[1] is not None else None)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


async def _count(store: Any) -> int | None:
    count = getattr(store, "count", None)
    return None if count is None else int(await asyncio.wait_for(count(), PROBE_TIMEOUT_S))
