"""Builders (make_config) and a running gateway over an injected upstream transport."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from proxy.app import State, create_app
from proxy.audit import MemoryAuditSink
from proxy.config import Config, from_dict
from proxy.mcp.gateway import Gateway
from proxy.state.inflight import Later
from tests import db_backends
from tests.db_backends import _per_test_databases, database, database_url  # noqa: F401 (fixtures)
from tests.servers import serve

MCP_HEADERS = {"Content-Type": "application/json",
               "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}


def make_config(upstream_url: str = "http://upstream.test/mcp", **sections: Any) -> Config:
    """A config with one upstream `e`, on the running test's database unless `database` is
    given."""
    raw: dict[str, Any] = {"upstreams": [{"name": "e", "url": upstream_url}],
                           "database": {"url": db_backends.url()}}
    for key, value in sections.items():
        raw[key] = value
    return from_dict(raw, env={})


@dataclass
class RunningGateway:
    url: str
    audit: MemoryAuditSink
    state: State
    client: httpx.AsyncClient

    @property
    def gateway(self) -> Gateway:
        assert self.state.gateway is not None
        return self.state.gateway

    def endpoint(self, name: str = "e") -> str:
        return f"{self.url}/mcp/{name}"

    async def post(self, body: bytes | dict[str, Any], *, name: str = "e",
                   headers: dict[str, str] | None = None) -> httpx.Response:
        content = body if isinstance(body, bytes) else __import__("orjson").dumps(body)
        return await self.client.post(self.endpoint(name), content=content,
                                      headers={**MCP_HEADERS, **(headers or {})})


class FakeResolver:
    """Made-up upstream hosts (upstream.test) resolve to a documentation address."""

    async def resolve(self, host: str, port: int) -> list[str]:
        return ["192.0.2.10"]


@asynccontextmanager
async def running_gateway(cfg: Config, transport: httpx.AsyncBaseTransport | None = None,
                          *, later: Later | None = None) -> AsyncIterator[RunningGateway]:
    audit = MemoryAuditSink()
    app = create_app(cfg, upstream_transport=transport, audit_sink=audit,
                     resolver=FakeResolver(), later=later)
    state: State = app.extensions["tollhouse"]
    async with serve(app) as url, httpx.AsyncClient(timeout=10) as client:
        yield RunningGateway(url, audit, state, client)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
