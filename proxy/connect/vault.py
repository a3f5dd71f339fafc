"""The token vault: each person's upstream tokens, and the gateway's own client at each
authorization server it registered with (RFC 7591), sealed with AES-GCM.

The key comes from the environment (`TOLLHOUSE_VAULT_KEYS="k2=<base64>,k1=<base64>"`: the first
seals, all unseal, so a key can be rotated without losing connections; or, failing that, a key
derived from `TOLLHOUSE_SECRET_KEY`). The upstream and the person are bound in as associated
data: a row copied to another person does not decrypt. A row sealed under an older key is
resealed under the current one when it is next written.

A registered client is one row per (upstream, issuer, registration endpoint, redirect URI),
written once: the first process to store its registration wins, and every other one adopts
that row (`keep_client`). Only the client secret is sealed, with the whole key and the
client id bound in as associated data.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import astuple, dataclass, field
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from proxy.config import ConfigError
from proxy.storage import db

_PUT_COLUMNS = ("upstream", "principal", "kid", "sealed", "status", "expires_at", "updated_at")
_CLIENT_COLUMNS = ("upstream", "issuer", "registration_endpoint", "redirect_uri", "client_id",
                   "kid", "sealed", "created_at")


_HOW = ("set TOLLHOUSE_VAULT_KEYS to kid=<32 random bytes in base64>, newest first, comma "
        "separated (make one with `openssl rand -base64 32`)")


class VaultKeyMissing(ConfigError):
    """A start-up refusal like any config error: one line, exit 2 (proxy.runtime.cli)."""


def keys_from_env(env: Mapping[str, str] | None = None) -> dict[str, bytes]:
    """{kid: 32-byte key}, the sealing key first."""
    env = os.environ if env is None else env
    spec = env.get("TOLLHOUSE_VAULT_KEYS", "")
    keys: dict[str, bytes] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        kid, _, value = item.partition("=")
        try:
            key = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise VaultKeyMissing(f"config: TOLLHOUSE_VAULT_KEYS: key {kid!r} is not base64: "
                                  f"{_HOW}") from None
        if not kid:
            raise VaultKeyMissing(f"config: TOLLHOUSE_VAULT_KEYS: a key has no id: {_HOW}")
        if len(key) != 32:
            raise VaultKeyMissing(f"config: TOLLHOUSE_VAULT_KEYS: key {kid!r} is {len(key)} "
                                  f"bytes, not 32: {_HOW}")
        keys[kid] = key
    if not keys and env.get("TOLLHOUSE_SECRET_KEY"):
        keys["s1"] = hashlib.sha256(b"tollhouse-vault|" + env["TOLLHOUSE_SECRET_KEY"].encode()
                                    ).digest()
    if not keys:
        raise VaultKeyMissing("config: a per_user upstream needs TOLLHOUSE_VAULT_KEYS or "
                              f"TOLLHOUSE_SECRET_KEY in the environment: {_HOW}, or set "
                              "TOLLHOUSE_SECRET_KEY to a long random string")
    return keys


@dataclass(frozen=True)
class ClientKey:
    """Which registration: a changed authorization server, registration endpoint or redirect
    URI (the gateway's public URL) is another row, so the gateway registers afresh."""

    upstream: str
    issuer: str
    registration_endpoint: str
    redirect_uri: str

    def ad(self, client_id: str) -> bytes:
        return "\n".join(("client", *astuple(self), client_id)).encode()


@dataclass(frozen=True)
class RegisteredClient:
    client_id: str
    client_secret: str = field(repr=False)  # "" for a public client; never logged


_CLIENT_WHERE = ("upstream = ? AND issuer = ? AND registration_endpoint = ? AND "
                 "redirect_uri = ?")


@dataclass(frozen=True)
class Connection:
    status: str  # connected | needs_reconnect
    tokens: dict[str, Any]  # access_token, refresh_token, ... (never logged)
    expires_at: float | None


class Vault:
    """Blocking database work: the gateway calls it from one database thread. `target` is the
    app's Database, a database URL, or a SQLite path."""

    def __init__(self, target: db.Target, keys: dict[str, bytes]) -> None:
        self._db = db.resolve(target)
        self._owns_db = self._db is not target
        self._db.ensure_schema()
        self._sql = self._db.sql
        self._put = self._db.upsert("upstream_tokens", _PUT_COLUMNS, ("upstream", "principal"))
        self._keep = self._db.insert_ignore("upstream_clients", _CLIENT_COLUMNS)
        self._current = next(iter(keys))
        self._aead = {kid: AESGCM(key) for kid, key in keys.items()}

    def close(self) -> None:
        """Close the connections of a Database made here (the app closes its own)."""
        if self._owns_db:
            self._db.close()

    @staticmethod
    def _ad(upstream: str, principal: str) -> bytes:
        return f"{upstream}\n{principal}".encode()

    def _seal(self, upstream: str, principal: str, tokens: dict[str, Any]) -> str:
        return self._seal_bytes(orjson.dumps(tokens), self._ad(upstream, principal))

    def _seal_bytes(self, plain: bytes, ad: bytes) -> str:
        nonce = secrets.token_bytes(12)
        sealed = nonce + self._aead[self._current].encrypt(nonce, plain, ad)
        return base64.b64encode(sealed).decode()

    def _unseal(self, kid: str, sealed: str, ad: bytes) -> bytes | None:
        """None: sealed under a retired key, or not for this `ad` (a row copied elsewhere)."""
        aead = self._aead.get(kid)
        if aead is None:
            return None
        raw = base64.b64decode(sealed)
        try:
            return aead.decrypt(raw[:12], raw[12:], ad)
        except InvalidTag:
            return None

    def put(self, upstream: str, principal: str, tokens: dict[str, Any],
            status: str = "connected") -> None:
        expires = tokens.get("expires_at")
        with self._db.transaction() as conn:
            conn.execute(self._put, (upstream, principal, self._current,
                                     self._seal(upstream, principal, tokens), status,
                                     expires if isinstance(expires, (int, float)) else None,
                                     time.time()))

    def replace(self, upstream: str, principal: str, tokens: dict[str, Any],
                status: str = "connected") -> bool:
        """Rewrite an existing row; False, and nothing written, when there is none: a row
        deleted meanwhile (a disconnect, the person deleted) is not brought back by a refresh
        or a reseal that read it before."""
        expires = tokens.get("expires_at")
        with self._db.transaction() as conn:
            changed = conn.execute(self._sql(
                "UPDATE upstream_tokens SET kid = ?, sealed = ?, status = ?, expires_at = ?, "
                "updated_at = ? WHERE upstream = ? AND principal = ?"),
                (self._current, self._seal(upstream, principal, tokens), status,
                 expires if isinstance(expires, (int, float)) else None, time.time(),
                 upstream, principal)).rowcount
        return bool(changed == 1)

    def get(self, upstream: str, principal: str) -> Connection | None:
        with self._db.transaction() as conn:
            row = conn.execute(self._sql("SELECT kid, sealed, status, expires_at FROM "
                                         "upstream_tokens WHERE upstream = ? AND principal = ?"),
                               (upstream, principal)).fetchone()
        if row is None:
            return None
        kid, sealed, status, expires = row
        plain = self._unseal(kid, sealed, self._ad(upstream, principal))
        if plain is None:  # sealed under a retired key, or not this person's row
            return Connection("needs_reconnect", {}, None)
        tokens = orjson.loads(plain)
        if kid != self._current and status == "connected":
            self.replace(upstream, principal, tokens, status)  # reseal under the current key
        return Connection(status, tokens, expires)

    def mark(self, upstream: str, principal: str, status: str) -> None:
        with self._db.transaction() as conn:
            conn.execute(self._sql("UPDATE upstream_tokens SET status = ?, updated_at = ? WHERE "
                                   "upstream = ? AND principal = ?"),
                         (status, time.time(), upstream, principal))

    def delete(self, upstream: str, principal: str) -> None:
        with self._db.transaction() as conn:
            conn.execute(self._sql("DELETE FROM upstream_tokens WHERE upstream = ? AND "
                                   "principal = ?"), (upstream, principal))

    def statuses(self, principal: str) -> dict[str, str]:
        with self._db.transaction() as conn:
            rows = conn.execute(self._sql("SELECT upstream, status FROM upstream_tokens WHERE "
                                          "principal = ?"), (principal,)).fetchall()
        return {str(r[0]): str(r[1]) for r in rows}

    # -- the gateway's registered clients -----------------------------------------------------

    def client(self, key: ClientKey) -> RegisteredClient | None:
        """The stored registration, or None. A row this process cannot unseal (its key was
        retired) is deleted, so the next registration takes its place; one sealed under an
        older key is resealed under the current one."""
        with self._db.transaction() as conn:
            row = conn.execute(self._sql(f"SELECT client_id, kid, sealed FROM upstream_clients "
                                         f"WHERE {_CLIENT_WHERE}"), astuple(key)).fetchone()
            if row is None:
                return None
            client_id, kid, sealed = row
            plain = self._unseal(kid, sealed, key.ad(client_id))
            if plain is None:
                conn.execute(self._sql(f"DELETE FROM upstream_clients WHERE {_CLIENT_WHERE} "
                                       "AND client_id = ? AND kid = ?"),
                             (*astuple(key), client_id, kid))
                return None
            if kid != self._current:
                conn.execute(self._sql(f"UPDATE upstream_clients SET kid = ?, sealed = ? WHERE "
                                       f"{_CLIENT_WHERE} AND client_id = ? AND kid = ?"),
                             (self._current, self._seal_bytes(plain, key.ad(client_id)),
                              *astuple(key), client_id, kid))
        return RegisteredClient(str(client_id), plain.decode())

    def keep_client(self, key: ClientKey, client: RegisteredClient) -> RegisteredClient:
        """Store `client` unless a registration for `key` is there already; the stored one
        either way (another process's, when it stored first: adopt it)."""
        sealed = self._seal_bytes(client.client_secret.encode(), key.ad(client.client_id))
        for _ in range(2):  # a second time if the row there was unreadable, and so deleted
            with self._db.transaction() as conn:
                conn.execute(self._keep, (*astuple(key), client.client_id, self._current,
                                          sealed, time.time()))
            stored = self.client(key)
            if stored is not None:
                return stored
        raise RuntimeError("a client registration stored here could not be read back")
