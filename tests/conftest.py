"""Builders (make_config, mock_upstream) and a running gateway over an injected upstream
transport (`tests.stack.gateway_stack` with audit records kept in memory)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
import respx

from proxy.audit import MemoryAuditSink
from proxy.config import Config, from_dict
from proxy.mcp.gateway import Gateway
from proxy.runtime.app import Services
from proxy.state.inflight import Later
from tests import db_backends, state_backends
from tests.db_backends import _per_test_databases, database, database_url  # noqa: F401 (fixtures)
from tests.stack import gateway_stack
from tests.state_backends import _per_test_prefixes  # noqa: F401 (fixture)

MCP_HEADERS = {"Content-Type": "application/json",
               "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}


def make_config(upstream_url: str = "http://upstream.test/mcp", **sections: Any) -> Config:
    """A config with one upstream `e`, on the running test's database and this run's state
    store (a fresh key prefix on Redis) unless `database` or `state` is given."""
    raw: dict[str, Any] = {"upstreams": [{"name": "e", "url": upstream_url}],
                           "database": {"url": db_backends.url()},
                           "state": state_backends.state()}
    for key, value in sections.items():
        raw[key] = value
    return from_dict(raw, env={})


UPSTREAM_SESSION = "UPSTREAM-SID"


@dataclass
class MockUpstream:
    """An MCP upstream behind an httpx MockTransport. POST answers each call with an empty
    result under its id (initialize also opens session `UPSTREAM_SESSION`; a message without an
    id is 202; another session id is 404; a body that is not JSON is 400); GET is 405 (no
    stream); DELETE is 200. `seen` is every request it got, in order."""

    router: respx.Router
    transport: httpx.MockTransport
    seen: list[httpx.Request]


def mock_upstream(url: str = "http://upstream.test/mcp") -> MockUpstream:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "GET":
            return httpx.Response(405)
        if request.method == "DELETE":
            return httpx.Response(200)
        try:
            msg = orjson.loads(request.content)
        except orjson.JSONDecodeError:
            return httpx.Response(400)
        if not isinstance(msg, dict) or "id" not in msg:
            return httpx.Response(202)
        if msg.get("method") == "initialize":
            return httpx.Response(200, json={"jsonrpc": "2.0", "id": msg["id"], "result": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {
                    "name": "up", "version": "1"}}}, headers={"mcp-session-id": UPSTREAM_SESSION})
        if request.headers.get("mcp-session-id") not in (None, UPSTREAM_SESSION):
            return httpx.Response(404)
        return httpx.Response(200, json={"jsonrpc": "2.0", "id": msg["id"], "result": {}})

    router = respx.Router(assert_all_called=False)
    router.route(url=url).mock(side_effect=answer)
    return MockUpstream(router, httpx.MockTransport(router.async_handler), seen)


@dataclass
class RunningGateway:
    url: str
    audit: MemoryAuditSink
    state: Services
    client: httpx.AsyncClient

    @property
    def gateway(self) -> Gateway:
        assert self.state.gateway is not None
        return self.state.gateway

    def endpoint(self, name: str = "e") -> str:
        return f"{self.url}/mcp/{name}"

    async def post(self, body: bytes | dict[str, Any], *, name: str = "e",
                   headers: dict[str, str] | None = None) -> httpx.Response:
        content = body if isinstance(body, bytes) else orjson.dumps(body)
        return await self.client.post(self.endpoint(name), content=content,
                                      headers={**MCP_HEADERS, **(headers or {})})


class FakeResolver:
    """Made-up upstream hosts (upstream.test) resolve to a documentation address."""

    async def resolve(self, host: str, port: int) -> list[str]:
        return ["192.0.2.10"]


@asynccontextmanager
async def running_gateway(cfg: Config, transport: httpx.AsyncBaseTransport | None = None,
                          *, later: Later | None = None, sock: socket.socket | None = None,
                          **options: Any) -> AsyncIterator[RunningGateway]:
    """The gateway for `cfg` on Hypercorn (on `sock`, from `bound_socket()`, when the config
    must name its own URL), its upstream calls going to `transport`, audit records kept in
    memory, made-up hosts resolved by `FakeResolver`; `options` are further `create_app`
    keywords (`resolver=None` for real DNS, `clock`, `secret_key`, ...)."""
    audit = MemoryAuditSink()
    options.setdefault("resolver", FakeResolver())
    async with gateway_stack(cfg, sock=sock, upstream_transport=transport, audit_sink=audit,
                             later=later, **options) as site:
        yield RunningGateway(site.url, audit, site.services, site.client)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
