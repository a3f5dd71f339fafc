"""What the gateway knows about each upstream's era, and the legacy sessions it holds so that a
2026-07-28 (sessionless) client can reach a 2025-11-25 upstream.

Each upstream's era is learned on first contact (a `server/discover` probe; anything but a
2026-07-28 DiscoverResult means legacy) and kept in the bridge store (proxy/state/learned.py),
so every replica that shares the store learns it once. For a modern caller on a legacy
upstream the gateway opens an upstream session per (endpoint, principal) on demand, never
shared between principals, holds it in the same store, and re-opens it when the upstream
forgets it.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import re
from typing import Any

import orjson

from proxy import __version__
from proxy.errors import (
    GatewayError,
    UpstreamBadGateway,
    UpstreamFailure,
    UpstreamProtocolError,
)
from proxy.jsonrpc import McpMessage
from proxy.mcp import eras
from proxy.mcp.sse import EventSplitter, event_data
from proxy.singleflight import SingleFlight
from proxy.state.learned import BridgeStore, HeldSession, Learned
from proxy.upstream import UpstreamAnswer, UpstreamClient, UpstreamRoute

log = logging.getLogger("tollhouse.bridge")

LEGACY_VERSION = "2025-11-25"
CLIENT_INFO = {"name": "tollhouse", "version": __version__}
JSON_TYPES = ("content-type", "application/json")


class Bridge:
    """The era of a route is read from the route itself on every call (`era` in its config
    or its API record: a change through /api/v1 applies on the next call); for `auto`, what
    the store learned about that name at that URL (`UpstreamRoute.state_key`)."""

    def __init__(self, upstream: UpstreamClient, store: BridgeStore) -> None:
        self._upstream = upstream
        self._store = store
        self._probes: SingleFlight[str, Learned] = SingleFlight()
        self._opening: SingleFlight[tuple[str, str], HeldSession] = SingleFlight()

    async def era(self, route: UpstreamRoute) -> eras.Era:
        if route.era == "legacy":
            return "legacy"
        if route.era == "modern":
            return "modern"
        learned = await self._store.learned(route.state_key)
        if learned is None:
            learned = await self._probes.run(route.state_key, lambda: self._learn(route))
        return learned.era

    async def modern_only(self, route: UpstreamRoute) -> bool:
        """An upstream that speaks only 2026-07-28: configured so, or learned when it refused
        a legacy initialize after answering server/discover."""
        if route.era == "legacy" or route.era == "modern":
            return route.era == "modern"
        learned = await self._store.learned(route.state_key)
        return learned is not None and learned.modern_only

    async def mark_modern_only(self, route: UpstreamRoute) -> None:
        learned = await self._store.learned(route.state_key) or Learned("modern")
        await self._store.learn(route.state_key,
                                dataclasses.replace(learned, era="modern", modern_only=True))

    async def discover(self, route: UpstreamRoute) -> dict[str, Any]:
        """The upstream's DiscoverResult (probed once and kept)."""
        learned = await self._store.learned(route.state_key)
        if learned is None or learned.discover is None:
            learned = await self._probes.run(route.state_key, lambda: self._learn(route))
        if learned.discover is None:
            raise UpstreamProtocolError("upstream answered no server/discover")
        return learned.discover

    async def _learn(self, route: UpstreamRoute) -> Learned:
        learned = await self._probe(route)  # a failed probe is retried on the next call
        await self._store.learn(route.state_key, learned)
        log.info("upstream %s speaks the %s era", route.name, learned.era)
        return learned

    async def _probe(self, route: UpstreamRoute) -> Learned:
        body = orjson.dumps({"jsonrpc": "2.0", "id": "tollhouse-discover",
                             "method": "server/discover", "params": {"_meta": {
                                 eras.PV: eras.MODERN_VERSIONS[0], eras.CLIENT_CAPS: {},
                                 eras.CLIENT_INFO: CLIENT_INFO}}})
        headers = self._upstream.headers(route, {}, None, extra=[
            JSON_TYPES, ("mcp-protocol-version", eras.MODERN_VERSIONS[0]),
            ("mcp-method", "server/discover")])
        obj = await self._exchange(route, headers, body, "tollhouse-discover", check=False)
        result = obj.get("result") if obj else None
        versions = result.get("supportedVersions") if isinstance(result, dict) else None
        if isinstance(versions, list) and eras.MODERN_VERSIONS[0] in versions:
            assert isinstance(result, dict)
            return Learned("modern", discover=result)
        return Learned("legacy")

    async def session(self, route: UpstreamRoute, principal_key: str,
                      extra: list[tuple[str, str]] | None) -> HeldSession:
        """The upstream session held for this principal at this upstream (its id None when
        the upstream is stateless), opening one if there is none."""
        held = await self._store.session(route.state_key, principal_key)
        if held is not None:
            return held

        async def open_and_hold() -> HeldSession:
            opened = await self._open(route, extra)
            await self._store.hold(route.state_key, principal_key, opened)
            return opened

        return await self._opening.run((route.state_key, principal_key), open_and_hold)

    async def forget(self, route: UpstreamRoute, principal_key: str) -> None:
        await self._store.forget(route.state_key, principal_key)

    async def answer(self, route: UpstreamRoute, principal_key: str, body: bytes,
                     extra: list[tuple[str, str]]) -> int | None:
        """A client's answer sent on, on the session held for the principal: the upstream's
        status, or None when no session is held. An upstream failure is 502."""
        held = await self._store.session(route.state_key, principal_key)
        if held is None:
            return None
        headers = self._upstream.headers(route, {}, held.upstream_session_id, extra=[
            JSON_TYPES, *extra, ("mcp-protocol-version", LEGACY_VERSION)])
        try:
            response = await self._upstream.open(route, "POST", headers, body)
            await response.aclose()
        except UpstreamFailure as exc:
            raise UpstreamBadGateway(exc.wire_message) from None
        return int(response.status_code)

    async def listen(self, route: UpstreamRoute, principal_key: str,
                     extra: list[tuple[str, str]] | None) -> UpstreamAnswer | None:
        """The GET stream on the session held for the principal (opened now if none is), an
        answer still open; None when the upstream is stateless."""
        held = await self.session(route, principal_key, extra)
        if held.upstream_session_id is None:
            return None
        headers = self._upstream.headers(route, {}, held.upstream_session_id, get=True, extra=[
            *(extra or []), ("mcp-protocol-version", LEGACY_VERSION)])
        return await self._upstream.open(route, "GET", headers, stream_timeout=True)

    async def end(self, route: UpstreamRoute, principal_key: str) -> None:
        """Forget the session held for the principal, and DELETE it upstream."""
        held = await self._store.session(route.state_key, principal_key)
        if held is None:
            return
        await self._store.forget(route.state_key, principal_key)
        if held.upstream_session_id is not None:
            headers = self._upstream.headers(route, {"mcp-protocol-version": LEGACY_VERSION},
                                             held.upstream_session_id)
            response = await self._upstream.open(route, "DELETE", headers)
            await response.aclose()

    async def _open(self, route: UpstreamRoute, extra: list[tuple[str, str]] | None
                    ) -> HeldSession:
        body = orjson.dumps({"jsonrpc": "2.0", "id": "tollhouse-bridge", "method": "initialize",
                             "params": {"protocolVersion": LEGACY_VERSION,
                                        "capabilities": route.client_capabilities or {},
                                        "clientInfo": CLIENT_INFO}})
        headers = self._upstream.headers(route, {}, None, extra=[JSON_TYPES, *(extra or [])])
        response = await self._upstream.open(route, "POST", headers, body)
        session_id = response.headers.get("mcp-session-id")
        obj = await self._read(response, "tollhouse-bridge")
        result = obj.get("result")
        if not isinstance(result, dict):
            raise UpstreamProtocolError("upstream refused to open a session")
        version = result.get("protocolVersion")
        note = orjson.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
        headers = self._upstream.headers(route, {}, session_id, extra=[
            JSON_TYPES, ("mcp-protocol-version", str(version or LEGACY_VERSION)),
            *(extra or [])])
        done = await self._upstream.open(route, "POST", headers, note)
        await done.aclose()
        return HeldSession(session_id, result)

    async def _exchange(self, route: UpstreamRoute, headers: list[tuple[str, str]], body: bytes,
                        request_id: str, *, check: bool = True) -> dict[str, Any] | None:
        response = await self._upstream.open(route, "POST", headers, body)
        if response.status_code >= 300 and not check:
            await response.aclose()
            return None
        try:
            return await self._read(response, request_id)
        except GatewayError:
            if check:
                raise
            return None

    async def _read(self, response: UpstreamAnswer, request_id: str) -> dict[str, Any]:
        """The JSON-RPC response to `request_id` from a JSON or SSE answer."""
        try:
            data = await response.aread()
        finally:
            await response.aclose()
        if response.status_code >= 300:
            raise UpstreamProtocolError(f"upstream answered HTTP {response.status_code}")
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            for event in EventSplitter().feed(data + b"\n\n"):
                obj = _loads(event_data(event))
                if isinstance(obj, dict) and obj.get("id") == request_id:
                    return obj
            raise UpstreamProtocolError()
        obj = _loads(data)
        if not isinstance(obj, dict):
            raise UpstreamProtocolError()
        return obj


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data) if data else None
    except orjson.JSONDecodeError:
        return None


