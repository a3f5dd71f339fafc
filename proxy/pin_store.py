"""The guardrails' pinned tool definitions, in the database (`tool_pins`, migration 14).

`policies.guardrails.pinning.Pins` decides and keeps the view every call reads; this is its
`PinStore`. Each change is written off the event loop in the order it was made (one writer
task, so a later state of a pin never lands before an earlier one), as the conditional
statement its kind needs: a first definition is inserted only if absent, a changed one is
noted only where it is not the approved or the rejected one, an approval or rejection lands
only on the definition the administrator saw. So processes racing on one pin end with one.

Several gateways (and workers) on one database agree like the server registry's: the table
is a mirror (proxy.mirror): every write bumps `tool_pins_version` (a trigger), each process
polls it on the mirrors' timer (never per call) and reloads the view when it moved, and the
API's routes `sync` first. A reload is read behind the writes made before it, on the writer.
A decision made through any process reaches the others' edges within `poll_s`. A write that
fails is logged and the view stands until the next reload shows the database's.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import orjson

from policies.guardrails.pinning import Change, Pin, Pins
from proxy.mirror import Mirrors
from proxy.storage.db import Database

log = logging.getLogger("tollhouse.pins")

_COLUMNS = ("endpoint", "name", "approved", "definition", "pending", "pending_definition",
            "rejected", "updated_at")
_KEY = "WHERE endpoint = ? AND name = ?"
_UPDATES: dict[Change, str] = {
    "pending": f"SET pending = ?, pending_definition = ?, updated_at = ? {_KEY} "
               "AND approved <> ? AND (rejected IS NULL OR rejected <> ?)",
    "settled": f"SET pending = NULL, pending_definition = NULL, updated_at = ? {_KEY} "
               "AND approved = ?",
    "approved": "SET approved = ?, definition = ?, pending = NULL, pending_definition = NULL, "
                f"rejected = NULL, updated_at = ? {_KEY} AND pending = ?",
    "rejected": "SET rejected = ?, pending = NULL, pending_definition = NULL, "
                f"updated_at = ? {_KEY} AND pending = ?",
}


@dataclass(frozen=True, slots=True)
class _Reload:
    done: asyncio.Future[tuple[int, list[Pin]]]


class DatabasePins:
    """The store and the view it keeps in step (`pins`, read when this is made). Without
    `mirrors`, it has its own, which `aclose` closes; with them, their owner does."""

    def __init__(self, database: Database, mirrors: Mirrors | None = None) -> None:
        self._db = database
        self._own = mirrors is None
        self._mirrors = Mirrors() if mirrors is None else mirrors
        self._insert = database.insert_ignore("tool_pins", _COLUMNS)
        self._updates = {change: database.sql(f"UPDATE tool_pins {text}")
                         for change, text in _UPDATES.items()}
        self._queue: asyncio.Queue[tuple[Pin, Change] | _Reload] | None = None
        self._task: asyncio.Task[None] | None = None
        self._mirror = self._mirrors.mirror(
            "pinned tool definitions", self._read_version, self._read_all, self._apply,
            errors=database.errors, load=self._read_behind_writes)
        self.pins = Pins(self)

    # -- reading -------------------------------------------------------------------------------

    def load(self) -> list[Pin]:
        return self._mirror.load_now()

    def _read_all(self) -> tuple[int, list[Pin]]:
        with self._db.transaction() as conn:
            version = conn.execute(self._db.sql(
                "SELECT version FROM tool_pins_version WHERE id = 1"), ()).fetchone()
            rows = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM tool_pins").fetchall()
        return (int(version[0]) if version else 0), [
            Pin(r[0], r[1], r[2], orjson.loads(r[3]), r[4],
                orjson.loads(r[5]) if r[5] is not None else None, r[6], float(r[7]))
            for r in rows]

    def _read_version(self) -> int:
        with self._db.transaction() as conn:
            row = conn.execute(self._db.sql(
                "SELECT version FROM tool_pins_version WHERE id = 1"), ()).fetchone()
        return int(row[0]) if row else 0

    async def _read_behind_writes(self) -> tuple[int, list[Pin]]:
        done: asyncio.Future[tuple[int, list[Pin]]] = asyncio.get_running_loop().create_future()
        self._enqueue(_Reload(done))
        return await done

    def _apply(self, pins: list[Pin]) -> None:
        if self.pins.reload(pins):  # a change made here meanwhile: read again once written
            self._mirror.stale()

    async def sync(self) -> None:
        """`pins` as the database has them, after every change made here so far is written."""
        await self._mirror.reload()

    # -- writing -------------------------------------------------------------------------------

    def save(self, pin: Pin, change: Change) -> None:
        snapshot = Pin(pin.endpoint, pin.name, pin.approved, pin.definition, pin.pending,
                       pin.pending_definition, pin.rejected, pin.updated_at)
        self._enqueue((snapshot, change))

    def _enqueue(self, item: tuple[Pin, Change] | _Reload) -> None:
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._write())
        self._queue.put_nowait(item)

    def write(self, pin: Pin, change: Change) -> bool:
        """`change` applied to the row of `pin`; False when the row was not as it expected
        (another process got there first: the next reload shows what it did)."""
        with self._db.transaction() as conn:
            cur = conn.execute(*self._statement(pin, change))
            return bool(cur.rowcount)

    def _statement(self, pin: Pin, change: Change) -> tuple[str, tuple[Any, ...]]:
        key = (pin.endpoint, pin.name)
        if change == "first":
            return self._insert, (pin.endpoint, pin.name, pin.approved,
                                  orjson.dumps(pin.definition).decode(), None, None, None,
                                  pin.updated_at)
        sql = self._updates[change]
        if change == "pending":
            return sql, (pin.pending, orjson.dumps(pin.pending_definition).decode(),
                         pin.updated_at, *key, pin.pending, pin.pending)
        if change == "settled":
            return sql, (pin.updated_at, *key, pin.approved)
        if change == "approved":
            return sql, (pin.approved, orjson.dumps(pin.definition).decode(), pin.updated_at,
                         *key, pin.approved)
        return sql, (pin.rejected, pin.updated_at, *key, pin.rejected)

    async def _write(self) -> None:
        assert self._queue is not None
        while True:
            item = await self._queue.get()
            try:
                if isinstance(item, _Reload):
                    await self._reload(item)
                elif not await self._mirrors.run(self.write, *item):
                    self._mirror.stale()  # not as this process saw it: read the row again
            except Exception:
                pin = item[0] if isinstance(item, tuple) else None
                log.exception("could not write the pin of %s/%s",
                              getattr(pin, "endpoint", "?"), getattr(pin, "name", "?"))
            finally:
                self._queue.task_done()

    async def _reload(self, item: _Reload) -> None:
        self.pins.begin_reload()
        try:
            read = await self._mirrors.run(self._read_all)
        except Exception as exc:  # noqa: BLE001 - whatever it is, the waiter gets it
            if not item.done.done():
                item.done.set_exception(exc)
            return
        if not item.done.done():
            item.done.set_result(read)

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
        if self._own:
            await self._mirrors.aclose()
