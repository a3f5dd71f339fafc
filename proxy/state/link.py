"""One pipelined connection to Redis, shared by every command of a gateway process.

A stateful MCP call asks Redis two or three things (its session, its lockout settlement, its
rate limit): each must cost little beside the proxying itself. A pooled client takes a
connection from a pool, checks it, writes, waits under its own timer and gives it back, for
every command; here every command is written at once on the one connection (RESP is in order:
the n-th reply answers the n-th command), its future queued, and the replies are parsed by
hiredis as they arrive and handed out in order. Concurrent calls pipeline by themselves, and
Redis, which runs one command at a time anyway, is not slower for it.

Time is bounded without a timer per command: each waiting command carries its deadline, and
one timer, armed on the oldest, checks it; a command not answered by its deadline means Redis
is hung or gone, so the connection is dropped and everything waiting on it fails at once
(`LinkDown`). A connection the peer closed fails its waiters the same way. The next command
connects afresh; a command whose connection was already known closed when it was asked
(an idle link Redis dropped) is not failed for it, it simply goes over the new connection.
A waiter that gives up (a cancelled call) leaves its slot queued, so the order holds.

URLs: `redis://[[user]:password@]host[:port][/db]`, and `rediss://` for TLS verified against
the system's certificate authorities. Nothing here ever shows the URL (it may hold a password).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import hiredis

# A reply Redis sent as an error (`-ERR ...`, `-NOSCRIPT ...`): hiredis returns it, not raises.
ReplyError = hiredis.ReplyError


class LinkDown(Exception):
    """The command has no reply: Redis could not be reached, closed the link, or did not answer
    in time. `reason` says which, in words that carry no address or password."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int
    db: int
    username: str | None
    password: str | None
    tls: bool

    @classmethod
    def parse(cls, url: str) -> Address:
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss") or not parts.hostname:
            raise ValueError("a Redis URL is redis://HOST[:PORT][/DB] or rediss://...")
        db = parts.path.strip("/")
        return cls(host=parts.hostname, port=parts.port or 6379, db=int(db) if db else 0,
                   username=unquote(parts.username) if parts.username else None,
                   password=unquote(parts.password) if parts.password else None,
                   tls=parts.scheme == "rediss")


class _Protocol(asyncio.Protocol):
    __slots__ = ("_link", "_reader", "transport")

    def __init__(self, link: Link) -> None:
        self._link = link
        self._reader = hiredis.Reader()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        pending = self._link._pending
        while (reply := reader.gets()) is not False:
            if not pending:  # a reply nobody asked for: the stream is out of step
                self._link._drop(self, "unexpected reply")
                return
            waiter = pending.popleft()[0]
            if not waiter.done():
                waiter.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self._link._drop(self, "connection lost")


class Link:
    """Commands to one Redis, pipelined on one connection. `call` is the only way in."""

    def __init__(self, address: Address, timeout_s: float) -> None:
        self._address = address
        self._timeout_s = timeout_s
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None
        # (waiter, deadline) of every command written on the current connection, oldest first
        self._pending: deque[tuple[asyncio.Future[Any], float]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    async def call(self, *args: bytes | str | float) -> Any:
        """Redis's reply to one command (a ReplyError is returned, not raised), or LinkDown."""
        protocol = self._protocol
        if protocol is None or protocol.transport is None or protocol.transport.is_closing():
            protocol = await self._connect()
        return await self._write(protocol, args)

    def send(self, *args: bytes | str | float) -> asyncio.Future[Any]:
        """The command written now (when the link is up), its reply to be awaited later: the
        round trip runs while the caller does other work. Awaiting the future is `call`;
        cancelling it gives the reply up (its slot stays queued, so the order holds)."""
        protocol = self._protocol
        if protocol is None or protocol.transport is None or protocol.transport.is_closing():
            return asyncio.ensure_future(self.call(*args))  # connects first
        return self._write(protocol, args)

    def _write(self, protocol: _Protocol, args: tuple[bytes | str | float, ...]
               ) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        waiter: asyncio.Future[Any] = loop.create_future()
        self._pending.append((waiter, deadline))
        # (hiredis's stub types its argument as a 1-tuple)
        protocol.transport.write(hiredis.pack_command(args))  # type: ignore[union-attr,arg-type]
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._check)
        return waiter

    async def _connect(self) -> _Protocol:
        if self._closed:
            raise LinkDown("closed")
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._open())
            self._connecting.add_done_callback(self._connected)
        # shielded: one caller giving up does not abort the connection the others wait on
        return await asyncio.shield(self._connecting)

    def _connected(self, done: asyncio.Future[_Protocol]) -> None:
        self._connecting = None  # _open itself made the connection current
        if not done.cancelled():
            done.exception()  # retrieved: a failure is each waiter's, raised to it

    async def _open(self) -> _Protocol:
        a = self._address
        loop = asyncio.get_running_loop()
        context = ssl.create_default_context() if a.tls else None
        try:
            async with asyncio.timeout(self._timeout_s):
                _, protocol = await loop.create_connection(
                    lambda: _Protocol(self), a.host, a.port, ssl=context,
                    server_hostname=a.host if context else None)
        except (OSError, TimeoutError, ssl.SSLError):
            raise LinkDown("connection failed") from None
        self._protocol = protocol  # the greeting below goes over it, like any command
        greeting: list[tuple[Any, ...]] = []
        if a.password is not None:
            greeting.append(("AUTH", a.username, a.password) if a.username
                            else ("AUTH", a.password))
        if a.db:
            greeting.append(("SELECT", a.db))
        try:
            for command in greeting:
                reply = await self.call(*command)
                if isinstance(reply, ReplyError):  # wrong password, no such database
                    raise LinkDown(f"refused the connection ({str(reply).split(' ', 1)[0]})")
        except LinkDown:
            self._drop(protocol, "refused")
            raise
        if self._protocol is not protocol:  # lost during the greeting
            raise LinkDown("connection lost")
        return protocol

    def _check(self) -> None:
        """The timer: fail everything when the oldest command is past its deadline, else wait
        for that deadline."""
        self._timer = None
        if not self._pending:
            return
        loop = asyncio.get_running_loop()
        deadline = self._pending[0][1]
        if deadline <= loop.time():
            if self._protocol is not None:
                self._drop(self._protocol, "timed out")
            return
        self._timer = loop.call_at(deadline, self._check)

    def _drop(self, protocol: _Protocol, reason: str) -> None:
        """The connection is done for: close it and fail every command that waits on it."""
        if protocol is not self._protocol:
            return  # an older connection, already dropped
        self._protocol = None
        if protocol.transport is not None:
            protocol.transport.abort()
        pending, self._pending = self._pending, deque()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for waiter, _ in pending:
            if not waiter.done():
                waiter.set_exception(LinkDown(reason))

    def reset(self) -> None:
        """Drop the connection (a failover: the next command finds the new primary)."""
        if self._protocol is not None:
            self._drop(self._protocol, "reset")

    async def aclose(self) -> None:
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        self.reset()
