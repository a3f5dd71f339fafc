"""Relaying an upstream SSE stream to the client, whole event by whole event, as it arrives.

A `StreamRelay` is the body of a streamed response. It follows the call it carries: it reads
each event's data to see the response to the client's request (for the audit record), turns an
upstream failure or a deliberate cancellation into one last JSON-RPC error event, and on a
client disconnect closes the upstream request and tells the upstream the call is cancelled.
An event larger than `HEAD_BYTES` is held only when it may be the answer of a call whose answer
is held (`hold_limit`, see `Forwarder.must_hold`), a notification a policy reads (`notice`,
the guardrails), or a request or notification a virtual endpoint views (`outgoing`, bounded by
`view_limit` when the answer is not held), each event bounded by `hold_limit`; any other goes
on as it arrives, so
memory per stream stays bounded and a slow client slows the upstream read (nothing queues
here). Every whole event goes out as soon as it is read: nothing waits for the answer.
A relay's state is one `RelayState`; what it learns of the call (the answer's outcome, a
failure, the bytes it sent) reaches the audit record only through the call's `Exchange`.
`JsonRelay` passes a large JSON answer on the same way; `StreamEnd` is a streamed call's end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import orjson

from proxy.chain import NOTICED, Notice
from proxy.errors import (
    Cancelled,
    GatewayError,
    ResponseTooLarge,
    StoreUnavailable,
    UpstreamFailure,
    UpstreamProtocolError,
    UpstreamStreamCut,
    render,
    sse_event,
)
from proxy.jsonrpc import response_outcome
from proxy.mcp.exchange import Exchange
from proxy.mcp.scan import AnswerScan
from proxy.mcp.sse import HEAD_BYTES, EventSplitter, LargeEvent, event_data, with_data
from proxy.state import CallHandle, InFlightRegistry
from proxy.state.inflight import EndReason
from proxy.state.resumable import ResumableStore

log = logging.getLogger("tollhouse.relay")

NO_REQUEST = object()
UNHELD = 1 << 62  # the splitter's bound when nothing holds events (they pass on past HEAD_BYTES)


class RelayState(IntEnum):
    """Where a relay is: one value, changed only by `StreamRelay._to` (the moves: `_MOVES`),
    in the order a relay goes through them (from FINISHED on, it reads nothing more).

        WAITING   a call's stream: each event read until the call's answer is seen
        READING   reading on: a GET stream, or a call's stream past its answer
        ENDING    a drain closed a GET stream's upstream: the read that fails ends it cleanly
        FINISHED  the last event went out (or nothing more will): the next read closes
        CLOSED    closed after its last event
        CUT       closed before its last event: the client went away (`disconnected`)
    """

    WAITING = 0
    READING = 1
    ENDING = 2
    FINISHED = 3
    CLOSED = 4
    CUT = 5


# the states by plain module names: a global read per check on the hot path (an int's compare,
# no class lookup and no enum hash)
WAITING, READING, ENDING = RelayState.WAITING, RelayState.READING, RelayState.ENDING
FINISHED, CLOSED, CUT = RelayState.FINISHED, RelayState.CLOSED, RelayState.CUT
_MOVES: tuple[tuple[RelayState, ...], ...] = (  # where each state may go, by its value
    (READING, FINISHED, CUT),  # WAITING: the answer, a failure, the client gone
    (ENDING, FINISHED, CUT),  # READING: a drain, the stream's end or a failure, the client gone
    (FINISHED, CUT),  # ENDING
    (CLOSED,),  # FINISHED
    (),  # CLOSED
    (),  # CUT
)


@dataclass(slots=True)
class Carried:
    """The call a relay carries (none for a GET stream): its request id (the answer is the
    response to it), its exchange (what the relay learns goes into the record only through
    it), its handle (deadline, cancel), what writes the record before the answer goes out
    (`answered`: False when it could be kept nowhere, and the answer is withheld), and what
    keeps a resumable call's context once the stream shows an event id (`remember`,
    proxy/mcp/resume.py)."""

    request_id: Any
    exchange: Exchange | None = None
    handle: CallHandle | None = None
    answered: Callable[[StreamRelay], Awaitable[bool]] | None = None
    remember: Callable[[], Awaitable[bool]] | None = None


@dataclass(frozen=True, slots=True)
class Views:
    """What a relay does with what it reads: `rewrite` the answer's result (held whole, up to
    `hold_limit`, when set), `notice` each notification a policy reads (keep, change, drop),
    `refuse_requests` (a request the client cannot answer ends the call), and `outgoing`: a
    virtual endpoint's view of each upstream request or notification (the member named, a
    request's id sealed; True when it changed the message), each held whole up to the hold
    limit or, when the answer is not held, `view_limit`."""

    rewrite: Callable[[dict[str, Any]], bool] | None = None
    notice: Notice | None = None
    refuse_requests: bool = False
    outgoing: Callable[[dict[str, Any]], bool] | None = None
    hold_limit: int | None = None
    view_limit: int | None = None


NO_VIEWS = Views()


class StreamRelay:
    """Async iterator of bytes for the client; `aclose` is always safe to call again. Its
    state is one `RelayState`; what it did, for the call's end to read, is `answered`,
    `refused`, `remembered` and `disconnected`."""

    def __init__(self, chunks: AsyncIterator[bytes], close: Callable[[], Awaitable[None]], *,
                 call: Carried | None = None, views: Views = NO_VIEWS,
                 spawn: Callable[[Coroutine[Any, Any, None]], None] | None = None,
                 on_done: Callable[[StreamRelay], Awaitable[None]] | None = None) -> None:
        self._close = close
        self._chunks = chunks  # errors already mapped at the upstream boundary
        self._spawn = spawn
        self._on_done = on_done  # however it ends (the call's end: proxy/mcp/relay StreamEnd)
        self._state = READING if call is None else WAITING
        self.request_id = NO_REQUEST if call is None else call.request_id
        self._exchange = None if call is None else call.exchange
        self.handle = handle = None if call is None else call.handle
        self.sent = 0  # bytes out (the record's, through the exchange, until it is accepted)
        # the answer (or the last event) goes out once this says its record is durable
        self._on_answer = None if call is None else call.answered
        # an answer (or the gateway's error in its place) is due, once its record is written:
        # what ends an event it began if it is withheld (None: nothing due)
        self._due: bytes | None = None
        self.answered = False  # the call's answer was seen (kept for the call's end)
        self.refused: str | None = None  # why the gateway ended the call itself
        # a call whose upstream stream shows an event id can be resumed on any replica: its
        # context is kept (proxy/mcp/resume.py) before the client holds an id to resume with
        self._on_resumable = None if call is None else call.remember
        self._resumable_due: Callable[[], Awaitable[bool]] | None = None
        self.remembered = False  # the context is kept: the call's end settles it
        self._rewrite = views.rewrite
        self._notice = views.notice  # None: notifications pass unread (no rule reads them)
        self._refuse_requests = views.refuse_requests
        self._outgoing = views.outgoing
        # None: no event is held past HEAD_BYTES; else each is held whole, up to this size
        self._hold_limit = views.hold_limit
        # with `outgoing`, a request or notification is held whole to be viewed, up to the
        # hold limit, or this when the answer is not held (None: `outgoing` sees none larger
        # than HEAD_BYTES)
        self._view_limit = views.view_limit if views.outgoing is not None else None
        # the held bound is kept per event by `_take`: only what must be held is bounded by it
        self._splitter = EventSplitter(UNHELD)
        self._judged = False  # the pending event of a held stream was judged (`_unheld`)
        self._large: LargeEvent | None = None  # the event being passed on as it arrives
        if handle is not None and handle.task is not None:
            # If the response is dropped before its body is iterated (a disconnect in that
            # window), nothing calls aclose: the task's end does it instead.
            handle.task.add_done_callback(self._task_done)

    def _to(self, state: RelayState) -> None:
        """The one place the state changes (to itself: nothing happens)."""
        if state is not self._state:
            assert state in _MOVES[self._state], (self._state, state)
            self._state = state

    @property
    def disconnected(self) -> bool:
        """Closed before its last event: the client went away (or its send failed)."""
        return self._state is CUT

    def __aiter__(self) -> StreamRelay:
        return self

    async def __anext__(self) -> bytes:
        out = await self._next()
        if self._resumable_due is not None:
            remember, self._resumable_due = self._resumable_due, None
            self.remembered = await remember()
        if self._due is not None:
            ended, self._due = self._due, None
            if self._exchange is not None:
                self._exchange.sent(self.sent)
            if self._on_answer is not None and not await self._on_answer(self):
                self._to(FINISHED)  # kept nowhere: the answer is withheld
                log.error("an answer withheld: its audit record could not be written")
                out = self._withheld(ended)
        return out

    def _withheld(self, ended: bytes) -> bytes:
        """What goes out instead of an answer whose record could be kept nowhere (`ended`
        first: what ends an event of it that went out in part)."""
        return ended + sse_event(render(StoreUnavailable("the audit log"), self.request_id)[2])

    @property
    def mid_event(self) -> bool:
        """Part of an event has gone out: nothing else (a heartbeat) may be sent now."""
        return self._large is not None

    async def _next(self) -> bytes:
        if self._state >= FINISHED:
            await self.aclose()
            raise StopAsyncIteration
        try:
            while True:
                try:
                    chunk = await self._chunks.__anext__()
                except StopAsyncIteration:
                    return self._end_of_stream()
                out = self._take(chunk)
                if out:
                    return out
        except asyncio.CancelledError:
            if self.handle is not None and self.handle.absorb():
                return self._fail(Cancelled(self.handle.reason))
            await self.aclose()  # the client went away
            raise
        except GatewayError as exc:
            if self._state is ENDING:  # our own close of the upstream: a clean end, no error
                self._to(FINISHED)
                await self.aclose()
                raise StopAsyncIteration from None
            return self._fail(exc)
        except ValueError:
            return self._fail(ResponseTooLarge(self._hold_limit or self._view_limit))

    def _take(self, chunk: bytes) -> bytes:
        """What of `chunk` goes out now: the rest of an event being passed on, whole events,
        and the start of an event that has outgrown HEAD_BYTES when nothing holds it."""
        out = b""
        if self._large is not None:
            end = self._large.feed(chunk)
            if end is None:
                return self._counted(chunk)
            out, chunk = self._counted(chunk[:end]), chunk[end:]
            out += self._large_ended()
            if self._state is FINISHED or not chunk:
                return out
        events = self._splitter.feed(chunk)
        if events:
            self._judged = False
            out += self._inspect(events)
            if self._state is FINISHED:
                return out
        pending = self._splitter.pending_size
        limit = self._hold_limit if self._hold_limit is not None else self._view_limit
        if limit is None:
            if pending > HEAD_BYTES:
                out += self._pass_on(LargeEvent(AnswerScan() if self._state is WAITING
                                                else None))
        elif pending > min(HEAD_BYTES, limit):
            large = self._unheld()
            if large is not None:
                out += self._pass_on(large, fed=True)
            elif pending > limit:
                raise ValueError("SSE event exceeds the size limit")
        return out

    def _pass_on(self, large: LargeEvent, fed: bool = False) -> bytes:
        """The pending event's start goes out; `large` passes the rest on as it arrives."""
        self._large, self._judged = large, False
        head = self._splitter.take()
        if not fed:
            # no event ends in what the splitter kept; a line end it begins with is the rest
            # of the last event's (or an empty line): no part of this event
            large.feed(head.lstrip(b"\r\n"))
        return self._counted(head)

    def _unheld(self) -> LargeEvent | None:
        """On a held stream, only the answer and what is read whole are held: a large event
        whose head shows a `method` (so not the answer) is passed on as it arrives, unless it
        is a notification `notice` reads, requests are refused, or a virtual endpoint views
        it (`outgoing`: every request and notification). On a stream held only for that view,
        an event with no `method` in its head (maybe the answer) is passed on too. Judged once
        per event, from its head; None: it stays held, bounded."""
        if self._judged:
            return None
        self._judged = True
        watching = self._state is WAITING
        if watching and self._refuse_requests:
            return None
        if not watching and self._notice is None and self._outgoing is None:
            large = LargeEvent(None)  # after the answer, nothing reads an event
        else:
            large = LargeEvent(AnswerScan())
        large.feed(self._splitter.pending.lstrip(b"\r\n"))
        if large.scan is None:
            return large
        method = large.scan.method()
        if large.scan.bad:
            return None
        if method is None:
            if self._hold_limit is not None:
                return None  # maybe the answer, held to be rewritten
        elif self._outgoing is not None or self._notice is not None and method in NOTICED:
            return None  # what is read whole
        if not watching:
            large.scan = None
        return large

    def _large_ended(self) -> bytes:
        """A passed-on event has ended: was it the answer? (its data, scanned, says so)"""
        large, self._large = self._large, None
        if large is None or large.scan is None or self._state is not WAITING:
            return b""
        obj = large.scan.message()
        if obj is None:
            return self._fail(UpstreamProtocolError())
        outcome = response_outcome(obj, self.request_id)
        if outcome is not None:
            self._answer_seen(outcome, obj)
            self._due = b"\n\n"  # its start went out: a withheld answer ends it first
        return b""

    def _counted(self, out: bytes) -> bytes:
        self.sent += len(out)
        return out

    def _answer_seen(self, outcome: tuple[bool, str | None], obj: dict[str, Any]) -> bool:
        """The response to the call: recorded; True if its result was rewritten in `obj`."""
        self._to(READING)
        self.answered, self._due = True, b""
        if self.handle is not None:
            self.handle.close()  # answered: no deadline ends it now
        ok, error = outcome
        if not ok:
            if self._exchange is not None:
                self._exchange.upstream_error(error)
            return False
        return self._rewrite is not None and isinstance(obj.get("result"), dict) \
            and self._rewrite(obj["result"])

    def _inspect(self, events: list[bytes]) -> bytes:
        """Whole events as they go out: each read, until the answer, to see it (and rewrite
        it); each notification read, when a policy inspects them (`notice`), to keep, rewrite
        or leave it out; each upstream request or notification shown to a virtual endpoint's
        `outgoing` (the member named, a request's id sealed). After the answer, an event that
        is not JSON cannot be inspected: with `notice` it is left out; before it, it fails the
        call."""
        if self._state is not WAITING and self._notice is None and self._outgoing is None:
            return self._counted(b"".join(events))
        out: list[bytes] = []
        for event in events:
            watching = self._state is WAITING
            if not watching and self._notice is None and self._outgoing is None:
                out.append(event)  # the answer was in this batch
                continue
            if self._on_resumable is not None and watching and _has_id(event):
                self._resumable_due, self._on_resumable = self._on_resumable, None  # once
            data = event_data(event)
            if not data:
                out.append(event)
                continue
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                if watching:
                    return self._fail(UpstreamProtocolError())
                if self._notice is None:
                    out.append(event)
                continue
            if watching:
                if self._refuse_requests and isinstance(obj, dict) and "method" in obj \
                        and "id" in obj:
                    # a legacy upstream asking a 2026-07-28 caller for sampling, elicitation or
                    # roots: nothing can carry the question, so the call ends, rather than hang
                    method = str(obj["method"])[:64]
                    self.refused = f"upstream sent {method}, which cannot reach this client"
                    return self._fail(UpstreamFailure(self.refused))
                outcome = response_outcome(obj, self.request_id)
                if outcome is not None:
                    if self._answer_seen(outcome, obj):
                        event = with_data(event, orjson.dumps(obj))
                    out.append(event)
                    continue
            changed = False
            if self._notice is not None and isinstance(obj, dict) and "id" not in obj \
                    and obj.get("method") in NOTICED:
                verdict = self._notice(obj)  # on the member's own message, before naming
                if verdict == "dropped":
                    continue
                changed = verdict == "changed"
            if self._outgoing is not None and isinstance(obj, dict) and "method" in obj:
                changed = self._outgoing(obj) or changed
            if changed:
                event = with_data(event, orjson.dumps(obj))
            out.append(event)
        return self._counted(b"".join(out))


    def _end_of_stream(self) -> bytes:
        if self._state is WAITING:  # the call's answer never came
            return self._fail(UpstreamStreamCut())
        self._to(FINISHED)
        if self.handle is not None:
            self.handle.close()
        raise StopAsyncIteration

    def _fail(self, exc: GatewayError) -> bytes:
        """The last event of the stream: the failure as a JSON-RPC error for this request."""
        self._to(FINISHED)
        if self.handle is not None:
            self.handle.close()
        if self.request_id is NO_REQUEST:
            return b""
        ended = b""
        if self._large is not None:  # part of an event went out: end it, unfinished, first
            self._large, ended = None, b"\n\n"
        out = self._counted(ended + sse_event(render(exc, self.request_id)[2]))
        if self._exchange is not None and self._exchange.fail(exc):
            self._due = ended  # its record first, as for an answer
        return out

    def end(self) -> None:
        """End a GET stream cleanly now (a drain): the upstream response is closed, so the
        read waiting on it fails, and the client sees the stream end after its last whole
        event. A call still waiting for its answer runs on (the drain waits for it)."""
        if self._state is not READING or self._spawn is None:
            return
        self._to(ENDING)
        self._spawn(self._close_upstream())

    async def _close_upstream(self) -> None:
        try:
            await self._close()
        except Exception:
            log.debug("closing the upstream stream failed", exc_info=True)

    async def aclose(self) -> None:
        if self._state >= CLOSED:
            return
        # closed before its last event: the send to the client failed, or the client went away
        self._to(CLOSED if self._state is FINISHED else CUT)
        if self.handle is not None and self.handle.task is not None:
            self.handle.task.remove_done_callback(self._task_done)
        if self._exchange is not None:
            self._exchange.sent(self.sent)
        try:
            await self._close()
        except Exception:  # a broken connection is closed either way
            log.debug("closing the upstream stream failed", exc_info=True)
        finally:
            if self._on_done is not None:
                await self._on_done(self)

    def _task_done(self, _task: object) -> None:
        if self._state < CLOSED and self._spawn is not None:
            self._spawn(self.aclose())


