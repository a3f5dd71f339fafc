"""The authorization server's HTTP surface. Every error is RFC 6749 section 5.2's shape;
errors that can be reported to the client go back through its registered redirect URI."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import html
import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlencode

import orjson
from quart import Quart, Response, request

from proxy.auth.lockout import Attempt, Locked
from proxy.oauth.cimd import MetadataDocuments
from proxy.oauth.server import AuthorizationServer, Client, OAuthError
from proxy.signin import COOKIE, Web, page, see_other
from proxy.state.flows import ForeignFlow

JSON = {"Content-Type": "application/json", "Cache-Control": "no-store", "Pragma": "no-cache"}


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status, {**JSON, **(headers or {})})


def _error(exc: OAuthError) -> Response:
    return _json({"error": exc.error, "error_description": exc.wire_message}, exc.status,
                 exc.headers)


def register(app: Quart, server: Callable[[], AuthorizationServer], web: Callable[[], Web],
             documents: MetadataDocuments | None = None) -> None:
    documents = documents or MetadataDocuments()
    # the authorization server's database-only steps run in a worker thread (asyncio.to_thread);
    # the steps that touch live state are its async methods

    async def known(client_id: str | None) -> None:
        """A client_id that is an https URL is a metadata document: fetch it (cached)."""
        if client_id and documents.applies(client_id) \
                and await asyncio.to_thread(server().client, client_id) is None:
            server().cimd[client_id] = await documents.client(client_id)

    @app.route("/.well-known/oauth-authorization-server")
    async def metadata() -> Response:
        return _json(server().metadata(), headers={"Cache-Control": "public, max-age=300"})

    @app.route("/oauth/jwks.json")
    async def jwks() -> Response:
        return _json(server().keys.jwks(), headers={"Cache-Control": "public, max-age=300"})

    @app.route("/oauth/authorize", methods=["GET"])
    async def authorize() -> Response:
        params = {k: v for k, v in request.args.items()}
        try:
            await known(params.get("client_id"))
            client, redirect_uri = await asyncio.to_thread(server().check_authorize, params)
        except OAuthError as exc:
            return _error(exc)  # never redirect to a URI that is not registered
        try:
            resource = server().check_request(params)
        except OAuthError as exc:
            return _back(redirect_uri, params, {"error": exc.error,
                                                "error_description": exc.wire_message})
        w = web()
        cookie = request.cookies.get(COOKIE)
        user = await w.user(cookie)
        if user is None or cookie is None:
            here = request.full_path if request.query_string else request.path
            return see_other("/signin?" + urlencode({"next": here}))
        # a consent form's token, bound to the browser session and to the exact request
        token = secrets.token_urlsafe(24)
        await server().consents.put(token, _binding(cookie), params)
        endpoint = server().endpoint_of(resource) or "?"
        body = (f"<p><strong>{html.escape(client.name)}</strong> asks to act as "
                f"<strong>{html.escape(user.name)}</strong> on the Tollhouse endpoint "
                f"<code>{html.escape(endpoint)}</code> ({html.escape(resource)}).</p>"
                f"<p>It will be sent back to <code>{html.escape(redirect_uri)}</code>.</p>"
                "<form method='post' action='/oauth/authorize'>"
                f"<input type='hidden' name='consent' value='{token}'>"
                "<button type='submit' name='decision' value='allow'>Allow</button> "
                "<button type='submit' name='decision' value='deny'>Deny</button></form>")
        return page("Allow access?", body)

    @app.route("/oauth/authorize", methods=["POST"])
    async def decide() -> Response:
        w = web()
        if not w.same_origin(request.headers):
            return _error(OAuthError("access_denied", "the consent form must come from this "
                                     "gateway", 403))
        form = await request.form
        cookie = request.cookies.get(COOKIE)
        try:
            params = await server().consents.take(form.get("consent", ""),
                                                  _binding(cookie or ""))
        except ForeignFlow:
            params = None  # left for the browser session that was shown the form
        if params is None or cookie is None:
            return _error(OAuthError("invalid_request", "the consent expired or belongs to "
                                     "another browser session"))
        user = await w.user(cookie)
        if user is None:
            return _error(OAuthError("access_denied", "sign in again", 401))
        try:
            client, redirect_uri = await asyncio.to_thread(server().check_authorize, params)
            resource = server().check_request(params)
        except OAuthError as exc:
            return _error(exc)
        if form.get("decision") != "allow":
            return _back(redirect_uri, params, {"error": "access_denied",
                                                "error_description": "the user declined"})
        code = await server().issue_code(client, redirect_uri, params, user, resource)
        return _back(redirect_uri, params, {"code": code, "iss": server().issuer})

    @app.route("/oauth/token", methods=["POST"])
    async def token() -> Response:
        try:
            form = await _form()
            client = await _client(form)
            grant = form.get("grant_type")
            if grant == "authorization_code":
                return _json(await server().exchange_code(client, form))
            if grant == "refresh_token":
                return _json(await server().refresh(client, form, web().accounts.get))
            raise OAuthError("unsupported_grant_type",
                             "grant_type must be authorization_code or refresh_token")
        except OAuthError as exc:
            return _error(exc)

    @app.route("/oauth/register", methods=["POST"])
    async def register_client() -> Response:
        try:
            try:
                metadata = orjson.loads(await request.get_data())
            except orjson.JSONDecodeError:
                raise OAuthError("invalid_client_metadata", "the body is not JSON") from None
            return _json(await asyncio.to_thread(server().register, metadata), 201)
        except OAuthError as exc:
            return _error(exc)

    @app.route("/oauth/revoke", methods=["POST"])
    async def revoke() -> Response:
        try:
            form = await _form()
            client = await _client(form)
            await server().revoke(client, form.get("token", ""))
            return Response(b"", 200, {"Cache-Control": "no-store"})
        except OAuthError as exc:
            return _error(exc)

    async def _form() -> dict[str, str]:
        if not request.mimetype == "application/x-www-form-urlencoded":
            raise OAuthError("invalid_request",
                             "the body must be application/x-www-form-urlencoded")
        form = await request.form
        return {k: v for k, v in form.items()}

    async def _client(form: dict[str, str]) -> Client:
        """Client authentication; repeated failures lock out the address and the client."""
        client_id, secret = form.get("client_id"), form.get("client_secret")
        basic = request.headers.get("Authorization", "")
        if basic.lower().startswith("basic "):
            try:
                pair = base64.b64decode(basic[6:]).decode()
                client_id, secret = (unquote(p) for p in pair.split(":", 1))
            except (ValueError, UnicodeDecodeError):
                raise OAuthError("invalid_client", "malformed Basic credentials", 401) from None
        w = web()
        peer = w.client_address(request.remote_addr, request.headers)
        watch = (f"oauth-ip:{peer}", f"oauth-client:{(client_id or '')[:100]}")
        try:
            # the lockout first: a locked-out caller makes the gateway fetch nothing
            async with Attempt(w.lockouts, watch) as attempt:
                try:
                    await known(client_id)  # a metadata document that cannot be had fails too
                    return await asyncio.to_thread(server().authenticate_client, client_id,
                                                   secret)
                except OAuthError:
                    attempt.failed = True
                    raise
        except Locked as locked:
            raise OAuthError("too_many_requests", "too many failed attempts; try again later",
                             429, {"Retry-After": str(max(1, int(locked.retry_after_s) + 1))}
                             ) from None


def _binding(cookie: str) -> str:
    """What a consent is bound to: the browser session, as a digest (never the cookie)."""
    return hashlib.sha256(cookie.encode()).hexdigest()


def _back(redirect_uri: str, params: dict[str, str], answer: dict[str, str]) -> Response:
    if params.get("state") is not None:
        answer["state"] = params["state"]
    separator = "&" if "?" in redirect_uri else "?"
    return see_other(redirect_uri + separator + urlencode(answer))
