"""The administrators' pages: overview, servers, API keys, users and roles, audit, usage.
Every figure comes from /api/v1 (proxy.console.api), every change goes to it."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

import orjson
from quart import Response, request

from proxy.api import query
from proxy.console import charts
from proxy.console.api import call
from proxy.console.render import after, render, words
from proxy.people.accounts import User
from proxy.people.signin import Web
from proxy.web.paths import segment

AUDIT_FILTERS = ("status", "endpoint", "principal", "tool", "since", "until")
PERIODS = {"hour": 3600, "day": 86400, "week": 7 * 86400}
KEYS_PAGE = 100
OVERVIEW_ROWS = 50  # the busiest endpoints of the day; the usage page has the rest
# servers a page, each with its state: one /server-status request (of at most 100 names)
SERVERS_PAGE = 100
# the usage page's table: the busiest principal, endpoint and tool totals of the period (the
# API sorts them all and sends these: a week at size has 7,500)
USAGE_ROWS = 200
ACCESS_LISTS = ("allow_subjects", "allow_groups", "allow_scopes", "allow_keys",
                "tools_allow", "tools_deny")


def _minute() -> float:
    """The end of this minute: periods end there, so that the API's aggregate of a query
    (cached for seconds) serves every reload within the minute."""
    return float((int(time.time()) // 60 + 1) * 60)


async def overview(web: Web, user: User) -> Response:
    now = _minute()
    hour = await call(web, "GET", "/usage/summary", params={"since": f"{now - 3600:.3f}"})
    day = await call(web, "GET", "/usage/summary", params={"since": f"{now - 86400:.3f}"})
    series = await call(web, "GET", "/usage/series", params={
        "since": f"{now - 3600:.3f}", "until": f"{now:.3f}", "bucket_s": "60"})
    sessions = await call(web, "GET", "/sessions")
    if not (hour.ok and day.ok and series.ok):
        bad = next(a for a in (hour, day, series) if not a.ok)
        return await render("message.html", user, bad.status, title="Overview unavailable",
                            message=bad.detail)
    by_hour = {e["endpoint"]: e for e in hour.body["endpoints"]}
    rows = [(e, by_hour.get(e["endpoint"])) for e in day.body["endpoints"][:OVERVIEW_ROWS]]
    return await render("overview.html", user, day=day.body, rows=rows,
                        sessions=sessions.body if sessions.ok else None,
                        more=max(0, len(day.body["endpoints"]) - OVERVIEW_ROWS),
                        chart=charts.stacked(series.body["items"], series.body["bucket_s"]))


def _offset() -> int:
    """The page's `offset` argument, read as the API reads it (anything it would refuse is
    the first page)."""
    return query.offset(request.args.get("offset"), [])


async def servers(web: Web, user: User) -> Response:
    at = _offset()
    answer = await call(web, "GET", "/servers", params={"limit": str(SERVERS_PAGE + 1),
                                                        "offset": str(at)})
    items = answer.body.get("items", []) if answer.ok else []
    shown = items[:SERVERS_PAGE]
    return await render("servers.html", user, servers=shown,
                        states=await _states(web, [s["name"] for s in shown]),
                        error=None if answer.ok else answer.detail,
                        newer=str(max(0, at - SERVERS_PAGE)) if at else None,
                        older=str(at + SERVERS_PAGE) if len(items) > SERVERS_PAGE else None)


async def _states(web: Web, names: list[str]) -> dict[str, dict[str, Any]]:
    """Each server's status (its state, era, error rate), in one request; a server whose
    status is not to be had is left out (the page shows a dash)."""
    if not names:
        return {}
    answer = await call(web, "GET", "/server-status", params={"name": names})
    return {s["name"]: s for s in answer.body["items"]} if answer.ok else {}


async def server(web: Web, user: User, name: str) -> Response:
    answer = await call(web, "GET", f"/servers/{segment(name)}")
    if not answer.ok:
        return await render("message.html", user, answer.status, title="No such server",
                            message=answer.detail, back="/console/servers")
    status = await call(web, "GET", f"/servers/{segment(name)}/status")
    access = answer.body["access"]
    return await render("server.html", user, server=answer.body, lists=ACCESS_LISTS,
                        live=status.body if status.ok else None,
                        group_tools=orjson.dumps(access.get("group_tools", {}),
                                                 option=orjson.OPT_INDENT_2).decode())


async def create_server(web: Web, user: User) -> Response:
    form = await request.form
    body: dict[str, Any] = {"name": form.get("name", ""), "url": form.get("url", ""),
                            "zones": form.getlist("zones") or ["remote"]}
    answer = await call(web, "POST", "/servers", json=body)
    return await after(answer, user, "/console/servers", "created")


async def change_server(web: Web, user: User, name: str) -> Response:
    form = await request.form
    access: dict[str, Any] = {field: words(form.get(field)) for field in ACCESS_LISTS}
    raw = form.get("group_tools", "").strip() or "{}"
    try:
        access["group_tools"] = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return await render("message.html", user, 422, title="Not saved",
                            message="group tool profiles: not JSON",
                            back=f"/console/servers/{segment(name)}")
    answer = await call(web, "PATCH", f"/servers/{segment(name)}", json={"access": access})
    return await after(answer, user, f"/console/servers/{segment(name)}", "saved")


async def delete_server(web: Web, user: User, name: str) -> Response:
    answer = await call(web, "DELETE", f"/servers/{segment(name)}")
    return await after(answer, user, "/console/servers", "deleted")


async def keys(web: Web, user: User, created: dict[str, Any] | None = None,
               status: int = 200) -> Response:
    at = _offset()
    found = await call(web, "GET", "/keys", params={"limit": str(KEYS_PAGE + 1),
                                                    "offset": str(at)})
    names = await call(web, "GET", "/servers")
    items = found.body.get("items", []) if found.ok else []
    return await render("keys.html", user, status, keys=items[:KEYS_PAGE],
                        endpoints=[s["name"] for s in names.body.get("items", [])]
                        if names.ok else [], created=created, action="/console/keys",
                        newer=str(max(0, at - KEYS_PAGE)) if at else None,
                        older=str(at + KEYS_PAGE) if len(items) > KEYS_PAGE else None)


def key_body(form: Any, admin: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"name": form.get("name", ""), "endpoints": form.getlist("endpoints")}
    if admin and form.get("role") in ("admin", "auditor"):
        body["role"] = form["role"]
    days = form.get("expires_in_days", "").strip()
    if days:
        try:
            body["expires_in_days"] = float(days)
        except ValueError:
            body["expires_in_days"] = days  # the API says what is wrong with it
    return body


async def make_key(web: Web, user: User, api_path: str, admin: bool,
                   listing: Callable[..., Awaitable[Response]]) -> Response:
    """A key made through `api_path` (/keys or /me/keys): its secret on the key list, once."""
    answer = await call(web, "POST", api_path, json=key_body(await request.form, admin))
    if not answer.ok:
        return await after(answer, user, f"/console{api_path}", "created")
    return await listing(web, user, answer.body, 201)


async def revoke_at(web: Web, user: User, api_path: str, key_id: str) -> Response:
    answer = await call(web, "DELETE", f"{api_path}/{segment(key_id)}")
    return await after(answer, user, f"/console{api_path}", "revoked")


async def users(web: Web, user: User) -> Response:
    people = await call(web, "GET", "/users")
    roles = await call(web, "GET", "/roles")
    return await render("users.html", user, users=people.body.get("items", [])
                        if people.ok else [], roles=roles.body.get("items", [])
                        if roles.ok else [])


async def create_user(web: Web, user: User) -> Response:
    form = await request.form
    answer = await call(web, "POST", "/users", json={
        "name": form.get("name", ""), "password": form.get("password", ""),
        "admin": form.get("admin") == "on", "roles": words(form.get("roles"))})
    return await after(answer, user, "/console/users", "created")


async def change_user(web: Web, user: User, name: str) -> Response:
    form = await request.form
    answer = await call(web, "PATCH", f"/users/{segment(name)}", json={
        "admin": form.get("admin") == "on", "roles": words(form.get("roles"))})
    return await after(answer, user, "/console/users", "saved")


async def delete_user(web: Web, user: User, name: str) -> Response:
    answer = await call(web, "DELETE", f"/users/{segment(name)}")
    return await after(answer, user, "/console/users", "deleted")


async def create_role(web: Web, user: User) -> Response:
    form = await request.form
    answer = await call(web, "POST", "/roles", json={
        "name": form.get("name", ""), "description": form.get("description", "")})
    return await after(answer, user, "/console/users", "created")


async def delete_role(web: Web, user: User, name: str) -> Response:
    answer = await call(web, "DELETE", f"/roles/{segment(name)}")
    return await after(answer, user, "/console/users", "deleted")


async def audit(web: Web, user: User) -> Response:
    filters = {k: request.args[k] for k in AUDIT_FILTERS if request.args.get(k)}
    params = {**filters, "limit": "50"}
    if request.args.get("cursor"):
        params["cursor"] = request.args["cursor"]
    answer = await call(web, "GET", "/audit", params=params)
    if not answer.ok:
        return await render("message.html", user, answer.status, title="Bad filter",
                            message=answer.detail, back="/console/audit")
    cursor = answer.body.get("next_cursor")
    return await render("audit.html", user, rows=answer.body["items"], filters=filters,
                        query=urlencode(filters),
                        older=urlencode({**filters, "cursor": cursor}) if cursor else None)


async def audit_record(web: Web, user: User, record_id: int) -> Response:
    answer = await call(web, "GET", f"/audit/{record_id}")
    if not answer.ok:
        return await render("message.html", user, answer.status, title="No such record",
                            message=answer.detail, back="/console/audit")
    return await render("audit_record.html", user, record=answer.body)


async def usage(web: Web, user: User) -> Response:
    period = request.args.get("period", "day")
    span = PERIODS.get(period, PERIODS["day"])
    now = _minute()
    params = {"since": f"{now - span:.3f}"}
    for key in ("endpoint", "principal"):
        if request.args.get(key):
            params[key] = request.args[key]
    totals = await call(web, "GET", "/usage", params={**params, "limit": str(USAGE_ROWS)})
    series = await call(web, "GET", "/usage/series", params={
        **params, "until": f"{now:.3f}", "bucket_s": str(max(60, span // 60))})
    if not (totals.ok and series.ok):
        bad = totals if not totals.ok else series
        return await render("message.html", user, bad.status, title="Bad filter",
                            message=bad.detail, back="/console/usage")
    rows = totals.body["items"]
    return await render("usage.html", user, rows=rows, period=period, periods=PERIODS,
                        filters={k: v for k, v in params.items() if k != "since"},
                        chart=charts.stacked(series.body["items"], series.body["bucket_s"]),
                        bars=charts.bars([(f"{r['endpoint']} {r['tool'] or ''}", r["calls"])
                                          for r in rows[:10]]))
