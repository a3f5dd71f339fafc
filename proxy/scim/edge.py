"""/scim/v2: the ASGI layer that answers every path under it, in front of Quart, with
`scim2-server`'s `ASGIApplication` over `ScimStore`. It reads the body up to
`server.max_request_bytes` (413 in SCIM's shape beyond), authenticates the identity
provider's client by `[scim] token` (compared in constant time; the token is never logged nor
echoed), and answers every failure as a SCIM error (`urn:ietf:params:scim:api:messages:2.0:
Error`): a malformed filter or body is a 400 with its `scimType` (`invalidFilter`,
`invalidValue`, `invalidSyntax`...), an unexpected fault a 500 that says nothing of it.
ServiceProviderConfig is public (RFC 7643 section 5); everything else needs the token."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from scim2_models import (
    AuthenticationScheme,
    Bulk,
    ChangePassword,
    EnterpriseUser,
    ETag,
    External,
    Filter,
    Group,
    Patch,
    PayloadTooLargeException,
    Reference,
    Resource,
    ResourceType,
    ScimProvider,
    ServiceProviderConfig,
    Sort,
    UnauthorizedException,
    User,
)
from scim2_server.applications.asgi import ASGIApplication
from scim2_server.requests import ScimRequest
from scim2_server.responses import ScimResponse
from scim2_server.service import ScimService

from proxy.scim.storage import ScimStore

log = logging.getLogger("tollhouse.scim")

PREFIX = "/scim/v2"
MAX_RESULTS = 1000  # a page's largest count (advertised in ServiceProviderConfig)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

BEARER = AuthenticationScheme(
    type=AuthenticationScheme.Type.oauthbearertoken, name="OAuth Bearer Token",
    description="The bearer token of [scim] token, sent as Authorization: Bearer <token>",
    spec_uri=Reference[External]("https://www.rfc-editor.org/rfc/rfc6750"), primary=True)


def provider() -> ScimProvider:
    """What this gateway serves and says it supports: Users (with the enterprise extension)
    and Groups; PATCH, filters, sorting and ETags; no bulk, no password changes."""
    config = ServiceProviderConfig(
        patch=Patch(supported=True),
        bulk=Bulk(supported=False, max_operations=0, max_payload_size=0),
        filter=Filter(supported=True, max_results=MAX_RESULTS),
        change_password=ChangePassword(supported=False),
        sort=Sort(supported=True), etag=ETag(supported=True),
        authentication_schemes=[BEARER])
    return ScimProvider(models=[User, EnterpriseUser, Group],
                        resource_types=[ResourceType.from_resource(User[EnterpriseUser]),
                                        ResourceType.from_resource(Group)],
                        config=config)


class ScimApp(ASGIApplication):
    """`scim2-server`'s ASGI application with this gateway's authentication and URLs."""

    def __init__(self, store: ScimStore, scim_provider: ScimProvider, token: str,
                 public_url: str, max_body: int) -> None:
        super().__init__(store, scim_provider, ScimService(scim_provider))
        self.store = store  # its `changes` are set once the gateway serves (deprovisioning)
        self._token = token.encode()
        self._base_url = public_url.rstrip("/") + PREFIX
        self._max_body = max_body

    def check_auth(self, request: ScimRequest) -> None:
        scheme, _, token = (request.header("Authorization") or "").partition(" ")
        # compare_digest on bytes of any length: the time says nothing of the token
        presented = token.strip().encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented, self._token):
            raise UnauthorizedException(detail="a valid bearer token is required")

    async def read_request(self, scope: Scope, receive: Receive) -> ScimRequest:
        path = scope["path"].removeprefix(PREFIX)
        request = ScimRequest(
            method=scope["method"], base_url=self._base_url,
            path=path.removesuffix(".scim") or "/",
            query=dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                                 keep_blank_values=True)),
            headers=[(n.decode("latin-1"), v.decode("latin-1")) for n, v in scope["headers"]])
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self._max_body:
                raise PayloadTooLargeException(detail=f"the body is over {self._max_body} bytes")
        request.body = body
        return request

    def handle_exception(self, request: ScimRequest, exception: Exception) -> ScimResponse:
        if not hasattr(exception, "status"):
            log.exception("SCIM %s %s failed", request.method, request.path)
        else:
            log.info("SCIM %s %s: %s", request.method, request.path,
                     getattr(exception, "status", ""))
        return self.service.error_response(exception)


class ScimEdge:
    """The ASGI layer: /scim/v2 and every path under it go to the SCIM app, the rest on."""

    def __init__(self, inner: Callable[..., Awaitable[None]], app: ScimApp) -> None:
        self._inner = inner
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == PREFIX or path.startswith(PREFIX + "/")):
            await self._inner(scope, receive, send)
            return
        app = self._app
        try:
            request = await app.read_request(scope, receive)
        except PayloadTooLargeException as exc:
            await app.send_response(app.service.error_response(exc), send)
            return
        await app.send_response(await app.serve(request), send)


def models_of(scim_provider: ScimProvider) -> Callable[[str], type[Resource[Any]]]:
    """Each resource type's model, by name."""
    def model(name: str) -> type[Resource[Any]]:
        found = scim_provider.model_for(name)
        assert found is not None and issubclass(found, Resource)
        return found
    return model