def envelope_for(session_envelope: dict[str, Any]) -> dict[str, Any]:
    return {eras.PV: eras.MODERN_VERSIONS[0], **session_envelope}


def initialize_from_discover(discover: dict[str, Any], requested: Any,
                             endpoint: str) -> dict[str, Any]:
    """The gateway's own answer to a legacy `initialize` for a 2026-07-28-only upstream."""
    caps = {k: v for k, v in (discover.get("capabilities") or {}).items() if k != "extensions"}
    for key in ("prompts", "resources", "tools"):
        if isinstance(caps.get(key), dict):  # no listen stream is bridged onto the session
            caps[key] = {k: v for k, v in caps[key].items()
                         if k not in ("listChanged", "subscribe")}
    meta = discover.get("_meta")
    info = meta.get(eras.SERVER_INFO) if isinstance(meta, dict) else None
    if not isinstance(info, dict):
        info = {"name": endpoint, "version": ""}
    version = requested if requested in eras.LEGACY_VERSIONS else LEGACY_VERSION
    out: dict[str, Any] = {"protocolVersion": version, "capabilities": caps, "serverInfo": info}
    if isinstance(discover.get("instructions"), str):
        out["instructions"] = discover["instructions"]
    return out


def with_envelope(msg_body: bytes, envelope: dict[str, Any]) -> bytes:
    """A legacy client's request as a 2026-07-28 upstream requires it: the envelope added."""
    obj = orjson.loads(msg_body)
    params = obj.get("params")
    if not isinstance(params, dict):
        params = obj["params"] = {}
    meta = params.get("_meta")
    params["_meta"] = {**(meta if isinstance(meta, dict) else {}), **envelope}
    return orjson.dumps(obj)


