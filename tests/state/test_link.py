"""The one pipelined connection every Redis store shares (proxy/state/link.py): replies reach
the command that asked, in order, under any concurrency and across cancelled waiters; a hung
Redis fails everything waiting at its deadline and the next command connects afresh; a
forgotten script is sent in full; credentials and a database number are honoured; and no
failure shows the URL."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from proxy.errors import StoreUnavailable
from proxy.state import open_stores
from proxy.state.link import Address, Link, LinkDown
from proxy.state.shared import Shared
from tests import state_backends
from tests.conftest import make_config
from tests.redis_server import PrivateRedis, private_redis


@pytest.fixture
def server() -> Iterator[PrivateRedis]:
    with private_redis() as started:
        yield started


@pytest.fixture
async def link() -> AsyncIterator[Link]:
    made = Link(Address.parse(state_backends.REDIS_URL), timeout_s=5.0)
    try:
        yield made
    finally:
        await made.aclose()


def test_addresses_are_parsed_without_keeping_the_url() -> None:
    a = Address.parse("rediss://me:p%40ss@cache.example:6380/4")
    assert (a.host, a.port, a.db, a.username, a.password, a.tls) == (
        "cache.example", 6380, 4, "me", "p@ss", True)
    b = Address.parse("redis://:secret@10.0.0.1")
    assert (b.port, b.db, b.username, b.password, b.tls) == (6379, 0, None, "secret", False)
    with pytest.raises(ValueError) as refused:
        Address.parse("http://user:secret@host/0")
    assert "secret" not in str(refused.value)


async def test_concurrent_commands_each_get_their_own_reply(link: Link) -> None:
    prefix = state_backends.fresh_prefix()
    keys = [f"{prefix}k{i}" for i in range(300)]
    await asyncio.gather(*(link.call("SET", k, f"v{i}") for i, k in enumerate(keys)))
    got = await asyncio.gather(*(link.call("GET", k) for k in keys))
    assert got == [f"v{i}".encode() for i in range(300)]


async def test_a_cancelled_waiter_keeps_the_order_for_the_others(link: Link) -> None:
    prefix = state_backends.fresh_prefix()
    await link.call("SET", prefix + "a", "A")
    await link.call("SET", prefix + "b", "B")
    first = asyncio.ensure_future(link.call("GET", prefix + "a"))
    second = asyncio.ensure_future(link.call("GET", prefix + "b"))
    await asyncio.sleep(0)  # both written (each wrote before its first await)
    first.cancel()
    assert await second == b"B"
    assert await link.call("GET", prefix + "a") == b"A"


async def test_a_reply_error_is_returned_not_raised(link: Link) -> None:
    prefix = state_backends.fresh_prefix()
    await link.call("SET", prefix + "s", "text")
    reply = await link.call("INCR", prefix + "s")
    assert isinstance(reply, Exception) and "not an integer" in str(reply)
    assert await link.call("GET", prefix + "s") == b"text"  # the link goes on


async def test_a_hung_redis_fails_every_waiter_at_its_deadline_then_recovers(
        server: PrivateRedis) -> None:
    link = Link(Address.parse(server.url), timeout_s=0.2)
    try:
        assert await link.call("PING") == b"PONG"
        server.pause()
        waiting = [asyncio.ensure_future(link.call("PING")) for _ in range(20)]
        done = await asyncio.gather(*waiting, return_exceptions=True)
        assert all(isinstance(e, LinkDown) and e.reason == "timed out" for e in done)
        server.resume()
        assert await link.call("PING") == b"PONG"  # a new connection, found by itself
    finally:
        await link.aclose()


async def test_redis_gone_then_back(server: PrivateRedis) -> None:
    link = Link(Address.parse(server.url), timeout_s=1.0)
    try:
        assert await link.call("PING") == b"PONG"
        server.kill()
        with pytest.raises(LinkDown):
            await link.call("PING")
        server.start()
        assert await link.call("PING") == b"PONG"
    finally:
        await link.aclose()


async def test_a_script_redis_forgot_is_sent_in_full() -> None:
    prefix = state_backends.fresh_prefix()
    shared = Shared(state_backends.REDIS_URL, prefix)
    try:
        # a source no other test uses, so this process is surely the first to send it
        script = shared.script(f"return '{secrets.token_hex(8)}' .. ARGV[1]", "test")
        first = await script((), ["x"])
        assert first.endswith(b"x")
        assert await script((), ["y"]) == first[:-1] + b"y"  # by its SHA now
    finally:
        await shared.aclose()


async def test_credentials_and_the_database_number_are_used(server: PrivateRedis) -> None:
    server.command("ACL", "SETUSER", "gateway", "on", ">s3cret-pw", "~*", "&*", "+@all")
    good = Shared(f"redis://gateway:s3cret-pw@127.0.0.1:{server.port}/3", "t:")
    bad = Shared(f"redis://gateway:wrong-pw@127.0.0.1:{server.port}/3", "t:")
    try:
        await good.command("test", "SET", "t:k", "in-db-3")
        db3 = redis.Redis(host="127.0.0.1", port=server.port, db=3)
        try:
            assert db3.get("t:k") == b"in-db-3"
        finally:
            db3.close()
        assert server.command("GET", "t:k") is None  # not in database 0
        with pytest.raises(StoreUnavailable) as refused:
            await bad.command("test", "GET", "t:k")
        assert "WRONGPASS" in str(refused.value)
        assert "wrong-pw" not in str(refused.value) and "127.0.0.1" not in str(refused.value)
    finally:
        await good.aclose()
        await bad.aclose()


async def test_nothing_reachable_is_store_unavailable_naming_only_the_store() -> None:
    shared = Shared("redis://:pw-never-shown@127.0.0.1:1/0", "t:", timeout_s=0.5)
    try:
        with pytest.raises(StoreUnavailable) as refused:
            await shared.command("session", "GET", "t:x")
        assert str(refused.value) == "the session store is unavailable (connection failed)"
    finally:
        await shared.aclose()


async def test_a_command_sent_is_written_before_it_is_awaited(link: Link) -> None:
    prefix = state_backends.fresh_prefix()
    await link.call("SET", prefix + "a", "A")  # connected: `send` writes at once
    asked = link.send("GET", prefix + "a")
    dropped = link.send("GET", prefix + "a")
    # a command written after them is answered after them: they are on the wire already
    assert await link.call("SET", prefix + "a", "changed") == b"OK"
    assert asked.done()
    dropped.cancel()  # given up: its reply is discarded, the order holds
    assert await asked == b"A"
    assert await link.call("GET", prefix + "a") == b"changed"


async def test_an_asked_command_fails_at_its_reading_and_a_dropped_one_is_silent() -> None:
    shared = Shared("redis://:pw-never-shown@127.0.0.1:1/0", "t:", timeout_s=0.5)
    try:
        asked = shared.ask("session", "GET", "t:x")  # not connected: it connects first
        with pytest.raises(StoreUnavailable) as refused:
            await asked.reply()
        assert str(refused.value) == "the session store is unavailable (connection failed)"
        asked.drop()  # after reading: harmless
        shared.ask("session", "GET", "t:y").drop()  # given up before its reply: no error
    finally:
        await shared.aclose()


async def test_a_session_fetched_early_is_the_session_get_reads() -> None:
    stores = open_stores(make_config())
    try:
        made = await stores.sessions.create("e", "p", "up-1", "2025-11-25")
        fetched = stores.sessions.fetch(made.id)
        missing = stores.sessions.fetch("no-such-session")
        unread = stores.sessions.fetch(made.id)
        got = await fetched.session()
        assert got is not None
        assert (got.id, got.endpoint, got.principal_key, got.upstream_session_id) == (
            made.id, "e", "p", "up-1")
        assert await missing.session() is None
        unread.drop()
        fetched.drop()
        assert await stores.sessions.get(made.id) is not None
    finally:
        await stores.aclose()
