"""The seam between the request path and tracing (`proxy.observability.tracing`), free of
OpenTelemetry so the path imports nothing of it when tracing is off.

While tracing is on, the tracer sets `CURRENT` to the inbound message's `CallTrace` as the
message is parsed (the request's own task); the chain runner tells it each policy's decision
and the forwarder hands it each upstream request to carry the trace on. Off, `CURRENT` is
never set: the path pays one context-variable read where it would trace.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from proxy.errors import GatewayError
    from proxy.jsonrpc import McpMessage
    from proxy.upstream import UpstreamRoute


class CallTrace(Protocol):
    def decided(self, policy: str, denial: GatewayError | None) -> None:
        """A policy allowed the message (`denial` None) or denied it."""

    def upstream(self, route: UpstreamRoute, msg: McpMessage, headers: list[tuple[str, str]],
                 body: bytes) -> tuple[list[tuple[str, str]], bytes]:
        """One upstream request for this message begins: the headers and body to send,
        carrying the trace context (in the headers and in `params._meta`)."""


CURRENT: ContextVar[CallTrace | None] = ContextVar("tollhouse_trace", default=None)
