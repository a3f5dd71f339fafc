"""The authorization server's HTTP surface: module-level handlers over one `OAuthRoutes`. Every
error is RFC 6749 section 5.2's shape (`proxy.errors.OAuthError`, rendered by the app's error
handler); errors that can be reported to the client go back through its registered redirect
URI."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import html
import secrets
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import unquote, urlencode

import orjson
from quart import Quart, Response, request

from proxy.auth.lockout import Attempt
from proxy.errors import OAuthError
from proxy.held import held
from proxy.oauth.cimd import MetadataDocuments
from proxy.oauth.grants import CLIENT_CREDENTIALS, GRANT_TYPES, JWT_BEARER, TOKEN_EXCHANGE
from proxy.oauth.redirects import redirect_source
from proxy.oauth.server import AuthorizationServer, Client
from proxy.people.accounts import User
from proxy.people.signin import COOKIE, Web, page, see_other
from proxy.state.flows import ForeignFlow

JSON = {"Content-Type": "application/json", "Cache-Control": "no-store", "Pragma": "no-cache"}
BASIC_CHALLENGE = {"WWW-Authenticate": 'Basic realm="tollhouse", charset="UTF-8"'}


@dataclass(frozen=True)
class OAuthRoutes:
    """What the authorization server's routes work with, bound to each handler when it is
    registered."""

    server: AuthorizationServer
    web: Web
    documents: MetadataDocuments


def register(app: Quart, server: AuthorizationServer, web: Web,
             documents: MetadataDocuments | None = None) -> None:
    here = OAuthRoutes(server, web, documents or MetadataDocuments())
    app.add_url_rule("/.well-known/oauth-authorization-server", "metadata",
                     partial(metadata, here))
    app.add_url_rule("/oauth/jwks.json", "jwks", partial(jwks, here))
    app.add_url_rule("/oauth/authorize", "authorize", partial(authorize, here), methods=["GET"])
    app.add_url_rule("/oauth/authorize", "decide", partial(decide, here), methods=["POST"])
    app.add_url_rule("/oauth/token", "token", partial(token, here), methods=["POST"])
    app.add_url_rule("/oauth/register", "register_client", partial(register_client, here),
                     methods=["POST"])
    app.add_url_rule("/oauth/revoke", "revoke", partial(revoke, here), methods=["POST"])


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status, {**JSON, **(headers or {})})


# The authorization server's database-only steps run in a worker thread (asyncio.to_thread);
# the steps that touch live state are its async methods. An OAuthError raised here is
# answered by the app's error handler (proxy.web.routes) in RFC 6749's shape.

async def metadata(here: OAuthRoutes) -> Response:
    return _json(here.server.metadata(), headers={"Cache-Control": "public, max-age=300"})


async def jwks(here: OAuthRoutes) -> Response:
    return _json(await here.server.keys.published(), headers={"Cache-Control": "public, max-age=300"})


async def authorize(here: OAuthRoutes) -> Response:
    params = {k: v for k, v in request.args.items()}
    # an error before the redirect URI is known to be registered is answered here, never
    # sent to a URI that is not registered
    await _known(here, params.get("client_id"))
    client, redirect_uri = await asyncio.to_thread(here.server.check_authorize, params)
    try:
        resource = here.server.check_request(params)
    except OAuthError as exc:
        return _back(redirect_uri, params, exc.as_params())
    cookie = request.cookies.get(COOKIE)
    user = await here.web.user(cookie)
    if user is None or cookie is None:
        target = request.full_path if request.query_string else request.path
        return see_other("/signin?" + urlencode({"next": target}))
    # a consent form's token, bound to the browser session and to the exact request
    consent = secrets.token_urlsafe(24)
    await here.server.consents.put(consent, _binding(cookie), params)
    endpoint = here.server.endpoint_of(resource) or "?"
    form = ("<form method='post' action='/oauth/authorize'>"
            f"<input type='hidden' name='consent' value='{consent}'>")
    refused = _refusal(endpoint, user)
    if refused is not None:  # no Allow: a token every call would refuse helps nobody
        body = (f"<p role='alert'>You may not use the Tollhouse endpoint "
                f"<code>{html.escape(endpoint)}</code>: {html.escape(refused)}. Ask an "
                "administrator for access.</p>"
                f"<p><strong>{html.escape(client.name)}</strong> will be told so at "
                f"<code>{html.escape(redirect_uri)}</code>.</p>"
                f"{form}<button type='submit' name='decision' value='deny'>Back to "
                f"{html.escape(client.name)}</button></form>")
        return _consent_page("Access not allowed", body, redirect_uri)
    body = (f"<p><strong>{html.escape(client.name)}</strong> asks to act as "
            f"<strong>{html.escape(user.name)}</strong> on the Tollhouse endpoint "
            f"<code>{html.escape(endpoint)}</code> ({html.escape(resource)}).</p>"
            "<p>The access it gets is for this endpoint only: to use another one, it asks "
            "again (one token per endpoint).</p>"
            f"<p>It will be sent back to <code>{html.escape(redirect_uri)}</code>.</p>"
            f"{form}<button type='submit' name='decision' value='allow'>Allow</button> "
            "<button type='submit' name='decision' value='deny'>Deny</button></form>")
    return _consent_page("Allow access?", body, redirect_uri)


def _consent_page(title: str, body: str, redirect_uri: str) -> Response:
    """The consent page, whose form's answer is a redirect to the client: its CSP
    `form-action` names that redirect's target as well as this gateway, since Chromium
    checks a form's redirects against it and would block one to `cursor://...` (a
    private-use scheme, which `*` does not cover), as fastmcp #2302 reports."""
    response = page(title, body)
    response.headers["Content-Security-Policy"] = (
        f"default-src 'none'; form-action 'self' {redirect_source(redirect_uri)}; "
        "style-src 'self'; frame-ancestors 'none'")
    return response


