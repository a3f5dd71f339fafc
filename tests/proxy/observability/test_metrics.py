"""The metrics' labels stay bounded whoever calls and whatever they send, and error_type is
what the OpenTelemetry MCP conventions define. The instrumentation is called directly, as the
gateway's spine calls it (Metrics.begin/end/results), so 10,000 callers take a second."""

from __future__ import annotations

import random
import secrets
from pathlib import Path

import orjson
from prometheus_client.parser import text_string_to_metric_families

from proxy.audit.record import AuditRecord, MemoryAuditSink
from proxy.errors import (
    BodyTooLarge,
    Forbidden,
    HiddenTool,
    InvalidParams,
    MethodNotFound,
    ParseError,
    RateLimited,
    SessionNotFound,
    ToolResultDenial,
    UpstreamHTTPError,
    UpstreamRejected,
    UpstreamTimeout,
)
from proxy.mcp.exchange import Exchange
from proxy.observability import Observers
from proxy.observability.metrics import MAX_TOOLS, OTHER, Metrics, bounded_error
from tests.builders import message

SERVER = "mcp_server_operation_duration_seconds"
TOOLS = [f"tool_{i}" for i in range(50)]


def _series(metrics: Metrics, name: str) -> set[tuple[tuple[str, str], ...]]:
    """The distinct label sets of one histogram (its _count samples)."""
    text = metrics.render().decode()
    return {tuple(sorted(s.labels.items())) for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == f"{name}_count"}


def _listed(metrics: Metrics, endpoint: str, names: list[str]) -> None:
    """A tools/list result relayed on `endpoint`, as the relay applies the rewrite."""
    rewrite = metrics.results(message("tools/list"), AuditRecord(endpoint=endpoint), None)
    assert rewrite is not None
    assert rewrite({"tools": [{"name": n, "inputSchema": {}} for n in names]}) is False


def _call(metrics: Metrics, endpoint: str, method: str | None, tool: str | None,
          principal: str, error_type: str | None = None, upstream: bool = True) -> None:
    record = AuditRecord(endpoint=endpoint, method=method, tool=tool, principal=principal,
                         session_hash=secrets.token_hex(8), request_id=principal)
    metrics.begin(record)
    record.upstream_started = 1.0 if upstream else 0.0
    record.duration_ms = 3.0
    record.error_type = error_type
    metrics.end(record)


def test_ten_thousand_callers_fifty_tools_and_junk_stay_within_the_bound() -> None:
    metrics = Metrics()
    _listed(metrics, "github", TOOLS)
    rng = random.Random(7)
    callers = [f"user-{i}@example.com" for i in range(10_000)]
    errors = [None, None, None, "tool_error", "-32602", "-32000", "-32603", "-1"]
    for i, caller in enumerate(callers):
        tool = rng.choice(TOOLS) if i % 3 else f"unknown-{secrets.token_hex(6)}"
        _call(metrics, "github", "tools/call", tool, caller, rng.choice(errors))
        if i % 10 == 0:  # junk a caller can send: an unknown method, an upstream's own code
            _call(metrics, "github", f"x/{secrets.token_hex(4)}", None, caller,
                  str(rng.randint(-99999, 99999)))
    series = _series(metrics, SERVER)
    # the bound: tools/call x (50 listed + _OTHER) x 8 error types (7 distinct, incl. none),
    # plus _OTHER methods x error types in the bounded set (at most 7 + _OTHER)
    tools_call = {s for s in series if ("mcp_method_name", "tools/call") in s}
    assert {dict(s)["gen_ai_tool_name"] for s in tools_call} == {*TOOLS, OTHER}
    assert len(tools_call) <= 51 * 7
    junk = series - tools_call
    assert {dict(s)["mcp_method_name"] for s in junk} == {OTHER}
    assert all(dict(s)["gen_ai_tool_name"] == "" for s in junk)
    assert len(series) <= 51 * 7 + 1 * 8 * 100  # every junk code is a JSON-RPC one or _OTHER
    assert {dict(s)["error_type"] for s in junk} <= {OTHER, *(str(c) for c in range(-32768,
                                                                                    -31999))}
    client = _series(metrics, "mcp_client_operation_duration_seconds")
    assert len(client) <= len(series)
    text = metrics.render().decode()
    for caller in (callers[0], callers[-1], "unknown-"):
        assert caller not in text
    count = sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == f"{SERVER}_count")
    assert count == 10_000 + 1_000  # every call counted, whatever its labels
    in_flight = [s.value for f in text_string_to_metric_families(text) for s in f.samples
                 if s.name == "tollhouse_calls_in_flight"]
    assert in_flight == [0.0]


def test_the_tool_list_is_bounded_per_endpoint() -> None:
    metrics = Metrics()
    _listed(metrics, "e", [f"t{i}" for i in range(MAX_TOOLS + 500)] + ["y" * 200])
    known = metrics.tools_of("e")
    assert len(known) == MAX_TOOLS and "y" * 200 not in known
    assert metrics.tools_of("other") == frozenset()  # learnt per endpoint
    _call(metrics, "other", "tools/call", "t1", "p")
    assert dict(next(iter(_series(metrics, SERVER))))["gen_ai_tool_name"] == OTHER


def test_an_iserror_result_is_tool_error_whichever_observers_are_on() -> None:
    """Marked where the result is seen (the call's exchange), not by the metrics observer:
    the log line and the trace say the same with metrics off (no observer at all here)."""
    record = AuditRecord(endpoint="e", method="tools/call", tool="t")
    exchange = Exchange(record, MemoryAuditSink(), Observers())
    rewrite = exchange.seeing(message("tools/call"), None)
    assert rewrite is not None
    assert rewrite({"content": [], "isError": False}) is False and record.error_type is None
    assert rewrite({"content": [], "isError": True}) is False
    assert record.error_type == "tool_error"


