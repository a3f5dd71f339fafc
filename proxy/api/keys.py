"""/api/v1/keys: API keys. PUT and PATCH change a key's name, endpoints, role and expiry; the
secret never changes and is shown only by POST. A revoked key is final: changing it is a 409.
The gateway's key index sees a change on its next lookup (the next /mcp request). A key of
role `auditor` is a management key: it names no endpoint (422), and no MCP endpoint takes it."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from quart import Response, request

from proxy.api import query
from proxy.api.bodies import Check, Problems, json_response, read, same_as_path
from proxy.api.caller import Caller
from proxy.api.context import Api
from proxy.api.models import KEY_ID, KeyCreated, KeyIn, KeyOut, KeyPatch, KeyPut
from proxy.auth import keys as api_keys
from proxy.errors import Conflict, Invalid, NotFound


def _key_id(key_id: str) -> str:
    if not re.fullmatch(KEY_ID, key_id):  # ids are generated: no query for anything else
        raise NotFound(f"API key '{key_id}' not found")
    return key_id


def _known_endpoints(api: Api) -> Check:
    """A check for `read`: each of the body's endpoints names a server."""

    async def check(data: dict[str, Any]) -> Problems:
        endpoints = data.get("endpoints")
        if not isinstance(endpoints, list):
            return []
        known = await api.registry.names()
        return [{"loc": ["body", "endpoints", i], "msg": f"no server named {name}",
                 "type": "value_error"} for i, name in enumerate(endpoints)
                if isinstance(name, str) and name not in known]

    return check


def _auditor_names_no_endpoint(api: Api, key_id: str | None = None) -> Check:
    """A check for `read`: a key of role `auditor` (the body's, or for a PATCH that leaves
    the role out, the stored key's) names no endpoint (the body's, else the stored key's)."""

    async def check(data: dict[str, Any]) -> Problems:
        role, endpoints = data.get("role"), data.get("endpoints")
        if key_id is not None and ("role" not in data or "endpoints" not in data):
            stored = await asyncio.to_thread(api_keys.get, api.database, key_id) \
                if re.fullmatch(KEY_ID, key_id) else None
            if stored is not None:
                role = data.get("role", stored.role)
                endpoints = data.get("endpoints", sorted(stored.endpoints))
        if role == "auditor" and isinstance(endpoints, list) and endpoints:
            return [{"loc": ["body", "endpoints"], "msg": "a key of role auditor reads the "
                     "management API and names no endpoint", "type": "value_error"}]
        return []

    return check


async def _change_key(api: Api, key_id: str, changes: dict[str, Any]) -> Response:
    try:
        changed = await asyncio.to_thread(
            lambda: api_keys.update(api.database, _key_id(key_id), **changes))
    except api_keys.KeyNotFound:
        raise NotFound(f"API key '{key_id}' not found") from None
    except api_keys.KeyRevoked:
        raise Conflict(f"API key '{key_id}' is revoked; a revoked key cannot be changed"
                       ) from None
    return json_response(KeyOut(**changed.public()))


async def keys(who: Caller, api: Api) -> Response:
    """Every key, or with `limit` (and `offset`) a page of them, oldest first."""
    problems: Problems = []
    size = query.limit(request.args["limit"], problems) if "limit" in request.args else None
    skip = query.offset(request.args.get("offset"), problems)
    if problems:
        raise Invalid(problems)
    # `name_prefix`: a person's own keys are `me:<user id>:<name>` (a person's console page)
    prefix = request.args.get("name_prefix") or None
    found = await asyncio.to_thread(lambda: api_keys.list_keys(
        api.database, name_prefix=prefix, limit=size, offset=skip))
    # beside them the names a new key may name (the console's keys page offers them: the
    # servers' names alone, not every server's whole definition through /servers)
    return json_response({"items": [KeyOut(**k.public()) for k in found],
                          "endpoints": sorted(await api.registry.names())})


async def create_key(who: Caller, api: Api) -> Response:
    body = await read(KeyIn, _known_endpoints(api), _auditor_names_no_endpoint(api))
    key, secret = await asyncio.to_thread(api_keys.create, api.database, body.name,
                                          body.endpoints, body.role, body.expires_in_days)
    return json_response(KeyCreated(**key.public(), key=secret), 201)


async def key(who: Caller, api: Api, key_id: str) -> Response:
    found = await asyncio.to_thread(api_keys.get, api.database, _key_id(key_id))
    if found is None:
        raise NotFound(f"API key '{key_id}' not found")
    return json_response(KeyOut(**found.public()))


async def put_key(who: Caller, api: Api, key_id: str) -> Response:
    body = await read(KeyPut, same_as_path("id", key_id), _known_endpoints(api),
                      _auditor_names_no_endpoint(api))
    return await _change_key(api, key_id, {"name": body.name, "endpoints": body.endpoints,
                                           "role": body.role, "expires_at": body.expires_at})


async def patch_key(who: Caller, api: Api, key_id: str) -> Response:
    body = await read(KeyPatch, same_as_path("id", key_id), _known_endpoints(api),
                      _auditor_names_no_endpoint(api, key_id))
    sent = body.model_fields_set - {"id"}
    return await _change_key(api, key_id, {field: getattr(body, field) for field in sent})


async def revoke_key(who: Caller, api: Api, key_id: str) -> Response:
    if not await asyncio.to_thread(api_keys.revoke, api.database, _key_id(key_id)):
        raise NotFound(f"API key '{key_id}' not found or already revoked")
    return Response(b"", 204)
