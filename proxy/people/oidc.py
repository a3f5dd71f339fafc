"""Federated sign-in for people through an external OpenID Connect provider (`[auth.oidc]`).

The authorization code flow with PKCE (S256), no JavaScript: `GET /signin/oidc` sends the browser
to the provider; `GET /signin/oidc/callback` takes the code back, redeems it at the provider's
token endpoint (server to server, through the gateway's shared AsyncClient) and verifies the ID
token against the provider's JWKS. The user is created on first sign-in and keeps the provider's
issuer and `sub`, so the same person arriving with an external JWT is the same principal.

Each sign-in's state, nonce and PKCE verifier stay on the server (a bounded 10-minute cache keyed
by `state`, one use). The state is also bound to the browser that started it: a short-lived
HttpOnly SameSite=Lax cookie holds a random value whose SHA-256 is stored with the state, so a
callback carried into another browser (login CSRF, a leaked link) is refused. Failures answer a
plain page saying what failed; no token, code or secret is ever shown or logged.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import html
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_plus, urlencode, urlsplit

import httpx
import jwt
from jwt.algorithms import get_default_algorithms
from quart import Quart, Response, request

from proxy.auth.jwks import JwksCache, kty_for
from proxy.config import OidcConfig
from proxy.config.presets import claim as claim_at
from proxy.people.accounts import LINK_CLAIMS
from proxy.people.signin import Web, page, safe_next
from proxy.state.flows import FlowStore, ForeignFlow

log = logging.getLogger("tollhouse.oidc")

BINDING_COOKIE = "tollhouse_oidc"
COOKIE_PATH = "/signin/oidc"
CALLBACK_PATH = "/signin/oidc/callback"
FLOW_TTL_S = 600  # the binding cookie's lifetime: the flow store keeps a flow as long
DISCOVERY_TTL_S = 3600.0
JWKS_REFRESH_S = 3600.0
JWKS_MIN_REFETCH_S = 30.0
HTTP_TIMEOUT_S = 10.0
LEEWAY_S = 60
MAX_NAME = 200
MAX_SUBJECT = 255
MAX_GROUPS = 256
MAX_GROUP_LEN = 256

_BINDING_FORMAT = re.compile(r"[A-Za-z0-9_-]{43}")
_PROTOCOL_CODE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_SUPPORTED_ALGS = frozenset(get_default_algorithms())


class SignInFailed(Exception):
    """What to tell the person (plain words, nothing secret) and the status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class Discovery:
    """What the gateway uses from the provider's discovery document."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    algorithms: tuple[str, ...]
    client_auth: str  # client_secret_basic | client_secret_post | none


@dataclass(frozen=True, slots=True)
class _Flow:
    nonce: str
    verifier: str
    next_url: str


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _challenge(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _protocol_code(value: object) -> str:
    """An OAuth error code fit to show: the provider's (or an attacker's) free text never is."""
    if isinstance(value, str) and _PROTOCOL_CODE.fullmatch(value):
        return value
    return "unspecified"


def _endpoint(doc: dict[str, Any], key: str, issuer: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str):
        raise SignInFailed(f"The identity provider's discovery document has no {key}.", 502)
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SignInFailed(f"The identity provider's {key} is not an http(s) URL.", 502)
    if issuer.startswith("https://") and parts.scheme != "https":
        raise SignInFailed(f"The identity provider's {key} is not https.", 502)
    return value


def parse_discovery(doc: object, cfg: OidcConfig) -> Discovery:
    if not isinstance(doc, dict):
        raise SignInFailed("The identity provider's discovery document is not a JSON object.",
                           502)
    issuer = doc.get("issuer")
    if not isinstance(issuer, str) or issuer.rstrip("/") != cfg.issuer.rstrip("/"):
        raise SignInFailed("The identity provider's discovery document names another issuer.",
                           502)
    offered = doc.get("id_token_signing_alg_values_supported")
    algorithms = tuple(
        a for a in (offered if isinstance(offered, list) else [])
        if isinstance(a, str) and a != "none" and not a.startswith("HS")
        and a in _SUPPORTED_ALGS and kty_for(a) is not None) or ("RS256",)
    methods = doc.get("token_endpoint_auth_methods_supported")
    if not isinstance(methods, list):
        methods = ["client_secret_basic"]  # the default when the document names none
    if not cfg.client_secret:
        client_auth = "none"
    elif "client_secret_basic" in methods or "client_secret_post" not in methods:
        client_auth = "client_secret_basic"
    else:
        client_auth = "client_secret_post"
    return Discovery(issuer=issuer,
                     authorization_endpoint=_endpoint(doc, "authorization_endpoint", issuer),
                     token_endpoint=_endpoint(doc, "token_endpoint", issuer),
                     jwks_uri=_endpoint(doc, "jwks_uri", issuer),
                     algorithms=algorithms, client_auth=client_auth)


def map_claims(claims: dict[str, Any], cfg: OidcConfig
               ) -> tuple[str, str, frozenset[str], bool]:
    """(subject, display name, groups, admin) from verified ID token claims."""
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub or len(sub) > MAX_SUBJECT:
        raise SignInFailed("The identity provider's ID token has no usable subject (sub).")
    name = sub
    for claim in (cfg.name_claim, "email"):
        value = claims.get(claim)
        if isinstance(value, str):
            value = "".join(ch for ch in value if ch.isprintable()).strip()
            if value:
                name = value
                break
    raw = claim_at(claims, cfg.groups_claim) if cfg.groups_claim else None
    listed: list[Any] = raw.split() if isinstance(raw, str) else (
        list(raw) if isinstance(raw, list) else [])
    groups = frozenset(g for g in listed[:MAX_GROUPS] if isinstance(g, str) and g
                       and len(g) <= MAX_GROUP_LEN and g.isprintable())
    admin = bool(cfg.admin_group) and cfg.admin_group in groups
    return sub, name[:MAX_NAME], groups, admin


class OidcSignIn:
    """The relying party: discovery, the pending sign-ins, the code exchange and verification."""

    def __init__(self, cfg: OidcConfig, http: Callable[[], httpx.AsyncClient],
                 redirect_uri: str, flows: FlowStore,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.redirect_uri = redirect_uri
        self._http = http
        self._clock = clock
        # pending sign-ins by state, bound to the browser's binding cookie (as a digest)
        self.flows = flows
        self._discovery: Discovery | None = None
        self._discovered_at = 0.0
        self._jwks: JwksCache | None = None
        self._jwks_http: httpx.AsyncClient | None = None

    @property
    def discovery_url(self) -> str:
        return f"{self.cfg.issuer.rstrip('/')}/.well-known/openid-configuration"

    async def discover(self) -> Discovery:
        """The provider's discovery document, cached; a stale copy serves while it is down."""
        now = self._clock()
        if self._discovery is not None and now - self._discovered_at < DISCOVERY_TTL_S:
            return self._discovery
        try:
            response = await self._http().get(self.discovery_url, timeout=HTTP_TIMEOUT_S,
                                              headers={"Accept": "application/json"})
            response.raise_for_status()
            fresh = parse_discovery(response.json(), self.cfg)
        except (httpx.HTTPError, ValueError, SignInFailed) as exc:
            reason = exc.message if isinstance(exc, SignInFailed) else type(exc).__name__
            if self._discovery is not None:
                log.warning("OIDC discovery at %s failed (%s); keeping the cached document",
                            self.discovery_url, reason)
                return self._discovery
            log.warning("OIDC discovery at %s failed (%s)", self.discovery_url, reason)
            if isinstance(exc, SignInFailed):
                raise
            raise SignInFailed("The identity provider could not be reached. Try again later.",
                               502) from None
        self._discovery, self._discovered_at = fresh, now
        return fresh

    async def begin(self, binding: str, next_url: str, discovery: Discovery) -> str:
        """Keep a new sign-in's secrets; the provider URL to send the browser to."""
        state = secrets.token_urlsafe(32)
        nonce = secrets.token_urlsafe(32)
        verifier = secrets.token_urlsafe(64)
        await self.flows.put(state, _digest(binding),
                             {"nonce": nonce, "verifier": verifier, "next_url": next_url})
        query = urlencode({
            "response_type": "code",
            "client_id": self.cfg.client_id,
            "redirect_uri": self.redirect_uri,
            "scope": " ".join(self.cfg.scopes),
            "state": state,
            "nonce": nonce,
            "code_challenge": _challenge(verifier),
            "code_challenge_method": "S256",
        })
        endpoint = discovery.authorization_endpoint
        return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"

    async def take(self, state: str | None, binding: str | None) -> _Flow:
        """The pending sign-in for `state` if this browser started it; used up once taken."""
        if not state:
            raise SignInFailed("The sign-in response has no state. Start the sign-in again.")
        try:
            flow = await self.flows.take(state, _digest(binding or ""))
        except ForeignFlow:
            # not used up: the browser that started it can still finish
            raise SignInFailed("This sign-in was started in another browser. Start the sign-in "
                               "again in this one.") from None
        if flow is None:
            raise SignInFailed("This sign-in is unknown, has expired or was already used. "
                               "Start the sign-in again.")
        return _Flow(flow["nonce"], flow["verifier"], flow["next_url"])

    async def redeem(self, discovery: Discovery, code: str, verifier: str) -> str:
        """The ID token for an authorization code, from the provider's token endpoint."""
        form = {"grant_type": "authorization_code", "code": code,
                "redirect_uri": self.redirect_uri, "code_verifier": verifier}
        headers = {"Accept": "application/json"}
        if discovery.client_auth == "client_secret_basic":
            pair = f"{quote_plus(self.cfg.client_id)}:{quote_plus(self.cfg.client_secret)}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        elif discovery.client_auth == "client_secret_post":
            form["client_id"] = self.cfg.client_id
            form["client_secret"] = self.cfg.client_secret
        else:
            form["client_id"] = self.cfg.client_id
        try:
            response = await self._http().post(discovery.token_endpoint, data=form,
                                               headers=headers, timeout=HTTP_TIMEOUT_S)
        except httpx.HTTPError as exc:
            log.warning("OIDC token endpoint unreachable (%s)", type(exc).__name__)
            raise SignInFailed("The identity provider could not be reached to finish signing "
                               "in. Try again later.", 502) from None
        try:
            body = response.json()
        except ValueError:
            body = None
        if 400 <= response.status_code < 500:
            code_name = _protocol_code(body.get("error") if isinstance(body, dict) else None)
            log.warning("OIDC token endpoint refused the code: %s %s",
                        response.status_code, code_name)
            raise SignInFailed("The identity provider refused to complete the sign-in "
                               f"({code_name}). Start the sign-in again.")
        if response.status_code != 200 or not isinstance(body, dict):
            log.warning("OIDC token endpoint answered %s", response.status_code)
            raise SignInFailed("The identity provider failed to complete the sign-in. Try "
                               "again later.", 502)
        id_token = body.get("id_token")
        if not isinstance(id_token, str) or not id_token:
            raise SignInFailed("The identity provider sent no ID token.", 502)
        return id_token

    def _key_set(self, discovery: Discovery) -> JwksCache:
        """The provider's keys, a per-process cache: a withdrawn key is still trusted here for
        at most JWKS_REFRESH_S; the discovery document itself at most DISCOVERY_TTL_S."""
        http = self._http()
        if (self._jwks is None or self._jwks.url != discovery.jwks_uri
                or self._jwks_http is not http):
            self._jwks = JwksCache(discovery.jwks_uri, http, refresh_s=JWKS_REFRESH_S,
                                   min_refetch_s=JWKS_MIN_REFETCH_S, clock=self._clock)
            self._jwks_http = http
        return self._jwks

    async def verify(self, discovery: Discovery, id_token: str, nonce: str) -> dict[str, Any]:
        """The ID token's claims once its signature, issuer, audience, times and nonce hold."""
        try:
            header = jwt.get_unverified_header(id_token)
        except jwt.InvalidTokenError:
            raise SignInFailed("The identity provider's ID token is malformed.") from None
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str) or alg not in discovery.algorithms:
            raise SignInFailed("The ID token is signed with an algorithm this gateway does not "
                               "accept.")
        if not isinstance(kid, str):
            raise SignInFailed("The ID token does not name its signing key (kid).")
        key = await self._key_set(discovery).key(kid, alg)
        if key is None:
            raise SignInFailed("The ID token is signed with a key the identity provider does "
                               "not publish.")
        try:
            claims = jwt.decode(id_token, key, algorithms=[alg], audience=self.cfg.client_id,
                                issuer=discovery.issuer, leeway=LEEWAY_S,
                                options={"require": ["iss", "aud", "exp", "iat", "sub"]})
        except jwt.ExpiredSignatureError:
            raise SignInFailed("The ID token has expired. Start the sign-in again.") from None
        except jwt.InvalidAudienceError:
            raise SignInFailed("The ID token was not issued for this gateway (audience).") \
                from None
        except jwt.InvalidIssuerError:
            raise SignInFailed("The ID token comes from another issuer.") from None
        except jwt.InvalidSignatureError:
            raise SignInFailed("The ID token's signature does not verify.") from None
        except jwt.MissingRequiredClaimError as exc:
            raise SignInFailed(f"The ID token lacks the '{exc.claim}' claim.") from None
        except jwt.InvalidTokenError:
            raise SignInFailed("The ID token is not valid.") from None
        azp = claims.get("azp")
        if azp is not None and azp != self.cfg.client_id:
            raise SignInFailed("The ID token was issued to another client (azp).")
        got = claims.get("nonce")
        if not isinstance(got, str) or not hmac.compare_digest(got.encode(), nonce.encode()):
            raise SignInFailed("The ID token does not belong to this sign-in (nonce).")
        return claims


