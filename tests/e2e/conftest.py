"""A stack per test (`tests.stack.gateway_stack`): an official-SDK upstream on Hypercorn, the
gateway on Hypercorn in front of it with its real transport and a real SQLite audit log, and
the official SDK client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy.audit import AuditSink, DatabaseAuditSink
from proxy.config import Config, from_dict
from proxy.mcp.gateway import Gateway
from proxy.runtime.app import Services
from proxy.state.inflight import Later
from tests import db_backends, state_backends
from tests.e2e.upstreams import UpstreamProbe, stateful_sse_app, stateless_json_app
from tests.stack import gateway_stack


@dataclass
class Stack:
    upstream_url: str
    gateway_url: str
    probe: UpstreamProbe
    state: Services
    db_path: str

    @property
    def gateway(self) -> Gateway:
        assert self.state.gateway is not None
        return self.state.gateway

    @property
    def endpoint(self) -> str:
        return f"{self.gateway_url}/mcp/up"


def stack_config(upstream_url: str, db_path: str, config: dict[str, Any] | None = None,
                 **upstream: Any) -> Config:
    """One upstream `up` with `upstream`'s settings, and `config`'s other top-level tables."""
    return from_dict({
        "database": {"url": db_path}, "state": state_backends.state(), **(config or {}),
        "upstreams": [{"name": "up", "url": f"{upstream_url}/mcp", **upstream}],
    }, env={})


@asynccontextmanager
async def open_stack(tmp_path: Path, make_upstream: Callable[..., Any], *,
                     audit: AuditSink | None = None, later: Later | None = None,
                     config: dict[str, Any] | None = None, span_exporter: Any = None,
                     **upstream: Any) -> AsyncIterator[Stack]:
    """`make_upstream()`'s app served, and the gateway in front of it as endpoint `up`
    (`upstream` its settings, `config` the other top-level tables; `span_exporter` where
    the spans go when `config` turns tracing on)."""
    app, probe = make_upstream()
    db_path = db_backends.url()
    async with gateway_stack(lambda urls: stack_config(urls.upstream, db_path, config,
                                                       **upstream),
                             upstream=app, audit_sink=audit, later=later,
                             span_exporter=span_exporter) as site:
        yield Stack(site.upstream, site.url, probe, site.services, db_path)


@pytest.fixture(params=["stateful_sse", "stateless_json"])
def upstream_kind(request: pytest.FixtureRequest) -> Callable[..., Any]:
    return {"stateful_sse": stateful_sse_app, "stateless_json": stateless_json_app}[
        request.param]


__all__ = ["DatabaseAuditSink", "Stack", "open_stack"]
