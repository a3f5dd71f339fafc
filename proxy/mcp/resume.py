"""A call's answer that reaches the client on a resumed stream, held to the call's own rules.

An upstream with an event store lets a client whose POST stream broke resume it with a GET
carrying `Last-Event-ID`; the upstream replays what it sent after that event, the call's answer
included. The call's own relay never sees that answer: its replica may be dead (kill -9), or
it ended the call when the client went away. Without this module the replay went out as it
came: no audit record, no usage event, no result guardrail or profile.

So, for a call on a session whose upstream stream carries event ids:
- the replica that runs it leaves the call's context in the shared store (`remember`, before
  the client holds an event id to resume with), and marks it settled once its own record is
  written (`StreamEnd`);
- a resumed stream on any replica reads every event whole (`ResumedRelay`); an answer among
  them is `settle`d before it goes out: an open context is recorded here (durably, with its
  usage event, as the call's own record would have been: the audit log's and the outbox's
  unique call id keep it once), its result rewritten by the call's rules; one settled as
  answered is rewritten and passes unrecorded (recorded already); one settled as unanswered
  (the call was cancelled or failed, and recorded so) and one nobody left (its replica died
  before the store had it, or the store is out of reach) are withheld: the client gets
  seed 004's `-32000` for that id instead, and the latter is audited as failed.

No answer leaves without a record, and no record says other than what the client got.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import orjson

from proxy.audit import AuditRecord, AuditSink
from proxy.audit.record import id_text
from proxy.auth.principal import Principal
from proxy.chain import NOTICED, CallContext, Chain, Notice
from proxy.errors import (
    Cancelled,
    GatewayError,
    StoreUnavailable,
    UpstreamStreamCut,
    render,
    sse_event,
)
from proxy.jsonrpc import McpMessage, response_outcome
from proxy.mcp.exchange import Exchange
from proxy.mcp.relay import FINISHED, StreamRelay
from proxy.mcp.sse import EventSplitter, event_data, event_object, with_data
from proxy.observability import Observers
from proxy.state import Session
from proxy.state.inflight import EndReason, call_key
from proxy.state.resumable import UNANSWERED, Claimed, ResumableStore

log = logging.getLogger("tollhouse.resume")

# how long past the call's own deadline a resumed stream may still bring its answer
RESUME_GRACE_S = 300.0
# the params a result rule reads (what the call names); never its arguments
_NAMING = ("name", "uri")
UNOBSERVED = Observers()  # a resumed answer's record is the audit log's: no observer is told


def context(msg: McpMessage, record: AuditRecord, ctx: CallContext, started_at: float
            ) -> dict[str, Any]:
    """What a resumed answer's record and rewrite need of the call; never an argument."""
    params = msg.params or {}
    return {"method": msg.method, "params": {k: params[k] for k in _NAMING if k in params},
            "tool": record.tool, "call_id": record.call_id, "note": ctx.audit_note,
            "session_hash": record.session_hash, "upstream": record.upstream,
            "bytes_in": record.bytes_in, "trace_id": record.trace_id,
            "upstream_url": ctx.upstream_url, "era": ctx.era, "started_at": started_at}


class Resumption:
    """The two ends: `remembering` for the replica that runs a call, `settle` for the one
    that relays a resumed stream."""

    def __init__(self, store: ResumableStore, audit: AuditSink) -> None:
        self.store = store
        self.audit = audit

    def remembering(self, key: str, ttl_s: float, build: Callable[[], dict[str, Any]]
                    ) -> Callable[[], Awaitable[bool]]:
        """The relay's `on_resumable`: the call's context kept, once the upstream's stream
        shows an event id (so only for resumable streams); False when it could not be kept
        (a resumed answer is then withheld)."""

        async def remember() -> bool:
            try:
                await self.store.remember(key, build(), ttl_s)
            except StoreUnavailable as exc:
                log.warning("a resumable call's context could not be kept (%s): an answer on "
                            "a resumed stream will be withheld", exc.audit_reason)
                return False
            return True

        return remember

    async def settle(self, chain: Chain, endpoint: str, session: Session,
                     principal: Principal, obj: dict[str, Any], event: bytes,
                     held: Sequence[bytes] = ()) -> bytes:
        """What goes out in place of `event`, the answer `obj` replayed on a resumed stream,
        and of `held`, the notifications replayed before it (each as the call's rules keep,
        change or drop it; none where the call is unknown)."""
        request_id = obj.get("id")
        key = call_key(endpoint, principal.key, session.id, request_id)
        try:
            claimed = await self.store.claim(key)
        except StoreUnavailable as exc:
            log.warning("a resumed answer withheld: the store is out of reach (%s)",
                        exc.audit_reason)
            claimed = None
        if claimed is None:
            return await self._withheld(endpoint, session, principal, request_id)
        if claimed.state == UNANSWERED:  # the call ended unanswered, and was recorded so
            return sse_event(render(Cancelled(EndReason.DISCONNECTED), request_id)[2])
        exchange = self._exchange(endpoint, session, principal, request_id, claimed)
        outcome = response_outcome(obj, request_id)
        ok, error = outcome if outcome is not None else (False, "not a JSON-RPC response")
        msg, ctx = _call(claimed.context, endpoint, principal, session, request_id)
        before = _noticed(chain.noticer(msg, ctx), held) if held else b""
        out = event
        try:
            rewrite = chain.rewriter(msg, ctx)
            result = obj.get("result")
            if ok and rewrite is not None and isinstance(result, dict) and rewrite(result):
                out = with_data(event, orjson.dumps(obj))
        except GatewayError as exc:  # a rule that refuses the result answers instead
            exchange.fail(exc)
            out = sse_event(render(exc, request_id)[2])
        else:
            if not ok:
                exchange.upstream_error(error)
        if not claimed.open:  # recorded by the call's own replica: delivered again only
            return before + out
        exchange.noted(_noted(ctx.audit_note, "answered on a resumed stream"))
        exchange.sent(len(out))
        if not await exchange.write():
            return sse_event(render(StoreUnavailable("the audit log"), request_id)[2])
        return before + out

    def _exchange(self, endpoint: str, session: Session, principal: Principal,
                  request_id: Any, claimed: Claimed) -> Exchange:
        """The resumed answer's record, as the call's own replica began it: timed from when
        the call began there (a clock ahead of this one's counts as now)."""
        c = claimed.context
        record = AuditRecord(
            endpoint=endpoint, method=c.get("method"), request_id=id_text(request_id),
            principal=principal.subject, tool=c.get("tool"), era=c.get("era") or "legacy",
            session_hash=session.id_hash, call_id=c.get("call_id"), upstream=c.get("upstream"),
            bytes_in=int(c.get("bytes_in") or 0), trace_id=c.get("trace_id") or "")
        since = max(0.0, time.time() - float(c.get("started_at") or 0))
        return Exchange(record, self.audit, UNOBSERVED, time.perf_counter() - since)

    async def _withheld(self, endpoint: str, session: Session, principal: Principal,
                        request_id: Any) -> bytes:
        exc = UpstreamStreamCut("upstream answer on a resumed stream withheld: no replica "
                                "kept its call to record it")
        exchange = Exchange(AuditRecord(endpoint=endpoint,
                                        request_id=id_text(request_id),
                                        principal=principal.subject,
                                        session_hash=session.id_hash), self.audit, UNOBSERVED)
        exchange.fail(exc)
        out = sse_event(render(exc, request_id)[2])
        exchange.sent(len(out))
        await exchange.write()  # withheld either way
        return out


