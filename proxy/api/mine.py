"""/api/v1/me/keys: a signed-in person's own API keys. A person creates endpoint-kind keys
only (never an admin key), for endpoints their access rules admit them to, and lists and
revokes only the keys they made. Ownership is recorded in the key's stored name
(`me:<user id>:<name>`, see `OWNER`): the api_keys table has no owner column, and the name
is the one field a person cannot set freely here."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from quart import Response

from proxy.api.bodies import Problems, json_response, read
from proxy.api.caller import Caller
from proxy.api.context import Api
from proxy.api.models import KEY_ID, KeyCreated, KeyOut, MyKeyIn
from proxy.auth import keys as api_keys
from proxy.errors import NotFound, NotPermitted
from proxy.people.accounts import User
from proxy.strict import ServerOut

OWNER = re.compile(r"^me:([^:]+):(.*)$", re.DOTALL)


def owned(user_id: str, name: str) -> str:
    return f"me:{user_id}:{name}"


def admits(server: ServerOut, user: User) -> bool:
    """Whether `user` may use `server` by its access rules (none: anyone signed in)."""
    a = server.access
    if not (a.allow_subjects or a.allow_groups or a.allow_scopes or a.allow_keys):
        return True
    return user.subject in a.allow_subjects or bool(user.groups & set(a.allow_groups))


async def person(who: Caller, api: Api) -> User:
    if who.via != "cookie":
        raise NotPermitted("/api/v1/me/keys is for a signed-in person (a browser session)")
    user = await asyncio.to_thread(api.accounts.by_subject, who.issuer, who.subject)
    if user is None:
        raise NotPermitted("no such person")
    return user


async def usable(api: Api, user: User) -> list[str]:
    """The endpoints `user` may use, by name."""
    return [s.name for s in await api.registry.list() if admits(s, user)]


def _mine(user: User, key: api_keys.ApiKey) -> dict[str, Any] | None:
    match = OWNER.match(key.name)
    if match is None or match.group(1) != user.id:
        return None
    return {**key.public(), "name": match.group(2)}


async def my_keys(who: Caller, api: Api) -> Response:
    user = await person(who, api)
    found = await asyncio.to_thread(lambda: api_keys.list_keys(
        api.database, name_prefix=owned(user.id, "")))
    return json_response({"items": [KeyOut(**k) for k in (_mine(user, key) for key in found)
                                    if k is not None],
                          "endpoints": await usable(api, user)})


async def create_my_key(who: Caller, api: Api) -> Response:
    user = await person(who, api)
    allowed = set(await usable(api, user))

    async def check(data: dict[str, Any]) -> Problems:
        problems: Problems = []
        endpoints = data.get("endpoints")
        if isinstance(endpoints, list):
            problems += [{"loc": ["body", "endpoints", i], "msg": f"not an endpoint you may "
                          f"use: {name}", "type": "value_error"}
                         for i, name in enumerate(endpoints)
                         if isinstance(name, str) and name not in allowed]
            if not endpoints:
                problems.append({"loc": ["body", "endpoints"], "msg": "name at least one "
                                 "endpoint", "type": "value_error"})
        if data.get("role", "") != "":
            problems.append({"loc": ["body", "role"], "msg": "a person's key has no role",
                             "type": "value_error"})
        return problems

    body = await read(MyKeyIn, check)
    key, secret = await asyncio.to_thread(api_keys.create, api.database,
                                          owned(user.id, body.name), body.endpoints, "",
                                          body.expires_in_days)
    return json_response(KeyCreated(**{**key.public(), "name": body.name}, key=secret), 201)


async def revoke_my_key(who: Caller, api: Api, key_id: str) -> Response:
    user = await person(who, api)
    gone = NotFound(f"API key '{key_id}' not found or already revoked")
    if not re.fullmatch(KEY_ID, key_id):
        raise gone
    key = await asyncio.to_thread(api_keys.get, api.database, key_id)
    if key is None or _mine(user, key) is None:
        raise gone  # another's key is as unknown as a missing one
    if not await asyncio.to_thread(api_keys.revoke, api.database, key_id):
        raise gone
    return Response(b"", 204)
