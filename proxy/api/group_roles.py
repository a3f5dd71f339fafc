"""/api/v1/group-roles: groups mapped to roles (issue 42 item 3, proxy.auth.group_roles). The
people in a group (a SCIM group's displayName, or a name in a token's groups claim) hold a
built-in role (admin, user, auditor) or a custom role, which they then hold as a group.

GET lists the config's (`[[auth.group_roles]]`, source "config") and the API's (source "api");
PUT adds one mapping (201, or 200 when it was there already); DELETE takes one away, named by
the query's `group` and `role` (204; 404 when the API has none; 409 for one of the config's,
which only the config file changes). A group's name may hold any character (Keycloak's full
paths start with '/'), which is why it is in the body and the query, never the path."""

from __future__ import annotations

import asyncio
from typing import Literal

from pydantic import BaseModel, Field
from quart import Response, request

from proxy.api.bodies import json_response, read
from proxy.api.caller import Caller
from proxy.api.context import Api
from proxy.api.models import NAME
from proxy.auth.group_roles import BUILTIN, GroupRoles
from proxy.errors import Conflict, Invalid, NotFound
from proxy.strict import Strict

TEXT = r"^[^\x00-\x1f\x7f]+$"  # one line, no control character


class GroupRoleIn(Strict):
    """One mapping: the people in `group` hold `role`."""

    group: str = Field(min_length=1, max_length=256, pattern=TEXT)
    role: str = Field(pattern=NAME)  # admin, user, auditor or a custom role's name


class GroupRole(BaseModel):
    group: str
    role: str
    source: Literal["config", "api"]


def _mapping(api: Api) -> GroupRoles:
    if api.group_roles is None:  # only a gateway that is not serving has none
        raise NotFound("group roles are not available on this gateway")
    return api.group_roles


async def group_roles(who: Caller, api: Api) -> Response:
    mapping = _mapping(api)
    items = [GroupRole(group=g, role=r, source="config") for g, r in mapping.configured]
    items += [GroupRole(group=g, role=r, source="api") for g, r in await mapping.stored()]
    return json_response({"items": items})


async def put_group_role(who: Caller, api: Api) -> Response:
    body = await read(GroupRoleIn)
    if body.role not in BUILTIN and await asyncio.to_thread(api.accounts.role, body.role) is None:
        raise Invalid([{"loc": ["body", "role"], "type": "value_error",
                        "msg": f"'{body.role}' is neither a built-in role (admin, user, "
                               "auditor) nor a custom role: create it first (/api/v1/roles)"}])
    added = await _mapping(api).add(body.group, body.role)
    api.accounts.group_roles_changed()  # what this process read of people before is stale
    out = GroupRole(group=body.group, role=body.role, source="api")
    return json_response(out, 201 if added else 200)


async def delete_group_role(who: Caller, api: Api) -> Response:
    group, role = request.args.get("group", ""), request.args.get("role", "")
    missing = [{"loc": ["query", k], "type": "missing", "msg": "required"}
               for k, v in (("group", group), ("role", role)) if not v]
    if missing:
        raise Invalid(missing)
    mapping = _mapping(api)
    if not await mapping.remove(group, role):
        if (group, role) in mapping.configured:
            raise Conflict(f"group '{group}' -> role '{role}' is in the config "
                           "([[auth.group_roles]]): change the config file")
        raise NotFound(f"no group role maps group '{group}' to role '{role}'")
    api.accounts.group_roles_changed()
    return Response(b"", 204)
