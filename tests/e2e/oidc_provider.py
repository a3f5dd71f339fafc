"""A small OpenID Connect provider for tests, as a plain ASGI app with an RSA key.

No login screen: `/authorize` signs in whatever identity the test set (`sign_in_as`) and sends
the browser back with a code and the state. `/token` checks the client, the redirect URI, the
PKCE S256 verifier and that each code is used once, then returns an ID token. Knobs make it
misbehave: a wrong audience, issuer or nonce, an expired token, a key it does not publish, a
forged signature, `alg` none or HS256, a refusal at /authorize, a broken token endpoint.

With `refresh_grant` it is also an upstream's OAuth authorization server: a code's answer
carries a refresh token, each good once (a reused one is invalid_grant), every access token
lives `expires_in` seconds, `refreshed` lists every refresh token presented (as it arrives),
and with `hold_refresh` set each refresh waits for that event before it is answered. Its
`/revoke` (RFC 7009) lists each token revoked in `revoked` and makes a refresh token no longer
good.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any
from urllib.parse import parse_qs, unquote_plus, urlencode

import jwt
import orjson
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from tests.servers import serve

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@cache
def rsa_key(n: int) -> rsa.RSAPrivateKey:
    """Test keys, made once per run (key generation is the slow part)."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def s256(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


@dataclass
class Grant:
    client_id: str
    redirect_uri: str
    challenge: str
    nonce: str | None
    claims: dict[str, Any]


