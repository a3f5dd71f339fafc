"""The upstream client: one route per upstream prepared at start-up (`UpstreamRoute`), the
headers a forwarded call carries, and `open` (the egress pin on the request, straight to the
transport), which returns an `UpstreamAnswer` (proxy/upstream/answer.py, where the way back
through httpx is mapped: its failures, an upstream's JSON-RPC refusal)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx

from proxy.config import UpstreamConfig
from proxy.config.template import UrlTemplate
from proxy.destinations import DIAL, Destinations
from proxy.upstream.answer import UpstreamAnswer, map_errors

# What a client's request may carry upstream. Everything else (the client's Authorization,
# cookies, hop-by-hop headers, the client's session id) stays at the gateway.
FORWARDED_REQUEST_HEADERS = ("content-type", "mcp-protocol-version", "last-event-id")
POST_ACCEPT = ("accept", "application/json, text/event-stream")
GET_ACCEPT = ("accept", "text/event-stream")


@dataclass(frozen=True, slots=True)
class UpstreamRoute:
    """One upstream, prepared once at start-up so the hot path parses nothing."""

    name: str
    url: httpx.URL
    static_headers: tuple[tuple[str, str], ...]
    call_timeout: httpx.Timeout
    stream_timeout: httpx.Timeout
    total_timeout_s: float
    era: str
    call_timeout_ext: dict[str, float | None]
    stream_timeout_ext: dict[str, float | None]
    url_text: str  # the URL as configured (httpx.URL is costly to print)
    state_key: str  # name and URL: what live state learned about this upstream is under
    identity: str = "none"  # how the caller's identity is forwarded (proxy.upstream.identity)
    identity_audience: str = ""  # the `aud` of an identity token (the URL unless configured)
    # -- per-caller upstreams (proxy.upstream.tenants) ------------------------------------
    template: UrlTemplate | None = None  # set: never dialled, resolved per caller first
    zones: tuple[str, ...] = ()  # where a resolved URL may be dialled
    max_resolved: int = 0
    origin: str = ""  # a resolved route: its upstream's origin (the audit names it)
    # a resolved route's own pool (egress-checked and pinned like any), or a local upstream's
    # own transport (`local`: proxy.upstream.stdio, nothing dialled, no egress pin)
    transport: httpx.AsyncBaseTransport | None = None
    local: bool = False
    # the client capabilities a session the bridge opens here declares: none, except on a
    # virtual endpoint's member for a legacy client (what it declared, as far as relayed)
    client_capabilities: dict[str, Any] | None = None

    @property
    def dial_key(self) -> str:
        """What the egress check and its pin are under: the name, or the resolved URL."""
        return self.state_key if self.origin else self.name

    @property
    def session_endpoint(self) -> str:
        """What a session is bound to: the endpoint, and for a per-caller upstream the URL
        it was opened on too, so a session never moves to another caller's server."""
        return self.state_key if self.origin else self.name

    @classmethod
    def from_config(cls, cfg: UpstreamConfig,
                    transport: httpx.AsyncBaseTransport | None = None) -> UpstreamRoute:
        if cfg.stdio:  # addressed as a Streamable HTTP server of its own, speaking 2025-11-25
            url = f"http://stdio.invalid/{cfg.name}"
            key = f"{cfg.name} stdio:{cfg.command}"
            cfg = dataclasses.replace(cfg, url=url, era="legacy")
        else:
            key = f"{cfg.name} {cfg.url}"  # a name has no space
        t = cfg.timeout_s
        template = None
        if cfg.templated:
            template = UrlTemplate.parse(cfg.url, {n: (p.claim, p.attribute, p.pattern)
                                                   for n, p in cfg.placeholders.items()})
        call = httpx.Timeout(t, connect=t, read=t, write=t, pool=t)
        stream = httpx.Timeout(t, connect=t, read=None, write=t, pool=t)  # a GET stream idles
        return cls(
            name=cfg.name,
            url=httpx.URL("http://per-caller.invalid/" if template else cfg.url),
            static_headers=tuple((k.lower(), v) for k, v in cfg.headers.items()),
            call_timeout=call,
            stream_timeout=stream,
            total_timeout_s=cfg.total_timeout_s,
            era=cfg.era,
            call_timeout_ext=call.as_dict(),
            stream_timeout_ext=stream.as_dict(),
            url_text=cfg.url,
            state_key=key,
            identity=cfg.identity,
            identity_audience=cfg.identity_audience or cfg.url,
            template=template, zones=tuple(cfg.zones), max_resolved=cfg.max_resolved,
            transport=transport, local=cfg.stdio,
        )


