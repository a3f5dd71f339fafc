"""Aggregates of the audit log for charts and the console's overview: calls per time bucket
and status, and per endpoint the calls, error rate and an estimated p95 latency, the busiest
tools and the denials by reason. Each reads the rollups the audit writer keeps
(proxy.audit.rollup: per minute, hour and day) for the whole minutes of its period and the raw
records (the audit_ts index) only for the parts of a minute at its edges, in one statement
(one snapshot); never rows. The p95 comes from a fixed latency histogram."""

from __future__ import annotations

import time
from typing import Any

from proxy.audit import rollup
from proxy.audit.commit import COLUMNS
from proxy.audit.database import read_rows
from proxy.audit.rollup import BOUNDS_MS, MANAGEMENT
from proxy.storage import db

__all__ = ["BOUNDS_MS", "MANAGEMENT", "MAX_BUCKETS", "MAX_HEALTHS", "NO_PERMIT", "health",
           "healths", "policy_denials", "record", "series", "summary"]

MAX_BUCKETS = 1000  # of a series
_COUNTS = ", ".join(f"CASE WHEN status = '{s}' THEN 1 ELSE 0 END AS {s}"
                    for s in rollup.STATUSES)
_SIGNED_COUNTS = ", ".join(f"CASE WHEN status = '{s}' THEN {{sign}} ELSE 0 END AS {s}"
                           for s in rollup.STATUSES)
_SUMS = ", ".join(f"sum({s})" for s in rollup.STATUSES)


def _filters(endpoint: str | None, principal: str | None) -> tuple[str, list[Any]]:
    """The clauses (each after an AND) of one endpoint and/or principal; without an
    endpoint, MCP traffic: the management API's changes only when asked for by name."""
    clauses: list[str] = []
    args: list[Any] = []
    for clause, value in (("endpoint = ?", endpoint), ("principal = ?", principal)):
        if value is not None:
            clauses.append(clause)
            args.append(value)
    if endpoint is None:
        clauses.append("endpoint <> ?")
        args.append(MANAGEMENT)
    return "".join(f" AND {c}" for c in clauses), args


def _dialect(target: db.Target) -> db.Dialect:
    with db.using(target) as database:
        return database.dialect


