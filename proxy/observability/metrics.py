"""Prometheus metrics, named after the OpenTelemetry MCP semantic conventions where they
define one (`mcp.server.operation.duration` -> `mcp_server_operation_duration_seconds`), and
Tollhouse's own `tollhouse_*`.

No label carries a caller, a key, a session or any value a caller chooses freely:
- `endpoint`: a configured endpoint (the route table, not the request path);
- `mcp_method_name`: a method the MCP specification defines, else `_OTHER`;
- `gen_ai_tool_name` (tools/call only): a tool the endpoint listed in the last tools/list
  this process relayed (at most `MAX_TOOLS` an endpoint), else `_OTHER`;
- `error_type`: a JSON-RPC code in the reserved range or -1, `tool_error`, an HTTP status
  400-599, or `_OTHER`; empty for a success.

Every label set is cached as its child, so a call costs a tuple, a dict lookup and the
observation. With `[server] workers` > 1 each worker writes its values to the run's
multiprocess directory (`PROMETHEUS_MULTIPROC_DIR`, made by the supervisor) and a scrape on any
worker reports the sum over all of them.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from proxy.audit.record import AuditRecord
from proxy.chain import Rewrite
from proxy.jsonrpc import McpMessage

OTHER = "_OTHER"
MAX_TOOLS = 1000  # tool names remembered per endpoint; beyond: _OTHER
MAX_TOOL_NAME = 128  # the MCP specification's own limit on a tool name
# the conventions' advisory buckets for the mcp.*.duration histograms
DURATION_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
HOOK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
SESSION_BUCKETS = (1, 10, 60, 300, 900, 1800, 3600, 7200, 14400, 43200, 86400)
MCP_METHODS = frozenset({
    "initialize", "ping", "completion/complete", "elicitation/create", "logging/setLevel",
    "prompts/get", "prompts/list", "resources/list", "resources/read", "resources/subscribe",
    "resources/templates/list", "resources/unsubscribe", "roots/list",
    "sampling/createMessage", "tools/call", "tools/list", "tasks/get", "tasks/list",
    "tasks/result", "tasks/cancel", "server/discover", "subscriptions/listen",
    "notifications/cancelled", "notifications/initialized", "notifications/message",
    "notifications/progress", "notifications/prompts/list_changed",
    "notifications/resources/list_changed", "notifications/resources/updated",
    "notifications/roots/list_changed", "notifications/tools/list_changed",
    "GET", "DELETE",  # the gateway's own names for the bodyless requests of the legacy era
})
LABELS = ("endpoint", "mcp_method_name", "gen_ai_tool_name", "error_type")
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")

Key = tuple[str, str, str, str]


def multiprocess_dir() -> str | None:
    """The run's multiprocess directory when this process is one of several workers."""
    return os.environ.get(MULTIPROC_ENV) or None


def bounded_error(error_type: str | None) -> str:
    """`error_type` as a label value from a bounded set."""
    if error_type is None:
        return ""
    if error_type == "tool_error":
        return error_type
    try:
        code = int(error_type)
    except ValueError:
        return OTHER
    if -32768 <= code <= -32000 or code == -1 or 400 <= code <= 599:
        return str(code)
    return OTHER


