"""Builders and a real-server fixture: Hypercorn on a loopback socket that is listening before
the server starts, so connections queue from the first moment and no test polls or sleeps."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config as HyperConfig

from proxy.app import State, create_app
from proxy.audit import MemoryAuditSink
from proxy.config import Config, from_dict
from proxy.gateway import Gateway

MCP_HEADERS = {"Content-Type": "application/json",
               "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}


@asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    """Run an ASGI app on Hypercorn at a free loopback port; yield its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    cfg = HyperConfig()
    cfg.bind = [f"fd://{sock.detach()}"]
    cfg.accesslog = None
    cfg.errorlog = None
    cfg.graceful_timeout = 5
    stop = asyncio.Event()
    task = asyncio.create_task(hypercorn_serve(app, cfg, shutdown_trigger=stop.wait))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def make_config(upstream_url: str = "http://upstream.test/mcp", **sections: Any) -> Config:
    raw: dict[str, Any] = {"upstreams": [{"name": "e", "url": upstream_url}]}
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


@asynccontextmanager
async def running_gateway(cfg: Config, transport: httpx.AsyncBaseTransport | None = None
                          ) -> AsyncIterator[RunningGateway]:
    audit = MemoryAuditSink()
    app = create_app(cfg, upstream_transport=transport, audit_sink=audit)
    state: State = app.extensions["tollhouse"]
    async with serve(app) as url, httpx.AsyncClient(timeout=10) as client:
        yield RunningGateway(url, audit, state, client)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
