"""Users and roles (/console/users) and a person's page (/console/users/<name>): roles are
chosen from the roles that exist, never typed; a person's page lists their API keys and their
recent calls (at /mcp and at /api/v1) with "revoke all keys", and what they hold open (browser
and MCP sessions, connected upstream accounts) with "end all sessions"; deleting a person,
revoking their keys or ending their sessions first asks, naming what goes."""

from __future__ import annotations

import asyncio
from typing import Any

from quart import Response, request

from proxy.console.api import Answer, call
from proxy.console.names import names
from proxy.console.records import Links
from proxy.console.render import after, confirmed, render
from proxy.people.accounts import User
from proxy.people.signin import Web
from proxy.web.paths import segment

AUDITOR = "auditor"  # the built-in role (proxy.api.users)
RECENT = 20  # a person's recent calls on their page (along the audit log's index by
# principal, audit_principal_ts_id: a few rows, however old); the audit log has the rest


async def _roles(web: Web) -> list[dict[str, Any]]:
    """Every role a person may be given: the custom roles and the built-in auditor."""
    found = await call(web, "GET", "/roles")
    roles = list(found.body.get("items", [])) if found.ok else []
    if not any(r["name"] == AUDITOR for r in roles):
        roles.append({"name": AUDITOR, "description": "reads the audit log, usage and the "
                      "audit evidence; changes nothing", "source": "built in"})
    return roles


async def users(web: Web, user: User) -> Response:
    people = await call(web, "GET", "/users")
    return await render("users.html", user, users=people.body.get("items", [])
                        if people.ok else [], roles=await _roles(web))


async def create_user(web: Web, user: User) -> Response:
    form = await request.form
    answer = await call(web, "POST", "/users", json={
        "name": form.get("name", ""), "password": form.get("password", ""),
        "admin": form.get("admin") == "on", "roles": form.getlist("roles")})
    return await after(answer, user, "/console/users", "created")


async def change_user(web: Web, user: User, name: str) -> Response:
    form = await request.form
    answer = await call(web, "PATCH", f"/users/{segment(name)}", json={
        "admin": form.get("admin") == "on", "roles": form.getlist("roles")})
    back = form.get("back") == "person"
    return await after(answer, user, f"/console/users/{segment(name)}" if back
                       else "/console/users", "saved")


async def _keys_of(web: Web, person: dict[str, Any]) -> list[dict[str, Any]]:
    """The person's own keys (stored as `me:<user id>:<name>`), named as they named them."""
    found = await call(web, "GET", "/keys", params={"name_prefix": f"me:{person['id']}:"})
    keys = found.body.get("items", []) if found.ok else []
    return [{**k, "name": k["name"].split(":", 2)[2]} for k in keys]


async def _recent(web: Web, person: dict[str, Any]) -> list[dict[str, Any]]:
    """Their last calls: at /mcp a record names the subject, at /api/v1 `issuer|subject`."""
    asked = [call(web, "GET", "/audit", params={"principal": p, "limit": str(RECENT)})
             for p in (person["subject"], f"{person['issuer']}|{person['subject']}")]
    answers: list[Answer] = list(await asyncio.gather(*asked))
    rows = [r for a in answers if a.ok for r in a.body["items"]]
    return sorted(rows, key=lambda r: (-r["ts"], -r["id"]))[:RECENT]


async def person(web: Web, user: User, name: str) -> Response:
    found = await call(web, "GET", f"/users/{segment(name)}")
    if not found.ok:
        return await render("message.html", user, found.status, title="No such person",
                            message=found.detail, back="/console/users")
    who = found.body
    recent, held = await asyncio.gather(_recent(web, who), _held(web, name))
    return await render("person.html", user, person=who, keys=await _keys_of(web, who),
                        recent=recent, roles=await _roles(web), held=held,
                        who=await names(web, [r["principal"] for r in recent]),
                        link=Links("/console/audit", {}))


async def _held(web: Web, name: str) -> dict[str, Any] | None:
    """What the person holds open (None when the API does not say: the page says so)."""
    found = await call(web, "GET", f"/users/{segment(name)}/sessions")
    return found.body if found.ok else None


def _removes(name: str, held: dict[str, Any]) -> list[str]:
    """What "end all sessions" removes, named for its confirmation."""
    browser, mcp = held["browser_sessions"], held["mcp_sessions"]
    return [
        (f"{browser} browser session{'s' * (browser != 1)}: {name} is signed out of the "
         "console everywhere (your own session stays, if you end your own)"),
        *[(f"the MCP session at {s['endpoint']} (hash {s['id_hash']}): its next request is "
           "refused as unknown") for s in mcp],
        *[(f"the connected {a['upstream']} account ({a['status']}): revoked at "
           f"{a['upstream']} where it allows, and deleted here")
          for a in held["upstream_accounts"]],
        f"the OAuth grants of {name}'s MCP clients: they sign in again",
    ]


async def end_sessions(web: Web, user: User, name: str) -> Response:
    """End everything the person holds open (one DELETE, one audit record); they stay
    active and keep their API keys."""
    back = f"/console/users/{segment(name)}"
    found = await call(web, "GET", f"/users/{segment(name)}/sessions")
    if not found.ok:
        return await after(found, user, back, "ended")
    asked = await confirmed(user, f"End every session of {name}?", _removes(name, found.body),
                            back, "End all sessions")
    if asked is not None:
        return asked
    answer = await call(web, "DELETE", f"/users/{segment(name)}/sessions")
    return await after(answer, user, back, "ended")


async def delete_user(web: Web, user: User, name: str) -> Response:
    found = await call(web, "GET", f"/users/{segment(name)}")
    keys = await _keys_of(web, found.body) if found.ok else []
    active = [k for k in keys if k["status"] == "active"]
    asked = await confirmed(user, f"Delete {name}?", [
        f"the person {name} and their sign-in: they are signed out everywhere",
        (f"their roles and administrator right; their {len(active)} active API "
         f"key{'s' * (len(active) != 1)} stop working")], "/console/users", f"Delete {name}")
    if asked is not None:
        return asked
    answer = await call(web, "DELETE", f"/users/{segment(name)}")
    return await after(answer, user, "/console/users", "deleted")


async def revoke_keys(web: Web, user: User, name: str) -> Response:
    """Revoke every active key of the person: one DELETE each, through the API (each one an
    audit record of its own)."""
    found = await call(web, "GET", f"/users/{segment(name)}")
    if not found.ok:
        return await after(found, user, "/console/users", "revoked")
    active = [k for k in await _keys_of(web, found.body) if k["status"] == "active"]
    back = f"/console/users/{segment(name)}"
    asked = await confirmed(user, f"Revoke every key of {name}?", [
        f"the API key {k['name']} ({k['id']})" for k in active] or ["nothing: no active key"],
        back, f"Revoke {len(active)} key{'s' * (len(active) != 1)}")
    if asked is not None:
        return asked
    for key in active:
        answer = await call(web, "DELETE", f"/keys/{segment(key['id'])}")
        if not answer.ok:
            return await after(answer, user, back, "revoked")
    return await after(Answer(200, None), user, back, "revoked")
