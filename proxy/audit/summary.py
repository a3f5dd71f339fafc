"""Aggregates of the audit log for charts and the console's overview: calls per time bucket
and status, and per endpoint the calls, error rate and an estimated p95 latency, the busiest
tools and the denials by reason. Each is one GROUP BY over the `ts` range (the audit_ts index),
never rows; the p95 comes from a fixed latency histogram counted in the same scan."""

from __future__ import annotations

from typing import Any

from proxy import db
from proxy.audit.database import _COLUMNS, _read

# latency histogram bounds in ms: a p95 is reported as the bound its bucket ends at
BOUNDS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
MAX_BUCKETS = 1000  # of a series
MANAGEMENT = "/api/v1"  # the endpoint of the management API's own audit records


def _where(since: float, until: float | None, endpoint: str | None,
           principal: str | None) -> tuple[str, list[Any]]:
    clauses: list[str] = ["ts >= ?"]
    args: list[Any] = [since]
    for clause, value in (("ts < ?", until), ("endpoint = ?", endpoint),
                          ("principal = ?", principal)):
        if value is not None:
            clauses.append(clause)
            args.append(value)
    if endpoint is None:  # MCP traffic: the management API's changes only when asked for
        clauses.append("endpoint <> ?")
        args.append(MANAGEMENT)
    return " AND ".join(clauses), args


def series(target: db.Target, *, since: float, until: float, bucket_s: int,
           endpoint: str | None = None, principal: str | None = None) -> list[dict[str, Any]]:
    """Calls per `bucket_s` from `since` to `until`, by status: every bucket, empty ones too."""
    where, args = _where(since, until, endpoint, principal)
    with db.using(target) as database:
        index = ("CAST((ts - ?) / ? AS INTEGER)" if database.dialect == "sqlite"
                 else "CAST(floor((ts - ?) / ?) AS BIGINT)")
    rows = _read(target, f"SELECT {index} AS b, status, count(*) FROM audit WHERE {where} "
                         "GROUP BY b, status", (since, bucket_s, *args)) or []
    count = max(1, min(MAX_BUCKETS, int(-(-(until - since) // bucket_s))))
    buckets = [{"start": since + i * bucket_s, "ok": 0, "denied": 0, "error": 0,
                "cancelled": 0} for i in range(count)]
    for b, status, n in rows:
        if 0 <= int(b) < count and status in buckets[0]:
            buckets[int(b)][status] += int(n)
    return buckets


def _p95(histogram: list[int]) -> float | None:
    total = sum(histogram)
    if not total:
        return None
    seen = 0
    for i, n in enumerate(histogram):
        seen += n
        if seen >= 0.95 * total:
            return float(BOUNDS_MS[i]) if i < len(BOUNDS_MS) else float("inf")
    return None


def summary(target: db.Target, *, since: float, until: float | None = None,
            top: int = 10) -> dict[str, Any]:
    """Per endpoint: calls, errors, denials and p95 (ms, a histogram bound); the `top` busiest
    tools; denials by reason; the usage outbox's backlog."""
    where, args = _where(since, until, None, None)
    classes = " ".join(f"WHEN duration_ms < {b} THEN {i}" for i, b in enumerate(BOUNDS_MS))
    rows = _read(target, f"SELECT endpoint, status, CASE {classes} ELSE {len(BOUNDS_MS)} END "
                         f"AS c, count(*) FROM audit WHERE {where} GROUP BY endpoint, status, c",
                 tuple(args)) or []
    endpoints: dict[str, dict[str, Any]] = {}
    histograms: dict[str, list[int]] = {}
    for endpoint, status, cls, n in rows:
        e = endpoints.setdefault(endpoint, {"endpoint": endpoint, "calls": 0, "ok": 0,
                                            "denied": 0, "error": 0, "cancelled": 0})
        e["calls"] += int(n)
        if status in e:
            e[status] += int(n)
        histograms.setdefault(endpoint, [0] * (len(BOUNDS_MS) + 1))[int(cls)] += int(n)
    for name, e in endpoints.items():
        e["error_rate"] = round(e["error"] / e["calls"], 4) if e["calls"] else 0.0
        e["p95_ms"] = _p95(histograms[name])
    tools = _read(target, f"SELECT endpoint, tool, count(*) FROM audit WHERE {where} AND "
                          "method = 'tools/call' GROUP BY endpoint, tool "
                          "ORDER BY count(*) DESC LIMIT ?", (*args, top)) or []
    denials = _read(target, f"SELECT denied_reason, count(*) FROM audit WHERE {where} AND "
                            "status = 'denied' GROUP BY denied_reason ORDER BY count(*) DESC "
                            "LIMIT ?", (*args, top)) or []
    backlog = _read(target, "SELECT count(*) FROM usage_outbox WHERE delivered_at IS NULL",
                    ()) or [(0,)]
    return {"since": since, "until": until,
            "endpoints": sorted(endpoints.values(), key=lambda e: -e["calls"]),
            "tools": [{"endpoint": e, "tool": t, "calls": int(n)} for e, t, n in tools],
            "denials": [{"policy": (r or "").split(":", 1)[0], "reason": r or "", "calls": int(n)}
                        for r, n in denials],
            "outbox_backlog": int(backlog[0][0])}


MAX_ERROR_MESSAGE = 300  # of the last error's message in a server's health


def health(target: db.Target, *, endpoint: str, now: float, recent_s: float,
           hour_s: float) -> dict[str, Any]:
    """One upstream server's calls, errors and error rate over the last `recent_s` and the
    last `hour_s` (a denial never reached it: not a call here), and its last ok and last
    error of the hour with that error's message (audit messages hold no secrets). Two reads
    along audit_ts."""
    hour, recent = now - hour_s, now - recent_s
    rows = _read(target, "SELECT status, count(*), sum(CASE WHEN ts >= ? THEN 1 ELSE 0 END), "
                         "max(ts) FROM audit WHERE ts >= ? AND endpoint = ? AND "
                         "status <> 'denied' GROUP BY status", (recent, hour, endpoint)) or []
    windows: dict[str, dict[str, Any]] = {"last_5m": {"calls": 0, "errors": 0},
                                          "last_hour": {"calls": 0, "errors": 0}}
    latest: dict[str, float] = {}
    for status, n, n_recent, at in rows:
        for key, count in (("last_hour", int(n)), ("last_5m", int(n_recent or 0))):
            windows[key]["calls"] += count
            if status == "error":
                windows[key]["errors"] += count
        latest[status] = float(at)
    for w in windows.values():
        w["error_rate"] = round(w["errors"] / w["calls"], 4) if w["calls"] else 0.0
    message = None
    if "error" in latest:
        found = _read(target, "SELECT error_message FROM audit WHERE ts >= ? AND endpoint = ? "
                              "AND status = 'error' ORDER BY ts DESC LIMIT 1",
                      (hour, endpoint)) or []
        message = found[0][0][:MAX_ERROR_MESSAGE] if found and found[0][0] else None
    return {**windows, "last_ok_at": latest.get("ok"), "last_error_at": latest.get("error"),
            "last_error": message}


def record(target: db.Target, record_id: int) -> dict[str, Any] | None:
    """One audit record by its id (as /api/v1/audit gives it)."""
    columns = ("id", *_COLUMNS)
    rows = _read(target, f"SELECT {', '.join(columns)} FROM audit WHERE id = ?",
                 (record_id,)) or []
    return dict(zip(columns, rows[0])) if rows else None
