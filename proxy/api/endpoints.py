"""/api/v1/endpoints: the virtual endpoints, from the config file (read-only) and created
through the API; `proxy.virtual.registry` holds them and applies each change to the edge."""

from __future__ import annotations

from quart import Response

from proxy.api.bodies import json_response, read, same_as_path
from proxy.api.caller import Caller
from proxy.api.context import Api
from proxy.virtual.schema import EndpointIn, EndpointPatch


async def endpoints(who: Caller, api: Api) -> Response:
    assert api.endpoints is not None
    return json_response({"items": await api.endpoints.list()})


async def create_endpoint(who: Caller, api: Api) -> Response:
    assert api.endpoints is not None
    return json_response(await api.endpoints.create(await read(EndpointIn)), 201)


async def endpoint(who: Caller, api: Api, name: str) -> Response:
    assert api.endpoints is not None
    return json_response(await api.endpoints.get(name))


async def put_endpoint(who: Caller, api: Api, name: str) -> Response:
    assert api.endpoints is not None
    body = await read(EndpointIn, same_as_path("name", name))
    return json_response(await api.endpoints.replace(name, body))


async def patch_endpoint(who: Caller, api: Api, name: str) -> Response:
    assert api.endpoints is not None
    patch = await read(EndpointPatch)
    return json_response(await api.endpoints.patch(
        name, patch.model_dump(mode="json", exclude_none=True)))


async def delete_endpoint(who: Caller, api: Api, name: str) -> Response:
    assert api.endpoints is not None
    await api.endpoints.delete(name)
    return Response(b"", 204)
