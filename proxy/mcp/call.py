"""A request's life from the chain's yes to its answer (the spine's `_call` step).

The call is registered in flight (cancellable by the client, ended by its deadline), forwarded
by its route's kind (`proxy.mcp.forwarding`), and answered in one of four ways:
- a result the gateway gives itself (`leg.local`: a bridge's initialize or discover, a
  virtual endpoint's merged list), rewritten by the policies;
- an SSE stream, relayed event by event (`relay.StreamRelay`; a resumable one keeps its
  context for proxy/mcp/resume.py), the registration handed to the stream;
- a large JSON answer nobody rewrites, passed on as it arrives (`relay.JsonRelay`);
- a whole JSON answer, rewritten.
Each answer waits for its record (`Exchange.answer`); a call that ends first is cancelled
(-32800) or, when the client went away, recorded so, and its upstream told.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson

from proxy.approvals import Approvals, Held
from proxy.chain import CallContext, Chain, Notice, Rewrite, Verdict
from proxy.errors import ApprovalRequired, Cancelled
from proxy.jsonrpc import McpMessage
from proxy.mcp import eras, resume
from proxy.mcp.exchange import EdgeResponse, Exchange
from proxy.mcp.forward import Forwarded, Forwarder
from proxy.mcp.forwarding import Routed
from proxy.mcp.legs import Leg, then
from proxy.mcp.relay import Carried, JsonRelay, StreamEnd, StreamRelay, Views
from proxy.mcp.resume import RESUME_GRACE_S, Resumption
from proxy.mcp.sse import HEAD_BYTES
from proxy.mcp.tasks import Tasks
from proxy.observability import Observer
from proxy.state import CallHandle, InFlightRegistry, Session, SessionStore
from proxy.state.inflight import EndReason, Later, call_key

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}
JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(slots=True)
class _Call:
    """One call on its way: what each step of `Calls.run` reads."""

    routed: Routed
    msg: McpMessage
    session: Session | None
    ctx: CallContext
    exchange: Exchange
    chain: Chain
    handle: CallHandle
    key: str
    forwarded: Forwarded
    headers: dict[str, str]  # the answer's own (the gateway session's id)


class Calls:
    def __init__(self, *, inflight: InFlightRegistry, sessions: SessionStore,
                 forward: Forwarder, observer: Observer, later: Later | None,
                 spawn: Callable[[Coroutine[Any, Any, None]], None],
                 max_response_bytes: int, resumption: Resumption | None,
                 tasks: Tasks | None = None) -> None:
        self._inflight = inflight
        self._sessions = sessions
        self._forward = forward  # how any kind's upstream answer is read (held or not)
        self._observer = observer
        self._later = later  # the clock deadlines run on (the loop's unless a test gives one)
        self._spawn = spawn
        self._max = max_response_bytes  # an answer held to be rewritten, at most
        self._resumption = resumption
        self._tasks = tasks  # a task's binding, its list kept to its caller, its end
        self.approvals: Approvals | None = None  # calls held for a person's yes (Serving)

    @property
    def inflight(self) -> InFlightRegistry:
        """Where calls are registered to be cancelled (a held call's wait too)."""
        return self._inflight

    async def checked(self, routed: Routed, headers: Mapping[str, str], msg: McpMessage,
                      session: Session | None, ctx: CallContext, exchange: Exchange,
                      chain: Chain) -> EdgeResponse:
        """A request: the chain, once per target (a virtual endpoint: the member's), then
        `run`; a call an approval rule holds waits for a person's yes first (`approvals`:
        proxy/approvals.py, which runs the chain again once it is given)."""
        try:
            ctx = await routed.forwarding.check(routed.route, chain, msg, ctx)
        except ApprovalRequired as held:
            if self.approvals is None:
                raise
            return await self.approvals.hold(held, Held.of(
                self, routed, headers, msg, session, ctx, exchange, chain))
        exchange.decided(ctx)
        return await self.run(routed, headers, ctx.message or msg, session, ctx, exchange, chain)

    async def run(self, routed: Routed, headers: Mapping[str, str], msg: McpMessage,
                  session: Session | None, ctx: CallContext, exchange: Exchange,
                  chain: Chain) -> EdgeResponse:
        """A request: registered in flight, forwarded, and answered; a streamed answer keeps
        the registration until the stream ends."""
        route = routed.route
        handle = CallHandle()
        if msg.method != "subscriptions/listen":  # a listen stream lasts as long as the client
            handle.deadline(route.total_timeout_s, self._later)
        key = call_key(route.name, ctx.principal.key, session.id if session else "", msg.id)
        self._inflight.add(key, handle)
        # until the leg is chosen, a cancel notice goes on the caller's session as it stands
        call = _Call(routed, msg, session, ctx, exchange, chain, handle, key,
                     Forwarded(Leg([], session.upstream_session_id if session else None,
                                   session.protocol_version if session else None)), {})
        handed_over = False
        try:
            exchange.leg_began()
            await routed.forwarding.call(route, headers, msg, session, ctx, call.forwarded,
                                         chain)
            answer, handed_over = await self._answer(call)
            if handed_over:  # a relay owns the call: its answer waits for its record there
                return answer
        except asyncio.CancelledError:
            if not handle.absorb():  # the client went away: clean up, let the cancel go on
                exchange.disconnected()
                routed.forwarding.notify_cancelled(route, call.forwarded.leg, msg.id,
                                                   EndReason.DISCONNECTED)
                raise
            return await self._cancelled(call)
        finally:
            if not handed_over:
                handle.close()
                self._inflight.discard(key, handle)
                if call.forwarded.response is not None:
                    await call.forwarded.response.aclose()
        # answered: out of the registry and past its deadline, it waits for its record
        return await exchange.answer(answer, msg.id)

    async def _answer(self, call: _Call) -> tuple[EdgeResponse, bool]:
        """The answer, and whether a relay now owns the response and the registration."""
        msg, ctx, exchange = call.msg, call.ctx, call.exchange
        leg = call.forwarded.leg
        exchange.noted(ctx.audit_note)
        rewrite = leg.rewrite(_noting(call.chain.rewriter(msg, ctx), ctx, exchange), msg.method)
        if self._tasks is not None:  # last: reads the task ids as the client sees them
            rewrite = then(rewrite, self._tasks.rewriter(call.routed.route.name, msg, ctx,
                                                         exchange, call.chain))
        held = self._forward.must_hold(msg, rewrite)
        # readers see either kind; a tool error is marked where the result is seen
        rewrite = self._observer.results(msg, exchange.record, exchange.seeing(msg, rewrite))
        response = call.forwarded.response
        if response is None:  # answered here
            call.handle.close()
            return await self._answer_here(call, rewrite), False
        if msg.method == "initialize":
            call.session = await self._sessions.create(
                call.routed.route.session_endpoint, ctx.principal.key,
                response.headers.get("mcp-session-id"), _protocol_version(msg),
                capabilities=_capabilities(msg))
            exchange.joined(call.session)
        if call.session is not None:
            call.headers["Mcp-Session-Id"] = call.session.id
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            return self._streamed(call, rewrite, held), True
        data, rest = await self._forward.json_body(call.forwarded, held=held, head=HEAD_BYTES,
                                                   limit=self._max)
        if rest is not None:  # large, and nobody rewrites it: streamed as it arrives
            call.handle.close()  # the upstream has answered: no deadline cuts the body
            end = self._end(call)
            relay = JsonRelay(data, rest, response.aclose, call=Carried(
                msg.id, exchange, call.handle, end.answered), views=Views(rewrite),
                spawn=self._spawn, on_done=end)
            return EdgeResponse(200, {**JSON_HEADERS, **call.headers}, stream=relay), True
        data, error = call.routed.forwarding.json_answer(call.routed.route, msg,
                                                         call.forwarded, rewrite, data)
        if error is not None:
            exchange.upstream_error(error)
        exchange.sent(len(data))
        return EdgeResponse(200, {**JSON_HEADERS, **call.headers}, data), False

    def _streamed(self, call: _Call, rewrite: Rewrite | None, held: bool) -> EdgeResponse:
        """The upstream's SSE stream, relayed; the relay owns the call from here."""
        msg, ctx, exchange = call.msg, call.ctx, call.exchange
        response = call.forwarded.response
        assert response is not None
        remember = self._remembering(call)
        end = self._end(call, resumable=remember is not None)
        refuse, outgoing = call.routed.forwarding.views(call.routed.route, call.forwarded.leg,
                                                        call.session, ctx)
        notice = call.chain.noticer(msg, ctx)
        if self._tasks is not None:  # a task's status notifications: its caller's, its rules
            notice = self._tasks.noticer(call.routed.route.name, msg, ctx, call.chain, notice)
        views = Views(rewrite, _heard(notice, ctx, exchange), refuse,
                      outgoing, self._max if held else None, self._max)
        relay = StreamRelay(response.chunks(), response.aclose, call=Carried(
            msg.id, exchange, call.handle, end.answered, remember), views=views,
            spawn=self._spawn, on_done=end)
        return EdgeResponse(200, {**SSE_HEADERS, **call.headers}, stream=relay)

    def _end(self, call: _Call, resumable: bool = False) -> StreamEnd:
        routed = call.routed
        return StreamEnd(self._inflight, call.exchange, call.key, partial(
            routed.forwarding.notify_cancelled, routed.route, call.forwarded.leg, call.msg.id),
            call.forwarded.leg.bridged,
            resumable=self._resumption.store if resumable and self._resumption else None)

    def _remembering(self, call: _Call) -> Callable[[], Awaitable[bool]] | None:
        """A streamed call a client could resume on another GET (a session, and the
        upstream's own stream): what keeps its context once the stream shows an event id."""
        if self._resumption is None or call.session is None \
                or not call.routed.forwarding.resumable(call.forwarded.leg):
            return None
        msg, record, ctx = call.msg, call.exchange.record, call.ctx
        started_at = time.time() - (time.perf_counter() - call.exchange.started)
        return self._resumption.remembering(
            call.key, call.routed.route.total_timeout_s + RESUME_GRACE_S,
            lambda: resume.context(msg, record, ctx, started_at))

    async def _answer_here(self, call: _Call, rewrite: Rewrite | None) -> EdgeResponse:
        """A result the gateway gives itself (a bridge's discover or initialize, a virtual
        endpoint's merged list), rewritten by the policies."""
        msg, ctx, exchange = call.msg, call.ctx, call.exchange
        local = call.forwarded.leg.local
        assert local is not None
        exchange.answered_here()
        if rewrite is not None:
            rewrite(local)
        headers = dict(JSON_HEADERS)
        if msg.method == "initialize":  # a legacy client's session onto a 2026-07-28 upstream
            session = await self._sessions.create(call.routed.route.session_endpoint,
                                                  ctx.principal.key, None,
                                                  local.get("protocolVersion"),
                                                  eras.envelope_of_initialize(msg),
                                                  _capabilities(msg))
            exchange.joined(session)
            headers["Mcp-Session-Id"] = session.id
        data = orjson.dumps({"jsonrpc": "2.0", "id": msg.id, "result": local})
        exchange.sent(len(data))
        return EdgeResponse(200, headers, data)

    async def _cancelled(self, call: _Call) -> EdgeResponse:
        """A deliberate end (the client's cancel, the deadline): -32800, and the upstream told
        unless the client's own notifications/cancelled is on its way there."""
        reason = call.handle.reason
        assert reason is not None
        forwarding = call.routed.forwarding
        if reason is not EndReason.CANCELLED or call.ctx.era == "modern" \
                or not forwarding.relays_client_cancel:
            forwarding.notify_cancelled(call.routed.route, call.forwarded.leg, call.msg.id,
                                        reason)
        return await call.exchange.refuse(Cancelled(reason), call.msg.id)


def _noting(rewrite: Rewrite | None, ctx: CallContext, exchange: Exchange
            ) -> Rewrite | None:
    """The policies' rewrite, and what it notes (a guardrail's finding) into the record."""
    if rewrite is None:
        return None

    def noted(result: dict[str, Any]) -> bool:
        try:
            return rewrite(result)
        finally:  # a refused result (raised) is noted too
            exchange.noted(ctx.audit_note)

    return noted


def _heard(notice: Notice | None, ctx: CallContext, exchange: Exchange) -> Notice | None:
    """The policies' notification inspection, and what it notes into the record (until the
    record is written with the answer)."""
    if notice is None:
        return None

    def noted(message: dict[str, Any]) -> Verdict:
        verdict = notice(message)
        exchange.noted(ctx.audit_note)
        return verdict

    return noted


def _protocol_version(msg: McpMessage) -> str | None:
    version = (msg.params or {}).get("protocolVersion")
    return version if isinstance(version, str) else None


def _capabilities(msg: McpMessage) -> dict[str, Any] | None:
    """What the client declared at initialize, kept with its session."""
    caps = (msg.params or {}).get("capabilities")
    return caps if isinstance(caps, dict) else None
