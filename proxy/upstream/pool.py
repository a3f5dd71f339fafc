"""The processes of one stdio upstream, by key: "" for a shared process, a person's key for a
per_user one (proxy.upstream.supervisor runs each).

A child starts on first use (single flight); after a crash it restarts only once an
exponential backoff has passed (a call before that is refused at once); one idle for
`idle_stop_s` stops; for per_user at most `max_processes` exist, counting those starting and
those still stopping, and the least recently used idle one stops to make room. A refreshed
token retires a person's child: it finishes its calls, then stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from proxy.upstream.supervisor import Busy, Child, Deliver, Spec, Unavailable

log = logging.getLogger("tollhouse.stdio")

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
STABLE_S = 60.0  # a child that ran this long before it died starts the backoff afresh


@dataclass(slots=True)
class _Slot:
    child: Child | None = None
    starting: asyncio.Future[Child] | None = None
    failures: int = 0
    not_before: float = 0.0
    retired: list[Child] = field(default_factory=list)


class Pool:
    """The processes of one stdio upstream, by key (see the module docstring)."""

    def __init__(self, spec: Spec, deliver: Deliver,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self._deliver = deliver
        self._clock = clock
        self._slots: OrderedDict[str, _Slot] = OrderedDict()
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False
        self.started = 0  # processes started, ever (tests and the benchmark read it)
        self._stopping: set[asyncio.Task[None]] = set()
        self._halting: set[Child] = set()  # stopped to make room, not yet gone

    def running(self) -> list[Child]:
        out = []
        for slot in self._slots.values():
            if slot.child is not None:
                out.append(slot.child)
            out.extend(slot.retired)
        return out

    def current(self, key: str) -> Child | None:
        slot = self._slots.get(key)
        return slot.child if slot is not None else None

    async def child(self, key: str, token: str | None = None) -> Child:
        """The running child for `key`, started if there is none; raise Unavailable."""
        if self._closed:
            raise Unavailable("the gateway is stopping")
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot()
        self._slots.move_to_end(key)
        child = slot.child
        if child is not None and self.spec.token_env and child.token != token:
            self._retire(slot, child)  # a refreshed token: a fresh process from this call on
            child = None
        if child is not None:
            child.last_used = self._clock()
            return child
        if slot.starting is not None:
            return await asyncio.shield(slot.starting)
        if slot.not_before > self._clock():
            raise Unavailable(f"restarting after a crash (in {slot.not_before - self._clock():.1f} s)")
        future: asyncio.Future[Child] = asyncio.get_running_loop().create_future()
        slot.starting = future  # counted from here on: the bound holds for concurrent starts
        try:
            await self._make_room(key)
            started = await self._start(key, token)
        except BaseException as exc:
            slot.starting = None
            if not isinstance(exc, Busy):
                slot.failures += 1
                slot.not_before = self._clock() + _backoff(slot.failures)
            future.set_exception(exc if isinstance(exc, Unavailable) else Unavailable(str(exc)))
            future.exception()  # read: nobody else may be waiting
            if isinstance(exc, Unavailable) and not isinstance(exc, Busy):
                log.warning("stdio upstream %s: %s", self.spec.name, exc)
            raise
        slot.starting = None
        slot.child = started
        future.set_result(started)
        self._watch()
        return started

    async def _start(self, key: str, token: str | None) -> Child:
        child = Child(self.spec, key, token, self._deliver, self._exited)
        self.started += 1
        await child.start()
        log.info("stdio upstream %s: process %s started", self.spec.name, child.pid)
        return child

    def _exited(self, child: Child) -> None:
        slot = self._slots.get(child.key)
        if slot is None:
            return
        if child in slot.retired:
            slot.retired.remove(child)
        if slot.child is child:
            slot.child = None
            if not child.stopping:  # a crash: back off before the next start
                if self._clock() - child.started_at >= STABLE_S:
                    slot.failures = 0
                slot.failures += 1
                slot.not_before = self._clock() + _backoff(slot.failures)

    def _retire(self, slot: _Slot, child: Child) -> None:
        slot.child = None
        if child.calls:
            child.retiring = True
            slot.retired.append(child)
        else:
            self._spawn_stop(child)

    async def _make_room(self, key: str) -> None:
        """per_user: at most max_processes, counting those starting (this one too) and
        those still stopping; the least recently used idle one makes room."""
        if not self.spec.per_user:
            return
        count = len(self._halting) + sum(
            (s.child is not None) + (s.starting is not None) + len(s.retired)
            for s in self._slots.values())
        if count <= self.spec.max_processes:
            return
        for other, slot in self._slots.items():  # least recently used first
            if other != key and slot.child is not None and not slot.child.calls:
                child, slot.child = slot.child, None
                self._halting.add(child)
                try:
                    await child.stop()
                finally:
                    self._halting.discard(child)
                return
        raise Busy(f"all {self.spec.max_processes} processes are busy")

    def _watch(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        """Stop what is idle; end when nothing runs."""
        tick = min(max(self.spec.idle_stop_s / 4, 0.05), 5.0)
        while not self._closed:
            await asyncio.sleep(tick)
            now = self._clock()
            for key, slot in list(self._slots.items()):
                child = slot.child
                if child is not None and not child.calls and \
                        now - child.last_used >= self.spec.idle_stop_s:
                    slot.child = None
                    log.info("stdio upstream %s: process %s stopped (idle)", self.spec.name,
                             child.pid)
                    await child.stop()
                for old in list(slot.retired):
                    if not old.calls:
                        slot.retired.remove(old)
                        await old.stop()
                if slot.child is None and not slot.retired and slot.starting is None \
                        and slot.not_before <= now:
                    self._slots.pop(key, None)
            if not self._slots:
                return

    def _spawn_stop(self, child: Child) -> None:
        self.spawn(child.stop())

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Background work on the children (a stop, a reply), kept and awaited at close."""
        task = asyncio.get_running_loop().create_task(coro)
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def aclose(self) -> None:
        """Every process stopped, the group killed, nothing left running."""
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.wait({self._reaper})
        starting = [s.starting for s in self._slots.values() if s.starting is not None]
        for future in starting:
            with contextlib.suppress(Exception):
                await future
        children = self.running()
        self._slots.clear()
        await asyncio.gather(*(c.stop() for c in children), return_exceptions=True)
        if self._stopping:
            await asyncio.wait(set(self._stopping))


def _backoff(failures: int) -> float:
    return float(min(BACKOFF_FIRST_S * 2.0 ** (failures - 1), BACKOFF_MAX_S))
