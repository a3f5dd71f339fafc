"""Tollhouse's own OAuth 2.1 authorization server, end to end on loopback.

The official SDK's ``OAuthClientProvider`` discovers everything from the gateway's 401
(protected-resource metadata -> RFC 8414 metadata -> dynamic registration), a headless
"browser" (plain httpx with a cookie jar) signs in and consents, and the SDK client then
lists and calls tools through the gateway, refreshes its access token, and sees a revoked
grant refused. The attack tests below drive the same server with plain httpx.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import httpx2
import jwt
import orjson
import pytest
from mcp import types
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from pydantic import AnyUrl

from proxy.oauth.cimd import MetadataDocuments
from proxy.oauth.server import Client, OAuthError
from proxy.people.accounts import Accounts
from proxy.storage.db import Database
from tests import db_backends
from tests.e2e.sdk_client import connect
from tests.e2e.upstreams import UpstreamProbe, stateful_sse_app
from tests.stack import gateway_stack

USER, PASSWORD = "alice", "pw-alice-123"
REDIRECT_URI = "http://127.0.0.1:47011/callback"  # never dialled: the test reads the Location
MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "raw", "version": "0"}}}


# -- servers -------------------------------------------------------------------------------------


@dataclass
class Gw:
    url: str
    db_path: str
    probe: UpstreamProbe

    def endpoint(self, name: str = "up") -> str:
        return f"{self.url}/mcp/{name}"

    def resource(self, name: str = "up") -> str:
        return self.endpoint(name)

    def clients(self) -> list[tuple[str, str, str]]:
        return [(str(a), str(b), str(c)) for a, b, c in db_backends.rows(
            self.db_path, "SELECT client_id, name, auth_method FROM oauth_clients")]


@asynccontextmanager
async def oauth_gateway(tmp_path: Path, *, endpoints: tuple[str, ...] = ("up",),
                        auth: dict[str, Any] | None = None,
                        access: dict[str, Any] | None = None,
                        access_on: tuple[str, ...] | None = None,
                        server: dict[str, Any] | None = None,
                        oauth: dict[str, Any] | None = None) -> AsyncIterator[Gw]:
    """`access` applies to the endpoints in `access_on` (all of them when None)."""
    upstream_app, probe = stateful_sse_app()
    database = db_backends.open_database()
    Accounts(database).create_local(USER, PASSWORD)
    db_path = database.url
    async with gateway_stack(lambda urls: {
            "server": {"listen": "127.0.0.1:8080", "public_url": urls.gateway,
                       **(server or {})},
            "auth": {"mode": "jwt", **(auth or {})},
            "oauth_server": {"enabled": True, **(oauth or {})},
            "database": {"url": db_path}, "state": {"url": "memory"},
            "upstreams": [{"name": n, "url": f"{urls.upstream}/mcp",
                           **({"access": access} if access and (
                               access_on is None or n in access_on) else {})}
                          for n in endpoints]},
            upstream=upstream_app, secret_key="test-secret") as site:
        yield Gw(site.url, db_path, probe)


# -- a headless browser --------------------------------------------------------------------------


class _Forms(HTMLParser):
    """The forms of a page: action, method, hidden inputs and submit buttons."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[dict[str, Any]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form":
            self.forms.append({"action": a.get("action", ""), "method": a.get("method", "get"),
                               "hidden": {}, "buttons": []})
        elif self.forms and tag == "input" and a.get("type") == "hidden":
            self.forms[-1]["hidden"][a.get("name", "")] = a.get("value", "")
        elif self.forms and tag == "button":
            self.forms[-1]["buttons"].append((a.get("name", ""), a.get("value", "")))


def forms(page: str) -> list[dict[str, Any]]:
    parser = _Forms()
    parser.feed(page)
    return parser.forms


