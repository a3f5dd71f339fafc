"""Item 2: a notifications/cancelled posted to any replica ends the call on the replica that
holds it. The notice goes by raw POST straight to the replica that does *not* run the call
(HAProxy's log says which one does), so it can only arrive by the cancel channel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import httpx2
import orjson
import pytest
from mcp import MCPError

from tests.conftest import MCP_HEADERS
from tests.e2e.sdk_client import SdkClient, connect
from tests.e2e.upstreams import UpstreamProbe, stateful_sse_app
from tests.helpers import DEADLINE_S, jwt_auth, token, until
from tests.replicas.harness import Cluster, open_cluster
from tests.servers import serve

CANCELLED = -32800


@dataclass
class Stack:
    cluster: Cluster
    probe: UpstreamProbe
    era: str


@pytest.fixture(params=["legacy", "modern"])
async def stack(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stack]:
    """The official-SDK upstream as a legacy (2025-11-25 sessions) or a modern (2026-07-28,
    the legacy client bridged onto it) upstream, behind two replicas and HAProxy."""
    app, probe = stateful_sse_app()
    async with serve(app, graceful_timeout=1) as url, \
            open_cluster(tmp_path, url, era=request.param,
                         config={"auth": jwt_auth()}) as cluster:
        yield Stack(cluster, probe, request.param)


class CallsTo(httpx2.AsyncBaseTransport):
    """Sends the POST of every call of `tool` to the replica on `port` (and keeps its
    JSON-RPC id), everything else where it was going (through the load balancer)."""

    def __init__(self, port: int, tool: str) -> None:
        self._port, self._tool = port, tool
        self._inner = httpx2.AsyncHTTPTransport()
        self.ids: list[Any] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        msg = orjson.loads(request.content) if request.method == "POST" else None
        if isinstance(msg, dict) and msg.get("method") == "tools/call" \
                and msg["params"]["name"] == self._tool:
            self.ids.append(msg["id"])
            request.url = request.url.copy_with(port=self._port)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


class Sent:
    """The JSON-RPC messages one SDK client POSTed (its own ids, read off the wire)."""

    def __init__(self) -> None:
        self.messages: list[Any] = []

    def client(self) -> httpx2.AsyncClient:
        async def record(request: httpx2.Request) -> None:
            if request.method == "POST":
                self.messages.append(orjson.loads(request.content))
        return httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=300),
                                  event_hooks={"request": [record]})

    def call_id(self, tool: str) -> Any:
        (found,) = [m["id"] for m in self.messages if m.get("method") == "tools/call"
                    and m["params"]["name"] == tool]
        return found


def bearer(cluster: Cluster, subject: str = "alice") -> dict[str, str]:
    """The Authorization header of a caller (a token for the endpoint's public URL)."""
    return {"Authorization": f"Bearer {token(sub=subject, aud=cluster.endpoint)}"}


async def cancel(replica_endpoint: str, session_id: str | None, request_id: Any,
                 auth: dict[str, str]) -> None:
    """notifications/cancelled for `request_id` of `session_id`, straight to one replica."""
    body = orjson.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                         "params": {"requestId": request_id, "reason": "test"}})
    async with httpx.AsyncClient(timeout=DEADLINE_S) as raw:
        response = await raw.post(replica_endpoint, content=body, headers={
            **MCP_HEADERS, **auth, "Mcp-Session-Id": session_id or ""})
    assert response.status_code == 202, response.text


async def running(cluster: Cluster, probe: UpstreamProbe, client: SdkClient, started: int
                  ) -> asyncio.Task[Any]:
    """A wait_forever call of `client`, once the upstream runs it (the `started`-th)."""
    call = asyncio.create_task(client.call_tool("wait_forever", {}))
    await until(lambda: probe.started_count >= started or call.done(),
                what="wait_forever to start upstream")
    assert not call.done(), call
    return call


async def ended_with(call: asyncio.Task[Any], code: int) -> None:
    with pytest.raises(MCPError) as info:
        await asyncio.wait_for(call, DEADLINE_S)
    assert info.value.error.code == code


