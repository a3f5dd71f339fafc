"""The three ways a call ends early: the client's notifications/cancelled, the total-timeout
ceiling, and a client that goes away. Each answers or cleans up, tells the upstream, audits
`cancelled`, and leaves no in-flight entry, task or open upstream stream behind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import orjson
import respx

from tests.conftest import MCP_HEADERS, make_config, running_gateway
from tests.helpers import DEADLINE_S, Deadlines


class Upstream:
    """A respx upstream whose calls hang until cancelled, and which records notifications."""

    def __init__(self, *, stream: bool = False) -> None:
        self.stream = stream
        self.started = asyncio.Event()
        self.hanging = 0
        self.more_hanging = asyncio.Event()
        self.notified = asyncio.Event()
        self.notifications: list[dict] = []
        self.streams: list[Hanging] = []
        router = respx.Router()
        router.post("http://upstream.test/mcp").mock(side_effect=self.answer)
        self.transport = httpx.MockTransport(router.async_handler)

    async def answer(self, request: httpx.Request) -> httpx.Response:
        msg = orjson.loads(request.content)
        if "id" not in msg:
            self.notifications.append(msg)
            self.notified.set()
            return httpx.Response(202)
        if msg["params"]["name"] == "quick":
            return httpx.Response(200, json={"jsonrpc": "2.0", "id": msg["id"], "result": {}})
        self.started.set()
        self.hanging += 1
        self.more_hanging.set()
        if self.stream:
            body = Hanging()
            self.streams.append(body)
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  stream=body)
        await asyncio.Event().wait()  # hangs until the gateway gives up on it
        raise AssertionError("unreachable")


class Hanging(httpx.AsyncByteStream):
    def __init__(self) -> None:
        self.closed = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        progress = {"jsonrpc": "2.0", "method": "notifications/progress",
                    "params": {"progressToken": 9, "progress": 1}}
        yield b"event: message\ndata: " + orjson.dumps(progress) + b"\n\n"
        await asyncio.Event().wait()

    async def aclose(self) -> None:
        self.closed.set()


def call(request_id: int = 9) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": "wait", "arguments": {}}}


CANCEL = {"jsonrpc": "2.0", "method": "notifications/cancelled",
          "params": {"requestId": 9, "reason": "user pressed stop"}}


async def assert_nothing_left(gw) -> None:
    await gw.gateway.drain(DEADLINE_S)
    assert len(gw.gateway.inflight) == 0
    assert not gw.gateway._tasks


async def test_client_cancel_answers_32800_and_forwards_the_notice() -> None:
    up = Upstream()
    async with running_gateway(make_config(), up.transport) as gw:
        pending = asyncio.create_task(gw.post(call()))
        await asyncio.wait_for(up.started.wait(), DEADLINE_S)
        note = await gw.post(CANCEL)
        assert note.status_code == 202
        response = await asyncio.wait_for(pending, DEADLINE_S)
        assert response.status_code == 200
        assert response.json() == {"jsonrpc": "2.0", "id": 9, "error": {
            "code": -32800, "message": "cancelled by the client"}}
        await asyncio.wait_for(up.notified.wait(), DEADLINE_S)
        assert up.notifications == [CANCEL]  # forwarded as sent, and only once
        (record,) = await gw.audit.wait_for(1)
        assert (record.status, record.error_message) == ("cancelled", "cancelled by the client")
        await assert_nothing_left(gw)


async def test_client_cancel_on_a_stream_is_its_last_event() -> None:
    up = Upstream(stream=True)
    async with running_gateway(make_config(), up.transport) as gw:
        async with gw.client.stream("POST", gw.endpoint(), content=orjson.dumps(call()),
                                    headers=MCP_HEADERS) as response:
            chunks = response.aiter_bytes()
            first = await asyncio.wait_for(chunks.__anext__(), DEADLINE_S)
            assert b"notifications/progress" in first
            assert (await gw.post(CANCEL)).status_code == 202
            rest = b"".join([c async for c in chunks])
        last = orjson.loads(rest.split(b"data: ", 1)[1])
        assert last["error"] == {"code": -32800, "message": "cancelled by the client"}
        await asyncio.wait_for(up.streams[0].closed.wait(), DEADLINE_S)
        await asyncio.wait_for(up.notified.wait(), DEADLINE_S)
        (record,) = await gw.audit.wait_for(1)
        assert record.status == "cancelled"
        await assert_nothing_left(gw)


async def past_the_deadline(gw, up: Upstream, deadlines: Deadlines) -> httpx.Response:
    """A call that hangs upstream, answered once its total-timeout deadline fires."""
    posted = asyncio.create_task(gw.post(call()))
    await asyncio.wait_for(up.started.wait(), DEADLINE_S)
    assert [t.seconds for t in deadlines.timers] == [30.0]  # the route's total_timeout_s
    assert deadlines.expire() == 1
    return await asyncio.wait_for(posted, DEADLINE_S)


async def test_total_timeout_cancels_and_tells_the_upstream() -> None:
    up = Upstream()
    deadlines = Deadlines()
    cfg = make_config(upstreams=[{"name": "e", "url": "http://upstream.test/mcp",
                                  "total_timeout_s": 30}])
    async with running_gateway(cfg, up.transport, later=deadlines) as gw:
        response = await past_the_deadline(gw, up, deadlines)
        assert response.json()["error"] == {"code": -32800, "message": "total timeout reached"}
        await asyncio.wait_for(up.notified.wait(), DEADLINE_S)
        assert up.notifications[0]["params"]["requestId"] == 9
        (record,) = await gw.audit.wait_for(1)
        assert (record.status, record.error_message) == ("cancelled", "total timeout reached")
        await assert_nothing_left(gw)


async def test_total_timeout_on_a_stream() -> None:
    up = Upstream(stream=True)
    deadlines = Deadlines()
    cfg = make_config(upstreams=[{"name": "e", "url": "http://upstream.test/mcp",
                                  "total_timeout_s": 30}])
    async with running_gateway(cfg, up.transport, later=deadlines) as gw:
        response = await past_the_deadline(gw, up, deadlines)
        last = orjson.loads(response.content.rsplit(b"data: ", 1)[1])
        assert last["error"]["code"] == -32800
        await asyncio.wait_for(up.notified.wait(), DEADLINE_S)
        await asyncio.wait_for(up.streams[0].closed.wait(), DEADLINE_S)
        await assert_nothing_left(gw)


async def test_client_disconnect_mid_stream_cancels_upstream() -> None:
    up = Upstream(stream=True)
    async with running_gateway(make_config(), up.transport) as gw:
        async with httpx.AsyncClient() as own, \
                own.stream("POST", gw.endpoint(), content=orjson.dumps(call()),
                           headers=MCP_HEADERS) as response:
            await asyncio.wait_for(response.aiter_bytes().__anext__(), DEADLINE_S)
        # the connection is gone: the gateway closes the upstream stream and says so
        await asyncio.wait_for(up.streams[0].closed.wait(), DEADLINE_S)
        await asyncio.wait_for(up.notified.wait(), DEADLINE_S)
        assert up.notifications[0]["params"] == {"requestId": 9, "reason": "client disconnected"}
        (record,) = await gw.audit.wait_for(1)
        assert (record.status, record.error_message) == ("cancelled", "client disconnected")
        await assert_nothing_left(gw)


async def test_client_disconnect_while_waiting_for_json() -> None:
    up = Upstream()
    async with running_gateway(make_config(), up.transport) as gw:
        async with httpx.AsyncClient() as own:
            pending = asyncio.create_task(own.post(gw.endpoint(), content=orjson.dumps(call()),
                                                   headers=MCP_HEADERS))
            await asyncio.wait_for(up.started.wait(), DEADLINE_S)
            pending.cancel()
        await asyncio.wait_for(up.notified.wait(), DEADLINE_S)
        (record,) = await gw.audit.wait_for(1)
        assert (record.status, record.error_message) == ("cancelled", "client disconnected")
        await assert_nothing_left(gw)


async def test_cancel_for_an_unknown_request_is_harmless() -> None:
    up = Upstream()
    async with running_gateway(make_config(), up.transport) as gw:
        note = await gw.post({"jsonrpc": "2.0", "method": "notifications/cancelled",
                              "params": {"requestId": 12345}})
        assert note.status_code == 202
        await assert_nothing_left(gw)


async def wait_hanging(up: Upstream, count: int) -> None:
    async with asyncio.timeout(DEADLINE_S):
        while up.hanging < count:
            up.more_hanging.clear()
            await up.more_hanging.wait()


async def test_calls_sharing_an_id_all_stay_registered() -> None:
    """Without a session (a sessionless client, or clients sharing one API key) two calls of
    one principal may carry the same id: one finishing must not unregister the other."""
    up = Upstream()
    async with running_gateway(make_config(), up.transport) as gw:
        pending = asyncio.create_task(gw.post(call()))
        await wait_hanging(up, 1)
        quick = {**call(), "params": {"name": "quick", "arguments": {}}}
        assert (await gw.post(quick)).json()["result"] == {}
        assert len(gw.gateway.inflight) == 1
        assert (await gw.post(CANCEL)).status_code == 202
        response = await asyncio.wait_for(pending, DEADLINE_S)
        assert response.json()["error"]["code"] == -32800
        await assert_nothing_left(gw)


async def test_a_cancel_reaches_every_call_of_the_principal_with_that_id() -> None:
    up = Upstream()
    async with running_gateway(make_config(), up.transport) as gw:
        pending = [asyncio.create_task(gw.post(call())) for _ in range(2)]
        await wait_hanging(up, 2)
        assert len(gw.gateway.inflight) == 2
        assert (await gw.post(CANCEL)).status_code == 202
        for response in await asyncio.wait_for(asyncio.gather(*pending), DEADLINE_S):
            assert response.json()["error"]["code"] == -32800
        await assert_nothing_left(gw)


async def test_a_call_ended_while_it_waits_tells_the_upstream_on_its_session() -> None:
    """The deadline fires while the upstream has not answered: the cancel notice goes on the
    caller's upstream session, with its protocol version, like the call itself."""
    started, notified = asyncio.Event(), asyncio.Event()
    notices: list[httpx.Request] = []

    async def answer(request: httpx.Request) -> httpx.Response:
        msg = orjson.loads(request.content)
        if msg.get("method") == "initialize":
            return httpx.Response(200, headers={"mcp-session-id": "UP-1"}, json={
                "jsonrpc": "2.0", "id": msg["id"], "result": {
                    "protocolVersion": "2025-11-25", "capabilities": {},
                    "serverInfo": {"name": "up", "version": "1"}}})
        if "id" not in msg:
            if msg["method"] == "notifications/cancelled":
                notices.append(request)
                notified.set()
            return httpx.Response(202)
        started.set()
        await asyncio.Event().wait()  # hangs until the gateway gives up on it
        raise AssertionError("unreachable")

    router = respx.Router()
    router.post("http://upstream.test/mcp").mock(side_effect=answer)
    deadlines = Deadlines()
    cfg = make_config(upstreams=[{"name": "e", "url": "http://upstream.test/mcp",
                                  "total_timeout_s": 30}])
    async with running_gateway(cfg, httpx.MockTransport(router.async_handler),
                               later=deadlines) as gw:
        init = await gw.post({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}})
        sid = init.headers["mcp-session-id"]
        posted = asyncio.create_task(gw.post(call(), headers={"Mcp-Session-Id": sid}))
        await asyncio.wait_for(started.wait(), DEADLINE_S)
        assert deadlines.expire() == 1
        response = await asyncio.wait_for(posted, DEADLINE_S)
        assert response.json()["error"]["code"] == -32800
        await asyncio.wait_for(notified.wait(), DEADLINE_S)
        (notice,) = notices
        assert notice.headers["mcp-session-id"] == "UP-1"
        assert notice.headers["mcp-protocol-version"] == "2025-11-25"
        await assert_nothing_left(gw)