@dataclass
class Browser:
    """A person at a browser: follows the authorization URL, signs in, clicks Allow."""

    base: str
    http: httpx.AsyncClient
    trail: list[tuple[str, str, int]] = field(default_factory=list)
    user: str = USER
    password: str = PASSWORD
    page: httpx.Response | None = None  # the last consent page shown

    async def _go(self, method: str, url: str, **kw: Any) -> httpx.Response:
        response = await self.http.request(method, url, **kw)
        self.trail.append((method, urlsplit(str(response.request.url)).path, response.status_code))
        return response

    async def consent(self, authorization_url: str) -> str:
        """Sign in if needed, allow, and return the redirect back to the client."""
        return await self.decide(authorization_url, "allow")

    async def decide(self, authorization_url: str, decision: str) -> str:
        """Sign in if needed, press the `decision` button, return the redirect back."""
        origin = {"Origin": self.base}
        response = await self._go("GET", authorization_url)
        if response.status_code == 303 and response.headers["location"].startswith("/signin?"):
            login = await self._go("GET", self.base + response.headers["location"])
            assert login.status_code == 200, login.text
            (form,) = forms(login.text)
            assert form["action"] == "/signin" and form["method"] == "post"
            signed = await self._go("POST", self.base + "/signin", headers=origin,
                                    data={**form["hidden"], "name": self.user,
                                          "password": self.password})
            assert signed.status_code == 303, signed.text
            assert "tollhouse_session" in signed.cookies
            next_url = parse_qs(urlsplit(response.headers["location"]).query)["next"][0]
            assert signed.headers["location"] == next_url
            response = await self._go("GET", self.base + next_url)
        assert response.status_code == 200, (response.status_code, response.text)
        (form,) = forms(response.text)
        assert form["action"] == "/oauth/authorize" and form["method"] == "post"
        assert ("decision", decision) in form["buttons"], response.text
        self.page = response
        decided = await self._go("POST", self.base + "/oauth/authorize", headers=origin,
                                 data={**form["hidden"], "decision": decision})
        assert decided.status_code == 303, (decided.status_code, decided.text)
        return decided.headers["location"]


@asynccontextmanager
async def browser(base: str) -> AsyncIterator[Browser]:
    async with httpx.AsyncClient(follow_redirects=False, timeout=10) as http:
        yield Browser(base, http)


