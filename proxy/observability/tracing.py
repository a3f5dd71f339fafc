"""Traces (`observability.otlp_endpoint`; the `tollhouse[otel]` extra): OpenTelemetry spans as
the MCP semantic conventions name them, exported over OTLP/HTTP.

One SERVER span per inbound MCP request or notification, named `{mcp.method.name} {target}`
(the tool of a `tools/call`, the prompt of a `prompts/get`), from the moment the HTTP request
arrived to the moment it is answered (a stream's end); one CLIENT span per upstream request it
makes, a child of it; each policy's decision an event of the SERVER span, recorded by the
chain runner (`proxy.chain`). The parent is the context in `params._meta` (`traceparent`,
`tracestate`, `baggage`, unprefixed), else the one in the HTTP headers; with both, the
headers' is a link. The upstream request carries the CLIENT span's context in its headers and
in its `params._meta`, on every leg (the era bridges too).

Only this module imports OpenTelemetry, and only `proxy.runtime.app` imports it, when tracing is on.
Spans are exported by a BatchSpanProcessor, on its own thread, never on the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import (
    Link,
    Span,
    SpanKind,
    Status,
    StatusCode,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from proxy import __version__
from proxy.audit.record import AuditRecord
from proxy.chain import Rewrite
from proxy.config import ObservabilityConfig
from proxy.errors import GatewayError
from proxy.jsonrpc import McpMessage
from proxy.traced import CURRENT
from proxy.upstream import UpstreamRoute

PROPAGATOR = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
CARRIED = ("traceparent", "tracestate", "baggage")
MAX_VALUE = 128  # a caller-chosen value in a span name or attribute is cut to this
DECISION = "tollhouse.policy.decision"  # the span event of one policy's decision
EXPORT_TIMEOUT_S = 5.0  # one export, its retries included: bounds a shutdown's last export
_RESOURCE_METHODS = frozenset({"resources/read", "resources/subscribe", "resources/unsubscribe"})


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of `observability.otlp_endpoint`: a base URL (the collector's
    `http://host:4318`) gets `/v1/traces`; a URL already ending so is used as it is."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else f"{endpoint}/v1/traces"


class Tracing:
    """The Observer that makes the spans; `exporter` replaces the OTLP/HTTP one (tests)."""

    def __init__(self, cfg: ObservabilityConfig, exporter: SpanExporter | None = None) -> None:
        self.provider = TracerProvider(resource=Resource.create({
            "service.name": cfg.service_name, "service.version": __version__}))
        self.provider.add_span_processor(BatchSpanProcessor(
            exporter or OTLPSpanExporter(endpoint=traces_url(cfg.otlp_endpoint),
                                         timeout=EXPORT_TIMEOUT_S)))
        self.tracer = self.provider.get_tracer("tollhouse", __version__)
        self._calls: dict[int, CallSpans] = {}  # id(record) -> its spans, until `end`

    def begin(self, record: AuditRecord) -> None:
        return None  # the span starts at the record's time, once the message is parsed

    def parsed(self, record: AuditRecord, msg: McpMessage, headers: Mapping[str, str],
               peer: str | None) -> str | None:
        if msg.kind == "response" or msg.method is None:
            CURRENT.set(None)  # a client's answer to a server's request: no MCP operation
            return None
        parent, link = _parent(msg, headers)
        name = _span_name(msg)
        attributes: dict[str, Any] = {"mcp.method.name": msg.method,
                                      "network.transport": "tcp",
                                      "network.protocol.name": "http"}
        _target(msg, attributes)
        if record.request_id is not None:
            attributes["jsonrpc.request.id"] = _cut(record.request_id)
        version = headers.get("mcp-protocol-version") or _requested_version(msg)
        if version:
            attributes["mcp.protocol.version"] = _cut(version)
        if peer:
            attributes["client.address"] = peer
        span = self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER,
                                      attributes=attributes, links=link,
                                      start_time=int(record.ts * 1e9))
        call = CallSpans(self, span, set_span_in_context(span, parent), name)
        self._calls[id(record)] = call
        CURRENT.set(call)
        return format(span.get_span_context().trace_id, "032x")  # the record's, by its Exchange

    def results(self, msg: McpMessage, record: AuditRecord, rewrite: Rewrite | None
                ) -> Rewrite | None:
        return rewrite

    def end(self, record: AuditRecord) -> None:
        call = self._calls.pop(id(record), None)
        if call is not None:
            call.finish(record)

    def force_flush(self) -> bool:
        """Export what has ended (blocking: a test's, or shutdown's, on a thread)."""
        return self.provider.force_flush()

    def shutdown(self) -> None:
        self.provider.shutdown()  # exports what is left, then stops the export thread


class CallSpans:
    """One inbound message's SERVER span, and the CLIENT span of its upstream request now
    (`proxy.traced.CallTrace`)."""

    __slots__ = ("_tracing", "client", "context", "name", "span")

    def __init__(self, tracing: Tracing, span: Span, context: Context, name: str) -> None:
        self._tracing = tracing
        self.span = span
        self.context = context  # the SERVER span's: what the CLIENT spans are children of
        self.name = name
        self.client: Span | None = None

    def decided(self, policy: str, denial: GatewayError | None) -> None:
        if denial is None:
            self.span.add_event(DECISION, {"tollhouse.policy.name": policy,
                                           "tollhouse.policy.decision": "allow"})
            return
        self.span.add_event(DECISION, {
            "tollhouse.policy.name": policy, "tollhouse.policy.decision": "deny",
            "tollhouse.policy.reason": _cut(denial.audit_reason or ""),
            "error.type": denial.error_type})

    def upstream(self, route: UpstreamRoute, msg: McpMessage, headers: list[tuple[str, str]],
                 body: bytes) -> tuple[list[tuple[str, str]], bytes]:
        if self.client is not None:  # a retry: the first request is over
            self.client.end()
        attributes: dict[str, Any] = {"mcp.method.name": msg.method or "",
                                      "network.transport": "tcp",
                                      "network.protocol.name": "http",
                                      "server.address": route.url.host,
                                      "server.port": route.url.port or (
                                          443 if route.url.scheme == "https" else 80)}
        _target(msg, attributes)
        if msg.kind == "request":
            attributes["jsonrpc.request.id"] = _cut(_id_text(msg.id))
        version = next((v for k, v in headers if k == "mcp-protocol-version"), None)
        if version:
            attributes["mcp.protocol.version"] = version
        client = self.client = self._tracing.tracer.start_span(
            self.name, context=self.context, kind=SpanKind.CLIENT, attributes=attributes)
        carrier: dict[str, str] = {}
        PROPAGATOR.inject(carrier, context=set_span_in_context(client, self.context))
        return [*headers, *carrier.items()], _with_meta(msg, body, carrier)

    def finish(self, record: AuditRecord) -> None:
        span, now = self.span, time.time_ns()
        if record.session_hash is not None and record.era == "legacy":
            span.set_attribute("mcp.session.id", record.session_hash)  # never the id itself
        error = record.error_type
        if error:
            _failed(span, error, record.error_message or record.denied_reason)
        client = self.client
        if client is not None:
            failure = record.failure
            kind = failure.upstream_kind if failure is not None else None
            if kind == "http_status":
                kind = str(getattr(failure, "status", "")) or kind
            if kind or error:
                _failed(client, kind or error or "", record.error_message)
            client.end(now)
        span.end(now)


def _parent(msg: McpMessage, headers: Mapping[str, str]) -> tuple[Context, list[Link] | None]:
    """The parent context: `params._meta`'s when it has a valid traceparent, else the HTTP
    headers'; with both, a link to the headers' (the transport's) context."""
    meta = msg.params.get("_meta") if msg.params is not None else None
    from_headers = PROPAGATOR.extract(headers) if "traceparent" in headers else Context()
    if isinstance(meta, dict) and isinstance(meta.get("traceparent"), str):
        carrier = {k: v for k in CARRIED if isinstance(v := meta.get(k), str)}
        from_meta = PROPAGATOR.extract(carrier)
        if get_current_span(from_meta).get_span_context().is_valid:
            transport = get_current_span(from_headers).get_span_context()
            return from_meta, [Link(transport)] if transport.is_valid else None
    return from_headers, None


def _span_name(msg: McpMessage) -> str:
    method = _cut(msg.method or "")
    target = _target_name(msg)
    return f"{method} {_cut(target)}" if target else method


def _target_name(msg: McpMessage) -> str | None:
    if msg.method in ("tools/call", "prompts/get") and msg.params is not None:
        name = msg.params.get("name")
        return name if isinstance(name, str) and name else None
    return None


def _target(msg: McpMessage, attributes: dict[str, Any]) -> None:
    """The conventions' target attributes: the tool, the prompt, the resource."""
    name = _target_name(msg)
    if msg.method == "tools/call" and name:
        attributes["gen_ai.tool.name"] = _cut(name)
        attributes["gen_ai.operation.name"] = "execute_tool"
    elif msg.method == "prompts/get" and name:
        attributes["gen_ai.prompt.name"] = _cut(name)
    elif msg.method in _RESOURCE_METHODS and msg.params is not None:
        uri = msg.params.get("uri")
        if isinstance(uri, str):
            attributes["mcp.resource.uri"] = uri[:1024]


def _failed(span: Span, error: str, message: str | None) -> None:
    span.set_attribute("error.type", error)
    if error.startswith("-") and error[1:].isdigit():  # a JSON-RPC error code
        span.set_attribute("rpc.response.status_code", error)
    span.set_status(Status(StatusCode.ERROR, _cut(message) if message else None))


def _with_meta(msg: McpMessage, body: bytes, carrier: dict[str, str]) -> bytes:
    """The upstream request with the trace context in `params._meta` (unprefixed keys, as
    the conventions say), built from the message already parsed when the body is the one the
    caller sent, else (a bridge's rewrite) from that body."""
    if body is msg.body:
        obj: dict[str, Any] = {"jsonrpc": "2.0", "method": msg.method}
        if msg.kind == "request":  # a notification has no id, not a null one
            obj["id"] = msg.id
        params = msg.params
    else:
        obj = orjson.loads(body)
        params = obj.get("params")
    out = dict(params) if isinstance(params, dict) else {}
    meta = out.get("_meta")
    out["_meta"] = {**meta, **carrier} if isinstance(meta, dict) else carrier
    obj["params"] = out
    return orjson.dumps(obj)


def _requested_version(msg: McpMessage) -> str | None:
    version = (msg.params or {}).get("protocolVersion") if msg.method == "initialize" else None
    return version if isinstance(version, str) else None


def _id_text(value: object) -> str:
    return value if isinstance(value, str) else str(value)


def _cut(value: str) -> str:
    return value if len(value) <= MAX_VALUE else value[:MAX_VALUE]
