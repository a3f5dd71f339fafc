"""Item 5: a replica killed (SIGKILL) mid-session loses nothing a client cannot recover. The
session goes on through the load balancer on the other replica, with the same upstream
session; the call that ran on the dead one is answered by nobody, so the client's own timeout
ends it; and what is left in Redis is only state that expires by itself."""

from __future__ import annotations

import asyncio

import pytest
from mcp import MCPError

from tests.e2e.sdk_client import connect
from tests.helpers import DEADLINE_S, until
from tests.replicas.conftest import Upstream
from tests.replicas.harness import KEPT_KINDS, KEY_KINDS, Cluster

REQUEST_TIMEOUT = -32001  # the SDK client's own: no answer within read_timeout_seconds
# ... or, sooner, the SDK client's own verdict on a response stream that closed unanswered
# and cannot be resumed (the gateway sends no event ids): mcp.client.streamable_http
ABANDONED = (-32000, "SSE stream ended without a response")
CLIENT_TIMEOUT_S = 3.0


def echo_calls(cluster: Cluster, session_id: str | None) -> list[str]:
    """The replicas that served this session's echo calls, in order."""
    return [s.server for s in cluster.of_session(session_id) if s.rpc_method == "tools/call"
            and (s.rpc["params"] or {}).get("name") == "echo"]


async def assert_only_expiring_state(cluster: Cluster) -> dict[str, int]:
    keys = await cluster.keys()
    assert all(k.startswith(KEY_KINDS) for k in keys), keys
    assert all(ttl > 0 for k, ttl in keys.items() if not k.startswith(KEPT_KINDS)), keys
    return keys


async def test_a_killed_replica_loses_nothing_the_client_cannot_recover(
        cluster: Cluster, upstream: Upstream) -> None:
    probe = upstream.probe
    async with connect(cluster.endpoint) as client:
        sid = client.session_id
        for i in range(6):
            assert (await client.call_tool("echo", {"text": f"{i}"})).content[0].text == f"{i}"
            if set(echo_calls(cluster, sid)) == {"r0", "r1"}:
                break
        assert set(echo_calls(cluster, sid)) == {"r0", "r1"}

        doomed = asyncio.create_task(client.call_tool(
            "wait_forever", {}, read_timeout_seconds=CLIENT_TIMEOUT_S))
        await until(lambda: probe.started.is_set() or doomed.done(),
                    what="wait_forever to start upstream")
        held = await cluster.logged(lambda s: s.session_id == sid and s.rpc_method == "tools/call"
                                    and s.rpc["params"]["name"] == "wait_forever",
                                    "the wait_forever call")
        dead, survivor = cluster.replica(held.server), cluster.other(held.server)
        dead.kill()
        assert await asyncio.wait_for(dead.process.wait(), DEADLINE_S) == -9

        # nobody answers the call that ran there: the client's own timeout ends it, or the
        # client itself gives up on the stream that closed
        with pytest.raises(MCPError) as info:
            await asyncio.wait_for(doomed, CLIENT_TIMEOUT_S + DEADLINE_S)
        error = info.value.error
        assert error.code == REQUEST_TIMEOUT or (error.code, error.message) == ABANDONED, error
        if error.code != REQUEST_TIMEOUT:  # (a timed-out SDK call sends its own cancel)
            assert not probe.cancelled.is_set()  # nobody cancelled it upstream either

        # the next requests continue the same session, on the survivor
        before = len(echo_calls(cluster, sid))
        for i in range(4):
            result = await client.call_tool("echo", {"text": f"after {i}"})
            assert result.content[0].text == f"after {i}"
        assert client.session_id == sid
        assert set(echo_calls(cluster, sid)[before:]) == {survivor.name}
        # with the upstream session they had before the kill
        sessions = {c.headers.get("mcp-session-id") for c in probe.tool_calls("echo")}
        assert len(sessions) == 1 and None not in sessions

        async def one_listener() -> bool:
            return await cluster.subscribers() == 1

        await until(one_listener, what="the dead replica's cancel subscription to go")

        # nothing in Redis that keeps growing: expiring state only, the same keys after more
        # calls; the dead replica's call left nothing behind
        keys = await assert_only_expiring_state(cluster)
        for i in range(3):
            await client.call_tool("echo", {"text": f"more {i}"})
        assert set(await assert_only_expiring_state(cluster)) == set(keys)
    assert client.delete_status == 200  # the session ends on the survivor too
    assert not [k for k in await cluster.keys() if k.startswith("ms:")]
