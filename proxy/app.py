"""Build the Quart app for a config: every long-lived object is made here and passed down."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from quart import Quart

from policies import default_policies
from proxy import edge
from proxy.audit import AuditSink, SqliteAuditSink
from proxy.auth import build_authenticator
from proxy.chain import Chain
from proxy.config import Config
from proxy.gateway import Gateway
from proxy.state import MemoryInFlight, MemorySessionStore
from proxy.upstream import UpstreamClient, UpstreamRoute

log = logging.getLogger("tollhouse")

BODY_TIMEOUT_S = 60.0


class State:
    """What the app holds while serving; tests reach sessions and in-flight calls here."""

    gateway: Gateway | None = None


def create_app(cfg: Config, *, upstream_transport: httpx.AsyncBaseTransport | None = None,
               audit_sink: AuditSink | None = None, base_dir: Path | None = None) -> Quart:
    app = Quart("tollhouse")
    app.config.update(
        MAX_CONTENT_LENGTH=cfg.server.max_request_bytes,
        BODY_TIMEOUT=BODY_TIMEOUT_S,
        RESPONSE_TIMEOUT=None,
        PROVIDE_AUTOMATIC_OPTIONS=False,
    )
    routes = {u.name: UpstreamRoute.from_config(u) for u in cfg.upstreams}
    authenticator = build_authenticator(cfg, base_dir or Path.cwd())
    chain = Chain(default_policies(cfg))
    sessions = MemorySessionStore(cfg.server.session_idle_timeout_s, cfg.server.max_sessions)
    inflight = MemoryInFlight()
    origins = {o.rstrip("/").lower() for o in cfg.server.allowed_origins}
    public = urlsplit(cfg.server.public_url)
    origins.add(f"{public.scheme}://{public.netloc}".lower())
    state = State()
    app.extensions["tollhouse"] = state

    @app.while_serving  # type: ignore[type-var]
    async def lifespan() -> AsyncIterator[None]:
        upstream = UpstreamClient(upstream_transport)
        audit = audit_sink or SqliteAuditSink(cfg.database.sqlite_path)
        state.gateway = Gateway(
            routes=routes, authenticator=authenticator, chain=chain, sessions=sessions,
            inflight=inflight, upstream=upstream, audit=audit,
            allowed_origins=frozenset(origins))
        try:
            yield
        finally:
            await state.gateway.drain(cfg.server.shutdown_grace_s)
            await upstream.aclose()
            await audit.close()

    def gateway() -> Gateway:
        assert state.gateway is not None, "the gateway is built when the app starts serving"
        return state.gateway

    edge.register(app, gateway, BODY_TIMEOUT_S)
    return app
