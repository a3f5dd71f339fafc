"""Tables other processes change, mirrored in memory: the server registry (proxy.servers),
the virtual endpoints (proxy.virtual.registry), the guardrails' pins (proxy.pin_store), the API
keys (proxy.auth.keys) and the Cedar policies of the management API (proxy.policy_store).

A `Mirror` reads its table whole once, then only a version that moves with every write (a
counter the table's triggers bump, or SQLite's `data_version`), and reads the table again and
hands it to its owner's `apply` when the version moved. It looks on a timer (`poll_s`, every
mirror of `Mirrors` that is `polled`) and whenever its owner asks (`sync`: the management API
before it answers, a key lookup before it decides). Callers asking together share one read of
the version, begun after each of them asked; a call that finds the version unmoved takes no
lock and reads no table. Writes the owner makes go to the database first, inside `changing()`,
and are applied once committed (`catch_up`).

`Mirrors` is one process's set: one thread pool every blocking read and write of every mirror
runs on, and one lifecycle (`async with mirrors.running():` polls each until it ends, then the
pool closes, after the reads in progress gave their connections back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

log = logging.getLogger("tollhouse.mirror")

POLL_S = 1.0  # how often a process looks for changes other processes made
WORKERS = 5  # one per mirror of a gateway: a slow read of one never delays another's probe

T = TypeVar("T")
R = TypeVar("R")


class Mirrors:
    """One process's mirrors: their thread pool, their poll interval and their lifecycle.
    `sleep` is what a polling mirror waits `poll_s` with (tests pass their own)."""

    def __init__(self, poll_s: float = POLL_S,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.poll_s = poll_s
        self._sleep = sleep
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="tollhouse-mirror")
        self._mirrors: list[Mirror[Any]] = []
        self._polls: list[asyncio.Task[None]] = []

    def mirror(self, name: str, version: Callable[[], int], read: Callable[[], tuple[int, T]],
               apply: Callable[[T], None], *, errors: tuple[type[Exception], ...],
               polled: bool = True, instant: Callable[[], int] | None = None,
               load: Callable[[], Awaitable[tuple[int, T]]] | None = None) -> Mirror[T]:
        """A mirror of the table `name` (for the log line): `version` and `read` are blocking
        (run on the pool); `read` answers the version it read with the rows. `instant` is a
        version cheap enough to read on the event loop (SQLite's data_version), read instead
        of `version`; `load` replaces reading on the pool (the pins read behind their writes).
        `errors` are the database's: a poll that meets one waits a turn."""
        mirror = Mirror(self, name, version, read, apply, errors, polled, instant, load)
        self._mirrors.append(mirror)
        return mirror

    async def run(self, fn: Callable[..., R], *args: Any) -> R:
        """`fn(*args)` on the pool (a blocking database call), awaited."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Mirrors]:
        self.start()
        try:
            yield self
        finally:
            await self.aclose()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._polls = [loop.create_task(m.poll(self._sleep)) for m in self._mirrors if m.polled]

    async def stop(self) -> None:
        """No more polls (the owners may still write and read, on the pool)."""
        polls, self._polls = self._polls, []
        for task in polls:
            task.cancel()
        if polls:
            await asyncio.wait(polls, timeout=5)

    async def aclose(self) -> None:
        """The polls stopped, then the pool: a read still running gives its connection back
        before the database closes."""
        await self.stop()
        await asyncio.wait_for(asyncio.to_thread(self._pool.shutdown, True), timeout=5)

    def close(self) -> None:
        """For a process that never polled (a key index of the CLI's, a test's): the pool."""
        self._pool.shutdown(wait=True)


class Mirror(Generic[T]):
    def __init__(self, mirrors: Mirrors, name: str, version: Callable[[], int],
                 read: Callable[[], tuple[int, T]], apply: Callable[[T], None],
                 errors: tuple[type[Exception], ...], polled: bool,
                 instant: Callable[[], int] | None,
                 load: Callable[[], Awaitable[tuple[int, T]]] | None) -> None:
        self._mirrors = mirrors
        self.name = name
        self._version = version
        self._read = read
        self._apply = apply
        self._errors = errors
        self.polled = polled
        self._instant = instant
        self._load = load
        self._seen = -1  # the version the applied rows are of; -1: read again
        self._marks = 0  # how often `stale` was called: once during a read, it stands
        self._lock = asyncio.Lock()
        self._waiters: list[asyncio.Future[int]] = []
        self._probe: asyncio.Task[None] | None = None

    def load_now(self) -> T:
        """The table as it is, read here and now (blocking: the owner's start); the owner
        applies it."""
        version, rows = self._read()
        self._seen = self._instant() if self._instant is not None else version
        return rows

    def stale(self) -> None:
        """What was applied may not be the table's: the next `sync` reads it again."""
        self._seen = -1
        self._marks += 1

    async def run(self, fn: Callable[..., R], *args: Any) -> R:
        return await self._mirrors.run(fn, *args)

    @contextlib.asynccontextmanager
    async def changing(self) -> AsyncIterator[None]:
        """Held by the owner's writes (and by a config reload swapping what `apply` writes
        into): no read is applied meanwhile, and a `sync` waits for them."""
        async with self._lock:
            yield

    async def sync(self) -> None:
        """Catch up with changes other processes made, if any; wait for a write in progress."""
        instant = self._instant  # (inline: a key lookup asks before every call it decides)
        version = instant() if instant is not None else await self._current()
        if version == self._seen and not self._lock.locked():
            return
        async with self._lock:
            if await self._current() != self._seen:
                await self.catch_up()

    async def reload(self) -> None:
        """Read and apply the table whether or not its version moved."""
        async with self._lock:
            await self.catch_up()

    async def catch_up(self) -> None:
        """Read and apply the table now: inside `changing()`, after the owner's own write."""
        instant = self._instant() if self._instant is not None else None
        marks = self._marks
        version, rows = await (self._load() if self._load is not None
                               else self._mirrors.run(self._read))
        if self._marks == marks:
            self._seen = version if instant is None else instant
        try:
            self._apply(rows)  # which may call `stale`
        except BaseException:
            self._seen = -1
            raise

    async def poll(self, sleep: Callable[[float], Awaitable[None]]) -> None:
        """`sync` every `poll_s` until cancelled; a database error waits a turn."""
        while True:
            await sleep(self._mirrors.poll_s)
            try:
                await self.sync()
            except self._errors as exc:
                log.warning("%s: cannot read the database (%s)", self.name, exc)

    async def _current(self) -> int:
        """The table's version, read after this call began; callers asking together share
        one read."""
        if self._instant is not None:
            return self._instant()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[int] = loop.create_future()
        self._waiters.append(waiter)
        if self._probe is None or self._probe.done():
            self._probe = loop.create_task(self._probing())
        return await waiter

    async def _probing(self) -> None:
        while self._waiters:
            # whoever waits now joins this read; whoever arrives during it, the next one
            batch, self._waiters = self._waiters, []
            try:
                version = await self._mirrors.run(self._version)
            except Exception as exc:  # noqa: BLE001 - each waiter gets the failure
                for waiter in batch:
                    if not waiter.done():
                        waiter.set_exception(exc)
                continue
            for waiter in batch:
                if not waiter.done():
                    waiter.set_result(version)
