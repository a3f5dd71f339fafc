"""Redis away, hung, or failed over: every request that needs live state is answered 503 with
Retry-After in its surface's shape and audited `state_store_unavailable`, none hangs, none is
let through a rate limit, and the gateway recovers by itself once Redis is back. Each test runs
its own redis-server (tests/redis_server.py), never the machine's."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import httpx
import pytest

from proxy.errors import StoreUnavailable
from proxy.state.inflight import CallHandle, EndReason, SharedInFlight
from proxy.state.shared import Shared
from tests.conftest import RunningGateway, make_config, mock_upstream, running_gateway
from tests.helpers import jwt_auth, token, until
from tests.redis_server import PrivateRedis, private_redis

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}}}
CALL = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "hi"}}}
TIMEOUT_S = 0.25  # the test's state.timeout_s: a hung Redis is found this fast


@pytest.fixture
async def redis_server() -> AsyncIterator[PrivateRedis]:
    with private_redis() as server:
        yield server


def _config(server: PrivateRedis, **sections: object) -> object:
    return make_config(
        auth=jwt_auth(), state={"url": server.url, "key_prefix": f"t{secrets.token_hex(4)}:",
                                "timeout_s": TIMEOUT_S},
        rate_limits=[{"name": "calls", "rate": "1000/s", "burst": 1000}], **sections)


def _headers(session: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token()}"}
    if session:
        headers["Mcp-Session-Id"] = session
    return headers


async def _open_session(gw: RunningGateway) -> str:
    opened = await gw.post(INIT, headers=_headers())
    assert opened.status_code == 200, opened.text
    return opened.headers["mcp-session-id"]


def _unavailable(response: httpx.Response, request_id: object = None) -> None:
    """The store is asked before the body is parsed (lockout, session), so the id is null
    (seed 004), unless `request_id` says the refusal came later."""
    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"] == "1"
    assert response.json() == {"jsonrpc": "2.0", "id": request_id, "error": {
        "code": -32000, "message": "Resident runtime unavailable"}}


async def test_redis_gone_is_503_audited_never_unlimited_and_recovers_by_itself(
        redis_server: PrivateRedis) -> None:
    up = mock_upstream()
    async with running_gateway(_config(redis_server), up.transport) as gw:
        session = await _open_session(gw)
        assert (await gw.post(CALL, headers=_headers(session))).status_code == 200
        forwarded = len(up.seen)

        redis_server.kill()
        _unavailable(await gw.post(CALL, headers=_headers(session)))
        # without a session too: a valid bearer token needs no lockout command, but the rate
        # limit cannot be decided, so the call is not made (refused once its body is read)
        _unavailable(await gw.post(CALL, headers=_headers()), 2)
        _unavailable(await gw.post(INIT, headers=_headers()), 1)
        # a wrong credential must be counted where every replica sees it: not told either
        _unavailable(await gw.post(CALL, headers={"Authorization": "Bearer not-a-token"}))
        assert len(up.seen) == forwarded  # nothing reached the upstream while Redis was away
        failed = [r for r in gw.audit.records if r.status == "error"]
        assert len(failed) == 4
        assert {r.error_message for r in failed} == {"state_store_unavailable"}
        assert all("127.0.0.1" not in str(r.as_dict()) for r in failed)

        redis_server.start()  # the same address, empty (it kept nothing): no gateway restart
        async def served() -> bool:
            return (await gw.post(CALL, headers=_headers())).status_code == 200
        await until(served, what="a call served after Redis is back")
        # the session lived only in the Redis that went away: the client starts a new one
        gone = await gw.post(CALL, headers=_headers(session))
        assert gone.status_code == 404
        fresh = await _open_session(gw)
        assert (await gw.post(CALL, headers=_headers(fresh))).status_code == 200


async def test_a_hung_redis_is_found_within_its_timeout_and_nothing_hangs(
        redis_server: PrivateRedis) -> None:
    up = mock_upstream()
    async with running_gateway(_config(redis_server), up.transport) as gw:
        session = await _open_session(gw)
        redis_server.pause()  # still accepting, answering nothing
        try:
            answers = await asyncio.gather(
                *(gw.post({**CALL, "id": i}, headers=_headers(session)) for i in range(5)))
            for answer in answers:
                _unavailable(answer)
        finally:
            redis_server.resume()
        async def served() -> bool:
            return (await gw.post(CALL, headers=_headers(session))).status_code == 200
        await until(served, what="the session served again once Redis answers")


async def test_a_failover_to_a_read_only_replica_then_a_new_primary(
        redis_server: PrivateRedis) -> None:
    """A managed Redis failing over: the address leads to a read-only replica for a while
    (READONLY on every write), then to the new primary. The pool is dropped on READONLY, so
    the gateway finds the primary again without a restart."""
    up = mock_upstream()
    with private_redis() as primary:
        async with running_gateway(_config(redis_server), up.transport) as gw:
            await _open_session(gw)
            redis_server.command("REPLICAOF", "127.0.0.1", str(primary.port))
            await until(lambda: redis_server.command("ROLE")[0] == b"slave",  # type: ignore[index]
                        what="the server to be a replica")
            _unavailable(await gw.post(INIT, headers=_headers()), 1)  # a write: READONLY
            assert gw.audit.records[-1].error_message == "state_store_unavailable"
            redis_server.command("REPLICAOF", "NO", "ONE")  # promoted
            session = await _open_session(gw)
            assert (await gw.post(CALL, headers=_headers(session))).status_code == 200


async def test_cancels_reach_other_processes_again_after_redis_comes_back(
        redis_server: PrivateRedis) -> None:
    """The cancel subscription reconnects by itself; while Redis is away a cancel is
    StoreUnavailable for its sender (the notification is answered 503), not silently lost."""
    prefix = f"t{secrets.token_hex(4)}:"
    a, b = Shared(redis_server.url, prefix, TIMEOUT_S), Shared(redis_server.url, prefix,
                                                                 TIMEOUT_S)
    here, there = SharedInFlight(a), SharedInFlight(b)
    here.start()
    there.start()
    blocker = asyncio.Event()
    try:
        async def call() -> None:
            await blocker.wait()

        for round_ in ("before", "after"):
            await until(a.listening.is_set, what=f"a's subscription ({round_})")
            task = asyncio.create_task(call())
            handle = CallHandle(task)
            here.add("k", handle)
            await there.cancel("k", EndReason.CANCELLED)
            await until(task.done, what=f"the call cancelled from b ({round_})")
            assert handle.reason is EndReason.CANCELLED
            here.discard("k", handle)
            if round_ == "before":
                redis_server.kill()
                await until(lambda: not a.listening.is_set(), what="a to notice")
                with pytest.raises(StoreUnavailable):
                    await there.cancel("k", EndReason.CANCELLED)
                redis_server.start()
    finally:
        blocker.set()
        await a.aclose()
        await b.aclose()


async def test_a_cancel_published_while_a_replica_was_not_listening_still_ends_its_call(
        redis_server: PrivateRedis) -> None:
    """Pub/sub keeps nothing, so each cancel also leaves a mark: a replica whose subscription
    comes (back) up reads the marks of the calls it holds, and ends those that started before
    their cancel, not a later call that reuses the key."""
    prefix = f"t{secrets.token_hex(4)}:"
    a, b = Shared(redis_server.url, prefix, 5.0), Shared(redis_server.url, prefix, 5.0)
    here, there = SharedInFlight(a), SharedInFlight(b)
    blocker = asyncio.Event()
    try:
        async def call() -> None:
            await blocker.wait()

        cancelled = asyncio.create_task(call())
        early = CallHandle(cancelled)
        here.add("k", early)  # running on a, whose subscription is not live
        await there.cancel("k", EndReason.CANCELLED)  # published to nobody on a
        assert not cancelled.done()
        later = CallHandle(asyncio.create_task(call()))  # the key reused after the cancel
        here.add("k", later)
        other = CallHandle(asyncio.create_task(call()))
        here.add("other", other)
        here.start()  # a listens (again): it catches up on the marks
        await until(cancelled.done, what="the call cancelled while a was not listening")
        assert early.reason is EndReason.CANCELLED
        assert later.reason is None and other.reason is None
        assert not later.task.done()  # type: ignore[union-attr]
    finally:
        blocker.set()
        await a.aclose()
        await b.aclose()
