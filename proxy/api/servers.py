"""/api/v1/servers: the upstream servers, from the config file (read-only) and registered
through the API; `proxy.servers` holds them and applies each change to the live edge."""

from __future__ import annotations

from quart import Response, request

from proxy.api import query
from proxy.api.bodies import Problems, json_response, read, same_as_path
from proxy.api.caller import Caller
from proxy.api.context import Api
from proxy.api.models import ServerIn, ServerPatch
from proxy.errors import Invalid


async def servers(who: Caller, api: Api) -> Response:
    """Every server by name, or with `limit` (and `offset`) a page of them."""
    problems: Problems = []
    size = query.limit(request.args["limit"], problems) if "limit" in request.args else None
    skip = query.offset(request.args.get("offset"), problems)
    if problems:
        raise Invalid(problems)
    return json_response({"items": await api.registry.list(limit=size, offset=skip)})


async def create_server(who: Caller, api: Api) -> Response:
    return json_response(await api.registry.create(await read(ServerIn)), 201)


async def server(who: Caller, api: Api, name: str) -> Response:
    return json_response(await api.registry.get(name))


async def put_server(who: Caller, api: Api, name: str) -> Response:
    body = await read(ServerIn, same_as_path("name", name))
    return json_response(await api.registry.replace(name, body))


async def patch_server(who: Caller, api: Api, name: str) -> Response:
    patch = await read(ServerPatch)
    return json_response(await api.registry.patch(
        name, patch.model_dump(mode="json", exclude_none=True)))


async def delete_server(who: Caller, api: Api, name: str) -> Response:
    await api.registry.delete(name)
    return Response(b"", 204)
