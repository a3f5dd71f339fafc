"""The connection every shared store of one gateway process uses: one pipelined link to Redis
(`proxy.state.link`), its key prefix, its Lua scripts, and the pub/sub listener that carries
cancellations between replicas.

Every command a store sends goes through `Shared.command` (or a `Script`), which turns any Redis
failure (refused, closed, not answered within `timeout_s`, read-only after a failover, loading,
out of memory) into `proxy.errors.StoreUnavailable` naming the store: the request is answered
503 with Retry-After, never a 500 and never a hang. Nothing is retried: a Redis that refuses
costs a request nothing, a hung one `timeout_s`. A read-only reply means the address now leads
to a replica (a managed Redis failed over): the link is dropped, so the next command connects
afresh and finds the new primary.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as rex

from proxy.errors import StoreUnavailable
from proxy.state.link import Address, Link, LinkDown, ReplyError

log = logging.getLogger("tollhouse.state")

RECONNECT_MIN_S = 0.05  # the pub/sub listener's first wait before it reconnects, doubling
RECONNECT_MAX_S = 1.0

Arg = bytes | str | float


class Shared:
    """One Redis for one gateway process. `replica` names this process on the cancel channel,
    so it can tell its own messages from the others'."""

    def __init__(self, url: str, prefix: str, timeout_s: float = 1.0) -> None:
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.replica = secrets.token_hex(8)
        address = Address.parse(url)
        self._link = Link(address, timeout_s)
        self._address = address
        self._listeners: list[asyncio.Task[None]] = []
        self.listening = asyncio.Event()  # set while every subscription is live (tests wait)
        self._kinds: set[str] = set()  # every store's key kinds (`key`)

    def key(self, kind: str) -> str:
        """The prefix of a store's keys of one `kind` (its own two letters and a colon, then
        one letter and a colon where the store keeps more than one kind). No kind may begin
        another (`br:` beside `br:u:`): a key a caller names under one kind would then read or
        write one of the other kind. Checked as each store is made (once, at start-up)."""
        clash = next((k for k in self._kinds if k != kind and
                      (k.startswith(kind) or kind.startswith(k))), None)
        if clash is not None:
            raise ValueError(f"Redis key kind {kind!r} overlaps {clash!r}")
        self._kinds.add(kind)
        return self.prefix + kind

    def script(self, source: str, store: str) -> Script:
        """A Lua script run for `store`, sent by its SHA and in full when Redis forgot it."""
        return Script(self, source, store)

    async def command(self, store: str, *args: Arg) -> Any:
        """The command's reply, or StoreUnavailable naming `store` (never the URL)."""
        try:
            reply = await self._link.call(*args)
        except LinkDown as exc:
            raise _unavailable(store, exc) from None
        if isinstance(reply, ReplyError):
            self._refused(store, reply)
        return reply

    def ask(self, store: str, *args: Arg) -> Asked:
        """The command written now, its reply read later (`await asked.reply()`, as `command`
        would answer it) or given up (`asked.drop()`): a store that knows early what it will
        need overlaps the round trip with the caller's other work."""
        return Asked(self, store, self._link.send(*args))

    def _refused(self, store: str, reply: ReplyError) -> None:
        code = str(reply).split(" ", 1)[0][:20]
        if code == "READONLY":
            self._link.reset()  # failed over: find the new primary
            raise StoreUnavailable(f"the {store} store is read-only (failing over)")
        raise StoreUnavailable(f"the {store} store is unavailable (replied {code})")

    def subscribe(self, channel: str, on_message: Callable[[bytes], None],
                  on_subscribed: Callable[[], None] | None = None) -> None:
        """Deliver every message published on `channel` to `on_message` (in this loop), from
        now until `aclose`; reconnects by itself after Redis goes away. Messages published while
        it is disconnected are not delivered (pub/sub keeps nothing): `on_subscribed`, called
        each time the subscription is (again) live, is where a listener catches up on what it
        may have missed."""
        self._listeners.append(asyncio.get_running_loop().create_task(
            self._listen(channel, on_message, on_subscribed), name=f"tollhouse-listen-{channel}"))

    async def _listen(self, channel: str, on_message: Callable[[bytes], None],
                      on_subscribed: Callable[[], None] | None) -> None:
        a = self._address
        client = aioredis.Redis(
            host=a.host, port=a.port, db=a.db, username=a.username, password=a.password,
            ssl=a.tls, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s,
            health_check_interval=0)
        try:
            await self._subscribed(client, channel, on_message, on_subscribed)
        finally:
            await client.aclose(close_connection_pool=True)

    async def _subscribed(self, client: aioredis.Redis, channel: str,
                          on_message: Callable[[bytes], None],
                          on_subscribed: Callable[[], None] | None) -> None:
        wait = RECONNECT_MIN_S
        while True:
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(channel)
                if on_subscribed is not None:
                    on_subscribed()
                self.listening.set()
                wait = RECONNECT_MIN_S
                while True:
                    message = await pubsub.get_message(timeout=self.timeout_s)
                    if message is None:
                        await pubsub.ping()  # an idle link that died is found within timeout_s
                        continue
                    if message.get("type") == "message":
                        try:
                            on_message(message["data"])
                        except Exception:  # a bad message must not end the listener
                            log.exception("a message on %s could not be handled", channel)
            except asyncio.CancelledError:
                raise
            except (rex.RedisError, OSError) as exc:
                if self.listening.is_set():
                    log.warning("state store: lost the %s subscription (%s); reconnecting",
                                channel, _reason(exc))
                self.listening.clear()
                await asyncio.sleep(wait)
                wait = min(wait * 2, RECONNECT_MAX_S)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def ping(self) -> None:
        await self.command("state", "PING")

    async def count(self, store: str, prefix: str) -> int:
        """How many keys start with `prefix` (SCAN, never KEYS: Redis stays responsive).
        For metrics, which sample it at most every few seconds."""
        found = 0
        async for keys in self.scan(store, prefix):
            found += len(keys)
        return found

    async def scan(self, store: str, prefix: str) -> AsyncIterator[list[bytes]]:
        """The keys that start with `prefix`, a SCAN batch at a time (empty ones left out)."""
        match = "".join("\\" + c if c in "\\*?[]" else c for c in prefix) + "*"
        cursor = b"0"
        while True:
            cursor, keys = await self.command(store, "SCAN", cursor, "MATCH", match,
                                              "COUNT", 1000)
            if keys:
                yield list(keys)
            if cursor == b"0":
                return

    async def aclose(self) -> None:
        for task in self._listeners:
            task.cancel()
        if self._listeners:
            await asyncio.wait(self._listeners, timeout=2)
        self._listeners.clear()
        await self._link.aclose()


