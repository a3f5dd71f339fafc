"""The audit log (/console/audit), one record (/console/audit/<id>) and usage
(/console/usage): every filter in the page's URL (a view can be shared), periods in people's
times (proxy.console.times), principals by name (proxy.console.names), and every endpoint,
tool, principal and status on them a link that filters by it."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlencode

from quart import Response, request

from proxy.console import charts, times
from proxy.console.api import call
from proxy.console.names import names
from proxy.console.render import render
from proxy.people.accounts import User
from proxy.people.signin import Web

AUDIT_FILTERS = ("status", "endpoint", "principal", "tool")
AUDIT_PAGE = 50
STATUSES = ("ok", "denied", "error", "cancelled")
PERIODS = {"hour": 3600, "day": 86400, "week": 7 * 86400}
# the usage page's table: the busiest principal, endpoint and tool totals of the period (the
# API sorts them all and sends these: a week at size has 7,500)
USAGE_ROWS = 100  # (each row's links and names: 200 of them made a page of 140 KB)


def _minute() -> float:
    """The end of this minute: periods end there, so that the API's aggregate of a query
    (cached for seconds) serves every reload within the minute."""
    return float((int(time.time()) // 60 + 1) * 60)


class Links:
    """Links to the audit log (or usage) with this page's filters and one more."""

    def __init__(self, page: str, kept: dict[str, str]) -> None:
        self.page, self.kept = page, kept

    def __call__(self, key: str, value: Any, **more: Any) -> str:
        args = {**self.kept, key: str(value), **{k: str(v) for k, v in more.items()}}
        args.pop("cursor", None)
        return f"{self.page}?{urlencode(args)}"

    def without(self, *keys: str) -> str:
        return f"{self.page}?{urlencode({k: v for k, v in self.kept.items() if k not in keys})}"


async def audit(web: Web, user: User) -> Response:
    filters = {k: request.args[k] for k in AUDIT_FILTERS if request.args.get(k)}
    when = times.period(request.args)
    if when.problems:
        return await render("message.html", user, 422, title="Bad filter",
                            message="; ".join(when.problems), back="/console/audit")
    params = {**filters, **when.api, "limit": str(AUDIT_PAGE)}
    if request.args.get("cursor"):
        params["cursor"] = request.args["cursor"]
    answer = await call(web, "GET", "/audit", params=params)
    if not answer.ok:
        return await render("message.html", user, answer.status, title="Bad filter",
                            message=answer.detail, back="/console/audit")
    rows = answer.body["items"]
    kept = {**filters, **when.args}
    cursor = answer.body.get("next_cursor")
    return await render("audit.html", user, rows=rows, filters=filters, when=when,
                        ranges=times.RANGES, statuses=STATUSES, query=urlencode(
                            {**filters, **when.api}), kept=urlencode(kept),
                        who=await names(web, [r["principal"] for r in rows]),
                        link=Links("/console/audit", kept),
                        older=urlencode({**kept, "cursor": cursor}) if cursor else None)


async def audit_record(web: Web, user: User, record_id: int) -> Response:
    answer = await call(web, "GET", f"/audit/{record_id}")
    if not answer.ok:
        return await render("message.html", user, answer.status, title="No such record",
                            message=answer.detail, back="/console/audit")
    record = answer.body
    who = await names(web, [record.get("principal")])
    return await render("audit_record.html", user, record=record,
                        named=who.get(record.get("principal") or ""),
                        link=Links("/console/audit", {}))


async def usage(web: Web, user: User) -> Response:
    period = request.args.get("period", "day")
    period = period if period in PERIODS else "day"
    span = PERIODS[period]
    now = _minute()
    filters = {k: request.args[k] for k in ("endpoint", "principal") if request.args.get(k)}
    params = {**filters, "since": f"{now - span:.3f}", "until": f"{now:.3f}"}
    totals = await call(web, "GET", "/usage", params={**params, "limit": str(USAGE_ROWS)})
    series = await call(web, "GET", "/usage/series", params={
        **params, "bucket_s": str(max(60, span // 60))})
    if not (totals.ok and series.ok):
        bad = totals if not totals.ok else series
        return await render("message.html", user, bad.status, title="Bad filter",
                            message=bad.detail, back="/console/usage")
    rows, buckets = totals.body["items"], series.body["items"]
    counted = {s: sum(b[s] for b in buckets) for s in STATUSES}
    since, until = now - span, now
    return await render("usage.html", user, rows=rows, period=period, periods=PERIODS,
                        filters=filters, counted=counted, total=sum(counted.values()),
                        since=since, until=until, stamp=times.stamp,
                        who=await names(web, [r["principal"] for r in rows]),
                        link=Links("/console/usage", {**filters, "period": period}),
                        audit=Links("/console/audit", {
                            **filters, "from": times.stamp(since), "to": times.stamp(until),
                            "tz": "UTC"}),
                        chart=charts.stacked(buckets, series.body["bucket_s"],
                                             "MCP requests"),
                        bars=charts.bars([(f"{r['endpoint']} {r['tool'] or ''}", r["calls"])
                                          for r in _tools(rows)[:10]]))


def _tools(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows' tool calls summed per endpoint and tool, busiest first (the bars)."""
    tools: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        key = (r["endpoint"], r["tool"] or "")
        tools.setdefault(key, {"endpoint": key[0], "tool": key[1], "calls": 0})
        tools[key]["calls"] += r["calls"]
    return sorted(tools.values(), key=lambda t: (-t["calls"], t["endpoint"], t["tool"]))
