"""/api/v1/servers: the upstream servers, from the config file (read-only) and registered
through the API; `proxy.registry` holds them and applies each change to the live edge."""

from __future__ import annotations

from quart import Response

from proxy.api.bodies import json_response, read, same_as_path
from proxy.api.caller import Caller
from proxy.api.context import Api
from proxy.api.models import ServerIn, ServerPatch


async def servers(who: Caller, api: Api) -> Response:
    return json_response({"items": await api.registry.list()})


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
