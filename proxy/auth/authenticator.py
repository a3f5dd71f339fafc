"""Who is calling the MCP edge: a bearer JWT from a configured issuer (JWKS or static keys), a
token this gateway's OAuth server issued, or an API key; `NoAuth` when `auth.mode = "none"`.
Failures answer 401 with the reason in the audit only, counted by the lockout helper against
the caller's address; except a token whose signature verifies and that is only out of its time
window (expired, not yet valid) or meant for another endpoint: no guess makes one, so it answers
401 `invalid_token` and counts for nothing (a hundred people behind one address whose tokens
expire at once are not an attack). A token that names a deprovisioned person (proxy.auth.
deprovisioned: by its issuer and subject, or by the link rule's claims) is refused on every
call, the cached ones too: 401 `invalid_token`, not counted either. A JWT's groups get the
SCIM groups of the provisioned person an external issuer's token names, and the custom roles
`[[auth.group_roles]]` and /api/v1/group-roles map them to (proxy.auth.group_roles, read in
memory on each call, so a change applies to cached tokens too)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import httpx
import jwt
from cachetools import LRUCache
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from proxy.auth import keys as api_keys
from proxy.auth.deprovisioned import Deprovisioned, link_keys, subject_key
from proxy.auth.group_roles import GroupRoles
from proxy.auth.jwks import JwksCache, kty_for
from proxy.auth.lockout import Attempt
from proxy.auth.people import People, StoreDown
from proxy.auth.principal import ANONYMOUS, CLIENT_ISSUER, Principal
from proxy.config import Config, IssuerConfig
from proxy.config.presets import claim as claim_at
from proxy.deadlines import Deadlines
from proxy.errors import Forbidden, Unauthenticated
from proxy.state.lockouts import LockoutStore

log = logging.getLogger("tollhouse.auth")


class Authenticator(Protocol):
    async def authenticate(self, authorization: str | None, endpoint: str,
                           peer: str | None = None) -> Principal: ...

    def keep_claims(self, cfg: Config) -> None:
        """A reload: keep the claims `cfg`'s per-caller upstream URLs are filled from."""


class NoAuth:
    """`auth.mode = "none"`: every caller is one anonymous principal (loopback only)."""

    async def authenticate(self, authorization: str | None, endpoint: str,
                           peer: str | None = None) -> Principal:
        return ANONYMOUS

    def keep_claims(self, cfg: Config) -> None:
        return None  # an anonymous caller has no claims


@dataclass(frozen=True)
class _Issuer:
    cfg: IssuerConfig
    static_key: Any = None
    jwks: JwksCache | None = None