def query(location: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


# -- the official SDK client ---------------------------------------------------------------------


class MemoryStorage:
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None
        self.history: list[OAuthToken] = []

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens
        self.history.append(tokens)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


def echo_text(result: types.CallToolResult) -> str:
    assert not result.is_error, result
    (content,) = result.content
    assert isinstance(content, types.TextContent)
    return content.text


async def test_sdk_oauth_discovery_consent_refresh_revoke(tmp_path: Path) -> None:
    async with oauth_gateway(tmp_path) as gw, browser(gw.url) as person:
        wire: list[tuple[str, str, int, str]] = []  # method, path, status, grant_type

        async def on_response(response: httpx2.Response) -> None:
            request = response.request
            grant = ""
            if request.url.path == "/oauth/token":
                grant = parse_qs(request.content.decode()).get("grant_type", [""])[0]
            wire.append((request.method, request.url.path, response.status_code, grant))

        redirects: list[str] = []

        async def redirect_handler(authorization_url: str) -> None:
            params = query(authorization_url)
            assert urlsplit(authorization_url).path == "/oauth/authorize"
            assert params["resource"] == gw.resource()
            assert params["code_challenge_method"] == "S256"
            assert params["redirect_uri"] == REDIRECT_URI
            redirects.append(await person.consent(authorization_url))

        async def callback_handler() -> AuthorizationCodeResult:
            back = redirects[-1]
            assert back.startswith(REDIRECT_URI + "?")
            params = query(back)
            return AuthorizationCodeResult(code=params["code"], state=params["state"],
                                           iss=params.get("iss"))

        storage = MemoryStorage()
        provider = OAuthClientProvider(
            server_url=gw.endpoint(),
            client_metadata=OAuthClientMetadata(
                client_name="tollhouse e2e", redirect_uris=[AnyUrl(REDIRECT_URI)],
                token_endpoint_auth_method="client_secret_basic"),
            storage=storage, redirect_handler=redirect_handler, callback_handler=callback_handler)

        async with httpx2.AsyncClient(auth=provider, timeout=httpx2.Timeout(30, read=300),
                                      event_hooks={"response": [on_response]}) as http, \
                connect(gw.endpoint(), http_client=http) as client:
            tools = await client.list_tools()
            assert "echo" in {t.name for t in tools.tools}
            assert echo_text(await client.call_tool("echo", {"text": "hi"})) == "hi"

            # discovery started from the 401 and registered one client dynamically
            first = [(m, p, s) for m, p, s, _ in wire[:6]]
            assert first == [
                ("POST", "/mcp/up", 401),
                ("GET", "/.well-known/oauth-protected-resource/mcp/up", 200),
                ("GET", "/.well-known/oauth-authorization-server", 200),
                ("POST", "/oauth/register", 201),
                ("POST", "/oauth/token", 200),
                ("POST", "/mcp/up", 200),
            ], wire
            assert wire[4][3] == "authorization_code"
            assert [p for _, p, _ in person.trail] == [
                "/oauth/authorize", "/signin", "/signin", "/oauth/authorize",
                "/oauth/authorize"]
            (registered,) = gw.clients()
            assert storage.client_info is not None
            assert registered == (storage.client_info.client_id, "tollhouse e2e",
                                  "client_secret_basic")
            assert storage.client_info.client_secret
            assert len(storage.history) == 1 and storage.history[0].refresh_token
            session_id = client.session_id
            assert session_id

            # refresh: make the provider believe its access token expired
            first_tokens = storage.history[0]
            provider.context.token_expiry_time = time.time() - 1
            mark = len(wire)
            assert echo_text(await client.call_tool("echo", {"text": "again"})) == "again"
            refreshed = [(p, s, g) for _, p, s, g in wire[mark:] if p == "/oauth/token"]
            assert refreshed == [("/oauth/token", 200, "refresh_token")]
            assert len(storage.history) == 2
            second_tokens = storage.history[1]
            assert second_tokens.access_token != first_tokens.access_token
            assert second_tokens.refresh_token not in (None, first_tokens.refresh_token)
            assert client.session_id == session_id
            assert [c.arguments["text"] for c in gw.probe.tool_calls("echo")] == [
                "hi", "again"]

            # revocation (RFC 7009) with client authentication as the registered client
            info = storage.client_info
            basic = base64.b64encode(f"{info.client_id}:{info.client_secret}".encode()).decode()
            async with httpx.AsyncClient(timeout=10) as raw:
                revoked = await raw.post(f"{gw.url}/oauth/revoke",
                                         headers={"Authorization": f"Basic {basic}"},
                                         data={"token": second_tokens.refresh_token,
                                               "token_type_hint": "refresh_token"})
                assert revoked.status_code == 200, revoked.text
                again = await raw.post(f"{gw.url}/oauth/token",
                                       headers={"Authorization": f"Basic {basic}"},
                                       data={"grant_type": "refresh_token",
                                             "refresh_token": second_tokens.refresh_token,
                                             "resource": gw.resource()})
                assert again.status_code == 400, again.text
                assert again.json()["error"] == "invalid_grant"
                # the access token of the revoked grant is refused at the MCP edge at once
                bearer = {"Authorization": f"Bearer {second_tokens.access_token}"}
                refused = await raw.post(gw.endpoint(), content=orjson.dumps(INITIALIZE),
                                         headers={**MCP_HEADERS, **bearer})
                assert refused.status_code == 401, refused.text
                assert 'error="invalid_token"' in refused.headers["www-authenticate"]

            # the SDK client meets that 401 and authorizes again (still signed in: no
            # sign-in page, straight to consent), on the same registration
            mark = len(wire)
            assert echo_text(await client.call_tool("echo", {"text": "third"})) == "third"
            assert len(redirects) == 2
            assert [p for _, p, _ in person.trail[5:]] == ["/oauth/authorize",
                                                           "/oauth/authorize"]
            later = wire[mark:]
            assert later[0] == ("POST", "/mcp/up", 401, "")
            assert ("POST", "/oauth/token", 200, "authorization_code") in later
            assert ("POST", "/oauth/register") not in [(m, p) for m, p, _, _ in later]
            assert len(gw.clients()) == 1
            assert storage.history[-1].access_token != second_tokens.access_token


# -- attacks, with plain httpx -------------------------------------------------------------------


def s256(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@dataclass
class Flow:
    gw: Gw
    http: httpx.AsyncClient
    person: Browser
    client_id: str = ""
    client_secret: str | None = None

    async def register(self, method: str = "none") -> None:
        r = await self.http.post(f"{self.gw.url}/oauth/register", json={
            "client_name": "attacker's test", "redirect_uris": [REDIRECT_URI],
            "token_endpoint_auth_method": method})
        assert r.status_code == 201, r.text
        self.client_id, self.client_secret = r.json()["client_id"], r.json().get("client_secret")

    def authorize_url(self, verifier: str | None, **override: str) -> str:
        params = {"response_type": "code", "client_id": self.client_id,
                  "redirect_uri": REDIRECT_URI, "state": "st-1", "resource": self.gw.resource(),
                  "code_challenge_method": "S256", **override}
        if verifier is not None:
            params["code_challenge"] = s256(verifier)
        return f"{self.gw.url}/oauth/authorize?{urlencode(params)}"

    async def code(self, verifier: str) -> str:
        back = query(await self.person.consent(self.authorize_url(verifier)))
        assert back["state"] == "st-1" and back["iss"] == self.gw.url
        return back["code"]

    async def token(self, **form: str) -> httpx.Response:
        body = {"client_id": self.client_id, **form}
        return await self.http.post(f"{self.gw.url}/oauth/token", data=body)

    async def exchange(self, code: str, verifier: str) -> httpx.Response:
        return await self.token(grant_type="authorization_code", code=code,
                                redirect_uri=REDIRECT_URI, code_verifier=verifier)

    async def refresh(self, refresh_token: str) -> httpx.Response:
        return await self.token(grant_type="refresh_token", refresh_token=refresh_token)

    async def mcp(self, access_token: str, endpoint: str = "up") -> httpx.Response:
        return await self.http.post(self.gw.endpoint(endpoint), content=orjson.dumps(INITIALIZE),
                                    headers={**MCP_HEADERS,
                                             "Authorization": f"Bearer {access_token}"})


@asynccontextmanager
async def flow(tmp_path: Path, **kw: Any) -> AsyncIterator[Flow]:
    async with oauth_gateway(tmp_path, **kw) as gw, browser(gw.url) as person, \
            httpx.AsyncClient(timeout=10) as http:
        f = Flow(gw, http, person)
        await f.register()
        yield f


def invalid_grant(response: httpx.Response) -> bool:
    return response.status_code == 400 and response.json()["error"] == "invalid_grant"


async def test_pkce_missing_redirects_with_invalid_request(tmp_path: Path) -> None:
    async with flow(tmp_path) as f:
        r = await f.http.get(f.authorize_url(None))
        assert r.status_code == 303
        assert r.headers["location"].startswith(REDIRECT_URI + "?")
        back = query(r.headers["location"])
        assert back["error"] == "invalid_request" and back["state"] == "st-1"
        assert "code" not in back


async def test_wrong_code_verifier_is_invalid_grant(tmp_path: Path) -> None:
    async with flow(tmp_path) as f:
        verifier = secrets.token_urlsafe(48)
        code = await f.code(verifier)
        assert invalid_grant(await f.exchange(code, secrets.token_urlsafe(48)))


async def test_unregistered_redirect_uri_is_400_without_redirect(tmp_path: Path) -> None:
    async with flow(tmp_path) as f:
        url = f.authorize_url(secrets.token_urlsafe(48),
                              redirect_uri="https://evil.example/callback")
        r = await f.http.get(url)
        assert r.status_code == 400
        assert "location" not in r.headers
        assert r.headers["content-type"].startswith("application/json")
        assert r.json()["error"] == "invalid_request"


async def test_code_reuse_revokes_what_it_produced(tmp_path: Path) -> None:
    async with flow(tmp_path) as f:
        verifier = secrets.token_urlsafe(48)
        code = await f.code(verifier)
        first = await f.exchange(code, verifier)
        assert first.status_code == 200, first.text
        tokens = first.json()
        assert (await f.mcp(tokens["access_token"])).status_code == 200
        assert invalid_grant(await f.exchange(code, verifier))
        assert invalid_grant(await f.refresh(tokens["refresh_token"]))
        assert (await f.mcp(tokens["access_token"])).status_code == 401


async def test_refresh_token_reuse_revokes_the_family(tmp_path: Path) -> None:
    """With no grace period (the grace's end is tests/proxy/oauth/test_oauth_reuse.py's, on a
    clock the test moves)."""
    async with flow(tmp_path, oauth={"refresh_grace_s": 0}) as f:
        verifier = secrets.token_urlsafe(48)
        r0 = (await f.exchange(await f.code(verifier), verifier)).json()["refresh_token"]
        step = await f.refresh(r0)
        assert step.status_code == 200, step.text
        r1 = step.json()["refresh_token"]
        assert r1 != r0
        assert invalid_grant(await f.refresh(r0))  # replayed
        assert invalid_grant(await f.refresh(r1))  # the newest of the family is gone too


async def test_access_token_is_bound_to_its_endpoint(tmp_path: Path) -> None:
    async with flow(tmp_path, endpoints=("up", "other")) as f:
        verifier = secrets.token_urlsafe(48)
        access = (await f.exchange(await f.code(verifier), verifier)).json()["access_token"]
        assert (await f.mcp(access, "up")).status_code == 200
        other = await f.mcp(access, "other")
        assert other.status_code == 401, other.text
        assert other.headers["www-authenticate"].startswith(
            f'Bearer resource_metadata="{f.gw.url}/.well-known/oauth-protected-resource/mcp/other"')


async def test_token_endpoint_body_cap(tmp_path: Path) -> None:
    expected = {"error": "invalid_request",
                "error_description": "request body exceeds the 65536-byte limit"}
    async with flow(tmp_path) as f:
        body = b"grant_type=refresh_token&refresh_token=" + b"a" * (70000 - 39)
        assert len(body) == 70000
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        declared = await f.http.post(f"{f.gw.url}/oauth/token", content=body, headers=form)
        assert declared.status_code == 413 and declared.json() == expected

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked
            for i in range(0, len(body), 8192):
                yield body[i:i + 8192]

        streamed = await f.http.post(f"{f.gw.url}/oauth/token", content=chunks(), headers=form)
        assert streamed.status_code == 413 and streamed.json() == expected


async def test_repeated_bad_client_secrets_lock_out(tmp_path: Path) -> None:
    async with flow(tmp_path, auth={"lockout": {"max_failures": 3}}) as f:
        await f.register("client_secret_post")
        assert f.client_secret
        form = {"grant_type": "refresh_token", "refresh_token": "x"}
        for _ in range(3):
            bad = await f.token(client_secret="wrong", **form)
            assert bad.status_code == 401 and bad.json()["error"] == "invalid_client"
        locked = await f.token(client_secret="wrong", **form)
        assert locked.status_code == 429, locked.text
        assert int(locked.headers["retry-after"]) >= 1
        # the right secret is refused too while the lockout lasts
        right = await f.token(client_secret=f.client_secret, **form)
        assert right.status_code == 429



def claims_of(access_token: str) -> dict[str, Any]:
    return dict(jwt.decode(access_token, options={"verify_signature": False}))


async def test_a_requested_scope_is_never_granted(tmp_path: Path) -> None:
    """Tollhouse has no model of which scopes a person may hold: a scope asked for at
    /oauth/authorize (or on a refresh) is ignored, the answer says "scope": "" (RFC 6749
    section 5.1), and the access token carries no scope claim, so a person cannot give
    themselves `mcp:admin` and pass an endpoint's allow_scopes."""
    async with flow(tmp_path, endpoints=("up", "open"), access={"allow_scopes": ["mcp:admin"]},
                    access_on=("up",)) as f:
        verifier = secrets.token_urlsafe(48)
        # the endpoint that admits mcp:admin only: refused at consent, no token at all
        refused = query(await f.person.decide(f.authorize_url(verifier, scope="mcp:admin"),
                                              "deny"))
        assert refused["error"] == "access_denied", refused
        assert "scopes" in refused["error_description"]
        open_resource = f"{f.gw.url}/mcp/open"
        back = query(await f.person.consent(f.authorize_url(verifier, scope="mcp:admin",
                                                            resource=open_resource)))
        issued = await f.exchange(back["code"], verifier)
        assert issued.status_code == 200, issued.text
        tokens = issued.json()
        assert tokens["scope"] == ""
        claims = claims_of(tokens["access_token"])
        assert "scope" not in claims
        ((user_id,),) = db_backends.rows(f.gw.db_path, "SELECT id FROM users WHERE name = ?",
                                         USER)
        assert claims["uid"] == str(user_id)
        # a refresh that asks for the scope again gets none either
        again = await f.token(grant_type="refresh_token", refresh_token=tokens["refresh_token"],
                              scope="mcp:admin")
        assert again.status_code == 200, again.text
        assert again.json()["scope"] == ""
        assert "scope" not in claims_of(again.json()["access_token"])
        # a grant stored before this rule, with a scope in its row, refreshes without it
        old = again.json()["refresh_token"]
        stored = Database(f.gw.db_path)
        try:
            with stored.transaction() as conn:
                conn.execute(stored.sql("UPDATE oauth_refresh SET scope = ?"), ("mcp:admin",))
        finally:
            stored.close()
        legacy = await f.refresh(old)
        assert legacy.status_code == 200, legacy.text
        assert "scope" not in legacy.json()
        assert "scope" not in claims_of(legacy.json()["access_token"])


async def test_no_scope_asked_no_scope_member(tmp_path: Path) -> None:
    async with flow(tmp_path) as f:
        verifier = secrets.token_urlsafe(48)
        tokens = (await f.exchange(await f.code(verifier), verifier)).json()
        assert "scope" not in tokens and "scope" not in claims_of(tokens["access_token"])
        assert (await f.mcp(tokens["access_token"])).status_code == 200


# Python and browsers disagree on a backslash before "@", userinfo misleads on the consent
# page, and whitespace or a control character would break the Location header at redirect
MISLEADING_REDIRECTS = ["http://evil.example\\@127.0.0.1/cb", "http://evil.example\\@localhost/cb",
                        "https://trusted.example@evil.example/cb",
                        "https://user:pw@evil.example/cb", "https://a.example/cb\r\nX-A: b",
                        "https://a.example/c b", "https://a.example/cb\t",
                        "http://127.0.0.1:abc/cb", "https://a.example/\u00e9"]


async def test_misleading_redirect_uris_are_refused_at_registration(tmp_path: Path) -> None:
    async with oauth_gateway(tmp_path) as gw, httpx.AsyncClient(timeout=10) as http:
        for uri in MISLEADING_REDIRECTS:
            r = await http.post(f"{gw.url}/oauth/register",
                                json={"client_name": "x", "redirect_uris": [uri]})
            assert r.status_code == 400, (uri, r.text)
            assert r.json()["error"] == "invalid_redirect_uri"
        assert gw.clients() == []


async def test_a_stored_misleading_redirect_uri_is_refused_at_authorize(tmp_path: Path) -> None:
    """A client registered before the stricter rule: its URI is not redirected to."""
    async with flow(tmp_path) as f:
        bad = "http://evil.example\\@127.0.0.1/cb"
        stored = Database(f.gw.db_path)
        try:
            with stored.transaction() as conn:
                conn.execute(stored.sql("UPDATE oauth_clients SET redirect_uris = ?"),
                             (orjson.dumps([bad]).decode(),))
        finally:
            stored.close()
        r = await f.http.get(f.authorize_url(secrets.token_urlsafe(48), redirect_uri=bad))
        assert r.status_code == 400 and "location" not in r.headers
        assert r.json()["error"] == "invalid_request"


async def _bad_secrets(f: Flow, forwarded_for: str | None = None) -> None:
    for i in range(3):  # three different clients: only the address counter reaches the limit
        bad = await f.http.post(f"{f.gw.url}/oauth/token", data={
            "grant_type": "refresh_token", "refresh_token": "x", "client_id": f"nobody-{i}"},
            headers={"X-Forwarded-For": forwarded_for} if forwarded_for else {})
        assert bad.status_code == 401, bad.text


async def test_token_lockout_behind_a_trusted_proxy_is_per_client_address(tmp_path: Path
                                                                          ) -> None:
    async with flow(tmp_path, auth={"lockout": {"max_failures": 3}},
                    server={"trusted_proxies": ["127.0.0.0/8"]}) as f:
        await _bad_secrets(f, "203.0.113.9")
        form = {"grant_type": "refresh_token", "refresh_token": "unknown"}
        elsewhere = await f.http.post(f"{f.gw.url}/oauth/token",
                                      data={**form, "client_id": f.client_id},
                                      headers={"X-Forwarded-For": "198.51.100.7"})
        assert elsewhere.status_code == 400 and elsewhere.json()["error"] == "invalid_grant"
        locked = await f.http.post(f"{f.gw.url}/oauth/token",
                                   data={**form, "client_id": f.client_id},
                                   headers={"X-Forwarded-For": "203.0.113.9"})
        assert locked.status_code == 429, locked.text


async def test_token_lockout_ignores_x_forwarded_for_without_trusted_proxies(tmp_path: Path
                                                                             ) -> None:
    async with flow(tmp_path, auth={"lockout": {"max_failures": 3}}) as f:
        await _bad_secrets(f, "203.0.113.9")
        spoofed = await f.http.post(f"{f.gw.url}/oauth/token", data={
            "grant_type": "refresh_token", "refresh_token": "unknown",
            "client_id": f.client_id}, headers={"X-Forwarded-For": "198.51.100.7"})
        assert spoofed.status_code == 429, spoofed.text


async def test_a_locked_out_caller_makes_the_gateway_fetch_no_metadata_document(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fetched: list[str] = []

    async def client(self: MetadataDocuments, client_id: str) -> Client:
        fetched.append(client_id)
        raise OAuthError("invalid_client", "the client metadata document could not be fetched")

    monkeypatch.setattr(MetadataDocuments, "client", client)
    async with flow(tmp_path, auth={"lockout": {"max_failures": 3}}) as f:
        await _bad_secrets(f)
        document = "https://client.example/oauth/client.json"
        for path in ("/oauth/token", "/oauth/revoke"):
            locked = await f.http.post(f"{f.gw.url}{path}", data={
                "grant_type": "refresh_token", "refresh_token": "x", "token": "x",
                "client_id": document})
            assert locked.status_code == 429, locked.text
        assert fetched == []
