"""Observability wraps the spine at its two ends (ARCHITECTURE.md): the gateway calls one
`Observer` when an inbound MCP message begins, once it is parsed, and when it ends, and lets
it see the results it relays. Metrics (`metrics`), the request log line (`logs`) and, with
`observability.otlp_endpoint` set, the tracer (`tracing`, the `tollhouse[otel]` extra) are
observers. No policy or store knows about any of it.

`health` answers /healthz and /readyz; `routes` registers those and /metrics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from proxy.audit.record import AuditRecord
from proxy.chain import Rewrite
from proxy.jsonrpc import McpMessage


class Observer(Protocol):
    def begin(self, record: AuditRecord) -> None:
        """An inbound message arrived (its record holds only the endpoint so far)."""

    def end(self, record: AuditRecord) -> None:
        """The message is answered, refused or cancelled; its record is final. Called once
        per `begin`, whether or not the record is audited."""

    def parsed(self, record: AuditRecord, msg: McpMessage, headers: Mapping[str, str],
               peer: str | None) -> str | None:
        """The message is parsed (its method and id are on the record); the HTTP request's
        headers and peer address. Not called for a message refused before it was parsed.
        An observer that starts a trace for the message returns its trace id, which the
        call's `Exchange` puts on the record (observers never write it themselves)."""

    def results(self, msg: McpMessage, record: AuditRecord, rewrite: Rewrite | None
                ) -> Rewrite | None:
        """The rewrite the relay applies to this call's result, wrapped if this observer
        reads results (None, the common case, when nobody rewrites or reads)."""


class Observers:
    """Several observers as one, called in order."""

    __slots__ = ("_all",)

    def __init__(self, observers: Sequence[Observer] = ()) -> None:
        self._all = tuple(observers)

    def add(self, observer: Observer) -> None:
        self._all = (*self._all, observer)

    def begin(self, record: AuditRecord) -> None:
        for o in self._all:
            o.begin(record)

    def end(self, record: AuditRecord) -> None:
        for o in self._all:
            o.end(record)

    def parsed(self, record: AuditRecord, msg: McpMessage, headers: Mapping[str, str],
               peer: str | None) -> str | None:
        traced = None
        for o in self._all:
            traced = o.parsed(record, msg, headers, peer) or traced
        return traced

    def results(self, msg: McpMessage, record: AuditRecord, rewrite: Rewrite | None
                ) -> Rewrite | None:
        for o in self._all:
            rewrite = o.results(msg, record, rewrite)
        return rewrite


__all__ = ["Observer", "Observers"]
