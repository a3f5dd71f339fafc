"""/api/v1/users/<name>/sessions: what a person holds open (issue 43), for an administrator:
their browser sessions (how many: the ids are secrets), their MCP sessions (endpoint, when
opened, the hash the audit log knows them by) and the upstream accounts they connected; and
DELETE, which ends them all (proxy.people.deprovision's steps, the person staying active and
their API keys staying: "revoke all keys" is the keys' own route). The change's one audit
record says what it ended."""

from __future__ import annotations

import asyncio

from quart import Response, request

from proxy.api.bodies import json_response
from proxy.api.caller import Caller
from proxy.api.context import Api
from proxy.audit import AuditRecord
from proxy.errors import NotFound
from proxy.people.accounts import User
from proxy.people.deprovision import Deprovisioner
from proxy.people.signin import COOKIE


async def _person(api: Api, name: str) -> tuple[User, Deprovisioner]:
    if api.deprovision is None:
        raise RuntimeError("the deprovisioner is built when the app starts serving")
    found = None if "\x00" in name or len(name) > 1000 else \
        await asyncio.to_thread(api.accounts.by_name, name)
    if found is None:
        raise NotFound(f"user '{name}' not found")
    return found, api.deprovision


async def person_sessions(who: Caller, api: Api, name: str) -> Response:
    user, taker = await _person(api, name)
    held = await taker.held(user)
    return json_response({
        "user": user.name, "browser_sessions": held.browser_sessions,
        "mcp_sessions": [{"id_hash": s.id_hash, "endpoint": s.endpoint,
                          "created_at": s.created_at, "protocol_version": s.protocol_version}
                         for s in held.mcp_sessions],
        "upstream_accounts": [{"upstream": n, "status": s}
                              for n, s in sorted(held.upstreams.items())]})


async def end_person_sessions(who: Caller, api: Api, record: AuditRecord, name: str) -> Response:
    user, taker = await _person(api, name)
    # an administrator ending their own keeps the browser session they asked from
    keep = request.cookies.get(COOKIE) if who.via == "cookie" and who.name == user.name \
        else None
    lost = await taker.end_sessions(user, keep=keep)
    record.method = "people/end-sessions"
    record.note = (f"{user.name} ({user.issuer}|{user.subject}, id {user.id}): browser "
                   f"sessions {lost.browser_sessions}, OAuth grants {lost.grants}, MCP "
                   f"sessions {lost.mcp_sessions}, upstream accounts {lost.upstreams}")[:1000]
    return json_response({"user": user.name, "browser_sessions": lost.browser_sessions,
                          "oauth_grants": lost.grants, "mcp_sessions": lost.mcp_sessions,
                          "upstream_accounts": lost.upstreams})
