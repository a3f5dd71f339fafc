"""The access-token signing keys: ES256, rotated, stored encrypted at rest.

Private keys are sealed with AES-GCM under a key derived from `TOLLHOUSE_SECRET_KEY` (never
printed); the key id is bound in as associated data. The newest key signs; every key young
enough to have signed a live token is published at the JWKS URL.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from proxy import db
from proxy.config import ConfigError

NO_SECRET = ("config: oauth_server.enabled needs TOLLHOUSE_SECRET_KEY in the environment: set it "
             "to a long random string that stays the same across restarts (make one once, e.g. "
             "with `openssl rand -base64 32`)")
WRONG_SECRET = ("config: TOLLHOUSE_SECRET_KEY does not open the signing keys stored in the "
                "database: set it to the value they were sealed with")


class SecretKeyMissing(ConfigError):
    """A start-up refusal like any config error: one line, exit 2 (proxy.cli)."""


@dataclass(frozen=True)
class SigningKey:
    kid: str
    private: ec.EllipticCurvePrivateKey
    created_at: float

    def jwk(self) -> dict[str, Any]:
        public = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.private.public_key()))
        return {**public, "kid": self.kid, "alg": "ES256", "use": "sig"}


class KeyRing:
    def __init__(self, target: db.Target, secret: str, rotation_s: float,
                 token_ttl_s: float) -> None:
        if not secret:
            raise SecretKeyMissing(NO_SECRET)
        self._aead = AESGCM(hashlib.sha256(b"tollhouse-keys|" + secret.encode()).digest())
        self._db = db.resolve(target)
        self._db.ensure_schema()
        self._rotation_s = rotation_s
        self._token_ttl_s = token_ttl_s
        self._keys = self._load()
        self.rotate_if_due()

    def _load(self) -> list[SigningKey]:
        keys = []
        with self._db.transaction() as conn:
            rows = conn.execute(self._db.sql("SELECT kid, sealed, created_at FROM oauth_keys "
                                             "ORDER BY created_at"), ()).fetchall()
        for kid, sealed, created in rows:
            raw = base64.b64decode(sealed)
            try:
                pem = self._aead.decrypt(raw[:12], raw[12:], kid.encode())
            except InvalidTag:
                raise SecretKeyMissing(WRONG_SECRET) from None
            private = serialization.load_pem_private_key(pem, password=None)
            assert isinstance(private, ec.EllipticCurvePrivateKey)
            keys.append(SigningKey(kid, private, created))
        return keys

    def rotate_if_due(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        if self._keys and now - self._keys[-1].created_at < self._rotation_s:
            return
        private = ec.generate_private_key(ec.SECP256R1())
        kid = secrets.token_urlsafe(9)
        pem = private.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        nonce = secrets.token_bytes(12)
        sealed = base64.b64encode(nonce + self._aead.encrypt(nonce, pem, kid.encode()))
        # keys too old to have signed any live token are of no use to anyone
        cutoff = now - 2 * self._rotation_s - self._token_ttl_s
        with self._db.transaction() as conn:
            conn.execute(self._db.sql("INSERT INTO oauth_keys (kid, sealed, created_at) "
                                      "VALUES (?, ?, ?)"), (kid, sealed.decode(), now))
            conn.execute(self._db.sql("DELETE FROM oauth_keys WHERE created_at < ?"), (cutoff,))
        self._keys = [k for k in self._keys if k.created_at >= cutoff]
        self._keys.append(SigningKey(kid, private, now))

    @property
    def current(self) -> SigningKey:
        return self._keys[-1]

    def public(self, kid: str) -> Any:
        for key in self._keys:
            if key.kid == kid:
                return key.private.public_key()
        return None

    def jwks(self) -> dict[str, Any]:
        return {"keys": [k.jwk() for k in self._keys]}
