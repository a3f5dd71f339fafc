"""/api/v1/users: people. `roles` are custom roles (see /roles), each of which must exist, and
the built-in role `auditor` (reads the audit log, usage, policies and the audit evidence's
status; changes nothing); the other built-in ones are `admin` (the admin field) and `user`
(everyone). PUT replaces admin and
roles and keeps the password unless one is sent; a federated user has no password here (400)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from quart import Response, request

from proxy.api.bodies import Check, Problems, json_response, read, same_as_path
from proxy.api.caller import Caller
from proxy.api.context import Api
from proxy.api.models import NAME, UserIn, UserOut, UserPatch, UserPut
from proxy.errors import BadRequest, Conflict, Invalid, NotFound
from proxy.people.accounts import (
    AUDITOR,
    LastAdmin,
    NotLocal,
    UnknownRoles,
    User,
    UserExists,
)
from proxy.people.signin import COOKIE


def _user_name(name: str) -> str:
    if "\x00" in name or len(name) > 1000:  # never a stored name: no query
        raise NotFound(f"user '{name}' not found")
    return name


def _user_out(u: User) -> UserOut:
    roles = u.roles | {AUDITOR} if u.is_auditor else u.roles
    return UserOut(id=u.id, name=u.name, issuer=u.issuer, subject=u.subject, admin=u.is_admin,
                   roles=sorted(roles), attributes=dict(u.attributes))


def _unknown_roles(exc: UnknownRoles, roles: list[str]) -> Invalid:
    """422 naming each role that is not a custom role, at its place in the body's list."""
    problems = []
    for i, name in enumerate(roles):
        if name not in exc.names:
            continue
        msg = (f"'{name}' is a built-in role: every user holds 'user', and 'admin' is the "
               "admin field" if name in ("admin", "user") else f"no role named {name}")
        problems.append({"loc": ["body", "roles", i], "msg": msg, "type": "value_error"})
    return Invalid(problems)


def _known_roles(api: Api) -> Check:
    """A check for `read`: each of the body's roles (well-formed ones: the model names the
    others) is a custom role or `auditor`."""

    async def check(data: dict[str, Any]) -> Problems:
        roles = data.get("roles")
        if not isinstance(roles, list):
            return []
        named = [r for r in roles if isinstance(r, str) and re.fullmatch(NAME, r)]
        if not named:
            return []
        known = {r.name for r in await asyncio.to_thread(api.accounts.roles) if not r.builtin}
        known.add(AUDITOR)
        return _unknown_roles(UnknownRoles([r for r in named if r not in known]),
                              roles).problems

    return check


async def _not_last_admin(api: Api, name: str) -> None:
    """Before a deletion's deprovisioning: the last administrator is not deleted (the delete
    itself checks again, in its transaction)."""
    admins = [u for u in await asyncio.to_thread(api.accounts.list) if u.is_admin]
    if len(admins) <= 1:
        raise _last_admin(name)


def _last_admin(name: str) -> Conflict:
    return Conflict(f"user '{name}' is the last administrator; make another user an "
                    "administrator first")


async def _change_user(api: Api, name: str, roles: list[str] | None,
                       **changes: Any) -> Response:
    try:
        changed = await asyncio.to_thread(
            lambda: api.accounts.update(_user_name(name), roles=roles, **changes))
    except NotLocal:
        raise BadRequest(f"user '{name}' signs in through an identity provider and has no "
                         "password here") from None
    except UnknownRoles as exc:  # deleted since the request was checked
        raise _unknown_roles(exc, roles or []) from None
    except LastAdmin:
        raise _last_admin(name) from None
    if changed is None:
        raise NotFound(f"user '{name}' not found")
    if changes.get("password") is not None and api.web is not None:
        # a new password ends the person's other browser sessions (one stolen with the old
        # password among them); the caller's own session, if it is theirs, stays
        await api.web.sessions.end_for(changed.id, keep=request.cookies.get(COOKIE))
    return json_response(_user_out(changed))


async def users(who: Caller, api: Api) -> Response:
    found = await asyncio.to_thread(api.accounts.list)
    return json_response({"items": [_user_out(u) for u in found]})


async def create_user(who: Caller, api: Api) -> Response:
    body = await read(UserIn, _known_roles(api))
    try:
        user = await asyncio.to_thread(api.accounts.create_local, body.name, body.password,
                                       body.admin, body.roles, body.attributes)
    except UserExists:
        raise Conflict(f"user '{body.name}' already exists") from None
    except UnknownRoles as exc:
        raise _unknown_roles(exc, body.roles) from None
    return json_response(_user_out(user), 201)


async def user(who: Caller, api: Api, name: str) -> Response:
    found = await asyncio.to_thread(api.accounts.by_name, _user_name(name))
    if found is None:
        raise NotFound(f"user '{name}' not found")
    return json_response(_user_out(found))


async def put_user(who: Caller, api: Api, name: str) -> Response:
    body = await read(UserPut, same_as_path("name", name), _known_roles(api))
    return await _change_user(api, name, body.roles, admin=body.admin, password=body.password,
                              attributes=body.attributes)


async def patch_user(who: Caller, api: Api, name: str) -> Response:
    body = await read(UserPatch, _known_roles(api))
    return await _change_user(api, name, body.roles, admin=body.admin, password=body.password,
                              attributes=body.attributes)


async def delete_user(who: Caller, api: Api, name: str) -> Response:
    if who.via == "cookie" and who.name == name:
        raise BadRequest("an administrator cannot delete their own account")
    found = await asyncio.to_thread(api.accounts.by_name, _user_name(name))
    if found is not None and found.is_admin:
        await _not_last_admin(api, name)
    if found is not None and api.deprovision is not None:
        # every credential of theirs taken, on every replica, before the rows go
        await api.deprovision.deleted(found.id)
    try:
        gone = await asyncio.to_thread(api.accounts.delete, _user_name(name))
    except LastAdmin:
        raise _last_admin(name) from None
    if gone is None:
        raise NotFound(f"user '{name}' not found")
    if api.forget_person is not None:  # in memory, cannot fail: before the store that can
        api.forget_person(gone.principal().key)
    if api.web is not None:
        await api.web.sessions.end_for(gone.id)
    return Response(b"", 204)
