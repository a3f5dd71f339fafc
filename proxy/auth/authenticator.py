from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jwt
from cachetools import TTLCache

from proxy.auth.principal import ANONYMOUS, Principal
from proxy.config import Config, IssuerConfig
from proxy.errors import Unauthenticated


class Authenticator(Protocol):
    async def authenticate(self, authorization: str | None, endpoint: str) -> Principal: ...


class NoAuth:
    """`auth.mode = "none"`: every caller is one anonymous principal (loopback only)."""

    async def authenticate(self, authorization: str | None, endpoint: str) -> Principal:
        return ANONYMOUS


@dataclass(frozen=True)
class _Issuer:
    cfg: IssuerConfig
    key: Any


class JwtAuth:
    """Bearer JWTs from the configured issuers, verified with pyjwt against static keys.

    Verified tokens are cached by their exact text until shortly before they expire, so a
    client that sends the same token on every call costs one signature check, not one per call.
    """

    def __init__(self, cfg: Config, base_dir: Path) -> None:
        self._issuers: dict[str, _Issuer] = {}
        for iss in cfg.auth.issuers:
            if iss.hs256_secret:
                key: Any = iss.hs256_secret
            else:
                pem = iss.public_key_pem
                if "-----BEGIN" not in pem:
                    pem = (base_dir / pem).read_text(encoding="utf-8")
                key = pem
            self._issuers[iss.issuer] = _Issuer(iss, key)
        self._public_url = cfg.server.public_url.rstrip("/")
        self._cache: TTLCache[tuple[str, str], tuple[Principal, float]] = TTLCache(
            maxsize=50_000, ttl=300)
        self._challenge = f'Bearer resource_metadata="{self._public_url}/.well-known/oauth-protected-resource"'

    async def authenticate(self, authorization: str | None, endpoint: str) -> Principal:
        token = _bearer(authorization)
        if token is None:
            raise Unauthenticated("Unauthorized: bearer token required", headers=self._www())
        cached = self._cache.get((token, endpoint))
        if cached is not None:
            principal, exp = cached
            if exp > time.time():
                return principal
        principal, exp = self._verify(token, endpoint)
        self._cache[(token, endpoint)] = (principal, exp)
        return principal

    def _verify(self, token: str, endpoint: str) -> tuple[Principal, float]:
        try:
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            raise Unauthenticated("Unauthorized: malformed token", headers=self._www()) from None
        issuer = self._issuers.get(str(unverified.get("iss", "")))
        if issuer is None:
            raise Unauthenticated("Unauthorized: untrusted issuer", headers=self._www())
        cfg = issuer.cfg
        audience = cfg.audience or f"{self._public_url}/mcp/{endpoint}"
        try:
            claims = jwt.decode(
                token, issuer.key, algorithms=cfg.algorithms, audience=audience,
                issuer=cfg.issuer, leeway=cfg.leeway_s,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("Unauthorized: token expired", headers=self._www()) from None
        except jwt.PyJWTError:
            raise Unauthenticated("Unauthorized: invalid token", headers=self._www()) from None
        subject = claims.get(cfg.subject_claim)
        if not isinstance(subject, str) or not subject:
            raise Unauthenticated("Unauthorized: token has no subject", headers=self._www())
        principal = Principal(subject=subject, issuer=cfg.issuer,
                              display_name=str(claims.get("name", "")))
        return principal, float(claims["exp"]) + cfg.leeway_s

    def _www(self) -> dict[str, str]:
        return {"WWW-Authenticate": self._challenge}


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def build_authenticator(cfg: Config, base_dir: Path) -> Authenticator:
    if cfg.auth.mode == "jwt":
        return JwtAuth(cfg, base_dir)
    return NoAuth()