class Asked:
    """One command in flight (`Shared.ask`). Read it once with `reply`, or `drop` it; dropping
    one already read, or read and failed, is harmless."""

    __slots__ = ("_future", "_shared", "_store")

    def __init__(self, shared: Shared, store: str, future: asyncio.Future[Any]) -> None:
        self._shared, self._store, self._future = shared, store, future

    async def reply(self) -> Any:
        try:
            reply = await self._future
        except LinkDown as exc:
            raise _unavailable(self._store, exc) from None
        if isinstance(reply, ReplyError):
            self._shared._refused(self._store, reply)
        return reply

    def drop(self) -> None:
        future = self._future
        if not future.done():
            future.cancel()
        elif not future.cancelled():
            future.exception()  # retrieved: an unread failure is nobody's to log


class Script:
    """A Lua script: `await script(keys, args)` is its reply, or StoreUnavailable."""

    __slots__ = ("_sha", "_shared", "_source", "_store")

    def __init__(self, shared: Shared, source: str, store: str) -> None:
        self._shared = shared
        self._source = source
        self._sha = hashlib.sha1(source.encode()).hexdigest()
        self._store = store

    async def __call__(self, keys: Sequence[str] = (), args: Sequence[Arg] = ()) -> Any:
        shared, store = self._shared, self._store
        try:
            reply = await shared._link.call("EVALSHA", self._sha, len(keys), *keys, *args)
            if isinstance(reply, ReplyError) and str(reply).startswith("NOSCRIPT"):
                # a restarted or flushed Redis: send it in full (which also caches it)
                reply = await shared._link.call("EVAL", self._source, len(keys), *keys, *args)
        except LinkDown as exc:
            raise _unavailable(store, exc) from None
        if isinstance(reply, ReplyError):
            shared._refused(store, reply)
        return reply


def _unavailable(store: str, exc: LinkDown) -> StoreUnavailable:
    return StoreUnavailable(f"the {store} store is unavailable ({exc.reason})")


def _reason(exc: BaseException) -> str:
    """What went wrong, in words that carry no address or password."""
    if isinstance(exc, rex.MaxConnectionsError):
        return "every connection busy"
    if isinstance(exc, rex.TimeoutError):
        return "timed out"
    if isinstance(exc, rex.BusyLoadingError):  # a ConnectionError too: first
        return "loading"
    if isinstance(exc, rex.ConnectionError):
        return "connection failed"
    if isinstance(exc, rex.ResponseError):
        return f"replied {str(exc).split(' ', 1)[0][:20]}"
    return type(exc).__name__
