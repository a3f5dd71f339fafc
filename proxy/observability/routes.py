"""GET /metrics (Prometheus text format) and GET /readyz; /healthz is the edge's
(proxy.web.routes). None of them is audited, authenticated as a caller, or behind the MCP
edge's Origin check.

/metrics answers only a loopback peer unless `observability.metrics_public`, and, when
`observability.metrics_token` is set, only with `Authorization: Bearer <token>` (compared in
constant time). The peer is the connection's own address: a forwarded-for header never makes
a scrape loopback.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
from collections.abc import Callable
from typing import Protocol

import orjson
from quart import Quart, Response, request

from proxy.config import ObservabilityConfig
from proxy.errors import HTTPRefusal, OAuthError
from proxy.observability.health import Health
from proxy.observability.metrics import Metrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
JSON = {"Content-Type": "application/json", "Cache-Control": "no-store"}


class Serving(Protocol):
    """What these routes read of the serving app (proxy.runtime.serving.Serving)."""

    @property
    def draining(self) -> bool: ...

    @property
    def health(self) -> Health: ...


def register(app: Quart, cfg: ObservabilityConfig, metrics: Metrics | None,
             serving: Callable[[], Serving | None]) -> None:
    """`serving()`: the app's Serving while it serves, else None (starting or stopped); its
    `health` probes the database and the live-state store."""
    token = cfg.metrics_token.encode()

    async def readyz() -> Response:
        now = serving()
        if now is None:
            return _ready(["starting"])
        if now.draining:
            return _ready(["draining"])
        readiness = await now.health.readiness()
        return _ready(list(readiness.down))

    async def scrape() -> Response:
        if metrics is None:
            raise HTTPRefusal(404, "Not Found")
        if not cfg.metrics_public and not _loopback(request.remote_addr):
            raise OAuthError("forbidden", "/metrics answers on loopback only "
                             "(observability.metrics_public)", 403)
        if token and not _bearer_matches(request.headers.get("authorization", ""), token):
            raise OAuthError("unauthorized", "a valid metrics bearer token is required", 401,
                             headers={"WWW-Authenticate": 'Bearer realm="metrics"'})
        now = serving()
        if now is not None:
            await now.health.sample()
        if metrics.multiproc_dir is None:
            body = metrics.render()
        else:  # every worker's files are read: off the loop
            body = await asyncio.to_thread(metrics.render)
        return Response(body, 200, {"Content-Type": CONTENT_TYPE, "Cache-Control": "no-store"})

    app.add_url_rule("/readyz", "readyz", readyz)
    app.add_url_rule("/metrics", "metrics", scrape)


def _ready(down: list[str]) -> Response:
    if not down:
        return Response(b'{"status":"ready"}', 200, JSON)
    return Response(orjson.dumps({"status": "unavailable", "down": down}), 503, JSON)


def _loopback(addr: str | None) -> bool:
    if not addr:
        return False
    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool((mapped or ip).is_loopback)


def _bearer_matches(header: str, token: bytes) -> bool:
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer":
        return hmac.compare_digest(b"", token)  # the same work either way
    return hmac.compare_digest(presented.strip().encode(), token)