@dataclass
class OidcProvider:
    client_id: str = "tollhouse-test"
    client_secret: str = "provider-client-secret-of-32-bytes-or-more"
    auth_methods: tuple[str, ...] = ("client_secret_basic", "client_secret_post")
    algorithms: tuple[str, ...] = ("RS256", "HS256", "none")  # the gateway must drop the last two
    redirect_uris: set[str] = field(default_factory=set)  # empty: any
    kid: str = "provider-key-1"
    base: str = ""  # set once served: the issuer
    claims: dict[str, Any] = field(default_factory=lambda: {
        "sub": "user-123", "preferred_username": "ada", "name": "Ada Lovelace",
        "email": "ada@example.test", "groups": ["staff"]})
    # misbehaviour
    wrong_aud: bool = False
    wrong_iss: bool = False
    wrong_nonce: bool = False
    expired: bool = False
    unknown_key: bool = False
    forged_signature: bool = False
    alg: str = "RS256"
    deny: bool = False
    token_status: int | None = None  # answer /token with this status and no token
    # the refresh grant (an upstream's authorization server)
    refresh_grant: bool = False
    expires_in: int = 300
    hold_refresh: asyncio.Event | None = None
    refreshed: list[str] = field(default_factory=list)
    refresh_tokens: set[str] = field(default_factory=set)  # the ones still good
    revoked: list[str] = field(default_factory=list)  # every token /revoke was given
    # what happened
    hits: Counter[str] = field(default_factory=Counter)
    challenges: list[str] = field(default_factory=list)
    authorize_params: list[dict[str, str]] = field(default_factory=list)
    client_auth_used: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    issued: list[str] = field(default_factory=list)  # every token and code handed out
    codes: dict[str, Grant] = field(default_factory=dict)

    def sign_in_as(self, sub: str, name: str | None = None, groups: Any = None,
                   **extra: Any) -> None:
        """The identity /authorize signs in from now on (only the claims given)."""
        self.claims = {"sub": sub, **extra}
        if name is not None:
            self.claims["preferred_username"] = name
        if groups is not None:
            self.claims["groups"] = groups

    @property
    def key(self) -> rsa.RSAPrivateKey:
        return rsa_key(0)

    def jwks(self) -> dict[str, Any]:
        jwk = RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        return {"keys": [{**jwk, "kid": self.kid, "use": "sig", "alg": "RS256"}]}

    def discovery(self) -> dict[str, Any]:
        return {
            "issuer": self.base,
            "authorization_endpoint": f"{self.base}/authorize",
            "token_endpoint": f"{self.base}/token",
            "jwks_uri": f"{self.base}/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": list(self.algorithms),
            "token_endpoint_auth_methods_supported": list(self.auth_methods),
            "code_challenge_methods_supported": ["S256"],
            "scopes_supported": ["openid", "profile", "email", "groups"],
        }

    # ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope["headers"]}
        query = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
        path, method = scope["path"], scope["method"]
        extra: dict[str, str] = {}
        if path == "/.well-known/openid-configuration" and method == "GET":
            self.hits["discovery"] += 1
            status, out = 200, self.discovery()
        elif path == "/jwks" and method == "GET":
            self.hits["jwks"] += 1
            status, out = 200, self.jwks()
        elif path == "/authorize" and method == "GET":
            self.hits["authorize"] += 1
            status, out, extra = self.authorize(query)
        elif path == "/token" and method == "POST":
            self.hits["token"] += 1
            form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
            if form.get("grant_type") == "refresh_token":
                self.refreshed.append(form.get("refresh_token", ""))
                if self.hold_refresh is not None:
                    await self.hold_refresh.wait()
            status, out, extra = self.token(form, headers.get("authorization", ""))
        elif path == "/revoke" and method == "POST":
            self.hits["revoke"] += 1
            form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
            if self._client(form, headers.get("authorization", "")) is None:
                status, out = 401, {"error": "invalid_client"}
            else:
                self.revoked.append(form.get("token", ""))
                self.refresh_tokens.discard(form.get("token", ""))
                status, out = 200, {}
        else:
            status, out = 404, {"error": "not_found"}
        payload = orjson.dumps(out)
        response_headers = [(b"content-type", b"application/json"),
                            (b"cache-control", b"no-store"),
                            *((k.encode(), v.encode()) for k, v in extra.items())]
        await send({"type": "http.response.start", "status": status,
                    "headers": response_headers})
        await send({"type": "http.response.body", "body": payload})

    # endpoints

    def authorize(self, q: dict[str, str]) -> tuple[int, dict[str, Any], dict[str, str]]:
        self.authorize_params.append(q)
        redirect_uri = q.get("redirect_uri", "")
        if q.get("client_id") != self.client_id or not redirect_uri or (
                self.redirect_uris and redirect_uri not in self.redirect_uris):
            return 400, {"error": "invalid_request"}, {}
        back: dict[str, str] = {}
        if "state" in q:
            back["state"] = q["state"]
        if self.deny:
            back["error"] = "access_denied"
        elif (q.get("response_type") != "code" or q.get("code_challenge_method") != "S256"
              or not q.get("code_challenge") or "openid" not in q.get("scope", "").split()):
            back["error"] = "invalid_request"
        else:
            code = secrets.token_urlsafe(24)
            self.challenges.append(q["code_challenge"])
            self.codes[code] = Grant(self.client_id, redirect_uri, q["code_challenge"],
                                     q.get("nonce"), dict(self.claims))
            self.issued.append(code)
            back["code"] = code
        return 302, {}, {"location": f"{redirect_uri}?{urlencode(back)}"}

    def _client(self, form: dict[str, str], authorization: str) -> str | None:
        """The authenticated client id, or None."""
        if authorization.lower().startswith("basic "):
            self.client_auth_used.append("client_secret_basic")
            try:
                pair = base64.b64decode(authorization[6:], validate=True).decode()
                client_id, secret = (unquote_plus(p) for p in pair.split(":", 1))
            except ValueError:
                return None
            allowed = "client_secret_basic" in self.auth_methods
        else:
            self.client_auth_used.append("client_secret_post")
            client_id, secret = form.get("client_id", ""), form.get("client_secret", "")
            allowed = "client_secret_post" in self.auth_methods
        ok = allowed and client_id == self.client_id and secrets.compare_digest(
            secret.encode(), self.client_secret.encode())
        return client_id if ok else None

    def _refuse(self, reason: str, error: str = "invalid_grant", status: int = 400
                ) -> tuple[int, dict[str, Any], dict[str, str]]:
        self.refusals.append(reason)
        return status, {"error": error, "error_description": f"refused: {reason}"}, {}

    def token(self, form: dict[str, str], authorization: str
              ) -> tuple[int, dict[str, Any], dict[str, str]]:
        if self.token_status is not None:
            return self.token_status, {"error": "server_error"}, {}
        client_id = self._client(form, authorization)
        if client_id is None:
            return self._refuse("client", "invalid_client", 401)
        if form.get("grant_type") == "refresh_token" and self.refresh_grant:
            if form.get("refresh_token") not in self.refresh_tokens:
                return self._refuse("refresh_token")
            self.refresh_tokens.discard(form["refresh_token"])
            return 200, self._access(), {}
        if form.get("grant_type") != "authorization_code":
            return self._refuse("grant_type", "unsupported_grant_type")
        grant = self.codes.pop(form.get("code", ""), None)
        if grant is None:
            return self._refuse("code")
        if grant.client_id != client_id or grant.redirect_uri != form.get("redirect_uri"):
            return self._refuse("redirect_uri")
        if s256(form.get("code_verifier", "")) != grant.challenge:
            return self._refuse("pkce")
        id_token = self.id_token(grant)
        self.issued.append(id_token)
        return 200, {**self._access(), "id_token": id_token, "scope": "openid profile email"}, {}

    def _access(self) -> dict[str, Any]:
        """A fresh access token (and, with `refresh_grant`, a refresh token good once)."""
        out: dict[str, Any] = {"access_token": secrets.token_urlsafe(32),
                               "token_type": "Bearer", "expires_in": self.expires_in}
        if self.refresh_grant:
            out["refresh_token"] = secrets.token_urlsafe(32)
            self.refresh_tokens.add(out["refresh_token"])
        self.issued += [v for k, v in out.items() if k.endswith("_token")]
        return out

    def id_token(self, grant: Grant) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {
            **grant.claims,
            "iss": f"{self.base}/elsewhere" if self.wrong_iss else self.base,
            "aud": "some-other-client" if self.wrong_aud else grant.client_id,
            "iat": now - 7200 if self.expired else now,
            "exp": now - 3600 if self.expired else now + 300,
        }
        if grant.nonce is not None:
            claims["nonce"] = "not-the-nonce" if self.wrong_nonce else grant.nonce
        if self.alg == "none":
            return jwt.encode(claims, "", algorithm="none", headers={"kid": self.kid})
        if self.alg.startswith("HS"):  # signed with the client secret, as some providers allow
            return jwt.encode(claims, self.client_secret, algorithm=self.alg,
                              headers={"kid": self.kid})
        if self.unknown_key:
            return jwt.encode(claims, rsa_key(1), algorithm=self.alg,
                              headers={"kid": "unpublished-key"})
        key = rsa_key(1) if self.forged_signature else self.key
        return jwt.encode(claims, key, algorithm=self.alg, headers={"kid": self.kid})


@asynccontextmanager
async def running_provider(provider: OidcProvider) -> AsyncIterator[str]:
    """Serve the provider on a loopback port; its base URL is its issuer."""
    async with serve(provider, graceful_timeout=1) as url:
        provider.base = url
        yield url
