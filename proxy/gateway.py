"""The spine: one MCP request from the edge's plain view of it to the answer, top to bottom.

post(): body (size cap) -> Origin -> media types -> identity -> session -> parse -> policy chain
-> upstream -> answer, and one audit record for every request and every refusal. Nothing here
imports the web framework: the edge hands in an `EdgeRequest` and turns the `EdgeResponse` into
its own response object.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any

import orjson

from policies.egress import caller_address
from proxy import eras, jsonrpc
from proxy.audit import AuditRecord, AuditSink
from proxy.auth import Authenticator, Principal
from proxy.bridge import Bridge
from proxy.chain import CallContext, Chain
from proxy.connect.manager import Connections
from proxy.egress import IPNetwork
from proxy.errors import (
    Cancelled,
    EndpointNotFound,
    GatewayError,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    NotAcceptable,
    OriginNotAllowed,
    SessionNotFound,
    UnsupportedMediaType,
    UnsupportedVersion,
    UpstreamBadGateway,
    UpstreamFailure,
    UpstreamHTTPError,
    UpstreamProtocolError,
    render,
)
from proxy.exchange import EdgeRequest, EdgeResponse
from proxy.jsonrpc import McpMessage
from proxy.legs import Leg, Legs, refusing_input, with_completion
from proxy.relay import StreamRelay
from proxy.state import CallHandle, InFlightRegistry, Session, SessionStore
from proxy.upstream import NO_CALL, UpstreamClient, UpstreamRoute, map_errors, rejection
from proxy.upstream.identity import IdentityForwarder

log = logging.getLogger("tollhouse.gateway")

CLIENT_CANCELLED = "cancelled by the client"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}
JSON_HEADERS = {"Content-Type": "application/json"}


class Gateway(Legs):
    def __init__(self, *, routes: Mapping[str, UpstreamRoute], authenticator: Authenticator,
                 chain: Chain, sessions: SessionStore, inflight: InFlightRegistry,
                 upstream: UpstreamClient, audit: AuditSink, allowed_origins: frozenset[str],
                 identity: IdentityForwarder | None = None,
                 connections: Connections | None = None,
                 trusted_proxies: Sequence[IPNetwork] = ()) -> None:
        self.routes = routes
        self.auth = authenticator
        self.chain = chain
        self.sessions = sessions
        self.inflight = inflight
        self.upstream = upstream
        self.audit = audit
        self.allowed_origins = allowed_origins
        self.identity = identity or IdentityForwarder.none()
        self.connections = connections
        self.bridge = Bridge(upstream)  # reads each route's era live: the API may change it
        self.trusted_proxies = tuple(trusted_proxies)  # parsed once, by create_app
        self._tasks: set[asyncio.Task[None]] = set()

    def route(self, name: str) -> UpstreamRoute:
        route = self.routes.get(name)
        if route is None:
            raise EndpointNotFound()
        return route

    # -- POST: one JSON-RPC message ----------------------------------------------------------

    async def post(self, route: UpstreamRoute, req: EdgeRequest) -> EdgeResponse:
        started = time.perf_counter()
        version = req.headers.get("mcp-protocol-version")
        modern_claim = eras.claims_modern(version)
        # the header's claim until the body says otherwise, so refusals before parsing name it
        record = AuditRecord(endpoint=route.name, era="modern" if modern_claim else "legacy")
        body = b""
        msg: McpMessage | None = None
        try:
            body = await req.read_body()
            record.bytes_in = len(body)
            self._check_origin(req.headers)
            _check_media(req.headers)
            principal = await self.auth.authenticate(req.headers.get("authorization"),
                                                     route.name, self._caller(req))
            record.principal = principal.subject
            session = None
            if not modern_claim:
                session = await self._session(req.headers, route, principal)
            if session is not None:
                record.session_hash = session.id_hash
            try:
                msg = jsonrpc.parse(body)
            except GatewayError:
                eras.check_header(version)  # no envelope to weigh the header against
                raise
            record.method, record.tool = msg.method, msg.tool
            if msg.kind == "request":
                record.request_id = _id_text(msg.id)
            era = record.era = eras.classify(msg, req.headers)
            if era == "modern":
                # a header of neither era is -32022 there, unless an envelope contradicts it
                eras.validate(msg, req.headers, req.duplicated)
                record.client_name = eras.client_name(msg)
            else:
                eras.check_header(version)
            ctx = CallContext(principal, route.name, str(route.url), era=era,
                              session_hash=record.session_hash, arguments_size=len(body),
                              api_key_id=principal.api_key_id, peer_ip=req.peer,
                              headers=req.forwarded)
            if msg.kind != "response":
                await self.chain.run(msg, ctx)
                if ctx.notes:
                    record.call_id = ctx.notes.get("call_id")
                    record.note = ctx.notes.get("metering")
            if msg.kind == "request":
                return await self._call(route, req, msg, session, ctx, record, started)
            if era == "modern" or (session is not None and session.bridged_envelope is not None):
                return await self._modern_notification(route, msg, principal, session)
            return await self._one_way(route, req, msg, session, principal, record, started)
        except GatewayError as exc:
            request_id = msg.id if msg is not None else _late_id(exc, body)
            return self._refuse(exc, record, started, request_id)
        except Exception:
            log.exception("unexpected failure on /mcp/%s", route.name)
            return self._refuse(InternalError(), record, started, msg.id if msg else None)

    async def _call(self, route: UpstreamRoute, req: EdgeRequest, msg: McpMessage,
                    session: Session | None, ctx: CallContext, record: AuditRecord,
                    started: float) -> EdgeResponse:
        principal = ctx.principal
        rewrite = self.chain.rewriter(msg, ctx)
        handle = CallHandle()
        if msg.method != "subscriptions/listen":  # a listen stream lasts as long as the client
            handle.deadline(route.total_timeout_s)
        key = (route.name, principal.key, session.id if session else "", msg.id)
        self.inflight.add(key, handle)
        response = None
        handed_over = False
        leg = Leg([], session.upstream_session_id if session else None,
                  session.protocol_version if session else None)
        try:
            leg = await self._leg(route, req, msg, session, ctx)
            if leg.local is None:
                if leg.bridged:
                    rewrite = with_completion(rewrite, msg.method)
                if leg.to_legacy_client:
                    rewrite = refusing_input(rewrite)
                response = await self.upstream.open(route, "POST", leg.headers,
                                                    leg.body or msg.body)
                if leg.bridged and response.status_code == 404:
                    # the upstream forgot the session the gateway holds for this caller
                    await response.aclose()
                    self.bridge.forget(route, principal.key)
                    leg = await self._leg(route, req, msg, session, ctx)
                    response = await self.upstream.open(route, "POST", leg.headers,
                                                        leg.body or msg.body)
                elif response.status_code == 401 and leg.bearer is not None \
                        and self.connections is not None:
                    # this person's upstream token was refused: refresh once, retry once
                    await response.aclose()
                    response = None
                    fresh = await self.connections.refresh(route.name, principal.key, leg.bearer)
                    leg = await self._leg(route, req, msg, session, ctx, fresh)
                    response = await self.upstream.open(route, "POST", leg.headers,
                                                        leg.body or msg.body)
                elif (msg.method == "initialize" and response.status_code >= 400
                      and await self._modern_only(route)):
                    # a 2026-07-28-only upstream refused a legacy opening: bridge it
                    await response.aclose()
                    response = None
                    leg = await self._leg(route, req, msg, session, ctx)
            if leg.local is not None:
                if rewrite is not None:
                    rewrite(leg.local)
                return await self._answer_here(route, msg, leg.local, ctx, record, started)
            assert response is not None
            await self._check_status(response, session, call_id=msg.id,
                                     modern=ctx.era == "modern")
            out_headers: dict[str, str]
            if msg.method == "initialize":
                session = await self.sessions.create(
                    route.name, principal.key, response.headers.get("mcp-session-id"),
                    _protocol_version(msg))
                record.session_hash = session.id_hash
            ctype = response.headers.get("content-type", "")
            if ctype.startswith("text/event-stream"):
                out_headers = dict(SSE_HEADERS)
                if session is not None:
                    out_headers["Mcp-Session-Id"] = session.id
                relay = StreamRelay(response, request_id=msg.id, handle=handle, record=record,
                                    started=started, spawn=self.spawn, rewrite=rewrite,
                                    refuse_requests=leg.bridged,
                                    on_done=self._relay_done(route, key, leg, msg.id))
                handed_over = True
                return EdgeResponse(200, out_headers, stream=relay)
            if not ctype.startswith("application/json"):
                raise UpstreamProtocolError("upstream sent an unexpected content type")
            with map_errors():
                data = await response.aread()
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                raise UpstreamProtocolError() from None
            outcome = jsonrpc.response_outcome(obj, msg.id)
            if outcome is None:
                raise UpstreamProtocolError()
            if not outcome[0]:
                record.status, record.error_message = "error", outcome[1]
            if leg.bearer is not None and outcome[0] and msg.method == "tools/list" \
                    and self.connections is not None and isinstance(obj.get("result"), dict):
                # the last list this upstream gave, before any per-caller filtering: what a
                # person not yet connected is shown (filtered for them)
                self.connections.last_lists[(route.name, "tools/list")] = copy.deepcopy(
                    obj["result"])
            if outcome[0] and rewrite is not None and isinstance(obj.get("result"), dict) \
                    and rewrite(obj["result"]):
                data = orjson.dumps(obj)
            out_headers = dict(JSON_HEADERS)
            if session is not None:
                out_headers["Mcp-Session-Id"] = session.id
            record.bytes_out = len(data)
            self._emit(record, started)
            return EdgeResponse(200, out_headers, data)
        except asyncio.CancelledError:
            if not handle.absorb():
                record.status, record.error_message = "cancelled", "client disconnected"
                self._emit(record, started)
                self._notify_cancelled(route, leg, msg.id, "client disconnected")
                raise
            if handle.reason != CLIENT_CANCELLED or ctx.era == "modern":
                self._notify_cancelled(route, leg, msg.id, handle.reason or "")
            return self._refuse(Cancelled(handle.reason), record, started, msg.id)
        finally:
            if not handed_over:
                handle.close()
                self.inflight.discard(key, handle)
                if response is not None:
                    await response.aclose()

    def _relay_done(self, route: UpstreamRoute, key: tuple[Any, ...], leg: Leg,
                    request_id: Any) -> Callable[[StreamRelay], Awaitable[None]]:
        async def done(relay: StreamRelay) -> None:
            handle = relay.handle
            if handle is not None:
                handle.close()
                self.inflight.discard(key, handle)
                if handle.reason is not None and (handle.reason != CLIENT_CANCELLED
                                                  or leg.bridged):
                    self._notify_cancelled(route, leg, request_id, handle.reason)
            record = relay.record
            if relay.refused is not None:
                self._notify_cancelled(route, leg, request_id, relay.refused)
            if relay.disconnected and record is not None:
                record.status, record.error_message = "cancelled", "client disconnected"
                self._notify_cancelled(route, leg, request_id, "client disconnected")
            if record is not None:
                self.audit.emit(record)

        return done

    async def _answer_here(self, route: UpstreamRoute, msg: McpMessage, result: dict[str, Any],
                           ctx: CallContext, record: AuditRecord, started: float) -> EdgeResponse:
        """A result the gateway gives itself: discover or initialize built for a bridge."""
        headers = dict(JSON_HEADERS)
        if msg.method == "initialize":
            params = msg.params or {}
            caps = params.get("capabilities")
            info = params.get("clientInfo")
            envelope: dict[str, Any] = {eras.CLIENT_CAPS: caps if isinstance(caps, dict) else {}}
            if isinstance(info, dict) and isinstance(info.get("name"), str) \
                    and isinstance(info.get("version"), str):
                envelope[eras.CLIENT_INFO] = {"name": info["name"], "version": info["version"]}
            session = await self.sessions.create(route.name, ctx.principal.key, None,
                                                 result.get("protocolVersion"), envelope)
            record.session_hash = session.id_hash
            headers["Mcp-Session-Id"] = session.id
        data = orjson.dumps({"jsonrpc": "2.0", "id": msg.id, "result": result})
        record.bytes_out = len(data)
        self._emit(record, started)
        return EdgeResponse(200, headers, data)

    async def _one_way(self, route: UpstreamRoute, req: EdgeRequest, msg: McpMessage,
                       session: Session | None, principal: Principal, record: AuditRecord,
                       started: float) -> EdgeResponse:
        """A notification or a response to a server-to-client request: forwarded, 202."""
        target_id = msg.params.get("requestId") if msg.params is not None else None
        if msg.method == "notifications/cancelled" and isinstance(target_id, (str, int)):
            target = (route.name, principal.key, session.id if session else "", target_id)
            await self.inflight.cancel(target, CLIENT_CANCELLED)
        headers = self.upstream.headers(
            route, req.headers, session.upstream_session_id if session else None)
        try:
            response = await self.upstream.open(route, "POST", headers, msg.body)
            try:
                await self._check_status(response, session)
            finally:
                await response.aclose()
        except UpstreamFailure as exc:  # no call to answer: 502, no id (2025-11-25 transport)
            raise UpstreamBadGateway(exc.wire_message) from None
        return EdgeResponse(202, {"Mcp-Session-Id": session.id} if session else {})

    async def _check_status(self, response: Any, session: Session | None, *,
                            call_id: Any = NO_CALL, modern: bool = False) -> None:
        """Return for a 2xx. An upstream's own JSON-RPC error is relayed (for a call: only
        one for this call's id, which the upstream's 'session not found' never is); a 404 on
        the upstream session ends the gateway's session; anything else is an upstream failure."""
        status = response.status_code
        if status < 300:
            return
        try:
            if call_id is NO_CALL and status == 404 and session is not None \
                    and session.upstream_session_id is not None:
                rejected = None
            else:
                rejected = await rejection(response, call_id=call_id, modern=modern)
        finally:
            await response.aclose()
        if rejected is not None:
            raise rejected
        if status == 404 and session is not None and session.upstream_session_id is not None:
            await self.sessions.delete(session.id)
            raise SessionNotFound()
        raise UpstreamHTTPError(status)

    # -- GET: the server-to-client stream; DELETE: end the session ---------------------------

    async def get(self, route: UpstreamRoute, req: EdgeRequest) -> EdgeResponse:
        """The server-to-client stream, relayed. Audited once, when it opens or is refused;
        an upstream failure is 502 with no upstream status, body or headers."""
        started = time.perf_counter()
        record = AuditRecord(endpoint=route.name, method="GET")
        try:
            session = await self._guard_bodyless(route, req, record)
            if session is not None and session.bridged_envelope is not None:
                # a 2026-07-28 upstream has no server-to-client stream to offer
                record.note = "no GET stream on a 2026-07-28 upstream"
                self._emit(record, started)
                return EdgeResponse(405, {"Allow": "POST, DELETE"})
            headers = self.upstream.headers(
                route, req.headers, session.upstream_session_id if session else None, get=True)
            try:
                response = await self.upstream.open(route, "GET", headers, stream_timeout=True)
            except UpstreamFailure as exc:
                raise UpstreamBadGateway(exc.wire_message) from None
            status = response.status_code
            if status >= 300:
                try:
                    gone = status == 404 and session is not None \
                        and session.upstream_session_id is not None
                    # an upstream's JSON-RPC error is the client's mistake: it keeps its 4xx
                    rejected = None if gone or status == 405 else await rejection(response)
                finally:
                    await response.aclose()
                if rejected is not None:
                    raise rejected
                if status == 404 and session and session.upstream_session_id:
                    await self.sessions.delete(session.id)
                    raise SessionNotFound()
                if status == 405:  # the upstream offers no GET stream: the spec's own answer
                    record.note = "upstream offers no GET stream"
                    self._emit(record, started)
                    return EdgeResponse(405, _allow(response))
                raise UpstreamBadGateway(f"upstream answered HTTP {status}")
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                await response.aclose()
                raise UpstreamBadGateway("upstream GET stream is not text/event-stream")
            out = dict(SSE_HEADERS)
            if session is not None:
                out["Mcp-Session-Id"] = session.id
            self._emit(record, started)
            return EdgeResponse(200, out, stream=StreamRelay(response, spawn=self.spawn))
        except GatewayError as exc:
            return self._refuse(exc, record, started, None)
        except Exception:
            log.exception("unexpected failure on GET /mcp/%s", route.name)
            return self._refuse(InternalError(), record, started, None)

    async def delete(self, route: UpstreamRoute, req: EdgeRequest) -> EdgeResponse:
        """End a session here and upstream. Audited once; an upstream failure is 502 and
        leaves the session as it was."""
        started = time.perf_counter()
        record = AuditRecord(endpoint=route.name, method="DELETE")
        try:
            session = await self._guard_bodyless(route, req, record)
            if session is None:
                raise InvalidRequest("Invalid Request: Mcp-Session-Id header required")
            if session.upstream_session_id is not None:
                headers = self.upstream.headers(route, req.headers, session.upstream_session_id)
                try:
                    response = await self.upstream.open(route, "DELETE", headers)
                    try:
                        rejected = None if response.status_code in (404, 405) \
                            else await rejection(response)
                    finally:
                        await response.aclose()
                except UpstreamFailure as exc:
                    raise UpstreamBadGateway(exc.wire_message) from None
                if rejected is not None:
                    raise rejected
                if response.status_code == 405:
                    record.note = "upstream does not let clients end sessions"
                    self._emit(record, started)
                    return EdgeResponse(405, _allow(response))
                if response.status_code >= 300 and response.status_code != 404:
                    raise UpstreamBadGateway(f"upstream answered HTTP {response.status_code}")
            await self.sessions.delete(session.id)
            self._emit(record, started)
            return EdgeResponse(200)
        except GatewayError as exc:
            return self._refuse(exc, record, started, None)
        except Exception:
            log.exception("unexpected failure on DELETE /mcp/%s", route.name)
            return self._refuse(InternalError(), record, started, None)

    async def _guard_bodyless(self, route: UpstreamRoute, req: EdgeRequest,
                              record: AuditRecord) -> Session | None:
        """GET and DELETE: Origin, identity and session, as for a POST. Neither exists in the
        2026-07-28 era: one that claims it is 405."""
        self._check_origin(req.headers)
        version = req.headers.get("mcp-protocol-version")
        if version in eras.MODERN_VERSIONS:
            record.era = "modern"
            raise MethodNotAllowed(headers={"Allow": "POST"})
        principal = await self.auth.authenticate(req.headers.get("authorization"), route.name,
                                                 self._caller(req))
        record.principal = principal.subject
        eras.check_header(version)
        session = await self._session(req.headers, route, principal)
        if session is not None:
            record.session_hash = session.id_hash
        return session

    # -- shared steps ------------------------------------------------------------------------

    def _caller(self, req: EdgeRequest) -> str | None:
        """The address auth-failure lockouts key on: the socket peer, or, when the peer is a
        trusted proxy, the client address it wrote in X-Forwarded-For (read as the egress
        policy reads it), so one caller behind the proxy cannot lock out everyone behind it.
        The peer when the caller cannot be told (a proxy that sent only `Forwarded`)."""
        if not self.trusted_proxies or not req.forwarded:
            return req.peer
        xff = ",".join(v for k, v in req.forwarded if k == "x-forwarded-for") or None
        forwarded = next((v for k, v in req.forwarded if k == "forwarded"), None)
        address = caller_address(req.peer, xff, self.trusted_proxies, forwarded=forwarded)
        return str(address) if address is not None else req.peer

    def _check_origin(self, headers: Mapping[str, str]) -> None:
        origin = headers.get("origin")
        if origin is not None and origin.rstrip("/").lower() not in self.allowed_origins:
            raise OriginNotAllowed()

    async def _session(self, headers: Mapping[str, str], route: UpstreamRoute,
                       principal: Principal) -> Session | None:
        session_id = headers.get("mcp-session-id")
        if session_id is None:
            return None
        session = await self.sessions.get(session_id)
        if (session is None or session.endpoint != route.name
                or session.principal_key != principal.key):
            raise SessionNotFound()
        return session

    def _refuse(self, exc: GatewayError, record: AuditRecord, started: float, request_id: Any,
                *, audit: bool = True) -> EdgeResponse:
        record.status = exc.audit_status
        if exc.data and isinstance(exc.data.get("audit"), dict):  # an egress denial's object
            record.egress = exc.data["audit"]
        if exc.audit_status == "denied":
            record.denied_reason = exc.audit_reason
        else:
            record.error_message = exc.audit_reason
        status, headers, body = render(exc, request_id)
        record.bytes_out = len(body)
        if audit and not isinstance(exc, EndpointNotFound):
            self._emit(record, started)
        return EdgeResponse(status, headers, body)

    def _emit(self, record: AuditRecord, started: float) -> None:
        if started:
            record.duration_ms = (time.perf_counter() - started) * 1000
        self.audit.emit(record)

    def _notify_cancelled(self, route: UpstreamRoute, leg: Leg, request_id: Any,
                          reason: str) -> None:
        """Tell a legacy upstream a call is over (seed 004: a disconnect is a cancellation).
        A 2026-07-28 upstream learns it from the closed request alone."""
        if not leg.notify:
            return
        body = orjson.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                             "params": {"requestId": request_id, "reason": reason}})
        headers = self.upstream.headers(route, {"content-type": "application/json"},
                                        leg.upstream_session_id)
        if leg.protocol_version:
            headers.append(("mcp-protocol-version", leg.protocol_version))

        async def send() -> None:
            try:
                response = await self.upstream.open(route, "POST", headers, body)
                await response.aclose()
            except GatewayError as exc:
                log.info("could not tell %s about a cancelled call: %s", route.name, exc)

        self.spawn(send())

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout: float) -> None:
        """At shutdown: let background work (cancel notices, stream clean-up) finish."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)


def _check_media(headers: Mapping[str, str]) -> None:
    ctype = headers.get("content-type", "")
    # the media type exactly (application/jsonx is not JSON), parameters such as charset allowed
    if ctype != "application/json" and \
            ctype.partition(";")[0].strip().lower() != "application/json":
        raise UnsupportedMediaType()
    accept = headers.get("accept")
    if accept is None:
        return
    accept = accept.lower()
    if "*/*" in accept:
        return
    if "application/json" not in accept or "text/event-stream" not in accept:
        raise NotAcceptable()


def _protocol_version(msg: McpMessage) -> str | None:
    version = (msg.params or {}).get("protocolVersion")
    return version if isinstance(version, str) else None


def _allow(response: Any) -> dict[str, str]:
    allow = response.headers.get("allow")
    return {"Allow": allow} if allow else {}


def _id_text(request_id: Any) -> str:
    return request_id if isinstance(request_id, str) else orjson.dumps(request_id).decode()


def _late_id(exc: GatewayError, body: bytes) -> Any:
    """Errors raised before parsing answer id null (seed 004); later ones echo the id, and
    so does an unsupported MCP-Protocol-Version, checked before parsing but about the body."""
    if isinstance(exc, (InvalidRequest, UnsupportedVersion)) and body:
        return jsonrpc.request_id_of(body)
    return None
