"""/api/v1/roles. `admin` and `user` are built in (source: builtin): changing or deleting one
is a 409. A custom role (source: api) is a group its holders are in; deleting one that someone
holds is a 409 that says how many do."""

from __future__ import annotations

import asyncio
import re

from quart import Response

from proxy.api.bodies import json_response, read, same_as_path
from proxy.api.caller import Caller
from proxy.api.context import Api
from proxy.api.models import NAME, Role, RoleIn, RolePatch
from proxy.errors import Conflict, NotFound
from proxy.people.accounts import BuiltinRole, RoleExists, RoleInUse
from proxy.people.accounts import Role as StoredRole


def _role_name(name: str) -> str:
    if not re.fullmatch(NAME, name):  # never a role's name: no query
        raise NotFound(f"role '{name}' not found")
    return name


def _role_out(r: StoredRole) -> Role:
    return Role(name=r.name, description=r.description,
                source="builtin" if r.builtin else "api")


def _builtin(name: str) -> Conflict:
    return Conflict(f"role '{name}' is built in and cannot be changed or deleted")


async def _change_role(api: Api, name: str, description: str | None) -> Response:
    try:
        if description is None:
            found = await asyncio.to_thread(api.accounts.role, _role_name(name))
            if found is not None and found.builtin:
                raise BuiltinRole(name)
        else:
            found = await asyncio.to_thread(api.accounts.update_role, _role_name(name),
                                            description)
    except BuiltinRole:
        raise _builtin(name) from None
    if found is None:
        raise NotFound(f"role '{name}' not found")
    return json_response(_role_out(found))


async def roles(who: Caller, api: Api) -> Response:
    found = await asyncio.to_thread(api.accounts.roles)
    return json_response({"items": [_role_out(r) for r in found]})


async def create_role(who: Caller, api: Api) -> Response:
    body = await read(RoleIn)
    try:
        made = await asyncio.to_thread(api.accounts.create_role, body.name, body.description)
    except RoleExists:
        raise Conflict(f"role '{body.name}' already exists") from None
    return json_response(_role_out(made), 201)


async def role(who: Caller, api: Api, name: str) -> Response:
    found = await asyncio.to_thread(api.accounts.role, _role_name(name))
    if found is None:
        raise NotFound(f"role '{name}' not found")
    return json_response(_role_out(found))


async def put_role(who: Caller, api: Api, name: str) -> Response:
    body = await read(RoleIn, same_as_path("name", name))
    return await _change_role(api, name, body.description)


async def patch_role(who: Caller, api: Api, name: str) -> Response:
    body = await read(RolePatch)
    return await _change_role(api, name, body.description)


async def delete_role(who: Caller, api: Api, name: str) -> Response:
    try:
        deleted = await asyncio.to_thread(api.accounts.delete_role, _role_name(name))
    except BuiltinRole:
        raise _builtin(name) from None
    except RoleInUse as exc:
        holders = f"{exc.holders} user" + ("s" if exc.holders != 1 else "")
        raise Conflict(f"role '{name}' is held by {holders}; take it from them first"
                       ) from None
    if not deleted:
        raise NotFound(f"role '{name}' not found")
    return Response(b"", 204)