def _call(c: dict[str, Any], endpoint: str, principal: Principal, session: Session,
          request_id: Any) -> tuple[McpMessage, CallContext]:
    """The call as the rules that read its result see it: method, what it names, who."""
    params = c.get("params") if isinstance(c.get("params"), dict) else {}
    msg = McpMessage("request", request_id, c.get("method"), params, b"")
    ctx = CallContext(principal, endpoint, str(c.get("upstream_url") or ""),
                      era=str(c.get("era") or "legacy"), session_hash=session.id_hash,
                      api_key_id=principal.api_key_id)
    ctx.call_id, ctx.audit_note = c.get("call_id"), c.get("note")
    return msg, ctx


def _noticed(notice: Notice | None, held: Sequence[bytes]) -> bytes:
    """The held notifications as the call's rules leave them."""
    if notice is None:
        return b"".join(held)
    out = []
    for event in held:
        obj = orjson.loads(event_data(event))  # (held only when it parsed)
        verdict = notice(obj)
        if verdict == "changed":
            event = with_data(event, orjson.dumps(obj))
        if verdict != "dropped":
            out.append(event)
    return b"".join(out)


def _noted(note: str | None, text: str) -> str:
    return text if not note else f"{note}; {text}"


class ResumedRelay(StreamRelay):
    """A resumed stream (a GET with `Last-Event-ID`): each event read whole, up to `limit`;
    an answer (a JSON-RPC response) goes out as `settle` returns it, the rest as it came. An
    event past the limit, or an upstream that breaks, ends the stream (the client may resume
    again)."""

    def __init__(self, chunks: AsyncIterator[bytes], close: Callable[[], Awaitable[None]], *,
                 settle: Callable[[dict[str, Any], bytes, Sequence[bytes]], Awaitable[bytes]],
                 limit: int, hold_notices: bool = False, **kwargs: Any) -> None:
        super().__init__(chunks, close, **kwargs)
        self._settle = settle
        self._whole = EventSplitter(limit)
        self._limit = limit
        # where a rule may read a call's notifications, those replayed before its answer wait
        # for it (whose call they belong to is known only then): a stream that ends first
        # sends none of them, and the client's next resume replays them again
        self._hold_notices = hold_notices
        self._held: list[bytes] = []
        self._held_size = 0

    async def _next(self) -> bytes:
        while self._state < FINISHED:
            try:
                events = self._whole.feed(await self._chunks.__anext__())
            except StopAsyncIteration:
                break
            except asyncio.CancelledError:
                await self.aclose()  # the client went away
                raise
            except ValueError:
                log.warning("a resumed stream ended: an event past server.max_response_bytes")
                break
            except GatewayError:  # the upstream broke, or a drain closed it
                break
            out = b"".join([await self._resumed(event) for event in events])
            if out:
                return out
        if self._state < FINISHED:  # (not when called again, after its end)
            self._to(FINISHED)
        await self.aclose()
        raise StopAsyncIteration

    async def _resumed(self, event: bytes) -> bytes:
        obj = event_object(event)
        if obj is None:
            return event  # not a message: nothing to settle
        if "method" in obj:
            if self._hold_notices and "id" not in obj and obj["method"] in NOTICED:
                return self._hold(event)
            return event  # an upstream request, or a notification nobody reads
        if "id" not in obj:
            return event
        held, self._held, self._held_size = self._held, [], 0
        return await self._settle(obj, event, held)

    def _hold(self, event: bytes) -> bytes:
        self._held_size += len(event)
        if self._held_size > self._limit:  # kept back, never let through unread
            log.warning("a resumed stream's notifications past server.max_response_bytes "
                        "before its answer: left out")
            self._held, self._held_size = [], 0
            return b""
        self._held.append(event)
        return b""
