"""The gateway stack a test stands up, in one place: an upstream app served first (the demo
server, say), the gateway's config built from the URLs it will be reached at, `create_app` on
Hypercorn on a loopback socket bound before the config is made (so the config may name its own
public URL), and an httpx client whose base URL is the gateway's. The config is on the running
test's database and this run's live state unless it names its own.

    async with gateway_stack(lambda urls: {"server": {"public_url": urls.gateway}, ...},
                             secret_key="k") as site:
        await site.client.post("/signin", ...)

Several upstreams are `upstreams={"alpha": app, ...}`, each served first and its URL in
`urls.upstreams["alpha"]`. A test that must know the gateway's URL before it can write the config
(an async step between) binds the socket itself (`tests.servers.bound_socket`) and hands it in.

`tests.conftest.running_gateway` is the same stack over an injected upstream transport, with
audit records kept in memory."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from quart import Quart

from proxy.config import Config, from_dict
from proxy.mcp.gateway import Gateway
from proxy.runtime.app import Services, create_app
from tests import db_backends, state_backends
from tests.servers import bound_socket, serve


@dataclass(frozen=True)
class Urls:
    """Where the stack is reached: the gateway's base URL, the served upstream's (empty when
    none was served), and each named upstream's."""

    gateway: str
    upstream: str = ""
    upstreams: Mapping[str, str] = field(default_factory=dict)


ConfigSource = Config | dict[str, Any] | Callable[[Urls], Config | dict[str, Any]]


@dataclass
class Site:
    """A served gateway: its URL, its app, a client on its URL, and the upstreams' URLs."""

    url: str
    app: Quart
    client: httpx.AsyncClient
    upstream: str = ""
    upstreams: Mapping[str, str] = field(default_factory=dict)

    @property
    def services(self) -> Services:
        services: Services = self.app.extensions["tollhouse"]
        return services

    @property
    def gateway(self) -> Gateway:
        assert self.services.gateway is not None
        return self.services.gateway

    def endpoint(self, name: str = "e") -> str:
        return f"{self.url}/mcp/{name}"


def stack_config(source: ConfigSource, urls: Urls) -> Config:
    """`source` as a Config: a Config as it is; a dict (or what a function of `urls`
    returns: a dict or a Config) on the test's database and state unless it names its own."""
    made = source(urls) if callable(source) else source
    if isinstance(made, Config):
        return made
    raw = dict(made)
    raw.setdefault("database", {"url": db_backends.url()})
    raw.setdefault("state", state_backends.state())
    return from_dict(raw, env={})


@asynccontextmanager
async def gateway_stack(config: ConfigSource, *, upstream: Any = None,
                        upstreams: Mapping[str, Any] | None = None,
                        sock: socket.socket | None = None, host: str = "127.0.0.1",
                        client: dict[str, Any] | None = None, graceful_timeout: float = 1.0,
                        **options: Any) -> AsyncIterator[Site]:
    """`upstream` (an ASGI app) and `upstreams` (by name) served first when given; then the
    gateway for `config` (see `stack_config`) on `sock` (bound on `host` unless given) with
    `options` as `create_app` keywords (`secret_key`, `vault_keys`, ...) and a client on it
    (`client`: more httpx.AsyncClient keywords)."""
    async with AsyncExitStack() as stack:
        async def served(app: Any) -> str:
            url: str = await stack.enter_async_context(
                serve(app, graceful_timeout=graceful_timeout))
            return url

        upstream_url = "" if upstream is None else await served(upstream)
        named = {name: await served(app) for name, app in (upstreams or {}).items()}
        if sock is None:
            sock, url = bound_socket(host)
        else:
            bound, port = sock.getsockname()[:2]
            url = f"http://{bound}:{port}"
        app = create_app(stack_config(config, Urls(url, upstream_url, named)), **options)
        await stack.enter_async_context(serve(app, sock=sock, graceful_timeout=graceful_timeout))
        http = await stack.enter_async_context(
            httpx.AsyncClient(base_url=url, **{"timeout": 10, **(client or {})}))
        yield Site(url, app, http, upstream_url, named)


@asynccontextmanager
async def gateway_client(config: ConfigSource, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
    """`gateway_stack`'s client alone, for a test that only talks to the gateway."""
    async with gateway_stack(config, **options) as site:
        yield site.client