def _has_id(event: bytes) -> bool:
    """The event carries an `id:` field (what a client resumes from)."""
    return event.startswith(b"id:") or b"\nid:" in event


class JsonRelay(StreamRelay):
    """A JSON answer nobody rewrites (`Forwarder.must_hold`), passed on as it arrives: the
    body is scanned on the way (`AnswerScan`) and its last chunk kept back until the whole
    message has been seen and its record is durable. What cannot be finished (the upstream
    breaks, the message is not this call's answer, the record is kept nowhere) ends the body
    short of a whole message, so the client never takes it for an answer; the record says
    why."""

    def __init__(self, head: bytes, chunks: AsyncIterator[bytes],
                 close: Callable[[], Awaitable[None]], **kwargs: Any) -> None:
        super().__init__(chunks, close, **kwargs)
        self._scan = AnswerScan()
        self._scan.feed(head)
        self._kept = head  # the latest bytes: they go out once the answer is known

    async def _next(self) -> bytes:
        if self._state >= FINISHED:
            await self.aclose()
            raise StopAsyncIteration
        try:
            chunk = await self._chunks.__anext__()
        except StopAsyncIteration:
            return self._whole()
        except asyncio.CancelledError:  # a disconnect, a cancel, the deadline: no answer
            await self.aclose()
            raise
        except GatewayError as exc:
            return self._short(exc)
        self._scan.feed(chunk)
        out, self._kept = self._kept, chunk
        return self._counted(out)

    def _whole(self) -> bytes:
        obj = self._scan.message()
        outcome = None if obj is None else response_outcome(obj, self.request_id)
        if obj is None or outcome is None:
            return self._short(UpstreamProtocolError())
        self._answer_seen(outcome, obj)  # read only: nothing rewrites an unheld answer
        self._to(FINISHED)  # its last chunk goes out now
        return self._counted(self._kept)

    def _short(self, exc: GatewayError) -> bytes:
        self._to(FINISHED)
        if self.handle is not None:
            self.handle.close()
        if self._exchange is not None:
            self._exchange.fail(exc)
        return b""

    def _withheld(self, ended: bytes) -> bytes:
        return b""


