"""The connection every shared store of one gateway process uses: one Redis client (one pool),
its key prefix, its Lua scripts, and the pub/sub listener that carries cancellations between
replicas.

Every command a store sends goes through `Shared.run`, which turns any Redis failure (refused,
reset, timed out after `timeout_s`, read-only after a failover, loading, out of memory) into
`proxy.errors.StoreUnavailable` naming the store: the request is answered 503 with Retry-After,
never a 500 and never a hang. Nothing is retried but once, at once, on a broken pooled
connection (redis-py's own retry; never a timeout): a Redis that refuses costs a request
nothing, a hung one `timeout_s`, and one whose every pooled connection is busy at most
`timeout_s` of waiting for one, then its command's own. A read-only reply means the address now leads to a replica (a managed Redis failed
over): the pool is dropped, so the next command connects afresh and finds the new primary.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis import exceptions as rex
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from proxy.errors import StoreUnavailable

log = logging.getLogger("tollhouse.state")
T = TypeVar("T")

MAX_CONNECTIONS = 200  # per process; a command beyond them waits for one (up to timeout_s)
RECONNECT_MIN_S = 0.05  # the pub/sub listener's first wait before it reconnects, doubling
RECONNECT_MAX_S = 1.0


class Shared:
    """One Redis for one gateway process. `replica` names this process on the cancel channel,
    so it can tell its own messages from the others'."""

    def __init__(self, url: str, prefix: str, timeout_s: float = 1.0,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.replica = secrets.token_hex(8)
        # a pool that makes a command wait (up to timeout_s) for a free connection when
        # max_connections are busy, rather than failing it at once as the default pool does
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=timeout_s,
            socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            # once, at once, on a broken pooled connection; a timeout is not retried, so a hung
            # Redis costs a request one timeout_s
            retry=Retry(NoBackoff(), 1, supported_errors=(rex.ConnectionError,)),
            health_check_interval=0, decode_responses=False)
        self.client: aioredis.Redis = aioredis.Redis(connection_pool=pool)
        self._listeners: list[asyncio.Task[None]] = []
        self.listening = asyncio.Event()  # set while every subscription is live (tests wait)

    def key(self, name: str) -> str:
        return self.prefix + name

    def script(self, source: str) -> Any:
        """A Lua script, sent by its SHA and loaded again by itself if Redis forgot it."""
        return self.client.register_script(source)

    async def run(self, store: str, command: Awaitable[T]) -> T:
        """The command's reply, or StoreUnavailable naming `store` (never the URL)."""
        try:
            return await command
        except rex.ReadOnlyError as exc:
            await self.client.connection_pool.disconnect()  # failed over: find the new primary
            raise StoreUnavailable(f"the {store} store is read-only (failing over)") from exc
        except rex.RedisError as exc:
            raise StoreUnavailable(f"the {store} store is unavailable "
                                   f"({_reason(exc)})") from exc
        except OSError as exc:  # pragma: no cover - redis-py wraps socket errors itself
            raise StoreUnavailable(f"the {store} store is unreachable") from exc

    def subscribe(self, channel: str, on_message: Callable[[bytes], None]) -> None:
        """Deliver every message published on `channel` to `on_message` (in this loop), from
        now until `aclose`; reconnects by itself after Redis goes away. Messages published while
        it is disconnected are not delivered (pub/sub keeps nothing)."""
        self._listeners.append(asyncio.get_running_loop().create_task(
            self._listen(channel, on_message), name=f"tollhouse-listen-{channel}"))

    async def _listen(self, channel: str, on_message: Callable[[bytes], None]) -> None:
        wait = RECONNECT_MIN_S
        while True:
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(channel)
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
        await self.run("state", self.client.ping())

    async def count(self, store: str, prefix: str) -> int:
        """How many keys start with `prefix` (SCAN, never KEYS: Redis stays responsive).
        For metrics, which sample it at most every few seconds."""
        async def scan() -> int:
            match = "".join("\\" + c if c in "\\*?[]" else c for c in prefix) + "*"
            return sum([1 async for _ in self.client.scan_iter(match=match, count=1000)])

        return await self.run(store, scan())

    async def aclose(self) -> None:
        for task in self._listeners:
            task.cancel()
        if self._listeners:
            await asyncio.wait(self._listeners, timeout=2)
        self._listeners.clear()
        await self.client.aclose(close_connection_pool=True)


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