class Metrics:
    """Every metric of one gateway process, in its own registry (so tests can run several
    gateways in one interpreter)."""

    def __init__(self, registry: CollectorRegistry | None = None,
                 multiproc_dir: str | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.multiproc_dir = multiproc_dir
        r = self.registry
        self.server_duration = Histogram(
            "mcp_server_operation_duration_seconds",
            "MCP request or notification duration as observed on the gateway, from its "
            "arrival until the result or ack is sent", LABELS, buckets=DURATION_BUCKETS,
            registry=r)
        self.client_duration = Histogram(
            "mcp_client_operation_duration_seconds",
            "The upstream leg of an MCP request: from the gateway's send until the upstream's "
            "response is received", LABELS, buckets=DURATION_BUCKETS, registry=r)
        self.session_duration = Histogram(
            "mcp_server_session_duration_seconds",
            "How long an MCP session lasted, from initialize to its DELETE", ["endpoint"],
            buckets=SESSION_BUCKETS, registry=r)
        self.in_flight = Gauge("tollhouse_calls_in_flight",
                               "MCP messages received and not yet answered", ["endpoint"],
                               registry=r, multiprocess_mode="livesum")
        self.sessions_active = Gauge(
            "tollhouse_sessions_active",
            "Live sessions: legacy = Mcp-Session-Id sessions of 2025-11-25 clients; modern = "
            "upstream sessions held for 2026-07-28 callers on legacy upstreams",
            ["era"], registry=r, multiprocess_mode="mostrecent")
        self.denials = Counter("tollhouse_denials_total",
                               "Calls refused, by the policy (or guard) and a bounded reason",
                               ["endpoint", "policy", "reason"], registry=r)
        # the Cedar policies (policies.cedar.gate), per policy id: a bounded set, the admin's
        self.policy_denials = Counter(
            "tollhouse_policy_denials_total",
            "Calls the Cedar policies refused, by the deciding policy (no permit: empty) "
            "and mode (enforce; shadow: what shadow policies would have refused)",
            ["endpoint", "policy", "mode"], registry=r)
        self.policy_errors = Counter(
            "tollhouse_policy_errors_total",
            "Cedar evaluation errors (each refused the call: fail closed)", ["endpoint"],
            registry=r)
        self.policy_shadow_errors = Counter(
            "tollhouse_policy_shadow_errors_total",
            "Calls let through whose shadow evaluation failed (not counted as shadow "
            "denials)", ["endpoint"], registry=r)
        self.rate_limited = Counter("tollhouse_rate_limit_refusals_total",
                                    "Calls refused by a rate limit", ["endpoint"], registry=r)
        self.upstream_failures = Counter("tollhouse_upstream_failures_total",
                                         "Upstream calls that failed, by kind",
                                         ["endpoint", "kind"], registry=r)
        self.audit_depth = Gauge("tollhouse_audit_queue_depth",
                                 "Audit records accepted and not yet written",
                                 registry=r, multiprocess_mode="livesum")
        self.audit_fallback = Counter(
            "tollhouse_audit_fallback_writes",
            "Audit records written to the fallback file because the database refused them",
            registry=r)
        self.outbox_depth = Gauge("tollhouse_usage_outbox_depth",
                                  "Usage events not yet delivered to the metering receiver",
                                  registry=r, multiprocess_mode="mostrecent")
        self.outbox_age = Gauge("tollhouse_usage_outbox_oldest_age_seconds",
                                "Age of the oldest undelivered usage event (0 when none)",
                                registry=r, multiprocess_mode="mostrecent")
        self._export_metrics(r)
        self.hook_duration = Histogram("tollhouse_metering_hook_duration_seconds",
                                       "How long the metering hook took to authorize a call",
                                       buckets=HOOK_BUCKETS, registry=r)
        self.state_store_up = Gauge("tollhouse_state_store_up",
                                    "1 when the live-state store answered its last probe",
                                    registry=r, multiprocess_mode="mostrecent")
        self.database_up = Gauge("tollhouse_database_up",
                                 "1 when the database answered its last probe",
                                 registry=r, multiprocess_mode="mostrecent")
        self._server: dict[Key, Any] = {}
        self._client: dict[Key, Any] = {}
        self._in_flight: dict[str, Any] = {}
        self._errors: dict[str | None, str] = {}
        self._tools: dict[str, set[str]] = {}
        self._upstream: dict[tuple[str, str], Any] = {}
        self._denied: dict[tuple[str, str, str], Any] = {}
        self._reasons: dict[type[Any], str] = {}

    def _export_metrics(self, r: CollectorRegistry) -> None:
        """The audit exports' (proxy.audit.exports), per configured export."""
        self.export_sent = Counter("tollhouse_audit_export_sent_total",
                                   "Audit records the export's receiver took", ["export"],
                                   registry=r)
        self.export_failed = Counter(
            "tollhouse_audit_export_failed_total",
            "Audit records in sends to the export's receiver that failed (each is tried again)",
            ["export"], registry=r)
        self.export_dropped = Counter(
            "tollhouse_audit_export_dropped_total",
            "Audit records not queued for the export because its backlog was full (they stay "
            "in the audit log)", ["export"], registry=r)
        self.export_backlog = Gauge("tollhouse_audit_export_backlog",
                                    "Audit records queued for the export and not yet delivered",
                                    ["export"], registry=r, multiprocess_mode="mostrecent")
        self.export_lag = Gauge(
            "tollhouse_audit_export_lag_seconds",
            "Age of the oldest audit record not yet delivered to the export (0 when none)",
            ["export"], registry=r, multiprocess_mode="mostrecent")

    # -- the Observer: the hot path --------------------------------------------------------

    def begin(self, record: AuditRecord) -> None:
        self._gauge(record.endpoint).inc()

    def parsed(self, record: AuditRecord, msg: McpMessage, headers: Mapping[str, str],
               peer: str | None) -> None:
        return None

    def end(self, record: AuditRecord) -> None:
        endpoint = record.endpoint
        self._gauge(endpoint).dec()
        method = record.method
        if method not in MCP_METHODS:
            method = "" if method is None else OTHER
        tool = ""
        if method == "tools/call":
            name = record.tool
            tool = name if name is not None and name in self._tools.get(endpoint, ()) else OTHER
        error = self._errors.get(record.error_type)
        if error is None:
            error = self._errors[record.error_type] = bounded_error(record.error_type)
        key = (endpoint, method, tool, error)
        child = self._server.get(key)
        if child is None:
            child = self._server[key] = self.server_duration.labels(*key)
        child.observe(record.duration_ms / 1000)
        failure = record.failure
        if record.upstream_started:
            self._client_leg(record, key, failure)
        if failure is not None:
            if failure.upstream_kind is not None:
                self._count_upstream(endpoint, failure.upstream_kind)
            if failure.audit_status == "denied":
                self._count_denial(endpoint, failure)
        if record.policy is not None:
            self._count_policy(endpoint, record.policy)

    def _count_policy(self, endpoint: str, decided: dict[str, Any]) -> None:
        if decided.get("errors"):
            self.policy_errors.labels(endpoint).inc()
        if decided.get("decision") == "deny":
            for policy in decided.get("policies") or [""]:
                self.policy_denials.labels(endpoint, policy, "enforce").inc()
        elif decided.get("shadow") == "deny" and decided.get("shadow_errors"):
            self.policy_shadow_errors.labels(endpoint).inc()
        elif decided.get("shadow") == "deny":
            for policy in decided.get("shadow_policies") or [""]:
                self.policy_denials.labels(endpoint, policy, "shadow").inc()

    def results(self, msg: McpMessage, record: AuditRecord, rewrite: Rewrite | None
                ) -> Rewrite | None:
        if msg.method == "tools/list":
            return self._learning(record.endpoint, rewrite)
        return rewrite

    # -- the rest --------------------------------------------------------------------------

    def _gauge(self, endpoint: str) -> Any:
        child = self._in_flight.get(endpoint)
        if child is None:
            child = self._in_flight[endpoint] = self.in_flight.labels(endpoint)
        return child

    def _client_leg(self, record: AuditRecord, key: Key, failure: Any) -> None:
        """The upstream leg: from the send until the answer was received (a stream's end)."""
        if failure is not None and failure.upstream_kind is not None:
            kind = failure.upstream_kind  # what went wrong upstream, not what the caller saw
            if kind == "http_status":
                kind = bounded_error(str(getattr(failure, "status", "")))
            key = (key[0], key[1], key[2], kind)
        child = self._client.get(key)
        if child is None:
            child = self._client[key] = self.client_duration.labels(*key)
        child.observe(max(0.0, time.perf_counter() - record.upstream_started))

    def _count_upstream(self, endpoint: str, kind: str) -> None:
        child = self._upstream.get((endpoint, kind))
        if child is None:
            child = self._upstream[(endpoint, kind)] = self.upstream_failures.labels(
                endpoint, kind)
        child.inc()

    def _count_denial(self, endpoint: str, failure: Any) -> None:
        policy = failure.decided_by or _guard(failure)
        reason = getattr(failure, "tool_code", None) or self._reason(type(failure))
        key = (endpoint, policy, reason)
        child = self._denied.get(key)
        if child is None:
            child = self._denied[key] = self.denials.labels(*key)
        child.inc()
        if reason == "rate_limited":
            self.rate_limited.labels(endpoint).inc()

    def _reason(self, cls: type[Any]) -> str:
        """A bounded reason: the denial's class (a closed set in the code), in snake case."""
        reason = self._reasons.get(cls)
        if reason is None:
            reason = self._reasons[cls] = _CAMEL.sub("_", cls.__name__).lower()
        return reason

    def _learning(self, endpoint: str, rewrite: Rewrite | None) -> Rewrite:
        """Remember the tools a tools/list result names (before any policy filters it)."""
        known = self._tools.setdefault(endpoint, set())

        def learn(result: dict[str, Any]) -> bool:
            tools = result.get("tools")
            if isinstance(tools, list):
                for tool in tools:
                    name = tool.get("name") if isinstance(tool, dict) else None
                    if isinstance(name, str) and len(name) <= MAX_TOOL_NAME \
                            and len(known) < MAX_TOOLS:
                        known.add(name)
            return rewrite(result) if rewrite is not None else False

        return learn

    def tools_of(self, endpoint: str) -> frozenset[str]:
        return frozenset(self._tools.get(endpoint, ()))

    def session_ended(self, endpoint: str, created_at: float) -> None:
        """A session DELETEd (an idle-expired one is not seen: nothing tells of it)."""
        self.session_duration.labels(endpoint).observe(max(0.0, time.time() - created_at))

    def render(self) -> bytes:
        """The Prometheus text format: this process's registry, or, as one of several
        workers, the sum over every worker's files (blocking file reads: run off the loop)."""
        if self.multiproc_dir is None:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=self.multiproc_dir)  # type: ignore[no-untyped-call]
        return generate_latest(merged)


def timed(backend: Any, metrics: Metrics | None) -> Any:
    """`backend` with its authorize timed into `metrics` (when there are metrics)."""
    return backend if metrics is None or backend is None else TimedBackend(
        backend, metrics.hook_duration)


class TimedBackend:
    """A metering backend whose `authorize` (the hook's pre-call decision) is timed."""

    def __init__(self, backend: Any, histogram: Histogram) -> None:
        self._backend = backend
        self._histogram = histogram
        self.in_process = bool(getattr(backend, "in_process", False))
        self.record = backend.record  # not timed: no coroutine of its own around the backend's

    async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            answer: dict[str, Any] = await self._backend.authorize(request)
            return answer
        finally:
            self._histogram.observe(time.perf_counter() - started)


def _guard(failure: Any) -> str:
    """Which guard refused, for a denial no policy raised."""
    name = type(failure).__name__
    if name in ("Unauthenticated", "Forbidden", "LockedOut"):
        return "auth"
    if name == "OriginNotAllowed":
        return "origin"
    if name == "SessionNotFound":
        return "session"
    return "edge"
