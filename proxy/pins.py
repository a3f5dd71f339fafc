"""The guardrails' pinned tool definitions, in the database (`tool_pins`, migration 14).

`policies.guardrails.pinning.Pins` decides and keeps the view every call reads; this is its
`PinStore`: read once at start-up, and each change written off the event loop in the order it
was made (one writer task, so a later state of a pin never lands before an earlier one). A
write that fails is logged and the view stands; the next change of that pin writes it whole.
"""

from __future__ import annotations

import asyncio
import logging

import orjson

from policies.guardrails.pinning import Pin
from proxy.db import Database

log = logging.getLogger("tollhouse.pins")

_COLUMNS = ("endpoint", "name", "approved", "definition", "pending", "pending_definition",
            "rejected", "updated_at")


class DatabasePins:
    def __init__(self, database: Database) -> None:
        self._db = database
        self._upsert = database.upsert("tool_pins", _COLUMNS, ("endpoint", "name"))
        self._queue: asyncio.Queue[Pin] | None = None
        self._task: asyncio.Task[None] | None = None

    def load(self) -> list[Pin]:
        with self._db.transaction() as conn:
            rows = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM tool_pins").fetchall()
        return [Pin(r[0], r[1], r[2], orjson.loads(r[3]), r[4],
                    orjson.loads(r[5]) if r[5] is not None else None, r[6], float(r[7]))
                for r in rows]

    def save(self, pin: Pin) -> None:
        snapshot = Pin(pin.endpoint, pin.name, pin.approved, pin.definition, pin.pending,
                       pin.pending_definition, pin.rejected, pin.updated_at)
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._write())
        self._queue.put_nowait(snapshot)

    def write(self, pin: Pin) -> None:
        with self._db.transaction() as conn:
            conn.execute(self._upsert, (
                pin.endpoint, pin.name, pin.approved, orjson.dumps(pin.definition).decode(),
                pin.pending, orjson.dumps(pin.pending_definition).decode()
                if pin.pending_definition is not None else None, pin.rejected, pin.updated_at))

    async def _write(self) -> None:
        assert self._queue is not None
        while True:
            pin = await self._queue.get()
            try:
                await asyncio.to_thread(self.write, pin)
            except Exception:
                log.exception("could not write the pin of %s/%s", pin.endpoint, pin.name)
            finally:
                self._queue.task_done()

    async def flush(self) -> None:
        """Every change made so far is written (the API's answers wait for it; so does close)."""
        if self._queue is not None:
            await self._queue.join()

    async def aclose(self) -> None:
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
            self._queue = None
