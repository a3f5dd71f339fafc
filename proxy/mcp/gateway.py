"""The spine: one MCP request from the edge's plain view of it to the answer, top to bottom.

post(): body (size cap) -> Origin -> media types -> identity -> session -> parse -> era checks
-> the policy chain, once per target (the route's `Forwarding`: proxy/mcp/forwarding.py) -> a
request's forwarding and answer (`Calls`, proxy/mcp/call.py), a notification's one-way send;
one audit record for every request and every refusal, owned by its `Exchange`. get() and
delete() take the same guards (a GET's stream is relayed by `Listening`, proxy/mcp/listening.py).
Nothing here imports the web framework or the HTTP client: the edge hands in an `EdgeRequest`
and turns the `EdgeResponse` into its own response object.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from functools import partial
from typing import Any

from proxy.audit import AuditRecord, AuditSink
from proxy.auth.authenticator import Authenticator
from proxy.auth.principal import Principal
from proxy.chain import CallContext, Chain
from proxy.connect.manager import Connections
from proxy.destinations import IPNetwork
from proxy.errors import (
    Draining,
    EndpointNotFound,
    GatewayError,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    SessionNotFound,
)
from proxy.jsonrpc import McpMessage
from proxy.mcp import eras, guards, tasks
from proxy.mcp.call import Calls
from proxy.mcp.exchange import EdgeRequest, EdgeResponse, Exchange
from proxy.mcp.forward import Forwarder
from proxy.mcp.forwarding import Forwarding, Route, Routed
from proxy.mcp.listening import Listening
from proxy.mcp.resume import Resumption
from proxy.mcp.tasks import Tasks
from proxy.observability import Observer, Observers
from proxy.observability.logs import trace_id
from proxy.snapshot import Live
from proxy.state import InFlightRegistry, Session, SessionStore
from proxy.state.inflight import EndReason, Later, call_key
from proxy.state.learned import BridgeStore
from proxy.state.resumable import ResumableStore
from proxy.state.sessions import Fetched
from proxy.state.tasks import MemoryTaskStore, TaskStore
from proxy.upstream import UpstreamClient, UpstreamRoute
from proxy.upstream.identity import IdentityForwarder
from proxy.upstream.tenants import Tenants
from proxy.virtual import VirtualForwarder, VirtualRoute
from proxy.virtual.meta_tools import unwrapped

log = logging.getLogger("tollhouse.gateway")

Bodyless = Callable[[Routed, EdgeRequest, "Session | None", Exchange, Principal],
                    Awaitable[EdgeResponse]]


class Gateway:
    def __init__(self, *, routes: Mapping[str, UpstreamRoute], authenticator: Authenticator,
                 live: Live, sessions: SessionStore, inflight: InFlightRegistry,
                 upstream: UpstreamClient, audit: AuditSink, allowed_origins: frozenset[str],
                 identity: IdentityForwarder, bridged: BridgeStore,
                 connections: Connections | None = None,
                 trusted_proxies: tuple[IPNetwork, ...] = (), later: Later | None = None,
                 observer: Observer | None = None,
                 session_ended: Callable[[str, float], None] | None = None,
                 tenants: Tenants | None = None,
                 endpoints: Mapping[str, VirtualRoute] | None = None,
                 cursor_key: bytes = b"",
                 max_response_bytes: int = 16 * 1024 * 1024,
                 resumable: ResumableStore | None = None,
                 tasks: TaskStore | None = None) -> None:
        self.routes = routes  # live: the registry changes it, each call reads it
        self.endpoints = {} if endpoints is None else endpoints  # proxy/virtual: live too
        self.auth = authenticator
        self.live = live  # swapped whole by a reload; a call reads it once, as it starts
        self.draining = False  # SIGTERM: new sessions, calls and GET streams answer 503
        self.sessions = sessions
        self.inflight = inflight
        self.upstream = upstream
        self.audit = audit
        self.allowed_origins = allowed_origins
        self.trusted_proxies = trusted_proxies  # parsed once, by create_app
        self.forward = Forwarder(upstream, sessions, bridged, identity=identity,
                                 connections=connections, spawn=self.spawn,
                                 max_response_bytes=max_response_bytes)
        self.virtual = VirtualForwarder(self.forward, routes, cursor_key, max_response_bytes)
        # a kind of upstream of its own (proxy.mcp.forwarding), by endpoint name: looked up
        # before the upstreams and the virtual endpoints
        self.mounts: dict[str, Routed] = {}
        self._routed: dict[str, Routed] = {}  # each endpoint's pair, made once per route
        # metrics, the request log (and a tracer): told when each message begins and ends
        self.observer: Observer = observer or Observers()
        self._session_ended = session_ended  # (endpoint, created_at) of a session DELETEd
        self._tasks: set[asyncio.Task[None]] = set()
        # per-caller upstreams; create_app gives one with the egress check and pools
        self.tenants = tenants or Tenants(None, lambda: None, self.spawn)
        # an answer that reaches the client on a resumed stream, recorded: proxy/mcp/resume.py
        self.resumption = None if resumable is None else Resumption(resumable, audit)
        self.listening = Listening(spawn=self.spawn, resumption=self.resumption,  # GET streams
                                   max_response_bytes=max_response_bytes,
                                   draining=lambda: self.draining)
        # MCP tasks: each bound to its caller, decided by its tool (proxy/mcp/tasks.py)
        self.tasks = Tasks(tasks or MemoryTaskStore(), audit, self.spawn)
        self.calls = Calls(inflight=inflight, sessions=sessions, forward=self.forward,
                           observer=self.observer, later=later, spawn=self.spawn,
                           max_response_bytes=max_response_bytes, resumption=self.resumption,
                           tasks=self.tasks)

    @property
    def chain(self) -> Chain:
        return self.live.chain

    def route(self, name: str) -> Routed:
        """The endpoint's route and the forwarding of its kind, chosen once per request."""
        mounted = self.mounts.get(name)
        if mounted is not None:
            return mounted
        route: Any = self.routes.get(name)
        forwarding: Forwarding = self.forward
        if route is None:
            route, forwarding = self.endpoints.get(name), self.virtual
            if route is None:
                raise EndpointNotFound()
        routed = self._routed.get(name)  # the same pair as last time, unless the route changed
        if routed is None or routed.route is not route:
            if len(self._routed) >= 4096:
                self._routed.clear()
            routed = self._routed[name] = Routed(route, forwarding)
        return routed

    def mount(self, name: str, route: Route, forwarding: Forwarding) -> None:
        """Serve `name` with a forwarding of its own (a new kind of upstream): the spine does
        not change for it."""
        self.mounts[name] = Routed(route, forwarding)

    # -- POST: one JSON-RPC message ----------------------------------------------------------

    async def post(self, routed: Routed, req: EdgeRequest) -> EdgeResponse:
        chain = self.live.chain  # this call's rules, whatever a reload does meanwhile
        version = req.headers.get("mcp-protocol-version")
        modern_claim = eras.claims_modern(version)
        # the header's claim until the body says otherwise, so refusals before parsing name it
        exchange = self._begin(routed, req, era="modern" if modern_claim else "legacy")
        record = exchange.record
        body = b""
        msg: McpMessage | None = None
        # a legacy caller's session is asked for now, read once the caller is known: a shared
        # store's round trip runs meanwhile (the read checks endpoint and principal)
        session_id = None if modern_claim else req.headers.get("mcp-session-id")
        fetched = None if session_id is None else self.sessions.fetch(session_id)
        try:
            body = await req.read_body()
            record.bytes_in = len(body)
            guards.check_origin(req.headers, self.allowed_origins)
            guards.check_media(req.headers)
            caller = guards.caller(req, self.trusted_proxies)
            principal = await self.auth.authenticate(req.headers.get("authorization"),
                                                     routed.name, caller)
            record.principal, record.actor = principal.subject, principal.actor or None
            routed = await self._resolve(routed, principal, record)
            route = routed.route
            session = None if fetched is None else await self._session(fetched, route,
                                                                       principal)
            if session is not None:
                record.session_hash = session.id_hash
            msg = guards.parse(body, version)
            self._settle(exchange, msg, req)
            msg = unwrapped(route, msg, record)  # tool search's call_tool: the tool it names
            ctx = CallContext(principal, route.name, route.url_text, era=record.era,
                              session_hash=record.session_hash, arguments_size=len(body),
                              api_key_id=principal.api_key_id, peer_ip=req.peer,
                              headers=req.forwarded, dial_key=route.dial_key)
            if tasks.concerned(msg):  # a task's request, or a task-run call: checked first
                msg = ctx.message = await self.tasks.admit(route.name, msg, ctx, exchange, session)
            if msg.kind == "request":  # the chain, once per target, then the call
                return await self.calls.checked(routed, req.headers, msg, session, ctx,
                                                exchange, chain)
            if msg.kind != "response":  # a notification: the chain (a virtual: the member's)
                ctx = await routed.forwarding.check(route, chain, msg, ctx)
                msg = ctx.message or msg  # a guardrail redacted its arguments
            answer = await self._one_way(routed, req, msg, session, ctx)
            record.http_status = answer.status
            exchange.done()  # a notification or a response is not audited
            return answer
        except asyncio.CancelledError:
            if record.status != "cancelled":  # gone before the call (which audits its own)
                exchange.disconnected()
            raise
        except GatewayError as exc:
            request_id = msg.id if msg is not None else guards.late_id(exc, body)
            return await exchange.refuse(exc, request_id)
        except Exception:
            log.exception("unexpected failure on /mcp/%s", routed.name)
            return await exchange.refuse(InternalError(), msg.id if msg else None)
        finally:
            if fetched is not None:
                fetched.drop()  # unread when the request failed first

    def _begin(self, routed: Routed, req: EdgeRequest, *, era: str = "legacy",
               method: str | None = None) -> Exchange:
        """The message's exchange, its record named by the trace the request came with."""
        record = AuditRecord(endpoint=routed.name, method=method, era=era)
        traceparent = req.headers.get("traceparent")
        if traceparent is not None:
            record.trace_id = trace_id(traceparent)
        return Exchange(record, self.audit, self.observer)

    def _settle(self, exchange: Exchange, msg: McpMessage, req: EdgeRequest) -> None:
        """The parsed message's facts on its record and the observers told (`Exchange.parsed`);
        then a request refused while draining, and the era settled (its 2026-07-28 checks)."""
        exchange.parsed(msg, req.headers, req.peer)
        record = exchange.record
        if self.draining and msg.kind == "request":  # notifications, answers still pass
            raise Draining()
        record.era = eras.settle(msg, req.headers, req.duplicated)
        if record.era == "modern":
            record.client_name = eras.client_name(msg)

    async def _one_way(self, routed: Routed, req: EdgeRequest, msg: McpMessage,
                       session: Session | None, ctx: CallContext) -> EdgeResponse:
        """A notification or a response to a server-to-client request: 202. A cancel naming
        one of this caller's calls in flight ends it; the forwarding sends on what its
        upstream needs."""
        target = msg.params.get("requestId") if msg.params is not None else None
        if msg.method == "notifications/cancelled" and isinstance(target, (str, int)):
            await self.inflight.cancel(call_key(routed.name, ctx.principal.key,
                                                session.id if session else "", target),
                                       EndReason.CANCELLED)
        approvals = self.calls.approvals  # an answer to its own "self" confirmation
        if msg.kind != "response" or approvals is None or not await approvals.answered(
                msg, ctx.principal):
            await routed.forwarding.one_way(routed.route, req.headers, msg, session, ctx)
        return EdgeResponse(202, {"Mcp-Session-Id": session.id} if session is not None else {})

    # -- GET: the server-to-client stream; DELETE: end the session ---------------------------

    async def get(self, routed: Routed, req: EdgeRequest) -> EdgeResponse:
        """The server-to-client stream, relayed. Audited once, when it opens or is refused;
        an upstream failure is 502 with no upstream status, body or headers."""
        chain = self.live.chain  # the rules a call's answer replayed on it is held to
        return await self._bodyless(routed, req, "GET", partial(self.listening.open,
                                                                chain=chain, tasks=self.tasks))

    async def delete(self, routed: Routed, req: EdgeRequest) -> EdgeResponse:
        """End a session here and upstream. Audited once; an upstream failure is 502 and
        leaves the session as it was."""
        return await self._bodyless(routed, req, "DELETE", self._end)

    async def _end(self, routed: Routed, req: EdgeRequest, session: Session | None,
                   exchange: Exchange, principal: Principal) -> EdgeResponse:
        if session is None:
            raise InvalidRequest("Invalid Request: Mcp-Session-Id header required")
        refused = await routed.forwarding.end(routed.route, req.headers, session)
        if refused is not None:
            exchange.noted("upstream does not let clients end sessions")
            return EdgeResponse(405, refused)
        await self.sessions.delete(session.id)
        if self._session_ended is not None:
            self._session_ended(routed.name, session.created_at)
        return EdgeResponse(200)

    async def _bodyless(self, routed: Routed, req: EdgeRequest, method: str,
                        step: Bodyless) -> EdgeResponse:
        """GET and DELETE: Origin, identity and session, as for a POST, then `step`; one audit
        record either way. Neither exists in the 2026-07-28 era: one that claims it is 405."""
        exchange = self._begin(routed, req, method=method)
        record = exchange.record
        try:
            guards.check_origin(req.headers, self.allowed_origins)
            version = req.headers.get("mcp-protocol-version")
            if version in eras.MODERN_VERSIONS:
                record.era = "modern"
                raise MethodNotAllowed(headers={"Allow": "POST"})
            principal = await self.auth.authenticate(req.headers.get("authorization"),
                                                     routed.name,
                                                     guards.caller(req, self.trusted_proxies))
            record.principal, record.actor = principal.subject, principal.actor or None
            routed = await self._resolve(routed, principal, record)
            eras.check_header(version)
            session_id = req.headers.get("mcp-session-id")
            session = None if session_id is None else await self._session(
                self.sessions.fetch(session_id), routed.route, principal)
            if session is not None:
                record.session_hash = session.id_hash
            return await exchange.answer(await step(routed, req, session, exchange,
                                                    principal), None)
        except asyncio.CancelledError:  # the client went away before the answer
            exchange.disconnected()
            raise
        except GatewayError as exc:
            return await exchange.refuse(exc, None)
        except Exception:
            log.exception("unexpected failure on %s /mcp/%s", method, routed.name)
            return await exchange.refuse(InternalError(), None)

    # -- shared steps ------------------------------------------------------------------------

    async def _session(self, fetched: Fetched, route: Route, principal: Principal
                       ) -> Session:
        session = await fetched.session()
        if (session is None or session.endpoint != route.session_endpoint
                or session.principal_key != principal.key):
            raise SessionNotFound()
        return session

    async def _resolve(self, routed: Routed, principal: Principal, record: AuditRecord
                       ) -> Routed:
        """A per-caller upstream: this caller's own server (or NoUpstreamForCaller)."""
        if routed.route.template is None:
            return routed
        resolved = await self.tenants.resolve(routed.route, principal)
        record.upstream = resolved.origin
        return Routed(resolved, routed.forwarding)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stop_serving(self) -> None:
        """SIGTERM: refuse what is new (503 with Retry-After, `Draining`) and end each GET
        stream cleanly, so its client reconnects to another replica; the calls in flight go
        on (`idle` says when they are done)."""
        self.draining = True
        self.listening.end_all()

    @property
    def idle(self) -> bool:
        """No call of this process in flight, streamed answers included."""
        return len(self.inflight) == 0

    async def drain(self, timeout: float) -> None:
        """At shutdown: let background work (cancel notices, stream clean-up) finish."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