def _refusal(endpoint: str, user: User) -> str | None:
    """Why `user` may not use `endpoint` by its access rules as the gateway applies them now
    (the running chain's access policy), or None."""
    gateway = held().gateway
    access = None if gateway is None else gateway.live.access
    return None if access is None else access.refusal(endpoint, user.principal())


async def decide(here: OAuthRoutes) -> Response:
    if not here.web.same_origin(request.headers):
        raise OAuthError("access_denied", "the consent form must come from this gateway", 403)
    form = await request.form
    cookie = request.cookies.get(COOKIE)
    try:
        params = await here.server.consents.take(form.get("consent", ""),
                                                 _binding(cookie or ""))
    except ForeignFlow:
        params = None  # left for the browser session that was shown the form
    if params is None or cookie is None:
        raise OAuthError("invalid_request", "the consent expired or belongs to another "
                         "browser session")
    user = await here.web.user(cookie)
    if user is None:
        raise OAuthError("access_denied", "sign in again", 401)
    client, redirect_uri = await asyncio.to_thread(here.server.check_authorize, params)
    resource = here.server.check_request(params)
    refused = _refusal(here.server.endpoint_of(resource) or "", user)
    if refused is not None:  # the person was told on the page; the client is told here
        return _back(redirect_uri, params, OAuthError("access_denied", refused).as_params())
    if form.get("decision") != "allow":
        return _back(redirect_uri, params,
                     OAuthError("access_denied", "the user declined").as_params())
    code = await here.server.issue_code(client, redirect_uri, params, user, resource)
    return _back(redirect_uri, params, {"code": code, "iss": here.server.issuer})


async def token(here: OAuthRoutes) -> Response:
    form = await _form()
    client = await _client(here, form)
    grant = form.get("grant_type")
    if grant == "authorization_code":
        return _json(await here.server.exchange_code(client, form))
    if grant == "refresh_token":
        return _json(await here.server.refresh(client, form, here.web.accounts.get))
    grants = here.server.grants
    if grant == CLIENT_CREDENTIALS:
        return _json(await grants.client_credentials(client.client_id, form))
    if grant == JWT_BEARER:
        return _json(await grants.identity_assertion(client.client_id, form,
                                                     here.web.accounts))
    if grant == TOKEN_EXCHANGE:
        return _json(await grants.exchange(client.client_id, form, here.web.accounts))
    raise OAuthError("unsupported_grant_type",
                     "grant_type must be authorization_code, refresh_token, "
                     f"{', '.join(GRANT_TYPES)}")