def series(target: db.Target, *, since: float, until: float, bucket_s: int,
           endpoint: str | None = None, principal: str | None = None) -> list[dict[str, Any]]:
    """Calls per `bucket_s` from `since` to `until`, by status: every bucket, empty ones too.
    Buckets that start on minutes (`since` and `bucket_s` multiples of 60) read the rollups,
    of the coarsest span both are multiples of; others the raw records."""
    count = max(1, min(MAX_BUCKETS, int(-(-(until - since) // bucket_s))))
    end = min(until, since + count * bucket_s)
    where, args = _filters(endpoint, principal)
    dialect = _dialect(target)
    index = ("CAST((ts - ?) / ? AS INTEGER)" if dialect == "sqlite"
             else "CAST(floor((ts - ?) / ?) AS BIGINT)")
    aligned = next((s for s in rollup.SPANS if since % s == 0 and bucket_s % s == 0), 0)
    segments: list[rollup.Segment] = (
        rollup.plan(since, end, spans=[s for s in rollup.SPANS if s <= aligned]) if aligned
        else [(0, since, end, 1)])
    # a bucket the plan takes away a part of (the rest of a whole hour, say) counts negated;
    # every bucket and the part taken from it fall in one bucket of the series
    raw = f"SELECT {index} AS k, {_SIGNED_COUNTS} FROM audit WHERE {{at}}{where}"
    # of one principal: the usage rollup (every method); of one endpoint: the endpoints';
    # else MCP traffic (the management API's records are not in rollup_calls)
    table, tier_where, tier_args = (("rollup_usage", where, args) if principal is not None
                                    else ("rollup_endpoints", where, args)
                                    if endpoint is not None else ("rollup_calls", "", []))
    negated = ", ".join(f"{{neg}}{s} AS {s}" for s in rollup.STATUSES)
    tier = f"SELECT (bucket - ?) / ? AS k, {negated} FROM {table} WHERE {{at}}{tier_where}"
    union, union_args = rollup.union(segments, tier, tier_args, raw, args,
                                     tier_head=[int(since), bucket_s],
                                     raw_head=[since, bucket_s])
    rows = read_rows(target, f"SELECT k, {_SUMS} FROM ({union}) AS u GROUP BY k",
                 tuple(union_args)) or []
    buckets = [{"start": since + i * bucket_s, "ok": 0, "denied": 0, "error": 0,
                "cancelled": 0} for i in range(count)]
    for b, *counts in rows:
        if 0 <= int(b) < count:
            bucket = buckets[int(b)]
            for status, n in zip(rollup.STATUSES, counts, strict=True):
                bucket[status] += int(n or 0)
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


_HISTOGRAM = ", ".join(rollup.HISTOGRAM)
_CLASSES = ", ".join(f"CASE WHEN c = {i} THEN 1 ELSE 0 END AS {h}"
                     for i, h in enumerate(rollup.HISTOGRAM))


def _net(columns: tuple[str, ...]) -> str:
    """The sums over a union of signed segments (each row's `sg`: 1, or -1 taken away)."""
    return ", ".join(f"sum(sg * {c})" for c in columns)


def summary(target: db.Target, *, since: float, until: float | None = None,
            top: int = 10) -> dict[str, Any]:
    """Per endpoint: calls, errors, denials and p95 (ms, a histogram bound); the `top` busiest
    tools; denials by reason; the usage outbox's backlog. MCP traffic only: never the
    management API's own records."""
    segments = rollup.plan(since, until, time.time())
    mcp = [MANAGEMENT]
    union, args = rollup.union(
        segments, f"SELECT endpoint, n, {', '.join(rollup.STATUSES)}, {_HISTOGRAM}, {{sign}} "
                  "AS sg FROM rollup_endpoints WHERE {at} AND endpoint <> ?", mcp,
        f"SELECT endpoint, 1 AS n, {', '.join(rollup.STATUSES)}, {_CLASSES}, {{sign}} AS sg "
        f"FROM (SELECT endpoint, {_COUNTS}, {rollup.histogram_class('duration_ms')} AS c "
        "FROM audit WHERE {at} AND endpoint <> ?) AS r", mcp)
    rows = read_rows(target, f"SELECT endpoint, "
                         f"{_net(('n', *rollup.STATUSES, *rollup.HISTOGRAM))} FROM ({union}) "
                         "AS u GROUP BY endpoint HAVING sum(sg * n) > 0", tuple(args)) or []
    endpoints: list[dict[str, Any]] = []
    for endpoint, n, *counts in rows:
        e: dict[str, Any] = {"endpoint": endpoint, "calls": int(n)}
        e.update((s, int(c)) for s, c in zip(rollup.STATUSES, counts, strict=False))
        e["error_rate"] = round(e["error"] / e["calls"], 4) if e["calls"] else 0.0
        e["p95_ms"] = _p95([int(h) for h in counts[len(rollup.STATUSES):]])
        endpoints.append(e)
    union, args = rollup.union(
        segments, "SELECT endpoint, kind, tool, n, {sign} AS sg FROM rollup_tools WHERE {at} "
                  "AND endpoint <> ?", mcp,
        "SELECT endpoint, CASE WHEN tool IS NULL THEN 2 ELSE 1 END AS kind, coalesce(tool, '') "
        "AS tool, 1 AS n, {sign} AS sg FROM audit WHERE {at} AND endpoint <> ? AND "
        "method = 'tools/call'", mcp)
    tools = read_rows(target, "SELECT endpoint, kind, tool, sum(sg * n) AS calls FROM "
                          f"({union}) AS u GROUP BY endpoint, kind, tool HAVING sum(sg * n) > 0 "
                          "ORDER BY calls DESC, endpoint, kind, tool LIMIT ?",
                  (*args, top)) or []
    union, args = rollup.union(
        segments, "SELECT kind, reason, n, {sign} AS sg FROM rollup_denials WHERE {at}", [],
        "SELECT CASE WHEN denied_reason IS NULL THEN 2 ELSE 1 END AS kind, "
        "coalesce(denied_reason, '') AS reason, 1 AS n, {sign} AS sg FROM audit WHERE {at} "
        "AND endpoint <> ? AND status = 'denied'", mcp)
    denials = read_rows(target, f"SELECT kind, reason, sum(sg * n) AS calls FROM ({union}) AS u "
                            "GROUP BY kind, reason HAVING sum(sg * n) > 0 ORDER BY calls DESC, "
                            "reason, kind LIMIT ?", (*args, top)) or []
    backlog = read_rows(target, "SELECT count(*) FROM usage_outbox WHERE delivered_at IS NULL",
                    ()) or [(0,)]
    return {"since": since, "until": until,
            "endpoints": sorted(endpoints, key=lambda e: (-e["calls"], e["endpoint"])),
            "tools": [{"endpoint": e, "tool": None if k == 2 else t, "calls": int(n)}
                      for e, k, t, n in tools],
            "denials": [{"policy": r.split(":", 1)[0], "reason": r, "calls": int(n)}
                        for _, r, n in denials],
            "outbox_backlog": int(backlog[0][0])}


MAX_ERROR_MESSAGE = 300  # of the last error's message in a server's health


def _health(rows: list[tuple[Any, ...]], message: str | None) -> dict[str, Any]:
    """A server's health from its hour's (status, calls, calls of the recent window, latest
    ts) per status other than denied, and its last error's message."""
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
    return {**windows, "last_ok_at": latest.get("ok"), "last_error_at": latest.get("error"),
            "last_error": message[:MAX_ERROR_MESSAGE] if message else None}


def health(target: db.Target, *, endpoint: str, now: float, recent_s: float,
           hour_s: float) -> dict[str, Any]:
    """One upstream server's calls, errors and error rate over the last `recent_s` and the
    last `hour_s` (a denial never reached it: not a call here), and its last ok and last
    error of the hour with that error's message (audit messages hold no secrets). Two reads
    along audit_endpoint_ts_id (the second only if the hour has an error)."""
    hour, recent = now - hour_s, now - recent_s
    rows = read_rows(target, "SELECT status, count(*), sum(CASE WHEN ts >= ? THEN 1 ELSE 0 END), "
                         "max(ts) FROM audit WHERE ts >= ? AND endpoint = ? AND "
                         "status <> 'denied' GROUP BY status", (recent, hour, endpoint)) or []
    message = None
    if any(status == "error" for status, *_ in rows):
        found = read_rows(target, "SELECT error_message FROM audit WHERE ts >= ? AND endpoint = ? "
                              "AND status = 'error' ORDER BY ts DESC, id DESC LIMIT 1",
                      (hour, endpoint)) or []
        message = found[0][0] if found else None
    return _health(rows, message)


MAX_HEALTHS = 100  # servers in one `healths` read


def healths(target: db.Target, *, endpoints: list[str], now: float, recent_s: float,
            hour_s: float) -> dict[str, dict[str, Any]]:
    """`health` of each of `endpoints` (at most MAX_HEALTHS), in one statement whatever
    their number: the hour's records of each, counted per endpoint and status, along
    audit_endpoint_ts_id (a range an endpoint; SQLite's plan) or audit_ts over the hour
    (PostgreSQL's, for a page of a few hundred servers whose hour is small); an endpoint's
    last error message read, as `health` reads it, only for an endpoint that has an error
    that hour. Equal to `health` of each, endpoint by endpoint."""
    if not endpoints:
        return {}
    if len(endpoints) > MAX_HEALTHS:
        raise ValueError(f"at most {MAX_HEALTHS} endpoints in one read")
    hour, recent = now - hour_s, now - recent_s
    names = list(dict.fromkeys(endpoints))
    marks = ", ".join("?" * len(names))
    rows = read_rows(target, "SELECT h.endpoint, h.status, h.n, h.n_recent, h.at, CASE WHEN "
                         "h.status = 'error' THEN (SELECT e.error_message FROM audit e WHERE "
                         "e.endpoint = h.endpoint AND e.ts >= ? AND e.status = 'error' ORDER "
                         "BY e.ts DESC, e.id DESC LIMIT 1) END FROM (SELECT endpoint, status, "
                         "count(*) AS n, sum(CASE WHEN ts >= ? THEN 1 ELSE 0 END) AS n_recent, "
                         f"max(ts) AS at FROM audit WHERE endpoint IN ({marks}) AND ts >= ? "
                         "AND status <> 'denied' GROUP BY endpoint, status) AS h",
                 (hour, recent, *names, hour)) or []
    found: dict[str, list[tuple[Any, ...]]] = {name: [] for name in names}
    messages: dict[str, str | None] = {}
    for endpoint, status, n, n_recent, at, message in rows:
        found[endpoint].append((status, n, n_recent, at))
        if status == "error":
            messages[endpoint] = message
    return {name: _health(found[name], messages.get(name)) for name in names}


def record(target: db.Target, record_id: int) -> dict[str, Any] | None:
    """One audit record by its id (as /api/v1/audit gives it)."""
    columns = ("id", *COLUMNS)
    rows = read_rows(target, f"SELECT {', '.join(columns)} FROM audit WHERE id = ?",
                 (record_id,)) or []
    return dict(zip(columns, rows[0])) if rows else None


NO_PERMIT = "(no permit)"  # the row of denials no permit decided (their policies are empty)
# Each record of the period that the Cedar gate decided and that says "deny" somewhere (the
# text test skips the JSON of the many allowed calls), as its kind: an evaluation error (it
# refused the call, whatever policies it names), an enforce denial (its `policies`, the forbids
# that decided, or none: no permit) or a shadow one (let through; `shadow_policies`); then one
# row per policy id the kind's list names, or one with none (NULL: no permit), counted.
# (PostgreSQL: the OFFSET 0s keep each record's text parsed once and its kind settled once,
# where the planner would inline both into every expression that reads them.)
_KIND = ("CASE WHEN coalesce({errors}, 0) > 0 THEN 'error' WHEN {decision} = 'deny' THEN "
         "'enforce' WHEN {shadow} = 'deny' AND coalesce({shadow_errors}, 0) > 0 THEN "
         "'shadow_error' WHEN {shadow} = 'deny' THEN 'shadow' END")
_DENIALS = {
    "sqlite": (
        "SELECT d.kind, CASE WHEN d.kind LIKE '%error' THEN '' ELSE p.value END AS pid, "
        "count(*) FROM (SELECT " + _KIND.format(
            errors="json_extract(policy, '$.errors')",
            decision="json_extract(policy, '$.decision')",
            shadow="json_extract(policy, '$.shadow')",
            shadow_errors="json_extract(policy, '$.shadow_errors')") +
        " AS kind, policy FROM audit WHERE ts >= ? AND ts < ? AND instr(policy, '\"deny\"') > 0"
        ") AS d LEFT JOIN json_each(d.policy, CASE d.kind WHEN 'shadow' THEN "
        "'$.shadow_policies' WHEN 'enforce' THEN '$.policies' ELSE '$.none' END) AS p "
        "WHERE d.kind IS NOT NULL GROUP BY d.kind, pid"),
    "postgresql": (
        "SELECT d.kind, CASE WHEN d.kind LIKE '%error' THEN '' ELSE p.id END AS pid, count(*) "
        "FROM (SELECT " + _KIND.format(errors="(j ->> 'errors')::numeric",
                                       decision="j ->> 'decision'", shadow="j ->> 'shadow'",
                                       shadow_errors="(j ->> 'shadow_errors')::numeric") +
        " AS kind, j FROM (SELECT policy::jsonb AS j FROM audit WHERE ts >= ? AND ts < ? AND "
        "strpos(policy, '\"deny\"') > 0 OFFSET 0) AS r OFFSET 0) AS d LEFT JOIN LATERAL "
        "jsonb_array_elements_text(CASE WHEN d.kind LIKE '%error' THEN NULL ELSE "
        "d.j -> (CASE d.kind WHEN 'shadow' THEN 'shadow_policies' ELSE 'policies' END) END) "
        "AS p(id) ON true WHERE d.kind IS NOT NULL GROUP BY d.kind, pid"),
}


def policy_denials(target: db.Target, *, since: float, until: float) -> dict[str, Any]:
    """Per Cedar policy id, the calls of [`since`, `until`) it refused (`enforce`: the
    deciding forbids of a refused call, or NO_PERMIT when no permit applied) and those it
    would have refused but that were let through (`shadow`: an allowed call's shadow denial,
    by the shadow decision's policies); `errors`, the calls refused for an evaluation
    error (fail closed: its record names no policy that decided); and `shadow_errors`, the
    calls let through whose shadow evaluation failed (that would have been refused for the
    error, had the shadow policies been enforced). From the audit records' `policy` column
    (policies.cedar.gate), along audit_ts, in one statement; a policy with no denial has no
    item."""
    rows = read_rows(target, _DENIALS[_dialect(target)], (since, until)) or []
    found: dict[str, dict[str, Any]] = {}
    errors = {"error": 0, "shadow_error": 0}
    for kind, policy, n in rows:
        if kind in errors:
            errors[kind] += int(n)
            continue
        item = found.setdefault(policy or NO_PERMIT, {"policy": policy or NO_PERMIT,
                                                      "enforce": 0, "shadow": 0})
        item[kind] += int(n)
    return {"since": since, "until": until, "errors": errors["error"],
            "shadow_errors": errors["shadow_error"], "items": [found[k] for k in sorted(found)]}
