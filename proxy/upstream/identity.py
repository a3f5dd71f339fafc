"""The caller's identity for upstreams that opt in (`identity = "headers"` or `"jwt"`).

The client's own credential never travels upstream. An upstream that wants to know who is
calling gets either plain headers (`X-Tollhouse-Subject`, `X-Tollhouse-Groups`,
`X-Tollhouse-Issuer`) or `X-Tollhouse-Identity`: a JWT signed by the gateway (ES256), valid for
`TTL_S`, with the upstream's audience; the gateway's public keys are served at
`/.well-known/jwks.json`. Signed tokens are reused until shortly before they expire.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jwt
from cachetools import TTLCache
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from proxy.auth.principal import Principal
from proxy.config import Config
from proxy.upstream.client import UpstreamRoute

log = logging.getLogger("tollhouse.identity")

TTL_S = 300
_SAFE = "@:._-+/=|~!$&'()*,;"


def _header_value(value: str) -> str:
    """Claims are caller-controlled text: percent-encode anything that is not plain ASCII."""
    return quote(value, safe=_SAFE)[:1024]


class IdentityForwarder:
    """The identity headers of a call. How (the mode and the token's audience) is the route's,
    read from the call's own `UpstreamRoute`, so a reload changes it for the next call; the
    signing key is loaded once, when the first upstream with identity = "jwt" appears."""

    def __init__(self, cfg: Config, base_dir: Path | None = None) -> None:
        self._issuer = cfg.server.public_url.rstrip("/")
        self._base_dir = base_dir or Path.cwd()
        self._key: Any = None
        self._kid = ""
        self.prepare(cfg)
        self._signed: TTLCache[tuple[str, str, str], list[tuple[str, str]]] = TTLCache(
            maxsize=50_000, ttl=TTL_S - 60)

    def prepare(self, cfg: Config) -> None:
        """Load the signing key if an upstream of `cfg` needs it and it is not loaded yet
        (a key that cannot be read raises, and a reload then changes nothing)."""
        if self._key is None and any(u.identity == "jwt" for u in cfg.upstreams):
            self._key, self._kid = _signing_key(cfg, self._base_dir)

    def headers(self, route: UpstreamRoute, principal: Principal) -> list[tuple[str, str]] | None:
        mode = route.identity
        if mode == "none" or not principal.authenticated:
            return None
        if mode == "headers":
            return [("x-tollhouse-subject", _header_value(principal.subject)),
                    ("x-tollhouse-issuer", _header_value(principal.issuer)),
                    ("x-tollhouse-groups", _header_value(",".join(sorted(principal.groups))))]
        cache_key = (principal.key, route.name, route.identity_audience)
        cached = self._signed.get(cache_key)
        if cached is None:
            now = int(time.time())
            token = jwt.encode(
                {"iss": self._issuer, "aud": route.identity_audience,
                 "sub": principal.subject, "groups": sorted(principal.groups),
                 "src_iss": principal.issuer, "iat": now, "exp": now + TTL_S},
                self._key, algorithm="ES256", headers={"kid": self._kid})
            cached = [("x-tollhouse-identity", token)]
            self._signed[cache_key] = cached
        return cached

    def jwks(self) -> dict[str, Any]:
        if self._key is None:
            return {"keys": []}
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self._key.public_key()))
        return {"keys": [{**jwk, "kid": self._kid, "alg": "ES256", "use": "sig"}]}


def _signing_key(cfg: Config, base_dir: Path) -> tuple[Any, str]:
    path = cfg.auth.signing_key_pem
    if path:
        pem = path if "-----BEGIN" in path else (base_dir / path).read_text(encoding="utf-8")
        key = load_pem_private_key(pem.encode(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("auth.signing_key_pem must be an EC P-256 private key")
    else:
        log.warning("no auth.signing_key_pem: identity tokens are signed with a key generated "
                    "at start-up, so upstreams must refetch /.well-known/jwks.json after restarts")
        key = ec.generate_private_key(ec.SECP256R1())
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
    kid = jwt.utils.base64url_encode(
        hashlib.sha256((jwk["x"] + jwk["y"]).encode()).digest()[:12]).decode()
    return key, kid