def _failure(exc: SignInFailed) -> Response:
    return page("Sign-in failed", f"<p role='alert'>{html.escape(exc.message)}</p>"
                                  "<p><a href='/signin'>Back to sign in</a></p>", exc.status)


def register(app: Quart, web: Callable[[], Web], cfg: OidcConfig,
             http: Callable[[], httpx.AsyncClient], redirect_base: str) -> None:
    """Add `GET /signin/oidc` and `GET /signin/oidc/callback` for the provider in `cfg`.

    `http` gives the gateway's shared AsyncClient (read on each call: it lives while the app
    serves); `redirect_base` is the gateway's public URL without a trailing slash."""
    rp = OidcSignIn(cfg, http, f"{redirect_base.rstrip('/')}{CALLBACK_PATH}",
                    web().signin_flows, clock=lambda: web().clock())

    @app.route("/signin/oidc", methods=["GET"])
    async def oidc_start() -> Response:
        w = web()
        next_url = safe_next(request.args.get("next"))
        try:
            discovery = await rp.discover()
        except SignInFailed as exc:
            return _failure(exc)
        binding = request.cookies.get(BINDING_COOKIE) or ""
        if not _BINDING_FORMAT.fullmatch(binding):  # one value per browser: tabs may overlap
            binding = secrets.token_urlsafe(32)
        response = Response("", 303, {"Location": await rp.begin(binding, next_url, discovery),
                                      "Cache-Control": "no-store"})
        response.set_cookie(BINDING_COOKIE, binding, max_age=FLOW_TTL_S, path=COOKIE_PATH,
                            httponly=True, samesite="Lax", secure=w.secure)
        return response

    @app.route(CALLBACK_PATH, methods=["GET"])
    async def oidc_callback() -> Response:
        if request.method != "GET":  # a HEAD (a link prefetcher) must not use the state up
            return Response("", 200, {"Cache-Control": "no-store"})
        args = request.args
        try:
            flow = await rp.take(args.get("state"), request.cookies.get(BINDING_COOKIE))
            if "error" in args:
                raise SignInFailed("The identity provider did not sign you in "
                                   f"({_protocol_code(args.get('error'))}).")
            code = args.get("code")
            if not code:
                raise SignInFailed("The sign-in response has no authorization code.")
            discovery = await rp.discover()
            id_token = await rp.redeem(discovery, code, flow.verifier)
            claims = await rp.verify(discovery, id_token, flow.nonce)
            sub, name, groups, admin = map_claims(claims, cfg)
        except SignInFailed as exc:
            log.warning("OIDC sign-in refused: %s", exc.message)
            return _failure(exc)
        w = web()
        # a person provisioned through SCIM is found by the link rule (proxy.people.directory)
        await asyncio.to_thread(w.accounts.link, discovery.issuer, sub,
                                [str(claims[c]) for c in LINK_CLAIMS
                                 if isinstance(claims.get(c), str)])
        # no groups claim at all (Google's tokens): what the person holds is kept
        held = groups if cfg.groups_claim and claim_at(claims, cfg.groups_claim) is not None \
            else None
        user = await asyncio.to_thread(w.accounts.upsert_federated, discovery.issuer, sub,
                                       name, held, admin)
        if not user.active:
            log.warning("OIDC sign-in refused: user %s is deprovisioned", user.id)
            return _failure(SignInFailed("Your account is deactivated.", 403))
        log.info("OIDC sign-in: user %s (sub %s at %s)%s", user.id, sub, discovery.issuer,
                 " as admin" if admin else "")
        return await w.sign_in(user, flow.next_url)
