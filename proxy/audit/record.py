"""One audit record per JSON-RPC request (and per GET and DELETE), the sink interface, and
`MemoryAuditSink` for tests. A record never holds a token, a header value or an argument."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Literal, Protocol

import orjson

if TYPE_CHECKING:
    from proxy.errors import GatewayError

Status = Literal["ok", "denied", "error", "cancelled"]


@dataclass(slots=True)
class AuditRecord:
    """What happened to one JSON-RPC request. Never a token, a header value or an argument."""

    endpoint: str
    method: str | None = None
    request_id: str | None = None
    principal: str = ""
    tool: str | None = None
    status: Status = "ok"
    denied_reason: str | None = None
    error_message: str | None = None
    duration_ms: float = 0.0
    bytes_in: int = 0
    bytes_out: int = 0
    era: str = "legacy"
    session_hash: str | None = None
    client_name: str | None = None  # modern requests' clientInfo.name: display only
    call_id: str | None = None  # set on metered calls: the usage event's idempotency key
    note: str | None = None  # e.g. a metering hook that failed and on_error allowed the call
    egress: dict[str, Any] | None = None  # an egress denial's audit object (seed 000)
    upstream: str | None = None  # a per-caller upstream: the origin this caller resolved to
    policy: dict[str, Any] | None = None  # the Cedar decision (policies.cedar.gate): version,
    # decision, deciding policy ids, the shadow decision and its policies
    # who acted for the principal (RFC 8693 `act`: an agent client, `client:<id>`), if anyone
    actor: str | None = None
    ts: float = field(default_factory=time.time)
    # -- for metrics and the request log line only: never written to the audit log ---------
    error_type: str | None = None  # the OpenTelemetry MCP conventions' error.type
    failure: GatewayError | None = None  # what the gateway answered with, when it refused
    upstream_started: float = 0.0  # perf_counter when the upstream leg began (0: none)
    http_status: int = 200
    trace_id: str = ""  # the W3C trace id the request came with, if any
    # a task-run tools/call: the task it created (proxy/mcp/tasks.py), for its usage event;
    # the audit log has it in the note
    task: str | None = None
    # when an in-process metering hook took the usage event at once (proxy/audit/outbox.py,
    # OutboxWorker.deliver_now): its outbox row goes in delivered. Not kept in the journal or
    # the fallback file, so a record replayed after a crash is delivered again (at least once)
    delivered_at: float | None = field(default=None, repr=False, compare=False)
    # set once the record is handed to a sink: it is not changed, nor handed over again, after
    accepted: bool = field(default=False, repr=False, compare=False)

    def fail(self, exc: GatewayError) -> None:
        """Record how the request failed or was refused: the one place a failure becomes audit
        fields, for the JSON answer and the last event of a stream alike."""
        self.status = exc.audit_status
        self.failure = exc
        self.error_type = exc.error_type
        if exc.policy is not None:
            self.policy = exc.policy
        if exc.data and isinstance(exc.data.get("audit"), dict):  # an egress denial's object
            self.egress = exc.data["audit"]
        if exc.audit_status == "denied":
            self.denied_reason = exc.audit_reason
        else:
            self.error_message = exc.audit_reason

    def as_dict(self) -> dict[str, Any]:
        """The audit log's fields (the fallback file's and the journal's line)."""
        return dict(zip(PERSISTED, _persisted(self), strict=True))

    def usage_event(self) -> dict[str, Any]:
        """The webhook's fixed `usage` shape; a call run as a task adds `task`, its id, and
        one made by an agent for a person `actor`, the agent."""
        event: dict[str, Any] = {
            "type": "usage", "call_id": self.call_id, "principal": self.principal,
            "endpoint": self.endpoint, "tool": self.tool, "status": self.status,
            "duration_ms": round(self.duration_ms, 3), "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out, "error": self.error_message or self.denied_reason,
            "at": self.ts}
        if self.task is not None:
            event["task"] = self.task
        if self.actor is not None:  # an agent acting for the principal
            event["actor"] = self.actor
        return event


_IN_PROCESS = frozenset({"error_type", "failure", "upstream_started", "http_status",
                         "trace_id", "accepted", "delivered_at", "task"})
PERSISTED = tuple(f.name for f in fields(AuditRecord) if f.name not in _IN_PROCESS)
# every persisted field of a record in one C call (as_dict runs for each record's journal line
# on the event loop: a comprehension of getattr calls was ~200 bytecodes of every call)
_persisted = attrgetter(*PERSISTED)


class AuditSink(Protocol):
    def emit(self, record: AuditRecord) -> None:
        """Accept a record without blocking; once accepted it is not lost on a clean shutdown."""

    def write(self, record: AuditRecord) -> Awaitable[bool]:
        """Accept a record without blocking; the awaitable is True once the record is durable
        (a crash of the process no longer loses it), False if it could be kept nowhere."""

    async def settled(self) -> None:
        """Return once every record accepted before the call is where audit queries read."""

    async def close(self) -> None:
        """Write everything accepted, then stop."""


class MemoryAuditSink:
    """For tests: records in a list, and an event to await a given count without sleeping."""

    def __init__(self) -> None:
        self.records: list[AuditRecord] = []
        self._waiters: list[tuple[int, Any]] = []

    def emit(self, record: AuditRecord) -> None:
        self.records.append(record)
        for count, fut in list(self._waiters):
            if len(self.records) >= count and not fut.done():
                fut.set_result(None)

    def write(self, record: AuditRecord) -> Awaitable[bool]:
        self.emit(record)
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        done.set_result(True)
        return done

    async def wait_for(self, count: int, timeout: float = 5.0) -> list[AuditRecord]:
        if len(self.records) < count:
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append((count, fut))
            await asyncio.wait_for(fut, timeout)
        return self.records

    async def settled(self) -> None:
        return None  # a record is in the list once accepted

    async def close(self) -> None:
        return None


def id_text(request_id: Any) -> str:
    """A request id as the audit log stores it."""
    return request_id if isinstance(request_id, str) else orjson.dumps(request_id).decode()
