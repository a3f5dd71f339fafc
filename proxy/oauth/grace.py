"""A rotation's answer as the rotation store keeps it for the grace period
(`oauth_server.refresh_grace_s`): sealed with AES-GCM under a key derived from the old refresh
token, so the store (Redis, say) holds nothing a reader could use, and only a caller presenting
that same token can open it. The store's key is the token's SHA-256, as the database's is.

Why a grace period: a client whose calls are in flight when its access token expires gets a
401 on each, and the official TypeScript SDK refreshes once per 401, so the same refresh token
arrives two or three times within a second. Without a grace the second is a reuse and revokes
the whole grant. Within it, the same client gets the same new tokens; after it, a reuse still
revokes the family (RFC 9700 section 4.14.2 allows this; large identity providers do the same).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

_CONTEXT = b"tollhouse refresh grace v1"


def store_key(refresh_token: str) -> str:
    return hashlib.sha256(refresh_token.encode()).hexdigest()


def _cipher(refresh_token: str) -> AESGCM:
    return AESGCM(hmac.new(refresh_token.encode(), _CONTEXT, hashlib.sha256).digest())


def seal(refresh_token: str, client_id: str, tokens: dict[str, Any], expires_at: float) -> bytes:
    nonce = os.urandom(12)
    body = orjson.dumps({"client_id": client_id, "tokens": tokens, "expires_at": expires_at})
    return nonce + _cipher(refresh_token).encrypt(nonce, body, _CONTEXT)


def opened(refresh_token: str, client_id: str, sealed: bytes,
           now: float) -> dict[str, Any] | None:
    """The tokens sealed for `client_id`, with `expires_in` as it stands at `now`; None when
    they were rotated for another client (a copy of the token elsewhere: a reuse)."""
    try:
        body = orjson.loads(_cipher(refresh_token).decrypt(sealed[:12], sealed[12:], _CONTEXT))
    except (InvalidTag, ValueError):
        return None
    if body.get("client_id") != client_id:
        return None
    tokens: dict[str, Any] = body["tokens"]
    return {**tokens, "expires_in": max(0, int(body["expires_at"] - now))}
