"""The guardrails' pinned tool definitions, in the database (`tool_pins`, migration 14).

`policies.guardrails.pinning.Pins` decides and keeps the view every call reads; this is its
`PinStore`. Each change is written off the event loop in the order it was made (one writer
task, so a later state of a pin never lands before an earlier one), as the conditional
statement its kind needs: a first definition is inserted only if absent, a changed one is
noted only where it is not the approved or the rejected one, an approval or rejection lands
only on the definition the administrator saw. So processes racing on one pin end with one.

Several gateways (and workers) on one database agree like the server registry's: every write
bumps `tool_pins_version` (a trigger), each process polls it on a timer (`watch`, every
`poll_s`; never per call) and reloads the view when it moved, and the API's routes `sync`
first. A decision made through any process reaches the others' edges within `poll_s`. A write
that fails is logged and the view stands until the next reload shows the database's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import orjson

from policies.guardrails.pinning import Change, Pin, Pins
from proxy.db import Database

log = logging.getLogger("tollhouse.pins")

POLL_S = 1.0  # how often a process looks for decisions other processes made
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
    pins: Pins
    done: asyncio.Future[None]


class DatabasePins:
    def __init__(self, database: Database) -> None:
        self._db = database
        self._insert = database.insert_ignore("tool_pins", _COLUMNS)
        self._updates = {change: database.sql(f"UPDATE tool_pins {text}")
                         for change, text in _UPDATES.items()}
        self._queue: asyncio.Queue[tuple[Pin, Change] | _Reload] | None = None
        self._task: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._version = -1

    # -- reading -------------------------------------------------------------------------------

    def load(self) -> list[Pin]:
        self._version, pins = self._read_all()
        return pins

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

    def start(self, pins: Pins, poll_s: float = POLL_S) -> None:
        """Keep `pins` in step with the database, each `poll_s`, until `aclose`."""
        self._stop = asyncio.Event()
        self._watch = asyncio.get_running_loop().create_task(self._watching(pins, poll_s))

    async def _watching(self, pins: Pins, poll_s: float) -> None:
        # stopped between reads, never cancelled inside one: a read's thread holds a connection
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), poll_s)
            if self._stop.is_set():
                return
            try:
                if await asyncio.to_thread(self._read_version) != self._version:
                    await self.sync(pins)
            except self._db.errors as exc:
                log.warning("pinned tool definitions: cannot read the database (%s)", exc)

    async def sync(self, pins: Pins) -> None:
        """`pins` as the database has them, after every change made here so far is written."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._enqueue(_Reload(pins, done))
        await done

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
                elif not await asyncio.to_thread(self.write, *item):
                    self._version = -1  # not as this process saw it: read the row again
            except Exception:
                pin = item[0] if isinstance(item, tuple) else None
                log.exception("could not write the pin of %s/%s",
                              getattr(pin, "endpoint", "?"), getattr(pin, "name", "?"))
            finally:
                self._queue.task_done()

    async def _reload(self, item: _Reload) -> None:
        item.pins.begin_reload()
        try:
            version, pins = await asyncio.to_thread(self._read_all)
        except Exception as exc:  # noqa: BLE001 - whatever it is, the waiter gets it
            if not item.done.done():
                item.done.set_exception(exc)
            return
        self._version = -1 if item.pins.reload(pins) else version
        if not item.done.done():
            item.done.set_result(None)

    async def flush(self) -> None:
        """Every change made so far is written (the API's answers wait for it; so does close)."""
        if self._queue is not None:
            await self._queue.join()

    async def aclose(self) -> None:
        if self._watch is not None:
            self._stop.set()
            await asyncio.gather(self._watch, return_exceptions=True)
            self._watch = None
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
            self._queue = None
