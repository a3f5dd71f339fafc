"""Confidential clients an administrator registered (`[[oauth_server.clients]]`): machine
clients and agents. One authenticates with a secret (its SHA-256 is what the config holds,
checked by the authorization server like a registered client's) or with `private_key_jwt`
(RFC 7523 section 2.2): a JWT it signs with a key its `jwks_url` publishes, whose `iss` and
`sub` are its client_id, whose `aud` is this server's issuer or token endpoint, and which is
used once (its `jti` remembered for its lifetime, in the live-state store every replica
shares) and lives at most `ASSERTION_MAX_S`. The roles it was given travel as groups.

Identity assertions (ID-JAG) from enterprise IdPs are checked here too (`Assertions`), with
the same JWKS cache and the same once-only rule: see proxy.oauth.grants for what is done with
them."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx
import jwt

from proxy.auth.jwks import JwksCache, kty_for
from proxy.config import EnterpriseIdpConfig, OAuthClientConfig
from proxy.errors import OAuthError
from proxy.state.revocations import RevocationStore

ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
ID_JAG_TYP = "oauth-id-jag+jwt"
ASSERTION_MAX_S = 300.0  # a client assertion valid for longer is refused
ASSERTION_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256",
                        "ES384", "ES512", "EdDSA")
_LEEWAY_S = 30


@dataclass(frozen=True)
class Machine:
    """A registered confidential client as the token endpoint uses it."""

    cfg: OAuthClientConfig
    jwks: JwksCache | None

    @property
    def client_id(self) -> str:
        return self.cfg.client_id

    @property
    def name(self) -> str:
        return self.cfg.name or self.cfg.client_id

    @property
    def subject(self) -> str:
        return f"client:{self.cfg.client_id}"

    @property
    def roles(self) -> frozenset[str]:
        return frozenset(self.cfg.roles)

    def may(self, grant_type: str) -> bool:
        return grant_type in self.cfg.grant_types

    def serves(self, endpoint: str) -> bool:
        """May this client have a token for `endpoint`? (none listed: every one)"""
        return not self.cfg.endpoints or endpoint in self.cfg.endpoints


class Once:
    """A JWT's `jti` used once across replicas: remembered in the revocation store (whose
    entries live as long as an access token, longer than any assertion taken). Two replicas
    given one assertion in the same instant may both take it; any later use is refused."""

    def __init__(self, store: RevocationStore) -> None:
        self._store = store

    async def use(self, kind: str, issuer: str, jti: object) -> None:
        if not isinstance(jti, str) or not jti or len(jti) > 256:
            raise OAuthError("invalid_grant", f"the {kind} has no usable jti")
        key = "once:" + hashlib.sha256(f"{kind}\0{issuer}\0{jti}".encode()).hexdigest()
        if await self._store.revoked(key, ""):
            raise OAuthError("invalid_grant", f"the {kind} was used already")
        await self._store.revoke_token(key)


def _header(token: str, what: str, error: str, status: int) -> tuple[dict[str, Any], str]:
    """The JOSE header and `iss` of a JWT not verified yet; `error` when it is no JWT."""
    try:
        header = jwt.get_unverified_header(token)
        issuer = jwt.decode(token, options={"verify_signature": False}).get("iss")
    except jwt.PyJWTError:
        raise OAuthError(error, f"the {what} is not a JWT", status) from None
    return header, issuer if isinstance(issuer, str) else ""


async def _key(cache: JwksCache, header: dict[str, Any], algorithms: Iterable[str], what: str,
               error: str, status: int) -> tuple[Any, str]:
    alg, kid = header.get("alg"), header.get("kid")
    if not isinstance(alg, str) or alg not in algorithms or kty_for(alg) is None:
        raise OAuthError(error, f"the {what}'s algorithm is not accepted", status)
    if not isinstance(kid, str) or not kid:
        raise OAuthError(error, f"the {what} names no key (kid)", status)
    key = await cache.key(kid, alg)
    if key is None:
        raise OAuthError(error, f"the {what}'s key is not in its issuer's JWKS", status)
    return key, alg


class MachineClients:
    """The registered confidential clients, by client_id."""

    def __init__(self, clients: Iterable[OAuthClientConfig], http: Callable[[], httpx.AsyncClient],
                 issuer: str, once: Once, clock: Callable[[], float] = time.time) -> None:
        self._issuer = issuer
        self._once = once
        self._clock = clock
        self._http = http
        self.by_id: dict[str, Machine] = {}
        for cfg in clients:
            jwks = _LazyJwks(cfg.jwks_url, http, 3600.0, 60.0) if cfg.jwks_url else None
            self.by_id[cfg.client_id] = Machine(cfg, jwks)

    def get(self, client_id: str) -> Machine | None:
        return self.by_id.get(client_id)

    async def asserted(self, form: dict[str, str]) -> Machine:
        """The client a `private_key_jwt` assertion authenticates (invalid_client, 401,
        otherwise)."""
        if form.get("client_assertion_type") != ASSERTION_TYPE:
            raise OAuthError("invalid_client", f"client_assertion_type must be {ASSERTION_TYPE}",
                             401)
        token = form.get("client_assertion", "")
        header, issuer = _header(token, "client assertion", "invalid_client", 401)
        machine = self.by_id.get(issuer)
        if machine is None or machine.jwks is None:
            raise OAuthError("invalid_client", "unknown client", 401)
        if form.get("client_id") not in (None, "", issuer):
            raise OAuthError("invalid_client", "client_id and the assertion disagree", 401)
        key, alg = await _key(machine.jwks, header, ASSERTION_ALGORITHMS, "client assertion",
                              "invalid_client", 401)
        try:
            claims = jwt.decode(token, key, algorithms=[alg], issuer=issuer, leeway=_LEEWAY_S,
                                audience=[self._issuer, f"{self._issuer}/oauth/token"],
                                options={"require": ["exp", "iss", "sub", "aud", "jti"]})
        except jwt.PyJWTError as exc:
            raise OAuthError("invalid_client", "the client assertion does not verify "
                             f"({type(exc).__name__})", 401) from None
        if claims["sub"] != issuer:
            raise OAuthError("invalid_client", "the client assertion's sub is not its iss", 401)
        if float(claims["exp"]) - self._clock() > ASSERTION_MAX_S:
            raise OAuthError("invalid_client", "the client assertion is valid for more than "
                             f"{int(ASSERTION_MAX_S)} s", 401)
        try:
            await self._once.use("client assertion", issuer, claims["jti"])
        except OAuthError as exc:
            raise OAuthError("invalid_client", exc.wire_message, 401) from None
        return machine


class _LazyJwks(JwksCache):
    """A JwksCache whose HTTP client is the gateway's shared one, asked for when first used
    (the client is made after the authorization server)."""

    def __init__(self, url: str, http: Callable[[], httpx.AsyncClient], refresh_s: float,
                 min_refetch_s: float) -> None:
        super().__init__(url, None, refresh_s=refresh_s,  # type: ignore[arg-type]
                         min_refetch_s=min_refetch_s)
        self._get_http = http

    async def key(self, kid: str, alg: str) -> jwt.PyJWK | None:
        if self._http is None:
            self._http = self._get_http()
        return await super().key(kid, alg)


class Assertions:
    """Identity Assertion JWT Authorization Grants (ID-JAG) from the configured enterprise
    IdPs: `typ` oauth-id-jag+jwt, signed by a key the IdP's JWKS publishes, `aud` this
    server's issuer, unexpired and not for longer than the IdP's `max_lifetime_s`, naming the
    client that presents it, used once."""

    def __init__(self, idps: Iterable[EnterpriseIdpConfig], http: Callable[[], httpx.AsyncClient],
                 issuer: str, once: Once, clock: Callable[[], float] = time.time) -> None:
        self._issuer = issuer
        self._once = once
        self._clock = clock
        self._idps = {idp.issuer: (idp, _LazyJwks(idp.jwks_url, http, idp.jwks_refresh_s,
                                                  idp.jwks_min_refetch_s)) for idp in idps}

    async def verified(self, token: str, client_id: str
                       ) -> tuple[EnterpriseIdpConfig, dict[str, Any]]:
        header, issuer = _header(token, "assertion", "invalid_grant", 400)
        if str(header.get("typ", "")).lower() != ID_JAG_TYP:
            raise OAuthError("invalid_grant", f"the assertion's typ must be {ID_JAG_TYP}")
        found = self._idps.get(issuer)
        if found is None:
            raise OAuthError("invalid_grant", "the assertion's issuer is not a trusted "
                             "enterprise identity provider")
        idp, jwks = found
        key, alg = await _key(jwks, header, idp.algorithms, "assertion", "invalid_grant", 400)
        try:
            claims = jwt.decode(token, key, algorithms=[alg], issuer=idp.issuer,
                                audience=self._issuer, leeway=idp.leeway_s,
                                options={"require": ["exp", "iat", "iss", "aud", "sub", "jti",
                                                     "client_id"]})
        except jwt.ExpiredSignatureError:
            raise OAuthError("invalid_grant", "the assertion expired") from None
        except jwt.InvalidAudienceError:
            raise OAuthError("invalid_grant", "the assertion is for another audience: its aud "
                             f"must be {self._issuer}") from None
        except jwt.PyJWTError as exc:
            raise OAuthError("invalid_grant", "the assertion does not verify "
                             f"({type(exc).__name__})") from None
        if claims["client_id"] != client_id:
            raise OAuthError("invalid_grant", "the assertion was issued to another client")
        sub = claims["sub"]
        if not isinstance(sub, str) or not sub or len(sub) > 255:
            raise OAuthError("invalid_grant", "the assertion has no usable sub")
        if float(claims["exp"]) - float(claims["iat"]) > idp.max_lifetime_s:
            raise OAuthError("invalid_grant", "the assertion is valid for more than "
                             f"{int(idp.max_lifetime_s)} s")
        await self._once.use("assertion", idp.issuer, claims["jti"])
        return idp, claims
