"""No leak: 1,000 sessions opened and closed on a shared process, and a few hundred per_user
processes started and stopped (max_processes makes room, idle stop ends the rest), leave the
gateway with the children and file descriptors it had before: no orphan, no zombie, no pipe."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import Counter
from typing import Any

import httpx
import orjson

from proxy.config import from_dict
from tests import db_backends, state_backends
from tests.conftest import MCP_HEADERS, running_gateway
from tests.helpers import jwt_auth, token, until
from tests.stdio.conftest import TINY, children, described, descriptors, open_files, transport_of

SESSIONS = 1000
PEOPLE = 200
AT_ONCE = 10
INITIALIZE = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {},
    "clientInfo": {"name": "leak", "version": "1"}}})
ECHO = orjson.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                     "params": {"name": "echo", "arguments": {"text": "x"}}})


def upstream(name: str, **settings: Any) -> dict[str, Any]:
    return {"name": name, "transport": "stdio", "command": sys.executable, "args": [TINY],
            "idle_stop_s": 0.5, **settings}


async def session(client: httpx.AsyncClient, url: str, sub: str, call: bool) -> None:
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {token(endpoint=url.rsplit('/', 1)[1], sub=sub)}"}
    opened = await client.post(url, content=INITIALIZE, headers=headers)
    assert opened.status_code == 200, opened.text
    assert "error" not in opened.json(), opened.text
    headers["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
    if call:
        answer = await client.post(url, content=ECHO, headers=headers)
        assert answer.json()["result"]["content"][0]["text"] == "x", answer.text
    assert (await client.delete(url, headers=headers)).status_code == 200


async def test_sessions_and_processes_leave_nothing_behind() -> None:
    raw = {"database": {"url": db_backends.url()}, "state": state_backends.state(),
           "auth": jwt_auth(),
           "upstreams": [upstream("local", idle_stop_s=1.0),
                         upstream("many", process="per_user", max_processes=20)]}
    async with running_gateway(from_dict(raw, env={})) as gw:
        shared, per_user = gw.endpoint("local"), gw.endpoint("many")
        # every pool exists, and the test client holds as many connections as it will
        await asyncio.gather(*(session(gw.client, shared, "warm", True)
                               for _ in range(AT_ONCE)))
        await session(gw.client, per_user, "warm", True)
        pools = [transport_of(gw, "local").pool, transport_of(gw, "many").pool]
        await until(lambda: not any(p.running() for p in pools))
        # the database pool at its steady size (it keeps up to max_idle connections, opened
        # as concurrency first needs them): those are not leaks
        assert gw.state.api is not None
        database = gw.state.api.database
        with contextlib.ExitStack() as held:
            for _ in range(database._max_idle):
                held.enter_context(database.lease())
        url = raw["state"].get("url") or ""
        redis = url if url.startswith("redis") else None  # its connections: the pool's
        pg: str | None = raw["database"]["url"]  # and the database's (opened as first needed)
        pg = pg if pg and pg.startswith("postgres") else None
        before_children, before_fds = children(), descriptors(redis, pg)
        before_files = open_files()

        async def batch(jobs: list[Any]) -> None:
            for i in range(0, len(jobs), AT_ONCE):
                await asyncio.gather(*jobs[i:i + AT_ONCE])

        await batch([session(gw.client, shared, "alice", i % 10 == 0) for i in range(SESSIONS)])
        # one process shared by every session, not one each (a loaded machine may leave it
        # idle past idle_stop_s between two sessions, and so start it again)
        assert pools[0].started < 10
        await batch([session(gw.client, per_user, f"person-{i}", True) for i in range(PEOPLE)])
        assert pools[1].started >= PEOPLE + 1  # (an idle one may be stopped between calls)
        assert len(pools[1].running()) <= 20
        await until(lambda: not any(p.running() for p in pools), 30.0, "every process idle-stopped")
        assert transport_of(gw, "local")._sessions == {}
        # nothing started since is left (a child of an earlier test that ended meanwhile, say
        # reaped by subprocess's own clean-up when this test started a process, is no leak)
        with contextlib.suppress(AssertionError):
            await until(lambda: children() <= before_children, 30.0, "no child left")
        assert children() <= before_children, \
            f"children left: {described(children() - before_children)}"
        # a child is reaped (by the watcher's thread) a moment before the loop reads its pipes'
        # end and closes them, and before a stop in flight closes its transport: wait for that
        with contextlib.suppress(AssertionError):
            await until(lambda: descriptors(redis, pg) <= before_fds, 30.0, "no descriptor left")
        after_files = open_files()
        assert descriptors(redis, pg) <= before_fds, (
            f"opened since: {sorted((Counter(after_files) - Counter(before_files)).elements())}; "
            f"closed since: {sorted((Counter(before_files) - Counter(after_files)).elements())}")
