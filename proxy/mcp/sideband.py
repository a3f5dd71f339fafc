"""A plain upstream's traffic beside its calls' requests, for the `Forwarder`
(proxy/mcp/forward.py), which holds one `Sideband` and hands the spine's `one_way`, `listen`,
`end` and `notify_cancelled` to it: a notification or a client's answer sent on, on the
caller's upstream session; the upstream's GET stream; DELETE, ending the upstream session; the
cancel notice a legacy upstream needs when a call ends unanswered. And `check_status`, what an
upstream answer that is not 2xx amounts to (a relayed JSON-RPC error, the gateway's session
ended, an upstream failure), which a call's answer shares.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import orjson

from proxy.chain import CallContext
from proxy.errors import (
    Draining,
    GatewayError,
    SessionNotFound,
    UpstreamBadGateway,
    UpstreamFailure,
    UpstreamHTTPError,
)
from proxy.jsonrpc import McpMessage
from proxy.mcp.forwarding import Listened, NoStream
from proxy.mcp.legs import Leg, person_header
from proxy.state import Session, SessionStore
from proxy.traced import CURRENT
from proxy.upstream import NO_CALL, UpstreamAnswer, UpstreamClient, UpstreamRoute, rejection

log = logging.getLogger("tollhouse.forward")

Spawn = Callable[[Coroutine[Any, Any, None]], None]


class Sideband:
    def __init__(self, upstream: UpstreamClient, sessions: SessionStore, spawn: Spawn) -> None:
        self.upstream = upstream
        self.sessions = sessions
        self._spawn = spawn

    async def check_status(self, response: UpstreamAnswer, session: Session | None, *,
                           call_id: Any = NO_CALL, modern: bool = False) -> None:
        """Return for a 2xx. An upstream's own JSON-RPC error is relayed (for a call: only
        one for this call's id, which the upstream's 'session not found' never is); a 404 on
        the upstream session ends the gateway's session; anything else is an upstream failure.
        The response is closed unless it is a 2xx."""
        status = response.status_code
        if status < 300:
            return
        gone = status == 404 and session is not None and session.upstream_session_id is not None
        try:
            relayed = None if call_id is NO_CALL and gone \
                else await rejection(response, call_id=call_id, modern=modern)
        finally:
            await response.aclose()
        if relayed is not None:
            raise relayed
        if gone:
            assert session is not None
            await self.sessions.delete(session.id)
            raise SessionNotFound()
        raise UpstreamHTTPError(status)

    async def one_way(self, route: UpstreamRoute, headers: Mapping[str, str], msg: McpMessage,
                      session: Session | None, ctx: CallContext) -> None:
        """A notification or a client's response, sent on, on the caller's own upstream
        session (an upstream takes an answer only on the session it asked on; a local process
        also by the person). A 2026-07-28 upstream has no use for either (it learns of a cancel
        from the closed request): nothing is sent. An upstream failure is 502 with no id (the
        2025-11-25 transport); the upstream's own 4xx error is relayed."""
        if ctx.era == "modern" or (session is not None and session.bridged_envelope is not None):
            return
        sent = self.upstream.headers(
            route, headers, session.upstream_session_id if session else None,
            extra=person_header(route, ctx.principal))
        body, trace = msg.body, CURRENT.get()
        if trace is not None:
            sent, body = trace.upstream(route, msg, sent, body)
        try:
            response = await self.upstream.open(route, "POST", sent, body)
            await self.check_status(response, session)
            await response.aclose()
        except UpstreamFailure as exc:
            raise UpstreamBadGateway(exc.wire_message) from None

    async def listen(self, route: UpstreamRoute, headers: Mapping[str, str],
                     session: Session | None, draining: bool) -> Listened | NoStream:
        """The upstream's GET stream (resumable when the client resumes a call's stream with
        Last-Event-ID), or NoStream: a legacy client's session on a 2026-07-28 upstream has
        none, nor has an upstream that answers 405."""
        if session is not None and session.bridged_envelope is not None:
            return NoStream({"Allow": "POST, DELETE"}, "no GET stream on a 2026-07-28 upstream")
        if draining:
            raise Draining()
        response = await self._open_stream(route, headers, session)
        if isinstance(response, dict):  # the spec's own answer: no GET stream offered
            return NoStream(response, "upstream offers no GET stream")
        return Listened(response.chunks(), response.aclose,
                        resumable=session is not None and "last-event-id" in headers)

    async def _open_stream(self, route: UpstreamRoute, headers: Mapping[str, str],
                           session: Session | None) -> UpstreamAnswer | dict[str, str]:
        """The upstream's GET stream, open; or, when it offers none (405), the Allow header
        to answer with. An upstream failure is 502, its own 4xx error relayed."""
        sent = self.upstream.headers(
            route, headers, session.upstream_session_id if session else None, get=True)
        try:
            response = await self.upstream.open(route, "GET", sent, stream_timeout=True)
        except UpstreamFailure as exc:
            raise UpstreamBadGateway(exc.wire_message) from None
        status = response.status_code
        if status == 405:
            await response.aclose()
            return _allow(response)
        if status >= 300:
            try:
                await self.check_status(response, session)
            except UpstreamFailure:
                raise UpstreamBadGateway(f"upstream answered HTTP {status}") from None
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            await response.aclose()
            raise UpstreamBadGateway("upstream GET stream is not text/event-stream")
        return response

    async def end(self, route: UpstreamRoute, headers: Mapping[str, str], session: Session
                  ) -> dict[str, str] | None:
        """DELETE the upstream session, if there is one; None once it is gone (a 404 too),
        or, when the upstream lets no client end a session (405), the Allow header."""
        if session.upstream_session_id is None:
            return None
        sent = self.upstream.headers(route, headers, session.upstream_session_id)
        try:
            response = await self.upstream.open(route, "DELETE", sent)
            status = response.status_code
            try:
                relayed = None if status in (404, 405) else await rejection(response)
            finally:
                await response.aclose()
        except UpstreamFailure as exc:
            raise UpstreamBadGateway(exc.wire_message) from None
        if relayed is not None:
            raise relayed
        if status == 405:
            return _allow(response)
        if status >= 300 and status != 404:
            raise UpstreamBadGateway(f"upstream answered HTTP {status}")
        return None

    def notify_cancelled(self, route: UpstreamRoute, leg: Leg, request_id: Any,
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

        self._spawn(send())



def _allow(response: UpstreamAnswer) -> dict[str, str]:
    allow = response.headers.get("allow")
    return {"Allow": allow} if allow else {}