class StreamEnd:
    """What happens when a streamed call's relay ends, however it ends: the call leaves the
    in-flight registry, the upstream is told of a call that did not finish (`notify`, a no-op
    for an upstream that learns it from the closed request), its resumable context is settled,
    and its exchange writes the one audit record."""

    __slots__ = ("_bridged", "_exchange", "_inflight", "_key", "_notify", "_resumable")

    def __init__(self, inflight: InFlightRegistry, exchange: Exchange, key: str,
                 notify: Callable[[str], None], bridged: bool, *,
                 resumable: ResumableStore | None = None) -> None:
        self._inflight = inflight
        self._exchange = exchange
        self._key = key
        self._notify = notify
        self._bridged = bridged  # a client's own cancel never reaches a bridged upstream
        self._resumable = resumable  # where a resumable call's context is settled

    async def __call__(self, relay: StreamRelay) -> None:
        handle = relay.handle
        reason = None if handle is None else handle.reason
        if handle is not None:
            handle.close()
            self._inflight.discard(self._key, handle)
            if reason is not None and (reason is not EndReason.CANCELLED or self._bridged):
                self._notify(reason)
        if relay.refused is not None:
            self._notify(relay.refused)
        unanswered = not self._exchange.record.accepted  # else written as the answer went out
        if self._exchange.ended(relay.disconnected, reason):
            self._notify(EndReason.DISCONNECTED)
        if unanswered and relay.remembered and self._resumable is not None:
            self._resumable.settled(self._key, answered=False)

    async def answered(self, relay: StreamRelay) -> bool:
        """The stream's answer is about to go out: its record first, durably (see
        `Exchange.answer`); False if it could be kept nowhere."""
        if self._exchange.record.accepted:
            return True
        durable = await self._exchange.write()
        if relay.remembered and self._resumable is not None:
            # the client got this answer (or the gateway's error in its place): a replay of
            # the upstream's answer is delivered again only if that was the answer itself
            self._resumable.settled(self._key, answered=durable and relay.answered)
        return durable
