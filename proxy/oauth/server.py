"""The authorization server's decisions, free of the web framework: clients, codes, tokens.

Client secrets and refresh tokens are stored only as SHA-256 hashes (both are 256-bit random
values). Codes live a minute in the live-state store (proxy.state.codes) and are used once; a
code presented twice revokes what it produced. Refresh tokens rotate on every use, and a refresh token used twice revokes its
whole family (RFC 9700 / OAuth 2.1), except that its client presenting it again within
`refresh_grace_s` gets the same new tokens (proxy.oauth.grace). Redirect URIs follow RFC 8252
(proxy.oauth.redirects). Access tokens are short-lived ES256 JWTs whose audience
is one endpoint's resource URL (RFC 8707).

No scope is ever granted. Tollhouse has no model of which scopes a person may hold, so a
requested `scope` is ignored (RFC 6749 section 3.3 lets the server issue a narrower scope than
asked), the token response then says `"scope": ""` (section 5.1: the issued scope differs from
the requested one), and the access token carries no scope claim. People get into endpoints
through allow_subjects / allow_groups (custom roles act as groups); `allow_scopes` is for
tokens from external issuers that do model scopes.

Methods that touch live state (codes, revocations) are async and run their database steps in
a worker thread themselves (the tokens' steps are `TokenLedger`'s, proxy.oauth.tokens: minting,
the refresh rows); those that only read or write the database are plain functions that the
routes run in a thread.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx
import jwt
import orjson
from cachetools import TTLCache

from proxy.config import Config, OAuthServerConfig
from proxy.errors import OAuthError as OAuthError  # noqa: PLC0414 - cimd raises it from here
from proxy.errors import StoreUnavailable
from proxy.oauth import grace
from proxy.oauth.grants import GRANT_TYPES, Grants
from proxy.oauth.keys import KeyRing
from proxy.oauth.machines import ASSERTION_ALGORITHMS, Assertions, MachineClients, Once
from proxy.oauth.redirects import RedirectPolicy
from proxy.oauth.tokens import FamilyRevoked, TokenLedger, Used, elsewhere, hashed
from proxy.people.accounts import User
from proxy.state.codes import CodeStore
from proxy.state.flows import FlowStore
from proxy.state.revocations import RevocationStore
from proxy.state.rotations import RotationStore
from proxy.storage import db

_LEEWAY_S = 30  # clock skew allowed on an access token's exp


@dataclass(frozen=True)
class Client:
    client_id: str
    name: str
    redirect_uris: tuple[str, ...]
    auth_method: str  # none | client_secret_post | client_secret_basic
    secret_sha256: str | None = None


@dataclass(frozen=True)
class Grant:
    client_id: str
    redirect_uri: str
    challenge: str
    user: User
    resource: str
    scope_requested: bool  # a scope was asked for: none is granted, and the answer says so
    family: str

    def to_json(self) -> dict[str, Any]:
        """The grant as the code store keeps it (a JSON object, as a shared store needs)."""
        u = self.user
        return {"client_id": self.client_id, "redirect_uri": self.redirect_uri,
                "challenge": self.challenge, "resource": self.resource,
                "scope_requested": self.scope_requested, "family": self.family,
                "user": {"id": u.id, "name": u.name, "issuer": u.issuer, "subject": u.subject,
                         "is_admin": u.is_admin, "groups": sorted(u.groups),
                         "roles": sorted(u.roles)}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Grant:
        u = data["user"]
        user = User(u["id"], u["name"], u["issuer"], u["subject"], u["is_admin"],
                    frozenset(u["groups"]), frozenset(u["roles"]))
        return cls(data["client_id"], data["redirect_uri"], data["challenge"], user,
                   data["resource"], data["scope_requested"], data["family"])


def _no_http() -> httpx.AsyncClient:
    raise OAuthError("temporarily_unavailable", "no HTTP client to fetch keys with", 503)


def s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(
        b"=").decode()


def valid_redirect_uri(uri: str) -> bool:
    """Under the default redirect policy (proxy.oauth.redirects); a client is checked again
    under the configured one whenever it is sent back."""
    return _DEFAULT_REDIRECTS.valid(uri)


_DEFAULT_REDIRECTS = RedirectPolicy.from_config(OAuthServerConfig())


class AuthorizationServer:
    AUTH_METHODS: ClassVar[tuple[str, ...]] = ("none", "client_secret_post",
                                               "client_secret_basic")

    def __init__(self, cfg: Config, target: db.Target, keys: KeyRing,
                 clock: Callable[[], float] = time.time,
                 endpoints: Mapping[str, object] | None = None, *, codes: CodeStore,
                 revocations: RevocationStore, consents: FlowStore,
                 rotations: RotationStore | None = None,
                 http: Callable[[], httpx.AsyncClient] | None = None) -> None:
        self.issuer = cfg.server.public_url.rstrip("/")
        # the live endpoints (the edge's routes, which the management API changes), else the
        # config's: a server added through /api/v1 can be authorized for at once
        self._endpoints: Mapping[str, object] = (
            endpoints if endpoints is not None else {u.name: u for u in cfg.upstreams})
        self._resource_prefix = f"{self.issuer}/mcp/"
        self._cfg = cfg.oauth_server
        self.redirects = RedirectPolicy.from_config(cfg.oauth_server)
        self._db = db.resolve(target)
        self._db.ensure_schema()
        self._sql = self._db.sql
        self.keys = keys
        self._clock = clock
        # the tokens it mints and their refresh rows (each method a database step)
        self._ledger = TokenLedger(self._db, keys, self.issuer, self._cfg, clock)
        self._codes = codes
        self._revocations = revocations
        # refresh rotations kept for the grace period; None: no grace, a reuse always revokes
        self._rotations = rotations if self._cfg.refresh_grace_s > 0 else None
        # pending consent forms, bound to the browser session (the routes put and take them)
        self.consents = consents
        # per-process caches, which only save work:
        # claims whose signature was checked, by (token, resource): one ES256 check a token.
        # Never stale: they are what the signed token says, expiry and revocation are checked
        # on every call, and an entry goes when the token expires.
        self._verified: TTLCache[tuple[str, str], dict[str, Any]] = TTLCache(
            maxsize=50_000, ttl=self._cfg.access_token_ttl_s + _LEEWAY_S)
        # clients described by a metadata document at their client_id URL, fetched and
        # cached: a changed document is seen here at most an hour late
        self.cimd: TTLCache[str, Client] = TTLCache(maxsize=10_000, ttl=3600)
        # the confidential clients an administrator registered, and their grants
        # (proxy.oauth.grants); their JWKS (private_key_jwt) and the enterprise IdPs' are
        # fetched with the gateway's shared client
        once = Once(revocations)
        fetch = http or _no_http
        self.machines = MachineClients(cfg.oauth_server.clients, fetch, self.issuer, once)
        self.grants = Grants(self._ledger, self.machines,
                             Assertions(cfg.oauth_server.enterprise_idps, fetch, self.issuer,
                                        once),
                             self.endpoint_of, self.verify_access)

    # -- clients -------------------------------------------------------------------------------

    def endpoint_of(self, resource: str) -> str | None:
        """The endpoint a resource URL (RFC 8707) names, if this gateway serves it now."""
        if not resource.startswith(self._resource_prefix):
            return None
        name = resource[len(self._resource_prefix):]
        return name if name in self._endpoints else None

    def register(self, metadata: Any) -> dict[str, Any]:
        if not isinstance(metadata, dict):
            raise OAuthError("invalid_client_metadata", "the body must be a JSON object")
        uris = metadata.get("redirect_uris")
        if not isinstance(uris, list) or not uris or not all(isinstance(u, str) for u in uris):
            raise OAuthError("invalid_redirect_uri", "redirect_uris must list at least one URI")
        for uri in uris:
            if not self.redirects.valid(uri):
                raise OAuthError("invalid_redirect_uri", self.redirects.described)
        method = metadata.get("token_endpoint_auth_method", "none")
        if method not in self.AUTH_METHODS:
            raise OAuthError("invalid_client_metadata",
                             f"token_endpoint_auth_method must be one of "
                             f"{', '.join(self.AUTH_METHODS)}")
        for key, allowed in (("grant_types", {"authorization_code", "refresh_token"}),
                             ("response_types", {"code"})):
            values = metadata.get(key)
            if values is not None and (not isinstance(values, list)
                                       or not set(values) <= allowed):
                raise OAuthError("invalid_client_metadata",
                                 f"{key} may only contain {', '.join(sorted(allowed))}")
        name = metadata.get("client_name")
        name = name[:200] if isinstance(name, str) and name else "an unnamed client"
        client_id = secrets.token_urlsafe(18)
        secret = secrets.token_urlsafe(32) if method != "none" else None
        now = self._clock()
        with self._db.transaction() as conn:
            conn.execute(self._sql(
                "INSERT INTO oauth_clients (client_id, secret_sha256, name, redirect_uris, "
                "auth_method, created_at) VALUES (?, ?, ?, ?, ?, ?)"),
                (client_id, hashed(secret) if secret else None, name,
                 orjson.dumps(uris).decode(), method, now))
        out: dict[str, Any] = {"client_id": client_id, "client_id_issued_at": int(now),
                               "client_name": name, "redirect_uris": uris,
                               "token_endpoint_auth_method": method,
                               "grant_types": ["authorization_code", "refresh_token"],
                               "response_types": ["code"]}
        if secret:
            out["client_secret"] = secret
            out["client_secret_expires_at"] = 0
        return out

    def client(self, client_id: str) -> Client | None:
        if client_id in self.cimd:
            return self.cimd[client_id]
        machine = self.machines.get(client_id)
        if machine is not None:  # registered by an administrator: no redirect, a secret or keys
            return Client(client_id, machine.name, (),
                          "private_key_jwt" if machine.jwks is not None
                          else "client_secret_basic", machine.cfg.secret_sha256 or None)
        with self._db.transaction() as conn:
            row = conn.execute(self._sql("SELECT client_id, name, redirect_uris, auth_method, "
                                         "secret_sha256 FROM oauth_clients WHERE client_id = ?"),
                               (client_id,)).fetchone()
        if row is None:
            return None
        return Client(row[0], row[1], tuple(orjson.loads(row[2])), row[3], row[4])

    def authenticate_client(self, client_id: str | None, secret: str | None) -> Client:
        """The client making a token or revocation request; invalid_client (401) otherwise."""
        client = self.client(client_id) if client_id else None
        if client is None:
            raise OAuthError("invalid_client", "unknown client", 401)
        if client.auth_method != "none" and (
                not secret or not client.secret_sha256
                or not hmac.compare_digest(client.secret_sha256, hashed(secret))):
            raise OAuthError("invalid_client", "client authentication failed", 401)
        return client

    # -- authorization codes -------------------------------------------------------------------

    def check_authorize(self, params: dict[str, str]) -> tuple[Client, str]:
        """Errors that must not redirect (unknown client, unregistered redirect URI)."""
        client = self.client(params.get("client_id", ""))
        if client is None:
            raise OAuthError("invalid_client", "unknown client_id")
        redirect_uri = params.get("redirect_uri", "")
        # checked again: a client registered before a rule was added may hold a URI it breaks
        if not self.redirects.matches(redirect_uri, client.redirect_uris):
            raise OAuthError("invalid_request", "redirect_uri is not registered for this client")
        return client, redirect_uri

    def check_request(self, params: dict[str, str]) -> str:
        """Errors reported to the client through its redirect URI; returns the resource."""
        if params.get("response_type") != "code":
            raise OAuthError("unsupported_response_type", "response_type must be code")
        if not params.get("code_challenge") or params.get("code_challenge_method") != "S256":
            raise OAuthError("invalid_request", "PKCE with code_challenge_method S256 is required")
        resource = params.get("resource") or ""
        if self.endpoint_of(resource) is None:
            raise OAuthError("invalid_target",
                             "resource must name one of this gateway's endpoints")
        return resource

    async def issue_code(self, client: Client, redirect_uri: str, params: dict[str, str],
                         user: User, resource: str) -> str:
        code = secrets.token_urlsafe(32)
        grant = Grant(client.client_id, redirect_uri, params["code_challenge"], user, resource,
                      bool(params.get("scope")), secrets.token_urlsafe(12))
        await self._codes.put(code, grant.to_json(), grant.family)
        return code

    # -- tokens --------------------------------------------------------------------------------

    async def exchange_code(self, client: Client, form: dict[str, str]) -> dict[str, Any]:
        taken = await self._codes.take(form.get("code", ""))
        if taken.grant is None:
            if taken.used_tag is not None:  # a code presented twice: what it produced is revoked
                await self._revoke_family(taken.used_tag)
            raise OAuthError("invalid_grant", "the code is invalid, expired or already used")
        grant = Grant.from_json(taken.grant)
        if grant.client_id != client.client_id:
            raise OAuthError("invalid_grant", "the code was issued to another client")
        if form.get("redirect_uri") != grant.redirect_uri:
            raise OAuthError("invalid_grant", "redirect_uri does not match the authorization")
        verifier = form.get("code_verifier", "")
        if not verifier or not hmac.compare_digest(s256(verifier), grant.challenge):
            raise OAuthError("invalid_grant", "PKCE verification failed")
        resource = form.get("resource") or grant.resource
        if resource != grant.resource:
            raise elsewhere(grant.resource, resource)
        tokens = await asyncio.to_thread(self._ledger.issue, client.client_id, grant.user,
                                         resource, grant.family,
                                         scope_requested=grant.scope_requested)
        return await self._unless_revoked(grant.family, tokens)

    async def refresh(self, client: Client, form: dict[str, str],
                      user_lookup: Callable[[str], User | None]) -> dict[str, Any]:
        """Rotate a refresh token (its database steps in a thread); a reuse revokes the
        family, in the database and in the live-state store, before the refusal. Within the
        grace period (`refresh_grace_s`) the same client presenting the token again gets the
        same new tokens (proxy.oauth.grace): the rotation is claimed in the shared store
        before the database marks the token used, so a presentation that finds it used
        finds the claim, on any replica."""
        token = form.get("refresh_token", "")
        try:
            try:
                family, answer, row = await asyncio.to_thread(
                    self._ledger.refreshed, client.client_id, form, user_lookup)
            except Used as used:
                return await self._again(token, client, used.family)
            if self._rotations is not None:
                held = await self._rotations.claim(
                    grace.store_key(token), grace.seal(token, client.client_id, answer,
                                                       self._clock() + answer["expires_in"]))
                if held is not None:  # a parallel presentation rotated it a moment ago
                    return await self._replayed(token, client, family, held)
            if not await asyncio.to_thread(self._ledger.rotate, token, row):
                return await self._again(token, client, family)
        except FamilyRevoked as revoked:
            await self._revoked_in_store(revoked.family)  # its rows are revoked already
            raise revoked.error from None
        return await self._unless_revoked(family, answer)

    async def _again(self, token: str, client: Client, family: str) -> dict[str, Any]:
        """A refresh token already rotated: its answer again within the grace period, for the
        client it was rotated for; otherwise a reuse, which revokes the family (raises
        `FamilyRevoked`)."""
        held = await self._rotations.get(grace.store_key(token)) \
            if self._rotations is not None else None
        if held is not None:
            return await self._replayed(token, client, family, held)
        raise await asyncio.to_thread(self._ledger.family_revoked, family,
                                      "refresh token reused; its family is revoked")

    async def _replayed(self, token: str, client: Client, family: str,
                        held: bytes) -> dict[str, Any]:
        answer = grace.opened(token, client.client_id, held, self._clock())
        if answer is None:  # rotated for another client: a copy is loose
            raise await asyncio.to_thread(self._ledger.family_revoked, family,
                                          "refresh token reused; its family is revoked")
        return await self._unless_revoked(family, answer)

    async def _unless_revoked(self, family: str, tokens: dict[str, Any]) -> dict[str, Any]:
        """`tokens`, just issued in `family`, whose refresh row may have been stored after a
        revocation of the family revoked its rows: the code or refresh token was presented
        again at the same moment (by another replica, or another request here). The revoker
        revokes the rows again once it has told the store, so whichever of the two comes
        second sees the other: here, the store says revoked, and the rows are revoked again.
        The answer stands (the first use succeeds); what it carries is refused. A store out
        of reach leaves the answer as it is (the revoker could not tell it either)."""
        try:
            revoked = await self._revocations.revoked("", family)  # "": the family only
        except StoreUnavailable:
            return tokens
        if revoked:
            await asyncio.to_thread(self._ledger.revoke_rows, family)
        return tokens

    async def _revoke_family(self, family: str) -> None:
        await asyncio.to_thread(self._ledger.revoke_rows, family)
        await self._revoked_in_store(family)

    async def _revoked_in_store(self, family: str) -> None:
        """Tell the store, then revoke the rows once more: a refresh row of the family
        stored since they were first revoked is caught by this, or by its issuer's look at
        the store (`_unless_revoked`)."""
        await self._revocations.revoke_family(family)
        await asyncio.to_thread(self._ledger.revoke_rows, family)

    async def revoke_person(self, user_id: str) -> int:
        """A person deprovisioned: every grant of theirs revoked (its access tokens refused
        wherever the live-state store reaches) and their refresh rows deleted; how many grants
        (families) there were."""
        families = await asyncio.to_thread(self._ledger.families_of, user_id)
        for family in families:
            await self._revocations.revoke_family(family)
        await asyncio.to_thread(self._ledger.delete_rows_of, user_id)
        return len(families)

    async def revoke(self, client: Client, token: str) -> None:
        """RFC 7009: a refresh token revokes its family; an access token is refused from now
        on. An unknown token is not an error."""
        row = await asyncio.to_thread(self._ledger.owner, token)
        if row is not None:
            if row[1] == client.client_id:
                await self._revoke_family(row[0])
            return
        try:
            claims = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            return
        if claims.get("client_id") == client.client_id and isinstance(claims.get("jti"), str):
            await self._revocations.revoke_token(claims["jti"])

    # -- at the MCP edge -----------------------------------------------------------------------

    async def verify_access(self, token: str, resource: str) -> dict[str, Any]:
        """The claims of a valid access token for this resource; raises jwt.PyJWTError. The
        signature is checked once per token and resource (the checked claims are kept until
        the token expires); expiry and revocation are checked on every call."""
        verified = self._verified.get((token, resource))
        if verified is None:
            header = jwt.get_unverified_header(token)
            key = await self.keys.public_key(str(header.get("kid", "")))
            if key is None or header.get("alg") != "ES256":
                raise jwt.InvalidTokenError("unknown signing key")
            verified = jwt.decode(token, key, algorithms=["ES256"], audience=resource,
                                  issuer=self.issuer, leeway=_LEEWAY_S,
                                  options={"require": ["exp", "iss", "aud", "sub"]})
            self._verified[(token, resource)] = verified
        elif not isinstance(verified.get("exp"), int | float) or \
                verified["exp"] + _LEEWAY_S < time.time():
            raise jwt.ExpiredSignatureError("Signature has expired")
        claims: dict[str, Any] = verified
        if await self._revocations.revoked(str(claims.get("jti")), str(claims.get("fam"))):
            raise jwt.InvalidTokenError("revoked")
        return claims

    def machine_now(self, client_id: str) -> tuple[str, frozenset[str]] | None:
        """A registered client's name and roles as configured now; None when it is not
        registered (its tokens are refused)."""
        machine = self.machines.get(client_id)
        return None if machine is None else (machine.name, machine.roles)

    def metadata(self) -> dict[str, Any]:
        base = self.issuer
        return {
            "issuer": base,
            "authorization_endpoint": f"{base}/oauth/authorize",
            "token_endpoint": f"{base}/oauth/token",
            "registration_endpoint": f"{base}/oauth/register",
            "revocation_endpoint": f"{base}/oauth/revoke",
            "jwks_uri": f"{base}/oauth/jwks.json",
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code", "refresh_token",
                                      *GRANT_TYPES],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": [*self.AUTH_METHODS, "private_key_jwt"],
            "token_endpoint_auth_signing_alg_values_supported": list(ASSERTION_ALGORITHMS),
            "revocation_endpoint_auth_methods_supported": list(self.AUTH_METHODS),
            "scopes_supported": [],
            "authorization_response_iss_parameter_supported": True,
            "client_id_metadata_document_supported": True,
        }