def test_error_type_is_the_jsonrpc_code_tool_error_or_the_status() -> None:
    assert ParseError().error_type == "-32700"
    assert InvalidParams().error_type == "-32602"
    assert MethodNotFound().error_type == "-32601"
    assert BodyTooLarge().error_type == "-32600"
    assert HiddenTool("access: tool x hidden", "x").error_type == "-32602"
    assert RateLimited("rate_limit: r", 1.0).error_type == "-32000"
    assert UpstreamTimeout().error_type == "-32000"
    assert ToolResultDenial("metering: no", "no credits", "gateway.metering.denied"
                            ).error_type == "tool_error"
    assert SessionNotFound().error_type == "404"  # not JSON-RPC shaped: the HTTP status
    assert UpstreamRejected({"code": -32050, "message": "m"}, 200).error_type == "-32050"
    assert [bounded_error(v) for v in (None, "-32602", "-1", "tool_error", "503", "7",
                                       "-40000", "oops")] == [
        "", "-32602", "-1", "tool_error", "503", OTHER, OTHER, OTHER]


def test_denials_failures_and_the_client_leg() -> None:
    metrics = Metrics()
    for exc, decided in ((RateLimited("rate_limit: r", 1.0), "rate_limit"),
                         (Forbidden("auth: key k not for e"), None),
                         (HiddenTool("access: tool x hidden", "x"), "access"),
                         (ToolResultDenial("m", "no", "gateway.metering.denied"), "metering")):
        exc.decided_by = decided
        record = AuditRecord(endpoint="e", method="tools/call", tool="x")
        metrics.begin(record)
        record.fail(exc)
        metrics.end(record)
    for failure in (UpstreamTimeout(), UpstreamHTTPError(502)):
        record = AuditRecord(endpoint="e", method="tools/call", tool="x")
        metrics.begin(record)
        record.upstream_started = 1.0
        record.fail(failure)
        metrics.end(record)
    text = metrics.render().decode()
    found = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for f in text_string_to_metric_families(text) for s in f.samples}
    denial = "tollhouse_denials_total"
    assert found[(denial, (("endpoint", "e"), ("policy", "rate_limit"),
                           ("reason", "rate_limited")))] == 1
    assert found[(denial, (("endpoint", "e"), ("policy", "auth"), ("reason", "forbidden")))] == 1
    assert found[(denial, (("endpoint", "e"), ("policy", "access"),
                           ("reason", "hidden_tool")))] == 1
    assert found[(denial, (("endpoint", "e"), ("policy", "metering"),
                           ("reason", "gateway.metering.denied")))] == 1
    assert found[("tollhouse_rate_limit_refusals_total", (("endpoint", "e"),))] == 1
    kinds = {dict(labels)["kind"]: v for (name, labels), v in found.items()
             if name == "tollhouse_upstream_failures_total"}
    assert kinds == {"timeout": 1, "http_status": 1}
    legs = {dict(labels)["error_type"] for (name, labels), v in found.items()
            if name == "mcp_client_operation_duration_seconds_count"}
    assert legs == {"timeout", "502"}  # what went wrong upstream, not the caller's -32000


async def test_fallback_writes_are_counted(tmp_path: Path) -> None:
    from proxy.audit import DatabaseAuditSink
    from tests import db_backends

    metrics = Metrics()
    fallback = tmp_path / "audit-fallback.jsonl"
    sink = DatabaseAuditSink(db_backends.url(), retry_backoff_s=0.001,
                             fallback_path=str(fallback))
    sink.on_fallback = metrics.audit_fallback.inc
    refused = AuditRecord(endpoint="e", request_id="2", bytes_in=2**70)  # no backend stores it
    refused.fail(UpstreamTimeout())  # its in-process fields never reach the file
    sink.emit(AuditRecord(endpoint="e", request_id="1"))
    sink.emit(refused)
    await sink.close()
    assert metrics.audit_fallback._value.get() == 1
    (line,) = fallback.read_bytes().splitlines()
    assert "failure" not in orjson.loads(line) and "error_type" not in orjson.loads(line)


def _samples(metrics: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = metrics.render().decode()
    return {tuple(sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name}


def test_cedar_decisions_counted_by_kind() -> None:
    """Enforce refusals per deciding policy, shadow refusals per shadow policy, evaluation
    errors, and shadow evaluation errors apart from the shadow refusals."""
    metrics = Metrics()
    for policy in ({"decision": "deny", "policies": ["f1"]},
                   {"decision": "deny", "policies": [], "errors": 1},
                   {"decision": "allow", "policies": ["p"], "shadow": "deny",
                    "shadow_policies": ["s1"]},
                   {"decision": "allow", "policies": ["p"], "shadow": "deny",
                    "shadow_policies": [], "shadow_errors": 1},
                   {"decision": "allow", "policies": ["p"]}):
        metrics.end(AuditRecord(endpoint="e", method="tools/call", policy=policy))
    denials = _samples(metrics, "tollhouse_policy_denials_total")
    assert denials == {
        (("endpoint", "e"), ("mode", "enforce"), ("policy", "f1")): 1.0,
        (("endpoint", "e"), ("mode", "enforce"), ("policy", "")): 1.0,
        (("endpoint", "e"), ("mode", "shadow"), ("policy", "s1")): 1.0}
    assert _samples(metrics, "tollhouse_policy_errors_total") == {(("endpoint", "e"),): 1.0}
    assert _samples(metrics, "tollhouse_policy_shadow_errors_total") == {
        (("endpoint", "e"),): 1.0}
