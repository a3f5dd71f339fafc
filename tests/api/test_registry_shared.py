"""The server registry under stress: two gateways on one database, concurrent writes, a write
the database refuses, and a server re-pointed and deleted under a call in flight."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from policies.access import Access
from proxy.api.models import ServerIn
from proxy.auth import keys as api_keys
from proxy.config import from_dict
from proxy.demo import demo_app
from proxy.destinations import Destinations
from proxy.mirror import Mirrors
from proxy.servers import Registry
from proxy.storage.db import Database
from proxy.upstream import UpstreamRoute
from tests import db_backends
from tests.conftest import MCP_HEADERS
from tests.helpers import until
from tests.servers import serve
from tests.stack import gateway_stack


@dataclass
class Gateway:
    url: str
    admin: httpx.AsyncClient

    def api(self, path: str) -> str:
        return f"{self.url}/api/v1{path}"

    async def call(self, endpoint: str, tool: str = "echo", **arguments: Any) -> httpx.Response:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": tool, "arguments": arguments or {"text": "hi"}}}
        return await self.admin.post(f"{self.url}/mcp/{endpoint}", content=orjson.dumps(body),
                                     headers=MCP_HEADERS)


@dataclass
class World:
    upstream: str
    database: str
    secret: str
    gateways: list[Gateway]


@asynccontextmanager
async def world(gateways: int = 2, busy_timeout_s: float = 10.0) -> AsyncIterator[World]:
    database = db_backends.url()
    _, secret = api_keys.create(database, "ops", [], role="admin")
    cfg = from_dict({"auth": {"mode": "jwt"},
                     "database": {"url": database, "busy_timeout_s": busy_timeout_s}}, env={})
    async with AsyncExitStack() as stack:
        upstream = await stack.enter_async_context(serve(demo_app(), graceful_timeout=1))
        running = [await stack.enter_async_context(gateway_stack(
            cfg, registry_poll_s=0.05,  # the other gateway catches up quickly
            client={"headers": {"Authorization": f"Bearer {secret}"}}))
            for _ in range(gateways)]
        yield World(upstream, database, secret, [Gateway(g.url, g.client) for g in running])


def answer(response: httpx.Response) -> Any:
    """The JSON-RPC answer of a call, whether it came as JSON or as an SSE stream."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines()
                if line.startswith("data:")]
        return orjson.loads(data[-1])
    return response.json()


async def test_a_change_through_one_gateway_reaches_the_other() -> None:
    async with world() as w:
        one, two = w.gateways
        spec = {"name": "shared", "url": f"{w.upstream}/mcp", "zones": ["loopback"]}
        assert (await one.admin.post(one.api("/servers"), json=spec)).status_code == 201
        # the other gateway's API sees it at once, its edge within a poll
        seen = await two.admin.get(two.api("/servers/shared"))
        assert seen.status_code == 200 and seen.json()["source"] == "api"

        async def served_by_two() -> bool:
            return (await two.call("shared")).status_code == 200

        await until(served_by_two)
        taken = await two.admin.post(two.api("/servers"), json=spec)
        assert taken.status_code == 409 and taken.json() == {
            "detail": "server 'shared' already exists"}
        # access rules changed on one apply on the other's edge
        tightened = await one.admin.patch(one.api("/servers/shared"),
                                          json={"access": {"tools_deny": ["echo"]}})
        assert tightened.status_code == 200

        async def echo_refused_by_two() -> bool:
            return "error" in answer(await two.call("shared"))

        await until(echo_refused_by_two)
        added = answer(await two.call("shared", tool="add", a=1, b=2))
        assert added["result"]["content"][0]["text"] == "3.0"
        # deleted on one: gone from the other's edge, and a write there is a 404
        assert (await one.admin.delete(one.api("/servers/shared"))).status_code == 204

        async def gone_from_two() -> bool:
            return (await two.call("shared")).status_code == 404

        await until(gone_from_two)
        late = await two.admin.patch(two.api("/servers/shared"), json={"timeout_s": 5})
        assert late.status_code == 404 and late.json() == {
            "detail": "server 'shared' not found"}


async def test_concurrent_patches_all_land() -> None:
    async with world() as w:
        one, two = w.gateways
        spec = {"name": "busy", "url": f"{w.upstream}/mcp", "zones": ["loopback"]}
        assert (await one.admin.post(one.api("/servers"), json=spec)).status_code == 201
        changes = [{"timeout_s": 11}, {"era": "legacy"}, {"total_timeout_s": 99},
                   {"access": {"tools_deny": ["add"]}}, {"zones": ["loopback", "lan"]}]
        answers = await asyncio.gather(*(
            (one if i % 2 else two).admin.patch(one.api("/servers/busy"), json=change)
            for i, change in enumerate(changes)))
        assert [a.status_code for a in answers] == [200] * len(changes)
        for gateway in (one, two):
            final = (await gateway.admin.get(gateway.api("/servers/busy"))).json()
            assert (final["timeout_s"], final["era"], final["total_timeout_s"],
                    final["access"]["tools_deny"], final["zones"]) == (
                11, "legacy", 99, ["add"], ["loopback", "lan"])


