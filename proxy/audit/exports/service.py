"""The exports as a gateway runs them: the audit writer's `ExportQueue` (handed to the audit
sink, which queues each record that lands for every export) and a worker per export, started
with the app and stopped with it (proxy.runtime.serving)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from proxy.audit.exports.queue import ExportQueue
from proxy.audit.exports.worker import ExportWorker
from proxy.config.tables import ExportConfig
from proxy.observability.metrics import Metrics
from proxy.storage import db


class Exports:
    """`queue` for the audit writer; `start` the workers (on the event loop), `close` them."""

    def __init__(self, database: db.Database, configs: Sequence[ExportConfig],
                 metrics: Metrics | None = None) -> None:
        self._database = database
        self._configs = tuple(configs)
        self._metrics = metrics
        self.queue = ExportQueue(database, [c.name for c in self._configs],
                                 on_queued=self.wake, on_dropped=self._dropped)
        self.workers: list[ExportWorker] = []
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for cfg in self._configs:
            worker = ExportWorker(self._database, cfg, self.queue, self._metrics)
            self.workers.append(worker)
            self._tasks.append(loop.create_task(worker.run(), name=f"audit-export-{cfg.name}"))

    def wake(self) -> None:
        """From the audit writer's thread: records were queued."""
        for worker in self.workers:
            worker.wake_threadsafe()

    def _dropped(self, name: str, count: int) -> None:
        if self._metrics is not None:
            self._metrics.export_dropped.labels(name).inc(count)

    async def close(self) -> None:
        """Stop the workers: what is undelivered waits in the outbox for the next start."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        self._tasks = []
