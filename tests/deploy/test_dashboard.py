"""deploy/grafana/tollhouse.json: valid JSON whose every query parses as PromQL and asks only
for the metrics, and the labels, that issue 15 names (item 1), and that shows each of them."""

from __future__ import annotations

import json
import re
from typing import Any

import promql_parser as promql
import pytest

from tests.deploy.files import DEPLOY

_MCP_LABELS = frozenset({"endpoint", "mcp_method_name", "gen_ai_tool_name", "error_type"})
# metric -> its labels; histograms also have _bucket (with le), _sum and _count
METRICS: dict[str, frozenset[str]] = {
    "mcp_server_operation_duration_seconds": _MCP_LABELS,
    "mcp_client_operation_duration_seconds": _MCP_LABELS,
    "mcp_server_session_duration_seconds": frozenset({"endpoint"}),
    "tollhouse_calls_in_flight": frozenset(),
    "tollhouse_sessions_active": frozenset({"era"}),
    "tollhouse_denials_total": frozenset({"policy", "reason"}),
    "tollhouse_rate_limit_refusals_total": frozenset(),
    "tollhouse_upstream_failures_total": frozenset({"kind"}),
    "tollhouse_audit_queue_depth": frozenset(),
    "tollhouse_audit_fallback_writes_total": frozenset(),
    "tollhouse_usage_outbox_depth": frozenset(),
    "tollhouse_usage_outbox_oldest_age_seconds": frozenset(),
    "tollhouse_metering_hook_duration_seconds": frozenset(),
    "tollhouse_state_store_up": frozenset(),
    "tollhouse_database_up": frozenset(),
}
HISTOGRAMS = frozenset({"mcp_server_operation_duration_seconds",
                        "mcp_client_operation_duration_seconds",
                        "mcp_server_session_duration_seconds",
                        "tollhouse_metering_hook_duration_seconds"})
TARGET_LABELS = frozenset({"instance", "job"})  # what Prometheus adds to every series
# Grafana's own variables, as Grafana substitutes them before Prometheus sees the query
_GRAFANA = {"$__rate_interval": "1m", "$__interval": "30s", "$__range": "1h"}


def metric_of(series: str) -> tuple[str, frozenset[str]] | None:
    """The metric a series name belongs to, and the labels a query may use on it."""
    if series in METRICS and series not in HISTOGRAMS:
        return series, METRICS[series]
    for histogram in HISTOGRAMS:
        for suffix, extra in (("_bucket", {"le"}), ("_sum", set()), ("_count", set())):
            if series == histogram + suffix:
                return histogram, METRICS[histogram] | extra
    return None


def query_problems(expr: str) -> tuple[set[str], list[str]]:
    """(the metrics `expr` reads, what is wrong with it)."""
    for variable, value in _GRAFANA.items():
        expr = expr.replace(variable, value)
    try:
        tree = promql.parse(expr)
    except ValueError as exc:
        return set(), [f"not PromQL: {exc}"]
    used: set[str] = set()
    problems: list[str] = []
    selectors: list[tuple[str, frozenset[str]]] = []
    grouping: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql.VectorSelector):
            known = metric_of(node.name or "")
            if known is None:
                problems.append(f"unknown metric {node.name}")
                return
            used.add(known[0])
            selectors.append(known)
            for matcher in node.matchers.matchers:
                if matcher.name not in known[1] | TARGET_LABELS:
                    problems.append(f"{node.name} has no label {matcher.name}")
        elif isinstance(node, promql.AggregateExpr) and node.modifier is not None:
            grouping.extend(node.modifier.labels)
        elif isinstance(node, promql.BinaryExpr) and node.modifier is not None \
                and node.modifier.matching is not None:
            grouping.extend(node.modifier.matching.labels)

    promql.walk(tree, visit)
    available = frozenset().union(*(labels for _, labels in selectors)) | TARGET_LABELS
    for label in grouping:
        if label not in available:
            problems.append(f"grouping by {label}, which none of {sorted(used)} has")
    return used, problems


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DEPLOY / "grafana" / "tollhouse.json").read_text("utf-8"))
    return loaded


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    flat = []
    for panel in dashboard["panels"]:
        flat.append(panel)
        flat.extend(panel.get("panels", []))
    return flat


def _queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    found = [(panel["title"], target["expr"]) for panel in _panels(dashboard)
             for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((\w+), *(\w+)\)", variable["query"]["query"])
            assert match, variable["query"]
            found.append((f"${variable['name']}", (f"count by ({match.group(2)}) "
                                                  f"({match.group(1)})")))
    return found


def test_every_query_parses_and_reads_only_the_named_metrics() -> None:
    dashboard = _dashboard()
    problems: list[str] = []
    for where, expr in _queries(dashboard):
        problems.extend(f"{where}: {p}" for p in query_problems(expr)[1])
    assert problems == []


def test_every_named_metric_is_on_the_dashboard() -> None:
    shown: set[str] = set()
    for _, expr in _queries(_dashboard()):
        shown |= query_problems(expr)[0]
    assert shown == set(METRICS)


def test_the_reader_catches_a_misnamed_metric_or_label() -> None:
    assert query_problems('sum(rate(tollhouse_denials_total{user="x"}[5m]))')[1] == [
        "tollhouse_denials_total has no label user"]
    assert query_problems("tollhouse_calls_inflight")[1] == [
        "unknown metric tollhouse_calls_inflight"]
    assert query_problems("tollhouse_calls_in_flight_bucket")[1] == [
        "unknown metric tollhouse_calls_in_flight_bucket"]
    assert query_problems("sum by (endpoint) (tollhouse_calls_in_flight)")[1] == [
        "grouping by endpoint, which none of ['tollhouse_calls_in_flight'] has"]
    assert query_problems("sum(rate(tollhouse_denials_total[5m])")[1][0].startswith("not PromQL")
    used, problems = query_problems(
        "histogram_quantile(0.95, sum by (le, endpoint) "
        "(rate(mcp_client_operation_duration_seconds_bucket[$__rate_interval])))")
    assert (used, problems) == ({"mcp_client_operation_duration_seconds"}, [])


def test_the_dashboard_is_importable() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] == "tollhouse" and dashboard["title"] == "Tollhouse"
    assert isinstance(dashboard["schemaVersion"], int)
    panels = _panels(dashboard)
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert "datasource" in variables
    for panel in panels:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]
            for target in panel["targets"]:
                for variable in re.findall(r"\$(\w+)", target["expr"]):
                    assert variable.startswith("__") or variable in variables, variable
    # no two panels overlap on Grafana's 24-column grid
    boxes = [panel["gridPos"] for panel in panels]
    for i, a in enumerate(boxes):
        assert a["x"] + a["w"] <= 24
        for b in boxes[i + 1:]:
            overlap = (a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"]
                       and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"])
            assert not overlap, (a, b)


@pytest.mark.parametrize("series, metric", [
    ("mcp_server_operation_duration_seconds_count", "mcp_server_operation_duration_seconds"),
    ("tollhouse_metering_hook_duration_seconds_bucket", "tollhouse_metering_hook_duration_seconds"),
    ("tollhouse_denials_total", "tollhouse_denials_total"),
])
def test_series_names_map_to_their_metric(series: str, metric: str) -> None:
    known = metric_of(series)
    assert known is not None and known[0] == metric
    assert metric_of(metric) is None or metric not in HISTOGRAMS