async def test_a_write_the_database_refuses_leaves_the_edge_as_it_was() -> None:
    async with world(gateways=1, busy_timeout_s=0.3) as w:
        (one,) = w.gateways
        spec = {"name": "steady", "url": f"{w.upstream}/mcp", "zones": ["loopback"]}
        assert (await one.admin.post(one.api("/servers"), json=spec)).status_code == 201
        assert (await one.call("steady")).status_code == 200
        with db_backends.tables_held(w.database, "servers"):  # another writer holds it
            moved = await one.admin.put(one.api("/servers/steady"), json={
                **spec, "url": "https://elsewhere.example/mcp", "zones": ["remote"]})
        assert moved.status_code == 503 and moved.headers["Retry-After"] == "1"
        assert moved.json() == {"detail": "the database is busy; retry"}
        # the edge still serves the server as stored, and the API shows it so
        assert answer(await one.call("steady"))["result"]["content"][0]["text"] == "hi"
        shown = (await one.admin.get(one.api("/servers/steady"))).json()
        assert shown["url"] == f"{w.upstream}/mcp"


async def test_a_server_named_by_a_key_cannot_be_deleted_until_the_key_is_changed() -> None:
    async with world(gateways=1) as w:
        (one,) = w.gateways
        spec = {"name": "scoped", "url": f"{w.upstream}/mcp", "zones": ["loopback"]}
        assert (await one.admin.post(one.api("/servers"), json=spec)).status_code == 201
        key = (await one.admin.post(one.api("/keys"), json={
            "name": "bot", "endpoints": ["scoped"]})).json()
        refused = await one.admin.delete(one.api("/servers/scoped"))
        assert refused.status_code == 409 and refused.json() == {
            "detail": f"server 'scoped' is named by API key(s) {key['id']}; "
                      "edit or revoke them first"}
        assert (await one.call("scoped")).status_code == 200  # still served
        assert (await one.admin.delete(one.api(f"/keys/{key['id']}"))).status_code == 204
        assert (await one.admin.delete(one.api("/servers/scoped"))).status_code == 204
        credentials = await one.admin.post(one.api("/servers"), json={
            **spec, "url": "https://user:pw@upstream.example/mcp"})
        assert credentials.status_code == 422
        assert credentials.json()["detail"][0]["loc"] == ["body", "url"]
        assert "pw" not in credentials.text


async def test_a_server_re_pointed_and_deleted_under_a_call_in_flight() -> None:
    async with world(gateways=1) as w:
        (one,) = w.gateways
        spec = {"name": "moving", "url": f"{w.upstream}/mcp", "zones": ["loopback"]}
        assert (await one.admin.post(one.api("/servers"), json=spec)).status_code == 201
        slow = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "count", "arguments": {"to": 20},
                           "_meta": {"progressToken": "p"}}}
        async with one.admin.stream("POST", f"{one.url}/mcp/moving",
                                    content=orjson.dumps(slow), headers=MCP_HEADERS) as stream:
            lines = stream.aiter_lines()
            async for line in lines:  # the first progress event: the upstream is counting
                if line.startswith("data:") and "notifications/progress" in line:
                    break
            # re-pointed at a closed port: new calls fail, the one in flight carries on
            moved = await one.admin.put(one.api("/servers/moving"), json={
                **spec, "url": "http://127.0.0.1:9/mcp"})
            assert moved.status_code == 200
            failed = answer(await one.call("moving"))
            assert failed["error"]["code"] == -32000
            # deleted: new calls are a 404, the one in flight carries on
            assert (await one.admin.delete(one.api("/servers/moving"))).status_code == 204
            assert (await one.call("moving")).status_code == 404
            rest = [line async for line in lines if line.startswith("data:")]
        final = orjson.loads(rest[-1][5:])
        assert final["id"] == 7 and final["result"]["content"][0]["text"] == "counted to 20"


async def test_a_put_lists_a_name_mismatch_beside_the_schema_problems() -> None:
    async with world(gateways=1) as w:
        (one,) = w.gateways
        spec = {"name": "a1", "url": f"{w.upstream}/mcp", "zones": ["loopback"]}
        assert (await one.admin.post(one.api("/servers"), json=spec)).status_code == 201
        both = await one.admin.put(one.api("/servers/a1"), json={"name": "other",
                                                                   "url": "ftp://x"})
        assert both.status_code == 422
        assert [p["loc"] for p in both.json()["detail"]] == [["body", "url"], ["body", "name"]]


async def test_watch_reloads_what_another_gateway_wrote_once_a_poll() -> None:
    """The mirrors wait `poll_s` with the sleep they were given between polls: here each wait
    lasts until the test lets it end."""
    url = db_backends.url()
    cfg = from_dict({"database": {"url": url}}, env={})
    database = Database(url)
    turns: asyncio.Queue[None] = asyncio.Queue()
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        await turns.get()

    routes: dict[str, UpstreamRoute] = {}
    here_mirrors, elsewhere_mirrors = Mirrors(poll_s=7.5, sleep=sleep), Mirrors()
    Registry(cfg, routes, here_mirrors, Access.published(), Destinations.published(),
             database)
    elsewhere = Registry(cfg, {}, elsewhere_mirrors, Access.published(),
                         Destinations.published(), database)
    try:
        async with here_mirrors.running():
            await until(lambda: waits == [7.5], what="the first wait")
            await elsewhere.create(ServerIn.model_validate(
                {"name": "late", "url": "http://127.0.0.1:9/mcp", "zones": ["loopback"]}))
            assert "late" not in routes  # not before the next poll
            turns.put_nowait(None)
            await until(lambda: len(waits) == 2, what="the next wait")  # polled, waiting again
            assert "late" in routes and waits == [7.5, 7.5]
    finally:
        await elsewhere_mirrors.aclose()
        database.close()