ENVELOPE_PREFIX = "io.modelcontextprotocol/"


def without_envelope(msg: McpMessage) -> bytes | None:
    """A 2026-07-28 request as a legacy upstream takes it: the envelope's
    `io.modelcontextprotocol/*` keys out of `params._meta`, every other `_meta` key (a
    progressToken, a vendor's own) kept. None when there is nothing to take out."""
    params = msg.params
    meta = params.get("_meta") if params is not None else None
    if not isinstance(meta, dict) or not any(k.startswith(ENVELOPE_PREFIX) for k in meta):
        return None
    assert params is not None
    kept = {k: v for k, v in meta.items() if not k.startswith(ENVELOPE_PREFIX)}
    out = {k: v for k, v in params.items() if k != "_meta"}
    if kept:
        out["_meta"] = kept
    return orjson.dumps({"jsonrpc": "2.0", "id": msg.id, "method": msg.method, "params": out})


def encode_header(value: str) -> str:
    """The `=?base64?...?=` form for a value that is not plain visible ASCII."""
    if re.fullmatch(r"[\x20-\x7E]*", value) and value == value.strip() \
            and not (value.startswith("=?base64?") and value.endswith("?=")):
        return value
    return "=?base64?" + base64.b64encode(value.encode()).decode() + "?="


def refuse_input_required(result: dict[str, Any]) -> bool:
    if result.get("resultType") == "input_required":
        raise UpstreamFailure("upstream asked for input, which this 2025-11-25 client cannot "
                              "give through the gateway")
    return False


def complete(result: dict[str, Any], method: str | None) -> bool:
    """A legacy result as a 2026-07-28 client expects it; the relay's rewrite hook."""
    result.setdefault("resultType", "complete")
    if method in eras.CACHEABLE:
        result.setdefault("ttlMs", 0)
        result.setdefault("cacheScope", "private")
    return True
