"""One HTTP exchange at the MCP edge: the edge's plain view of it (`EdgeRequest`,
`EdgeResponse`, free of the web framework) and the one object that owns its audit record's
life (`Exchange`)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from proxy.audit import AuditRecord, AuditSink
from proxy.audit.record import id_text
from proxy.chain import CallContext, Rewrite
from proxy.errors import (
    Cancelled,
    EndpointNotFound,
    GatewayError,
    StoreUnavailable,
    ToolResultDenial,
    render,
)
from proxy.jsonrpc import McpMessage, upstream_error_type
from proxy.observability import Observer
from proxy.observability.logs import trace_id
from proxy.state import Session
from proxy.state.inflight import EndReason

log = logging.getLogger("tollhouse.gateway")

CANCELLED = str(Cancelled.code)  # error_type of a call the client went away from


@dataclass(slots=True)
class EdgeRequest:
    headers: Mapping[str, str]
    read_body: Callable[[], Awaitable[bytes]]
    peer: str | None = None
    duplicated: frozenset[str] = frozenset()  # header names sent more than once
    forwarded: tuple[tuple[str, str], ...] = ()  # every X-Forwarded-For / Forwarded line


@dataclass(slots=True)
class EdgeResponse:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None


class Exchange:
    """One inbound message's audit record, from its arrival to its one write: every way a
    message ends goes through one method here, whoever sees it end (the gateway, a relay):

        answer        an answer, once its record is durable (or 503 when it can be kept nowhere)
        refuse        a refusal: its error rendered, recorded, and answered as above
        disconnected  the client went away before any answer: recorded as cancelled
        done          a message that is not audited (a notification, an unknown endpoint)
        write         a streamed answer about to go out: its record, durably
        ended         a streamed call's end, however it ended (the relay's last step)

    What the call's steps learn on the way is written here too, never into the record by the
    step itself: `seeing` (a tool error, where the result is seen), `fail`, `upstream_error`,
    `noted`, `sent` (what an answer or a stream sent), `joined` (a session), `leg_began` and
    `answered_here` (the upstream leg's clock). The observers are told when it begins and,
    once, when it ends; they read the record and never write it. The record is `accepted` once
    handed to the sink, and not changed after."""

    __slots__ = ("_audit", "_before", "_observer", "record", "started")

    def __init__(self, record: AuditRecord, audit: AuditSink, observer: Observer,
                 started: float | None = None) -> None:
        self.record = record
        # what must hold before the answer goes out (a created task's binding: tasked)
        self._before: Callable[[], Awaitable[None]] | None = None
        # perf_counter when the call began (a resumed answer's: when its call began elsewhere)
        self.started = time.perf_counter() if started is None else started
        self._audit = audit
        self._observer = observer
        observer.begin(record)

    def parsed(self, msg: McpMessage, headers: Mapping[str, str], peer: str | None) -> None:
        """The parsed message's facts on the record (method, tool, id, the trace it carries
        in `_meta`, which wins over the request's), then the observers told; the trace a
        tracer starts for it is the record's."""
        record = self.record
        record.method, record.tool = msg.method, msg.tool
        if msg.kind == "request":
            record.request_id = id_text(msg.id)
        meta = msg.params.get("_meta") if msg.params is not None else None
        if isinstance(meta, dict) and "traceparent" in meta:
            record.trace_id = trace_id(meta["traceparent"]) or record.trace_id
        traced = self._observer.parsed(record, msg, headers, peer)
        if traced is not None:
            record.trace_id = traced

    def decided(self, ctx: CallContext) -> None:
        """What the policies that let the call through tell the audit: the usage event's id,
        a note, the Cedar decision."""
        record = self.record
        record.call_id, record.note, record.policy = ctx.call_id, ctx.audit_note, ctx.policy
        if ctx.approval is not None:  # the approval it used (policies.approvals)
            record.policy = {**(ctx.policy or {}), "approval": ctx.approval}

    def seeing(self, msg: McpMessage, rewrite: Rewrite | None) -> Rewrite | None:
        """`rewrite`, for a tools/call with the result seen first: one with `isError: true`
        makes the record's `error_type` `tool_error` (the conventions' error.type), whichever
        observers are on."""
        if msg.method != "tools/call":
            return rewrite
        record = self.record

        def seen(result: dict[str, Any]) -> bool:
            if result.get("isError") is True:
                record.error_type = "tool_error"
            return rewrite(result) if rewrite is not None else False

        return seen

    # -- what the call's steps learn: written here, until the record is accepted ------------

    def fail(self, exc: GatewayError) -> bool:
        """The call failed on its way (the upstream broke, a stream's answer could not be
        read or was refused, a cancel met mid-stream); False when its record was accepted
        already (and says what the client got)."""
        if self.record.accepted:
            return False
        self.record.fail(exc)
        return True

    def upstream_error(self, error: str | None) -> None:
        """The upstream answered with a JSON-RPC error (`error`, its text)."""
        record = self.record
        record.status, record.error_message = "error", error
        record.error_type = upstream_error_type(error or "")

    def tasked(self, task_id: str, bind: Callable[[], Awaitable[None]]) -> None:
        """The call created a task (`task_id`): its record says so (the note, the usage
        event), and `bind` (its binding to the caller) is done before the answer goes out."""
        record = self.record
        if record.accepted:
            return
        record.task = task_id
        text = f"task {task_id[:100]} created"
        record.note = text if not record.note else f"{record.note}; {text}"
        self._before = bind

    def noted(self, note: str | None) -> None:
        """What the policies noted about the call (a guardrail's finding, a hook's failure)."""
        record = self.record
        if not record.accepted:
            task = f"task {record.task[:100]} created" if record.task is not None else None
            record.note = note if task is None else task if not note else f"{note}; {task}"

    def sent(self, size: int) -> None:
        """The bytes the answer sent (a stream: so far)."""
        if not self.record.accepted:
            self.record.bytes_out = size

    def joined(self, session: Session) -> None:
        """The call's session (one an `initialize` made, too)."""
        self.record.session_hash = session.id_hash

    def leg_began(self) -> None:
        """The upstream leg begins: its time is measured from now."""
        self.record.upstream_started = time.perf_counter()

    def answered_here(self) -> None:
        """The gateway answers itself: no upstream leg to measure."""
        self.record.upstream_started = 0.0

    def _accept(self) -> None:
        self.record.accepted = True  # not changed after this, nor handed to the sink again
        self.record.duration_ms = (time.perf_counter() - self.started) * 1000

    def done(self) -> None:
        """The end of a message that is not audited."""
        self.record.duration_ms = (time.perf_counter() - self.started) * 1000
        self._observer.end(self.record)

    def disconnected(self, reason: EndReason | None = None) -> None:
        """Nobody to answer: the record is written without waiting for it, cancelled (a
        disconnect is a cancellation, seed 004; `reason`, a deliberate end met mid-send). One
        already accepted (a client gone while its answer's record was being written) stands."""
        record = self.record
        if record.accepted:
            return
        if reason is not None:
            record.fail(Cancelled(reason))
        else:
            record.status, record.error_message = "cancelled", EndReason.DISCONNECTED.value
            record.error_type = CANCELLED
        self._accept()
        self._audit.emit(record)
        self._observer.end(record)

    async def answer(self, answer: EdgeResponse, request_id: Any) -> EdgeResponse:
        """`answer` once its record is durable (committed, or in the audit fallback file): a
        client never holds an answer whose audit record and usage event a crash could still
        lose. A record that could be kept nowhere turns the answer into 503 (-32000,
        Retry-After, the gateway's log says why): the client must not take an unrecorded call
        as done."""
        record = self.record
        if record.accepted:
            return answer
        record.http_status = answer.status
        if not await self.write():
            if answer.stream is not None:
                await cast(Any, answer.stream).aclose()
            log.error("/mcp/%s: an answer withheld: its audit record could not be written",
                      record.endpoint)
            status, headers, body = render(StoreUnavailable("the audit log"), request_id)
            answer = EdgeResponse(status, headers, body)
        self._observer.end(record)
        return answer

    async def refuse(self, exc: GatewayError, request_id: Any) -> EdgeResponse:
        """The refusal in its documented shape, recorded (an unknown endpoint: not audited)."""
        record = self.record
        if isinstance(exc, ToolResultDenial) and record.era == "modern":
            exc.result_type = "complete"  # a 2026-07-28 client reads no result without it
        status, headers, body = render(exc, request_id)
        answer = EdgeResponse(status, headers, body)
        if record.accepted:
            return answer
        record.fail(exc)
        record.bytes_out = len(body)
        record.http_status = status
        if isinstance(exc, EndpointNotFound):
            self.done()
            return answer
        return await self.answer(answer, request_id)

    async def write(self) -> bool:
        """Accept the record and write it durably; False if it could be kept nowhere. A
        record accepted already (written, or emitted) is not written again."""
        if self.record.accepted:
            return True
        if self._before is not None:
            try:
                await self._before()
            except GatewayError as exc:  # a task that could not be bound is not handed out
                log.error("/mcp/%s: a created task could not be bound to its caller: %s",
                          self.record.endpoint, exc)
                self.record.fail(exc)
                self._accept()
                self._audit.emit(self.record)
                return False
        self._accept()
        return await self._audit.write(self.record)

    def ended(self, disconnected: bool, reason: EndReason | None) -> bool:
        """A streamed call's end: the record, unless written with its answer, is emitted as
        it stands, or as cancelled when the client went away mid-stream (`reason`: a
        deliberate end met mid-send). True when the upstream must be told of the disconnect.
        The observers are told the call ended."""
        record = self.record
        told = False
        if not record.accepted:
            if disconnected:
                told = reason is None
                self.disconnected(reason)
                return told
            self._accept()
            self._audit.emit(record)
        self._observer.end(record)
        return told
