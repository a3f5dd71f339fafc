"""The administrators' pages: overview, servers, API keys, users and roles, audit, usage.
Every figure comes from /api/v1 (proxy.console.api), every change goes to it."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from quart import Response, request

from proxy.api import query
from proxy.console import charts
from proxy.console.api import call
from proxy.console.names import names
from proxy.console.render import after, confirmed, render, words
from proxy.people.accounts import User
from proxy.people.signin import Web
from proxy.web.paths import segment

KEYS_PAGE = 100
OVERVIEW_ROWS = 50  # the busiest endpoints of the day; the usage page has the rest
# servers a page, each with its state: one /server-status request (of at most 100 names)
SERVERS_PAGE = 100
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
    roles = await call(web, "GET", "/roles")
    access = answer.body["access"]
    return await render("server.html", user, server=answer.body, lists=ACCESS_LISTS,
                        groups=[r["name"] for r in roles.body.get("items", [])]
                        if roles.ok else [],
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


async def restrict_group(web: Web, user: User, name: str) -> Response:
    """One group's tool profile on a server: the tools its callers may not call (the rest of
    the server's access rules as they are)."""
    form = await request.form
    back = f"/console/servers/{segment(name)}"
    found = await call(web, "GET", f"/servers/{segment(name)}")
    group = form.get("group", "").strip()
    if not found.ok or not group:
        return await render("message.html", user, found.status if not found.ok else 422,
                            title="Not saved", message=found.detail if not found.ok
                            else "choose a group", back=back)
    access = found.body["access"]
    profiles = dict(access.get("group_tools") or {})
    denied = [*form.getlist("tools_deny"), *words(form.get("tools_deny_more"))]
    profile = {**profiles.get(group, {}), "tools_deny": denied}
    if denied or profile.get("tools_allow"):
        profiles[group] = profile
    else:
        profiles.pop(group, None)
    answer = await call(web, "PATCH", f"/servers/{segment(name)}",
                        json={"access": {**access, "group_tools": profiles}})
    return await after(answer, user, back, "saved")


async def delete_server(web: Web, user: User, name: str) -> Response:
    asked = await confirmed(user, f"Delete the server {name}?", [
        f"the server {name}, its access rules and tool profiles",
        f"its endpoint /mcp/{name}: clients using it are refused from then on"],
        f"/console/servers/{segment(name)}", f"Delete {name}")
    if asked is not None:
        return asked
    answer = await call(web, "DELETE", f"/servers/{segment(name)}")
    return await after(answer, user, "/console/servers", "deleted")


async def keys(web: Web, user: User, created: dict[str, Any] | None = None,
               status: int = 200) -> Response:
    at = _offset()
    found = await call(web, "GET", "/keys", params={"limit": str(KEYS_PAGE + 1),
                                                    "offset": str(at)})
    items = found.body.get("items", []) if found.ok else []
    # only a person's own keys (`me:<user id>:<name>`) need /principals: their owner's name;
    # the others' names are in the list
    owned = [f"key:{k['id']}" for k in items[:KEYS_PAGE] if k["name"].startswith("me:")]
    return await render("keys.html", user, status, keys=items[:KEYS_PAGE],
                        who=await names(web, owned),
                        endpoints=found.body.get("endpoints", []) if found.ok else [],
                        created=created, action="/console/keys",
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
    form = await request.form
    named = form.get("name") or key_id
    asked = await confirmed(user, f"Revoke the key {named}?", [
        f"the API key {named} ({key_id}): every call with it is refused from then on"],
        f"/console{api_path}", f"Revoke {named}")
    if asked is not None:
        return asked
    answer = await call(web, "DELETE", f"{api_path}/{segment(key_id)}")
    return await after(answer, user, f"/console{api_path}", "revoked")


async def create_role(web: Web, user: User) -> Response:
    form = await request.form
    answer = await call(web, "POST", "/roles", json={
        "name": form.get("name", ""), "description": form.get("description", "")})
    return await after(answer, user, "/console/users", "created")


async def delete_role(web: Web, user: User, name: str) -> Response:
    asked = await confirmed(user, f"Delete the role {name}?", [
        (f"the role {name}: whoever holds it loses it, and with it the access rules and "
         "tool profiles that name it as a group")], "/console/users", f"Delete the role {name}")
    if asked is not None:
        return asked
    answer = await call(web, "DELETE", f"/roles/{segment(name)}")
    return await after(answer, user, "/console/users", "deleted")