class Failed(Exception):
    """A credential was presented and did not hold; `reason` is for the audit log only.
    `guess` is False for a validly signed token that is merely out of its time window or for
    another endpoint: it is not counted towards the lockout. `description` goes to the
    client, in the challenge's error_description."""

    def __init__(self, reason: str, *, guess: bool = True, description: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.guess = guess
        self.description = description


def _expired(reason: str) -> Failed:
    return Failed(reason, guess=False, description=reason)


def _deprovisioned() -> Failed:
    return Failed("the token's person is deprovisioned", guess=False,
                  description="the person this token names is deactivated")


# what a token of a configured issuer names a provisioned person by (docs/provisioning.md)
LINK_CLAIMS = ("sub", "preferred_username", "email", "upn")


class BearerAuth:
    """Bearer credentials: JWTs from the configured issuers, or Tollhouse API keys.

    Verified JWTs are cached by their exact text until they expire (at most 300 s), so a client
    that sends the same token on every call costs one signature check, not one per call: this
    per-process cache holds only what the token itself says, so it is never staler than the
    token (an external issuer's tokens cannot be revoked here). API keys are looked up
    in memory on every call (revocation takes effect on the next request). Presented credentials
    that fail count towards a lockout of the client address.
    """

    CACHE_S = 300.0  # a verified token is trusted without a new check this long at most

    def __init__(self, cfg: Config, base_dir: Path, http: httpx.AsyncClient,
                 keys: api_keys.KeyIndex | None, lockouts: LockoutStore,
                 clock: Callable[[], float] = time.monotonic,
                 tollhouse: TokenVerifier | None = None,
                 people: People | None = None,
                 deprovisioned: Deprovisioned | None = None,
                 group_roles: GroupRoles | None = None) -> None:
        self._tollhouse = tollhouse
        self._group_roles = group_roles
        self._deprovisioned = deprovisioned
        self._people = people  # who the subject of a token this gateway issued is now
        self._store_down_logged = 0.0
        self._issuers: dict[str, _Issuer] = {}
        # each issuer's keys, a per-process cache: a key the issuer withdraws is still
        # trusted here for at most jwks_refresh_s (while the JWKS URL answers); a new kid is
        # fetched at once, at most every jwks_min_refetch_s
        for iss in cfg.auth.issuers:
            self._issuers[iss.issuer] = _Issuer(
                iss, static_key=_static_key(iss, base_dir),
                jwks=JwksCache(iss.jwks_url, http, refresh_s=iss.jwks_refresh_s,
                               min_refetch_s=iss.jwks_min_refetch_s, clock=clock)
                if iss.jwks_url else None)
        self._public_url = cfg.server.public_url.rstrip("/")
        self._keys = keys
        self._lockouts = lockouts
        self._clock = clock
        # verified tokens of external issuers, each until it expires and for at most CACHE_S,
        # with the deprovisioned keys that would refuse it
        self._cache: Deadlines[tuple[str, str], tuple[Principal, frozenset[str]]] = \
            Deadlines(maxsize=50_000)
        self._token_issuers: LRUCache[str, object] = LRUCache(maxsize=50_000)
        self._challenges = {u.name: self._challenge(u.name) for u in cfg.upstreams}
        self._kept_claims = _claims_of(cfg)

    def keep_claims(self, cfg: Config) -> None:
        """A reload: the claims kept are those `cfg`'s per-caller URLs name. When they change,
        the verified tokens cached forget theirs, so that the next call of each caller carries
        the claims the new routes are filled from (and none they no longer use)."""
        kept = _claims_of(cfg)
        if kept != self._kept_claims:
            self._kept_claims = kept
            self._cache.clear()

    def _challenge(self, endpoint: str) -> str:
        meta = f"{self._public_url}/.well-known/oauth-protected-resource/mcp/{endpoint}"
        return f'Bearer resource_metadata="{meta}"'

    def challenge(self, endpoint: str, error: str | None = None,
                  description: str = "") -> dict[str, str]:
        value = self._challenges.get(endpoint) or self._challenge(endpoint)
        if error:
            value += f', error="{error}"'
        if description:  # RFC 6750 section 3: no quote or backslash in a quoted string
            value += f', error_description="{_quotable(description)}"'
        return {"WWW-Authenticate": value}

    async def authenticate(self, authorization: str | None, endpoint: str,
                           peer: str | None = None) -> Principal:
        token = _bearer(authorization)
        if token is None:
            raise Unauthenticated("auth: no bearer credential", headers=self.challenge(endpoint))
        # by the caller's address only: an API key's secret and a JWT's signature cannot be
        # guessed, so locking a key id or a subject out would only let anyone who knows one
        # (they are public) shut its owner out
        watch = (f"ip:{peer}",) if peer else ()
        async with Attempt(self._lockouts, watch, unguessable=True) as attempt:  # LockedOut
            try:
                if api_keys.looks_like_key(token):
                    return await self._api_key(token, endpoint)
                return await self._jwt(token, endpoint)
            except Failed as failure:
                attempt.failed = failure.guess
                raise Unauthenticated(f"auth: {failure.reason}",
                                      headers=self.challenge(endpoint, "invalid_token",
                                                             failure.description)) from None

    async def identify(self, authorization: str | None, endpoints: Iterable[str],
                       peer: str | None = None) -> Principal:
        """Who presents `authorization`: a JWT this edge accepts for the endpoint its
        audience names (one of `endpoints`, this gateway's), or for any of them with an
        issuer's fixed `audience`. The approvers of /api/v1/approvals (proxy.api.approvals)
        are known so; an API key is not looked up here. Unauthenticated when none holds."""
        token = _bearer(authorization)
        if token is None or api_keys.looks_like_key(token):
            raise Unauthenticated("auth: no bearer JWT", headers={"WWW-Authenticate": "Bearer"})
        known = list(dict.fromkeys(endpoints))
        prefix = f"{self._public_url}/mcp/"
        named = [a[len(prefix):] for a in _audiences(token) if a.startswith(prefix)]
        tried = [e for e in named if e in known] or known[:1]
        watch = (f"ip:{peer}",) if peer else ()
        failure = Failed("the token names no endpoint of this gateway")
        async with Attempt(self._lockouts, watch, unguessable=True) as attempt:
            for endpoint in tried:
                try:
                    return await self._jwt(token, endpoint)
                except Failed as failed:
                    failure = failed
            attempt.failed = failure.guess
        raise Unauthenticated(f"auth: {failure.reason}", headers={"WWW-Authenticate": (
            f'Bearer error="invalid_token", error_description="{_quotable(failure.reason)}"')})

    async def _api_key(self, token: str, endpoint: str) -> Principal:
        key = await self._keys.lookup(token) if self._keys is not None else None
        if key is None:
            raise Failed("unknown, revoked or expired API key")
        if key.endpoints and endpoint not in key.endpoints:
            raise Forbidden(f"auth: API key {key.id} is not valid for endpoint {endpoint}")
        if key.role == "auditor":  # reads the management API, calls no tool
            raise Forbidden(f"auth: API key {key.id} is an auditor's: it is not valid for "
                            "any endpoint")
        return Principal(subject=f"key:{key.id}", issuer="tollhouse:api-key",
                         display_name=key.name, kind="api_key", api_key_id=key.id,
                         key_endpoints=key.endpoints, role=key.role)

    async def _jwt(self, token: str, endpoint: str) -> Principal:
        return self._mapped(*await self._verified(token, endpoint))

    def _mapped(self, principal: Principal, keys: frozenset[str]) -> Principal:
        """The principal with the SCIM groups of the provisioned person its token's `keys`
        name (an external issuer's), and the custom roles its groups are mapped to."""
        if self._group_roles is None:
            return principal
        groups = principal.groups | self._group_roles.scim_groups(keys)
        groups |= self._group_roles.grant(groups).groups
        return replace(principal, groups=groups) if groups != principal.groups else principal

    async def _verified(self, token: str, endpoint: str
                        ) -> tuple[Principal, frozenset[str]]:
        now = time.time()
        cached = self._cache.get((token, endpoint), now)  # external issuers' tokens only
        if cached is None:
            if self._tollhouse is not None and self._issuer(token) == self._public_url:
                # not cached here: the authorization server checks revocation on every call
                return await self._own(token, endpoint), frozenset()
            principal, keys, expires = await self._verify(token, endpoint)
            now = time.time()
            cached = (principal, keys)
            self._cache.put((token, endpoint), cached, min(expires, now + self.CACHE_S), now)
        if self._deprovisioned is not None and await self._deprovisioned.refuses(cached[1]):
            raise _deprovisioned()
        return cached

    def _issuer(self, token: str) -> str | None:
        """The unverified `iss` of a token, read once per token (a token's claims never
        change, so the cache can never be stale; it only saves a decode per call)."""
        issuer = self._token_issuers.get(token, _UNREAD)
        if issuer is _UNREAD:
            issuer = self._token_issuers[token] = _issuer_of(token)
        return issuer  # type: ignore[return-value]

    async def _own(self, token: str, endpoint: str) -> Principal:
        """A token this gateway's authorization server issued, for this endpoint only."""
        assert self._tollhouse is not None
        try:
            claims = await self._tollhouse.verify_access(
                token, f"{self._public_url}/mcp/{endpoint}")
        except jwt.InvalidAudienceError:
            raise Failed("token issued for another endpoint", guess=False,
                         description=_elsewhere(token, f"{self._public_url}/mcp/{endpoint}")
                         ) from None
        except jwt.ExpiredSignatureError:
            raise _expired("token expired") from None
        except jwt.ImmatureSignatureError:
            raise _expired("token not yet valid") from None
        except jwt.PyJWTError as exc:
            raise Failed(f"invalid token ({type(exc).__name__})") from None
        subject, issuer = str(claims["sub"]), str(claims.get("tollhouse_iss", ""))
        name, groups = str(claims.get("name", "")), _names(claims.get("groups"))
        if issuer == CLIENT_ISSUER:  # a registered machine client's own token
            return self._machine(claims)
        uid = claims.get("uid")
        if self._deprovisioned is not None and await self._deprovisioned.refuses(
                (subject_key(issuer, subject),), uid if isinstance(uid, str) else None):
            raise _deprovisioned()
        if self._people is not None:
            # the person as they are now: a deleted user's token stops working, and a role
            # given or taken applies to this call, not the next token
            try:
                user = await self._people.current(issuer, subject)
            except StoreDown as exc:  # the token is valid: carry on with what it says
                now = time.monotonic()
                if now - self._store_down_logged > 60:
                    self._store_down_logged = now
                    log.warning("users table out of reach (%s): gateway tokens keep the "
                                "groups they were issued with", exc)
            else:
                if user is None or (uid is not None and uid != user.id):
                    # deleted, or deleted and a new user of the same name made since
                    raise Failed("the token's user no longer exists")
                name, groups = user.name, user.groups
        # no scopes: this gateway grants none (it has no model of who may hold which), so a
        # `scope` claim, from a token issued before that rule, opens nothing (allow_scopes is
        # for tokens of external issuers; Tollhouse's own users get in by subject or group)
        return Principal(subject=subject, issuer=issuer, display_name=name, groups=groups,
                         kind="jwt", claims=_kept(claims, self._kept_claims),
                         actor=_actor(claims.get("act")))

    def _machine(self, claims: Mapping[str, Any]) -> Principal:
        """A machine client as it is registered now: one no longer registered is refused,
        and the roles it holds are today's, not its token's."""
        assert self._tollhouse is not None
        client_id = str(claims.get("client_id", ""))
        now = self._tollhouse.machine_now(client_id)
        if now is None or claims["sub"] != f"client:{client_id}":
            raise Failed("the token's client is no longer registered")
        return Principal(subject=str(claims["sub"]), issuer=CLIENT_ISSUER, display_name=now[0],
                         groups=now[1], kind="jwt", claims=_kept(claims, self._kept_claims))

    async def _verify(self, token: str, endpoint: str
                      ) -> tuple[Principal, frozenset[str], float]:
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            raise Failed("malformed token") from None
        issuer = self._issuers.get(str(unverified.get("iss", "")))
        if issuer is None:
            raise Failed("untrusted issuer")
        cfg = issuer.cfg
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in cfg.algorithms:
            raise Failed(f"algorithm {str(alg)[:16]!r} not allowed for this issuer")
        key: Any = issuer.static_key
        if issuer.jwks is not None:
            kid = header.get("kid")
            if not isinstance(kid, str) or kty_for(alg) is None:
                raise Failed("token names no usable key id")
            key = await issuer.jwks.key(kid, alg)
            if key is None:
                raise Failed("unknown key id")
        audience = cfg.audience or f"{self._public_url}/mcp/{endpoint}"
        try:
            claims = jwt.decode(token, key, algorithms=[alg], audience=audience,
                                issuer=cfg.issuer, leeway=cfg.leeway_s,
                                options={"require": ["exp", "iss", "aud"]})
        except jwt.ExpiredSignatureError:
            raise _expired("token expired") from None
        except jwt.ImmatureSignatureError:
            raise _expired("token not yet valid") from None
        except jwt.InvalidAudienceError:
            raise Failed("wrong audience", guess=False,
                         description="the token was issued for another audience") from None
        except jwt.PyJWTError as exc:
            raise Failed(f"invalid token ({type(exc).__name__})") from None
        subject = claims.get(cfg.subject_claim)
        if not isinstance(subject, str) or not subject:
            raise Failed("token has no subject")
        principal = Principal(
            subject=subject, issuer=cfg.issuer, display_name=str(claims.get(cfg.name_claim, "")),
            groups=_names(claim_at(claims, cfg.groups_claim)),
            scopes=_names(claims.get(cfg.scopes_claim)), kind="jwt",
            claims=_kept(claims, self._kept_claims))
        named = [v for v in (claims.get(c) for c in LINK_CLAIMS) if isinstance(v, str)]
        keys = frozenset({subject_key(cfg.issuer, subject), *link_keys(named)})
        return principal, keys, float(claims["exp"]) + cfg.leeway_s


class TokenVerifier(Protocol):
    async def verify_access(self, token: str, resource: str) -> dict[str, Any]: ...

    def machine_now(self, client_id: str) -> tuple[str, frozenset[str]] | None:
        """A registered machine client's name and roles now; None when not registered."""


_UNREAD = object()


def _quotable(text: str) -> str:
    return "".join(c for c in text if " " <= c <= "~" and c not in '"\\')[:300]


def _elsewhere(token: str, resource: str) -> str:
    """What a client is told about a token of this gateway's used at another of its
    endpoints: one token is for one resource (RFC 8707); the signature was verified."""
    try:
        audience = jwt.decode(token, options={"verify_signature": False}).get("aud")
    except jwt.PyJWTError:
        audience = None
    held = audience if isinstance(audience, str) else "another resource"
    return (f"this token is for {held}, not {resource}: one token is for one endpoint; "
            "authorize this one separately")


def _audiences(token: str) -> list[str]:
    """The unverified `aud` of a token (verified after, against the endpoint it names)."""
    try:
        aud = jwt.decode(token, options={"verify_signature": False}).get("aud")
    except jwt.PyJWTError:
        return []
    values = aud if isinstance(aud, list) else [aud]
    return [a for a in values if isinstance(a, str)]


def _actor(act: object) -> str:
    """Who acts for the subject (RFC 8693 `act`, the nearest actor): its `sub`."""
    if isinstance(act, Mapping) and isinstance(act.get("sub"), str):
        return str(act["sub"])[:200]
    return ""


def _issuer_of(token: str) -> str | None:
    try:
        iss = jwt.decode(token, options={"verify_signature": False}).get("iss")
    except jwt.PyJWTError:
        return None
    return iss if isinstance(iss, str) else None


def _static_key(iss: IssuerConfig, base_dir: Path) -> Any:
    if iss.hs256_secret:
        return iss.hs256_secret
    if iss.public_key_pem:
        pem = iss.public_key_pem
        if "-----BEGIN" not in pem:
            pem = (base_dir / pem).read_text(encoding="utf-8")
        return load_pem_public_key(pem.encode())  # parsed once, not on every verification
    return None


def _claims_of(cfg: Config) -> tuple[str, ...]:
    """The claims per-caller upstream URLs are filled from (proxy.config.template), and
    those Cedar policies read (`[policy] claims`, and the OAuth client's id)."""
    policy = (*cfg.policy.claims, "client_id", "azp") if cfg.policy.files else ()
    return tuple(sorted({p.claim or name for u in cfg.upstreams
                         for name, p in u.placeholders.items()} | set(policy)))


def _kept(claims: Mapping[str, Any], names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The named claims that are a string or an integer, as text; any other is absent."""
    out = []
    for name in names:
        value = claims.get(name)
        if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
            out.append((name, str(value)))
    return tuple(out)


def _names(value: object) -> frozenset[str]:
    """A claim holding names: a list, or one space- or comma-separated string (OAuth scope)."""
    if isinstance(value, str):
        return frozenset(v for v in value.replace(",", " ").split() if v)
    if isinstance(value, Iterable) and not isinstance(value, (bytes, Mapping)):
        return frozenset(str(v) for v in value if isinstance(v, (str, int)))
    return frozenset()


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token