def build_transport(*, pinned: bool = False) -> httpx.AsyncBaseTransport:
    """The transport under the shared client, chosen by measurement (bench/README.md).
    `pinned`: connections go only to the addresses the egress check admitted."""
    from proxy.upstream.transport import AiohttpTransport

    return AiohttpTransport(pinned=pinned)


class UpstreamClient:
    """The one AsyncClient every call shares; it lives as long as the app is serving. With
    `destinations`, every upstream request is admitted there first (`proxy.destinations`) and its
    transport dials only the admitted addresses."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None, *,
                 destinations: Destinations | None = None) -> None:
        self._destinations = destinations
        self._given = transport is not None
        self._transport = transport or build_transport(pinned=destinations is not None)
        # One client serves every caller, so it must keep no cookies: an upstream's Set-Cookie
        # for one person's call would otherwise ride along on the next person's call.
        no_cookies = CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))
        # JWKS and webhook calls are not upstream MCP calls: their own pool, plain DNS
        self._service_transport = transport or build_transport(pinned=False)
        self.http = httpx.AsyncClient(transport=self._service_transport, follow_redirects=False,
                                      trust_env=False, cookies=no_cookies)

    async def aclose(self) -> None:
        await self.http.aclose()
        if self._transport is not self._service_transport:
            await self._transport.aclose()

    def pool(self) -> httpx.AsyncBaseTransport | None:
        """A pool of its own for one per-caller upstream (proxy.upstream.tenants); None when
        a transport was given (tests), which every route then shares."""
        if self._given:
            return None
        return build_transport(pinned=self._destinations is not None)

    def connections_in_use(self) -> int:
        """Upstream responses not yet closed (each holds a pooled connection); 0 when idle."""
        return int(getattr(self._transport, "open_responses", 0))

    def headers(self, route: UpstreamRoute, inbound: Mapping[str, str],
                upstream_session_id: str | None, *, get: bool = False, modern: bool = False,
                extra: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = [GET_ACCEPT if get else POST_ACCEPT]
        for name in FORWARDED_REQUEST_HEADERS:
            value = inbound.get(name)
            if value is not None:
                out.append((name, value))
        if modern:  # the mirrored routing headers, Mcp-Param-* untouched
            out.extend((k, v) for k, v in inbound.items()
                       if k in ("mcp-method", "mcp-name") or k.startswith("mcp-param-"))
        out.extend(route.static_headers)
        if extra:
            out.extend(extra)
        if upstream_session_id is not None:
            out.append(("mcp-session-id", upstream_session_id))
        return out

    async def open(self, route: UpstreamRoute, method: str, headers: list[tuple[str, str]],
                   body: bytes | None = None, *, stream_timeout: bool = False) -> UpstreamAnswer:
        """Send and return once the answer's headers are in; the caller reads and closes it.

        The request goes straight to the transport: the client layer's redirect, auth, cookie
        and event-hook machinery has nothing to do for a proxied call and costs measurable
        latency on every one (bench/README.md)."""
        timeout = route.stream_timeout_ext if stream_timeout else route.call_timeout_ext
        if route.local and route.transport is not None:  # a process: nothing to admit or dial
            request = httpx.Request(method, route.url, headers=headers, content=body,
                                    extensions={"timeout": timeout})
            with map_errors():
                return UpstreamAnswer(await route.transport.handle_async_request(request))
        if self._destinations is None:
            extensions: dict[str, Any] = {"timeout": timeout}
        else:  # dial exactly the addresses the egress check admitted: no second resolution
            extensions = {"timeout": timeout,
                          DIAL: await self._destinations.admit(route.dial_key)}
        request = httpx.Request(method, route.url, headers=headers, content=body,
                                extensions=extensions)
        transport = route.transport or self._transport
        with map_errors():
            return UpstreamAnswer(await transport.handle_async_request(request))