async def test_a_cancel_posted_to_the_other_replica_ends_the_call(stack: Stack) -> None:
    """The session runs through HAProxy, but its wait_forever call is sent to r0 directly
    (a bridged call's answer starts only when it ends, so HAProxy could not log where it
    runs until then); the notice goes to r1."""
    cluster, probe = stack.cluster, stack.probe
    r0, r1 = cluster.replica("r0"), cluster.replica("r1")
    pinned = CallsTo(r0.port, "wait_forever")
    async with httpx2.AsyncClient(transport=pinned, timeout=httpx2.Timeout(30, read=300)
                                  ) as http, connect(cluster.endpoint, http_client=http,
                                                      headers=bearer(cluster)) as client:
        call = await running(cluster, probe, client, 1)
        (request_id,) = pinned.ids
        await cancel(r1.endpoint, client.session_id, request_id, bearer(cluster))
        await ended_with(call, CANCELLED)
        await asyncio.wait_for(probe.cancelled.wait(), DEADLINE_S)
        # the session goes on, through both replicas
        for i in range(6):
            assert (await client.call_tool("echo", {"text": f"{i}"})).content[0].text == f"{i}"
            echoes = [s for s in cluster.of_session(client.session_id)
                      if s.rpc_method == "tools/call"]
            if {s.server for s in echoes} == {"r0", "r1"}:
                break
        assert {s.server for s in echoes} == {"r0", "r1"}, echoes
    (upstream_call,) = [ex for ex in probe.exchanges if ex.rpc_method == "tools/call"
                        and ex.rpc["params"]["name"] == "wait_forever"]
    assert upstream_call.done
    notices = probe.posts("notifications/cancelled")
    if stack.era == "legacy":  # told with the upstream's own id of the call, on its session
        assert [n.rpc["params"]["requestId"] for n in notices] == [upstream_call.rpc["id"]]
        assert notices[0].request_header("mcp-session-id") == upstream_call.request_header(
            "mcp-session-id")
    else:  # a modern upstream learns it from its request, closed
        assert notices == []
    assert probe.cancelled_count == 1


async def test_a_cancel_naming_another_sessions_call_changes_nothing(stack: Stack) -> None:
    """Sessions A and B each run a call on replica r0 (connected to it directly); notices go
    to r1. B's notice naming A's request id ends nothing; B's notice for its own call ends
    that one; A's call runs on until A cancels it. The notices travel one channel in order,
    so once B's own has ended B's call, the stray one has been heard by r0 too. B is another
    session of A's own caller: only the session tells the two calls apart."""
    cluster, probe = stack.cluster, stack.probe
    r0, r1 = cluster.replica("r0"), cluster.replica("r1")
    a_auth = b_auth = bearer(cluster, "alice")
    a_sent, b_sent = Sent(), Sent()
    async with a_sent.client() as a_http, b_sent.client() as b_http, \
            connect(r0.endpoint, http_client=a_http, headers=a_auth) as a, \
            connect(r0.endpoint, http_client=b_http, headers=b_auth) as b:
        await b.list_tools()  # B's ids run one ahead of A's
        a_call = await running(cluster, probe, a, 1)
        b_call = await running(cluster, probe, b, 2)
        a_id, b_id = a_sent.call_id("wait_forever"), b_sent.call_id("wait_forever")
        assert a_id != b_id
        await cancel(r1.endpoint, b.session_id, a_id, b_auth)  # A's id, on B's session
        await cancel(r1.endpoint, b.session_id, b_id, b_auth)
        await ended_with(b_call, CANCELLED)
        await until(lambda: probe.cancelled_count >= 1, what="B's call to end upstream")
        assert not a_call.done()
        assert probe.cancelled_count == 1
        await cancel(r1.endpoint, a.session_id, a_id, a_auth)
        await ended_with(a_call, CANCELLED)
        await until(lambda: probe.cancelled_count >= 2, what="A's call to end upstream")
        assert probe.cancelled_count == 2


@pytest.mark.parametrize("stack", ["legacy"], indirect=True)
async def test_another_caller_cannot_post_into_a_session(stack: Stack) -> None:
    """Bob's notice on Alice's session id, to the replica that does not run her call, is
    refused as the unknown session it is to him, and her call runs on."""
    cluster, probe = stack.cluster, stack.probe
    async with connect(cluster.replica("r0").endpoint, headers=bearer(cluster)) as alice:
        call = await running(cluster, probe, alice, 1)
        body = orjson.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                             "params": {"requestId": 2, "reason": "not yours"}})
        async with httpx.AsyncClient(timeout=DEADLINE_S) as raw:
            refused = await raw.post(cluster.replica("r1").endpoint, content=body, headers={
                **MCP_HEADERS, **bearer(cluster, "bob"), "Mcp-Session-Id": alice.session_id})
        assert refused.status_code == 404 and refused.json() == {"error": "session not found"}
        assert not call.done() and probe.cancelled_count == 0
        call.cancel()  # the SDK's own cancel ends it
        await until(lambda: probe.cancelled_count == 1, what="Alice's cancel to reach upstream")
