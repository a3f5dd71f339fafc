"""An issuer's JSON Web Key Set, fetched through the gateway's shared AsyncClient (never
pyjwt's blocking urllib client), cached, and refetched on an unknown `kid` at most once per
`min_refetch_s`. Keys already fetched keep working while the JWKS URL is unreachable."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx
import jwt

log = logging.getLogger("tollhouse.auth")

# Which JWK key type each algorithm family needs: an HS256 token never meets an RSA key.
KTY_FOR_ALG = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}


def kty_for(alg: str) -> str | None:
    return KTY_FOR_ALG.get(alg[:2])


class JwksCache:
    def __init__(self, url: str, http: httpx.AsyncClient, *, refresh_s: float,
                 min_refetch_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self._http = http
        self._refresh_s = refresh_s
        self._min_refetch_s = min_refetch_s
        self._clock = clock
        self._jwks: dict[str, dict[str, Any]] = {}
        self._keys: dict[tuple[str, str], jwt.PyJWK] = {}
        self._fetched_at: float | None = None
        self._attempted_at: float | None = None
        self._inflight: asyncio.Future[None] | None = None

    async def key(self, kid: str, alg: str) -> jwt.PyJWK | None:
        """The verification key for (kid, alg), or None when there is none that fits."""
        now = self._clock()
        stale = self._fetched_at is None or now - self._fetched_at >= self._refresh_s
        if (kid not in self._jwks or stale) and self._may_fetch(now):
            await self._fetch()
        jwk = self._jwks.get(kid)
        if jwk is None:
            return None
        cached = self._keys.get((kid, alg))
        if cached is not None:
            return cached
        if jwk.get("kty") != kty_for(alg) or jwk.get("alg", alg) != alg:
            return None
        if jwk.get("use", "sig") != "sig":
            return None
        try:
            key = jwt.PyJWK(jwk, algorithm=alg)
        except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, KeyError):
            return None
        self._keys[(kid, alg)] = key
        return key

    def _may_fetch(self, now: float) -> bool:
        return self._attempted_at is None or now - self._attempted_at >= self._min_refetch_s

    async def _fetch(self) -> None:
        """One fetch at a time; concurrent callers wait for the one in flight."""
        if self._inflight is not None:
            await asyncio.shield(self._inflight)
            return
        self._attempted_at = self._clock()
        self._inflight = asyncio.get_running_loop().create_future()
        try:
            response = await self._http.get(self.url, timeout=5.0)
            response.raise_for_status()
            keys = response.json().get("keys")
            if not isinstance(keys, list):
                raise ValueError("no 'keys' array")  # noqa: TRY004 - a bad document, caught as one
            fresh = {k["kid"]: k for k in keys if isinstance(k, dict)
                     and isinstance(k.get("kid"), str)}
            old, self._jwks = self._jwks, fresh
            self._keys = {ka: v for ka, v in self._keys.items()
                          if ka[0] in fresh and fresh[ka[0]] == old.get(ka[0])}
            self._fetched_at = self._attempted_at
        except (httpx.HTTPError, ValueError, AttributeError, KeyError) as exc:
            log.warning("JWKS %s unreachable or invalid (%s); keeping %d cached keys",
                        self.url, type(exc).__name__, len(self._jwks))
        finally:
            self._inflight.set_result(None)
            self._inflight = None
