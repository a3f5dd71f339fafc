"""The access-token signing keys: ES256, rotated, stored encrypted at rest, shared by every
gateway process on the database.

Private keys are sealed with AES-GCM under a key derived from `TOLLHOUSE_SECRET_KEY` (never
printed); the key id is bound in as associated data. Every key young enough to have signed a
live token is published at the JWKS URL.

Several processes (replicas) share the `oauth_keys` table, each with its own copy of the keys:
- a token whose `kid` this process does not know makes it read the table again (at most once
  every `reread_min_s`, so made-up kids cannot hammer the database), so a token signed with a
  key another replica minted a moment ago verifies here at once;
- every process reads the table again at least every `refresh_s` (KEY_REFRESH_S, or
  `rotation_s` if shorter), so its JWKS lists a key minted elsewhere within that time;
- a rotation that falls due reads the table first, and adopts a key another replica minted
  instead of minting another (two replicas minting at the same instant is harmless: both keys
  are published, and each verifies).
A new key is published before it signs: the key that signs is the newest one at least
`publish_lead_s` old (KEY_REFRESH_S plus the JWKS response's max-age, or half `rotation_s` if
shorter), so a resource server that caches this gateway's JWKS, and every replica, has it
before the first token signed with it arrives. A fresh database's first key signs at once.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from proxy.config import ConfigError
from proxy.singleflight import SingleFlight
from proxy.storage import db

log = logging.getLogger("tollhouse.oauth")

NO_SECRET = ("config: oauth_server.enabled needs TOLLHOUSE_SECRET_KEY in the environment: set it "
             "to a long random string that stays the same across restarts (make one once, e.g. "
             "with `openssl rand -base64 32`)")
WRONG_SECRET = ("config: TOLLHOUSE_SECRET_KEY does not open the signing keys stored in the "
                "database: set it to the value they were sealed with")

KEY_REFRESH_S = 60.0  # every process reads the key table again at least this often
REREAD_MIN_S = 1.0  # a kid this process does not know reads it again at most this often
JWKS_MAX_AGE_S = 300.0  # the Cache-Control max-age the JWKS is served with (proxy.oauth.routes)


class SecretKeyMissing(ConfigError):
    """A start-up refusal like any config error: one line, exit 2 (proxy.runtime.cli)."""


@dataclass(frozen=True)
class SigningKey:
    kid: str
    private: ec.EllipticCurvePrivateKey
    created_at: float

    def jwk(self) -> dict[str, Any]:
        public = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.private.public_key()))
        return {**public, "kid": self.kid, "alg": "ES256", "use": "sig"}


class KeyRing:
    """`clock` (monotonic) paces the rereads; the `now` given to `rotate_if_due` is the wall
    time keys are dated by. Safe to use from the event loop and worker threads at once."""

    def __init__(self, target: db.Target, secret: str, rotation_s: float,
                 token_ttl_s: float, *, refresh_s: float | None = None,
                 reread_min_s: float = REREAD_MIN_S, publish_lead_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not secret:
            raise SecretKeyMissing(NO_SECRET)
        self._aead = AESGCM(hashlib.sha256(b"tollhouse-keys|" + secret.encode()).digest())
        self._db = db.resolve(target)
        self._db.ensure_schema()
        self._rotation_s = rotation_s
        self._token_ttl_s = token_ttl_s
        self._refresh_s = min(KEY_REFRESH_S, rotation_s) if refresh_s is None else refresh_s
        self._reread_min_s = reread_min_s
        # below half the rotation period, so the key before is never deleted while it signs
        self._lead_s = (min(KEY_REFRESH_S + JWKS_MAX_AGE_S, rotation_s / 2)
                        if publish_lead_s is None else publish_lead_s)
        self._clock = clock
        # one reread or rotation at a time; `_keys` is only ever replaced whole, so a reader
        # without the lock sees one list or the other
        self._lock = threading.Lock()
        self._unopened: set[str] = set()  # kids sealed under another secret (logged once)
        self._rereads: SingleFlight[str, None] = SingleFlight(detached=True)
        self.reads = 0  # how often the table was read (tests count the rereads)
        self._keys = self._read(strict=True)
        self._loaded_at = self._reread_at = clock()
        self._signing: SigningKey | None = None
        self.rotate_if_due()

    # -- reading the table -----------------------------------------------------------------

    def _read(self, strict: bool = False) -> list[SigningKey]:
        """Every stored key, oldest first. At start (`strict`) a key the secret does not open
        refuses the start; later it is left out (a replica sealing with another secret must
        not break this one's verification) and logged once, by kid."""
        known = {k.kid: k for k in getattr(self, "_keys", ())}
        with self._db.transaction() as conn:
            rows = conn.execute(self._db.sql("SELECT kid, sealed, created_at FROM oauth_keys "
                                             "ORDER BY created_at"), ()).fetchall()
        self.reads += 1
        keys = []
        for kid, sealed, created in rows:
            if kid in known:  # unsealed already
                keys.append(SigningKey(kid, known[kid].private, float(created)))
                continue
            raw = base64.b64decode(sealed)
            try:
                pem = self._aead.decrypt(raw[:12], raw[12:], kid.encode())
            except InvalidTag:
                if strict:
                    raise SecretKeyMissing(WRONG_SECRET) from None
                if kid not in self._unopened:
                    self._unopened.add(kid)
                    log.warning("signing key %s in the database does not open with this "
                                "process's TOLLHOUSE_SECRET_KEY; it is not used here", kid)
                continue
            private = serialization.load_pem_private_key(pem, password=None)
            assert isinstance(private, ec.EllipticCurvePrivateKey)
            keys.append(SigningKey(kid, private, float(created)))
        return keys

    def _reread_locked(self) -> None:
        keys = self._read()
        if keys:  # an emptied table leaves this process signing with what it has
            self._keys = keys
        self._loaded_at = self._reread_at = self._clock()

    def _refresh_if_stale(self) -> None:
        if self._clock() - self._loaded_at >= self._refresh_s:
            with self._lock:
                if self._clock() - self._loaded_at >= self._refresh_s:
                    self._reread_locked()

    def _reread_for_unknown(self, kid: str) -> None:
        """Read the table again for `kid`, unless it came in meanwhile or a reread happened
        within `reread_min_s`."""
        with self._lock:
            if self._find(kid) is None and \
                    self._clock() - self._reread_at >= self._reread_min_s:
                self._reread_locked()

    def _find(self, kid: str) -> SigningKey | None:
        for key in self._keys:
            if key.kid == kid:
                return key
        return None

    # -- rotation --------------------------------------------------------------------------

    def rotate_if_due(self, now: float | None = None) -> None:
        """Mint a key if the newest stored one is `rotation_s` old, unless another replica
        just did; then choose the key that signs at `now`. Touches the database: call it in
        a worker thread (the token endpoint does)."""
        now = time.time() if now is None else now
        self._refresh_if_stale()
        if self._keys and now - self._keys[-1].created_at < self._rotation_s:
            self._signing = self._choose(now)
            return
        with self._lock:
            self._reread_locked()  # another replica may have rotated already: adopt its key
            if not self._keys or now - self._keys[-1].created_at >= self._rotation_s:
                self._mint(now)
            self._signing = self._choose(now)

    def _mint(self, now: float) -> None:
        private = ec.generate_private_key(ec.SECP256R1())
        kid = secrets.token_urlsafe(9)
        pem = private.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        nonce = secrets.token_bytes(12)
        sealed = base64.b64encode(nonce + self._aead.encrypt(nonce, pem, kid.encode()))
        # keys too old to have signed any live token are of no use to anyone; the key that
        # signs until the new one is published stays whatever its age (a long idle spell)
        cutoff = now - 2 * self._rotation_s - self._token_ttl_s
        keep = self._choose(now).kid if self._keys else kid
        with self._db.transaction() as conn:
            # only if no replica minted one since this process read the table (one statement,
            # so on SQLite two replicas cannot both pass; on PostgreSQL they rarely do, and two
            # keys are harmless)
            added = conn.execute(self._db.sql(
                "INSERT INTO oauth_keys (kid, sealed, created_at) SELECT ?, ?, ? WHERE NOT "
                "EXISTS (SELECT 1 FROM oauth_keys WHERE created_at > ?)"),
                (kid, sealed.decode(), now, now - self._rotation_s)).rowcount == 1
            conn.execute(self._db.sql("DELETE FROM oauth_keys WHERE created_at < ? "
                                      "AND kid <> ?"), (cutoff, keep))
        if added:
            self._keys = [k for k in self._keys if k.created_at >= cutoff or k.kid == keep]
            self._keys.append(SigningKey(kid, private, now))
        else:
            self._reread_locked()

    def _choose(self, now: float) -> SigningKey:
        """The newest key published for `publish_lead_s`, else the oldest there is (a fresh
        database's only key, which no one can have cached yet)."""
        for key in reversed(self._keys):
            if now - key.created_at >= self._lead_s:
                return key
        return self._keys[0]

    @property
    def current(self) -> SigningKey:
        """The key that signs, as `rotate_if_due` last chose it."""
        if self._signing is None:  # pragma: no cover - the constructor chose one
            self._signing = self._choose(time.time())
        return self._signing

    # -- verifying and publishing ----------------------------------------------------------

    def public(self, kid: str) -> Any:
        """The public key `kid` names, or None. A kid not known here reads the table again
        first, in this thread (rate-limited): the synchronous fallback; on the event loop,
        `await public_key(kid)` does that read in a worker thread instead."""
        key = self._find(kid)
        if key is None:
            self._reread_for_unknown(kid)
            key = self._find(kid)
        return None if key is None else key.private.public_key()

    async def public_key(self, kid: str) -> Any:
        """`public(kid)` for the event loop: a reread runs in a worker thread, and the callers
        that want one meanwhile share it."""
        key = self._find(kid)
        if key is None:
            if self._clock() - self._reread_at < self._reread_min_s:
                return None  # read less than reread_min_s ago: it was not there
            await self._rereads.run("keys", lambda: asyncio.to_thread(
                self._reread_for_unknown, kid))
            key = self._find(kid)
        return None if key is None else key.private.public_key()

    def jwks(self) -> dict[str, Any]:
        """Every key, published or about to sign; read again first if `refresh_s` old (in
        this thread: `await published()` on the event loop)."""
        self._refresh_if_stale()
        return {"keys": [k.jwk() for k in self._keys]}

    async def published(self) -> dict[str, Any]:
        """`jwks()` for the event loop: a stale table is read in a worker thread."""
        if self._clock() - self._loaded_at >= self._refresh_s:
            await self._rereads.run("keys", lambda: asyncio.to_thread(self._refresh_if_stale))
        return {"keys": [k.jwk() for k in self._keys]}
