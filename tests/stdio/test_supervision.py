"""Supervision and confinement of stdio processes: start on first use with a bounded start-up,
crash restart with backoff (refused at once meanwhile), idle stop, the whole group stopped with
the gateway, per_user processes (isolation, max_processes, the person's token), the
environment and limits a process gets, and output that is not JSON-RPC or floods."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest
from mcp import MCPError, types

from proxy.config import UpstreamConfig
from proxy.upstream.stdio import PERSON_HEADER, LocalUpstreams, StdioTransport
from proxy.upstream.supervisor import LOG_LINES_PER_WINDOW
from tests.e2e import test_connect as connect_world
from tests.e2e.sdk_client import connect
from tests.helpers import jwt_auth, token, until
from tests.stdio.conftest import SERVER, TINY, alive, stdio_gateway, transport_of


def text(result: types.CallToolResult) -> str:
    content = result.content[0]
    assert isinstance(content, types.TextContent)
    return content.text


async def test_a_crash_is_refused_at_once_during_backoff_then_restarted() -> None:
    async with stdio_gateway() as gw, connect(gw.endpoint("local")) as client:
        first = text(await client.call_tool("pid", {}))
        with pytest.raises(MCPError) as crashed:
            await client.call_tool("crash", {})
        assert crashed.value.error.code == -32000
        with pytest.raises(MCPError) as backing_off:  # no restart yet: refused at once
            await client.call_tool("pid", {})
        assert backing_off.value.error.code == -32000
        assert not alive(int(first))

        pids: list[str] = []

        async def restarted() -> bool:
            try:
                pids.append(text(await client.call_tool("pid", {})))
            except MCPError:
                return False
            return True

        await until(restarted)
        assert pids[0] != first and alive(int(pids[0]))
        assert transport_of(gw).pool.started == 2
    failures = [r for r in gw.audit.records if r.tool in ("crash", "pid") and r.status == "error"]
    assert len(failures) >= 2


async def test_an_idle_process_stops_and_the_next_call_starts_one() -> None:
    async with stdio_gateway(idle_stop_s=0.2) as gw, connect(gw.endpoint("local")) as client:
        first = int(text(await client.call_tool("pid", {})))
        await until(lambda: not transport_of(gw).pool.running() and not alive(first))
        second = int(text(await client.call_tool("pid", {})))  # the session is still good
        assert second != first and alive(second)


async def test_the_gateway_stopping_stops_the_whole_group() -> None:
    """Its group, and a process that left the group with setsid (the keeper, a subreaper,
    is its parent by then, and kills everything below it as it ends)."""
    async with stdio_gateway() as gw, connect(gw.endpoint("local")) as client:
        leader = int(text(await client.call_tool("pid", {})))
        grandchild = int(text(await client.call_tool("spawn_child", {})))
        detached = int(text(await client.call_tool("spawn_detached", {})))
        assert alive(leader) and alive(grandchild) and alive(detached)
    assert not alive(leader)
    await until(lambda: not alive(grandchild) and not alive(detached))


async def test_confinement_environment_group_and_limits(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    monkeypatch.setenv("TOLLHOUSE_TEST_GATEWAY_SECRET", "never-in-a-child")
    async with stdio_gateway() as gw, connect(gw.endpoint("local")) as client:
        assert text(await client.call_tool("env", {"name": "STDIO_TEST"})) == "configured"
        assert text(await client.call_tool("env", {"name": "TOLLHOUSE_TEST_GATEWAY_SECRET"})) \
            == "<unset>"
        assert text(await client.call_tool("env", {"name": "PATH"})) == os.environ["PATH"]
        assert text(await client.call_tool("env", {"name": "HOME"})) != "<unset>"
        facts = (await client.call_tool("confinement", {})).structured_content
        assert facts is not None
        keeper = transport_of(gw).pool.running()[0].pid  # proxy/upstream/keeper.py
        assert facts["ppid"] == keeper != facts["pid"]
        assert facts["pgid"] == keeper == facts["sid"]  # a session and group of its own
        assert facts["cwd"] == "/"  # not the gateway's directory, where its database may be
        assert facts["data"] == 2048 * 1024 * 1024 and facts["nofile"] == 1024
        assert facts["cpu"] == -1  # no CPU-time limit by default


async def test_output_that_is_not_json_rpc_is_skipped_and_stderr_bounded(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tollhouse.stdio")
    async with stdio_gateway(args=[TINY], max_line_bytes=4096) as gw, \
            connect(gw.endpoint("local")) as client:
        assert text(await client.call_tool("noise", {})) == "noisy"
        assert text(await client.call_tool("echo", {"text": "after"})) == "after"
        await until(lambda: "not JSON-RPC, skipped): this is not JSON-RPC" in caplog.text)
        assert "skipped): [1, 2]" in caplog.text
        assert "a line over 4096 bytes" in caplog.text
        await until(lambda: sum("chatter" in r.getMessage() for r in caplog.records)
                    >= LOG_LINES_PER_WINDOW)
    chatter = [r.getMessage() for r in caplog.records if "chatter" in r.getMessage()]
    assert len(chatter) == LOG_LINES_PER_WINDOW  # 500 written, the rest counted, not logged
    assert all(m.startswith("stdio upstream local stderr: ") for m in chatter)


async def test_a_process_that_cannot_start_is_refused_at_once() -> None:
    async with stdio_gateway(command="/nonexistent/server", args=[]) as gw:
        response = await gw.post({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                  "params": {"protocolVersion": "2025-11-25",
                                             "capabilities": {}, "clientInfo": {
                                                 "name": "t", "version": "1"}}}, name="local")
        assert response.status_code == 200
        assert response.json()["error"]["code"] == -32000


async def test_start_up_is_bounded() -> None:
    before = time.monotonic()
    async with stdio_gateway(command="sleep", args=["300"], start_timeout_s=0.3) as gw:
        response = await gw.post({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                  "params": {"protocolVersion": "2025-11-25",
                                             "capabilities": {}, "clientInfo": {
                                                 "name": "t", "version": "1"}}}, name="local")
        assert response.json()["error"]["code"] == -32000
        assert transport_of(gw).pool.running() == []
    assert time.monotonic() - before < 60  # not the sleep's 300 s


def bearer(sub: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(endpoint='local', sub=sub)}"}


async def test_per_user_processes_are_isolated_and_bounded() -> None:
    async with stdio_gateway({"auth": jwt_auth()}, process="per_user", max_processes=1) as gw:
        started = asyncio.Event()

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            started.set()

        async with connect(gw.endpoint("local"), headers=bearer("alice")) as alice, \
                connect(gw.endpoint("local"), headers=bearer("bob")) as bob:
            alice_pid = text(await alice.call_tool("pid", {}))
            assert text(await alice.call_tool("pid", {})) == alice_pid
            busy = asyncio.create_task(alice.call_tool("slow", {"steps": 1, "wait": True},
                                                       progress_callback=on_progress))
            await started.wait()
            with pytest.raises(MCPError) as full:  # alice's only process is busy
                await bob.call_tool("pid", {})
            assert full.value.error.code == -32000
            busy.cancel()
            await until(lambda: not transport_of(gw).pool.running()[0].calls)
            bob_pid = text(await bob.call_tool("pid", {}))  # alice's idle process made room
            assert bob_pid != alice_pid and not alive(int(alice_pid))


async def post(transport: StdioTransport, body: dict[str, object], headers: dict[str, str]
               ) -> dict[str, object]:
    request = httpx.Request("POST", "http://stdio.invalid/", content=orjson.dumps(body),
                            headers={"content-type": "application/json", **headers},
                            extensions={"timeout": {"read": 10.0}})
    response = await transport.handle_async_request(request)
    answer: dict[str, object] = orjson.loads(await response.aread())
    return answer


async def test_the_persons_token_is_in_the_environment_and_a_refresh_restarts() -> None:
    cfg = UpstreamConfig(name="t", transport="stdio", command=sys.executable, args=[SERVER],
                         process="per_user", token_env="UPSTREAM_TOKEN")
    transport = StdioTransport(cfg)
    env = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
           "params": {"name": "env", "arguments": {"name": "UPSTREAM_TOKEN"}}}

    async def seen(person: str, secret: str) -> object:
        answer = await post(transport, env, {PERSON_HEADER: person,
                                             "authorization": f"Bearer {secret}"})
        return answer["result"]["content"][0]["text"]  # type: ignore[index]

    try:
        assert await seen("alice", "a-1") == "a-1"
        assert await seen("bob", "b-1") == "b-1"  # each person's own, never another's
        first = transport.pool.current("alice")
        assert first is not None and first.pid is not None
        assert await seen("alice", "a-2") == "a-2"  # refreshed: a new process
        assert transport.pool.current("alice") is not first
        await until(lambda: not alive(first.pid or 0))
    finally:
        await transport.aclose()


async def test_per_user_processes_get_each_persons_connected_token(tmp_path: Path) -> None:
    """The connect flow end to end (tests/e2e/test_connect.py's world): each person's own
    upstream token, from the vault, is in their own process's environment."""
    stdio = {"transport": "stdio", "command": sys.executable, "args": [SERVER],
             "process": "per_user", "token_env": "GH_TOKEN"}
    async with connect_world.world(tmp_path, explicit=True, stdio=stdio) as w:
        hint = await w.call("alice")
        assert "Connect your gh account first" in hint.json()["error"]["message"]
        people = [await connect_world.connect(w, "alice"), await connect_world.connect(w, "bob")]
        seen = {}
        for person in ("alice", "bob"):
            async with httpx.AsyncClient(timeout=10) as client:
                answer = await client.post(f"{w.outer}/mcp/gh", content=orjson.dumps(
                    {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                     "params": {"name": "env", "arguments": {"name": "GH_TOKEN"}}}),
                    headers={"content-type": "application/json",
                             "accept": "application/json, text/event-stream",
                             "authorization": f"Bearer {w.mcp_token(person)}"})
            seen[person] = answer.json()["result"]["content"][0]["text"]
        for http in people:
            await http.aclose()
        expected = {p: await w.state.connections.access_token(
            "gh", f"tollhouse:local|local:{p}") for p in ("alice", "bob")}
        assert seen == expected and seen["alice"] != seen["bob"]


async def test_an_upstream_removed_or_changed_by_a_reload_stops_its_processes() -> None:
    local = LocalUpstreams()
    cfg = UpstreamConfig(name="t", transport="stdio", command=sys.executable, args=[TINY])
    transport = local.transport(cfg)
    assert transport is not None and local.transport(cfg) is transport  # unchanged: kept
    first = await transport.pool.child("")
    changed = local.transport(dataclasses.replace(cfg, idle_stop_s=5.0))
    assert changed is not None and changed is not transport
    await until(lambda: not alive(first.pid or 0))  # the old config's process is stopped
    second = await changed.pool.child("")
    local.keep_only(set())  # the upstream is gone from the config
    await until(lambda: not alive(second.pid or 0))
    await local.aclose()


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
                    reason="switching users needs root (and a python3 any user may run)")
async def test_run_as_an_unprivileged_user() -> None:
    import pwd

    nobody = pwd.getpwnam("nobody")
    cfg = UpstreamConfig(name="t", transport="stdio", command="/usr/bin/python3", args=[TINY],
                         run_as="nobody")
    transport = StdioTransport(cfg)
    try:
        child = await transport.pool.child("")
        assert child.pid is not None  # the keeper; the server is its one child
        with open(f"/proc/{child.pid}/task/{child.pid}/children") as f:  # noqa: ASYNC230
            (server,) = f.read().split()
        with open(f"/proc/{server}/status") as f:  # noqa: ASYNC230 (procfs, instant)
            status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        assert status["Uid"].split()[0] == str(nobody.pw_uid)
        assert status["Gid"].split()[0] == str(nobody.pw_gid)
        assert status["Groups"].strip() == ""  # the gateway's groups are not kept
    finally:
        await transport.aclose()