async def register_client(here: OAuthRoutes) -> Response:
    try:
        document = orjson.loads(await request.get_data())
    except orjson.JSONDecodeError:
        raise OAuthError("invalid_client_metadata", "the body is not JSON") from None
    return _json(await asyncio.to_thread(here.server.register, document), 201)


async def revoke(here: OAuthRoutes) -> Response:
    form = await _form()
    client = await _client(here, form)
    await here.server.revoke(client, form.get("token", ""))
    return Response(b"", 200, {"Cache-Control": "no-store"})


async def _known(here: OAuthRoutes, client_id: str | None) -> None:
    """A client_id that is an https URL is a metadata document: fetch it (cached)."""
    if client_id and here.documents.applies(client_id) \
            and await asyncio.to_thread(here.server.client, client_id) is None:
        here.server.cimd[client_id] = await here.documents.client(client_id)


async def _form() -> dict[str, str]:
    if not request.mimetype == "application/x-www-form-urlencoded":
        raise OAuthError("invalid_request", "the body must be application/x-www-form-urlencoded")
    form = await request.form
    return {k: v for k, v in form.items()}


async def _client(here: OAuthRoutes, form: dict[str, str]) -> Client:
    """Client authentication; repeated failures lock out the address and the client (the
    lockout first: a locked-out caller makes the gateway fetch nothing)."""
    client_id, secret = form.get("client_id"), form.get("client_secret")
    if "client_assertion" in form or "client_assertion_type" in form:  # private_key_jwt
        return await _asserted(here, form)
    basic = request.headers.get("Authorization", "")
    if basic.lower().startswith("basic "):
        try:
            pair = base64.b64decode(basic[6:]).decode()
            client_id, secret = (unquote(p) for p in pair.split(":", 1))
        except (ValueError, UnicodeDecodeError):
            raise OAuthError("invalid_client", "malformed Basic credentials", 401,
                             BASIC_CHALLENGE) from None
        try:
            return await _authenticated(here, client_id, secret)
        except OAuthError as exc:
            if exc.status == 401:  # RFC 6749 section 5.2: the scheme the client used
                exc.headers = {**exc.headers, **BASIC_CHALLENGE}
            raise
    return await _authenticated(here, client_id, secret)


async def _authenticated(here: OAuthRoutes, client_id: str | None,
                         secret: str | None) -> Client:
    peer = here.web.client_address(request.remote_addr, request.headers)
    watch = (f"oauth-ip:{peer}", f"oauth-client:{(client_id or '')[:100]}")
    async with Attempt(here.web.lockouts, watch, "oauth: locked out after repeated failures") \
            as attempt:
        try:
            await _known(here, client_id)  # a metadata document that cannot be had fails too
            return await asyncio.to_thread(here.server.authenticate_client, client_id, secret)
        except OAuthError:
            attempt.failed = True
            raise


async def _asserted(here: OAuthRoutes, form: dict[str, str]) -> Client:
    """A registered client's private_key_jwt (proxy.oauth.machines), under the same lockout
    as a secret."""
    peer = here.web.client_address(request.remote_addr, request.headers)
    watch = (f"oauth-ip:{peer}", f"oauth-client:{form.get('client_id', '')[:100]}")
    async with Attempt(here.web.lockouts, watch, "oauth: locked out after repeated failures") \
            as attempt:
        try:
            machine = await here.server.machines.asserted(form)
        except OAuthError:
            attempt.failed = True
            raise
    client = await asyncio.to_thread(here.server.client, machine.client_id)
    assert client is not None  # a registered client is always known
    return client


def _binding(cookie: str) -> str:
    """What a consent is bound to: the browser session, as a digest (never the cookie)."""
    return hashlib.sha256(cookie.encode()).hexdigest()


def _back(redirect_uri: str, params: dict[str, str], answer: dict[str, str]) -> Response:
    if params.get("state") is not None:
        answer["state"] = params["state"]
    separator = "&" if "?" in redirect_uri else "?"
    return see_other(redirect_uri + separator + urlencode(answer))
