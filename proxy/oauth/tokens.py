"""The tokens the authorization server issues, on its database (`TokenLedger`): an access token
(a short-lived ES256 JWT whose audience is one endpoint's resource URL, RFC 8707) minted with
its refresh token, and the `oauth_refresh` table the refresh tokens live in, as SHA-256
hashes: stored, looked up when presented, rotated (marked used and followed by the new one in
one transaction) and revoked a family at a time. Every method is a database step that
`AuthorizationServer` (proxy.oauth.server) runs in a worker thread; the live-state side (the
revocation store, the grace period's rotations) is the server's.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jwt

from proxy.config import OAuthServerConfig
from proxy.errors import OAuthError
from proxy.oauth.keys import KeyRing
from proxy.people.accounts import User
from proxy.storage import db


@dataclass(frozen=True)
class Holder:
    """Whom an access token without a refresh token names: a person (their users row's id
    in `user_id`) or a machine client (`client:<id>` under proxy.auth.principal's
    CLIENT_ISSUER, no user)."""

    subject: str
    issuer: str
    name: str
    groups: frozenset[str]
    user_id: str | None = None


class Used(Exception):
    """Raised in the database thread: the refresh token was used already."""

    def __init__(self, family: str) -> None:
        super().__init__(family)
        self.family = family


class FamilyRevoked(Exception):
    """Raised in the database thread: the family's rows are revoked; the store must be told."""

    def __init__(self, family: str, error: OAuthError) -> None:
        super().__init__(family)
        self.family = family
        self.error = error


def elsewhere(granted: str, wanted: str) -> OAuthError:
    """A grant is for one resource (RFC 8707): the answer names both, so a person reading a
    client's error knows to authorize the other endpoint on its own."""
    return OAuthError("invalid_target", f"this grant is for {granted}, not {wanted[:200]}: one "
                      "token is for one endpoint; authorize the other one separately")


def hashed(value: str) -> str:
    """A secret as the database keeps it (a client secret, a refresh token): its SHA-256."""
    return hashlib.sha256(value.encode()).hexdigest()


class TokenLedger:
    """Mints tokens signed with `keys` under `issuer` and keeps their refresh rows."""

    def __init__(self, database: db.Database, keys: KeyRing, issuer: str,
                 cfg: OAuthServerConfig, clock: Callable[[], float] = time.time) -> None:
        self._db = database
        self._sql = database.sql
        self._keys = keys
        self._issuer = issuer
        self._cfg = cfg
        self._clock = clock

    def refreshed(self, client_id: str, form: dict[str, str],
                  user_lookup: Callable[[str], User | None]
                  ) -> tuple[str, dict[str, Any], tuple[Any, ...]]:
        """The family, the new tokens and their refresh row, not yet stored (`rotate` does,
        if this use is the first); raises `Used` for a token used already."""
        token = form.get("refresh_token", "")
        with self._db.transaction() as conn:
            row = conn.execute(self._sql(
                "SELECT family, client_id, user_id, resource, expires_at, used_at, "
                "revoked_at FROM oauth_refresh WHERE token_sha256 = ?"), (hashed(token),)
            ).fetchone()
        if row is None:
            raise OAuthError("invalid_grant", "unknown refresh token")
        # the row's scope column is not read: a grant made before no scope was granted may
        # hold one, and it must not reach a new access token
        family, owner, user_id, resource, expires_at, used_at, revoked_at = row
        if revoked_at is not None:
            raise OAuthError("invalid_grant", "the refresh token was revoked")
        if used_at is not None:  # a copy elsewhere, or a parallel refresh within the grace
            raise Used(family)
        if owner != client_id:
            raise OAuthError("invalid_grant", "the refresh token belongs to another client")
        if expires_at < self._clock():
            raise OAuthError("invalid_grant", "the refresh token expired")
        wanted = form.get("resource") or resource
        if wanted != resource:
            raise elsewhere(resource, wanted)
        user = user_lookup(user_id)
        if user is None:
            raise self.family_revoked(family, "the user no longer exists")
        if not user.active:
            raise self.family_revoked(family, "the user is deactivated")
        answer, new_row = self._mint(client_id, user, resource, family,
                                     scope_requested=bool(form.get("scope")))
        return family, answer, new_row

    def rotate(self, token: str, new_row: tuple[Any, ...]) -> bool:
        """Mark `token` used and store its successor, in one transaction; False when another
        use marked it first (nothing is stored then)."""
        with self._db.transaction() as conn:
            won = conn.execute(self._sql("UPDATE oauth_refresh SET used_at = ? WHERE "
                                         "token_sha256 = ? AND used_at IS NULL"),
                               (self._clock(), hashed(token))).rowcount == 1
            if won:
                self._store(conn, new_row)
        return won

    def issue(self, client_id: str, user: User, resource: str, family: str, *,
              scope_requested: bool) -> dict[str, Any]:
        """New tokens of `family` (a code's), their refresh row stored."""
        answer, row = self._mint(client_id, user, resource, family,
                                 scope_requested=scope_requested)
        with self._db.transaction() as conn:
            self._store(conn, row)
        return answer

    def _store(self, conn: db.Connection, row: tuple[Any, ...]) -> None:
        conn.execute(self._sql(
            "INSERT INTO oauth_refresh (token_sha256, family, client_id, user_id, resource, "
            "scope, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)"), row)

    def _mint(self, client_id: str, user: User, resource: str, family: str, *,
              scope_requested: bool) -> tuple[dict[str, Any], tuple[Any, ...]]:
        """A token answer and the row its refresh token is stored as."""
        now = self._clock()
        self._keys.rotate_if_due(now)
        key = self._keys.current
        ttl = self._cfg.access_token_ttl_s
        # no "scope" claim: this server grants none. "uid" names the user row, so a token of a
        # deleted user is not taken for a new user who got the same name (and subject).
        claims = {"iss": self._issuer, "sub": user.subject, "aud": resource,
                  "iat": int(now), "exp": int(now + ttl), "jti": secrets.token_urlsafe(12),
                  "client_id": client_id, "tollhouse_iss": user.issuer, "uid": user.id,
                  "fam": family,
                  "name": user.name, "groups": sorted(user.groups)}
        access = jwt.encode(claims, key.private, algorithm="ES256", headers={"kid": key.kid})
        refresh = secrets.token_urlsafe(32)
        row = (hashed(refresh), family, client_id, user.id, resource, "",
               now + self._cfg.refresh_token_ttl_s)
        out: dict[str, Any] = {"access_token": access, "token_type": "Bearer",
                               "expires_in": ttl, "refresh_token": refresh}
        if scope_requested:
            out["scope"] = ""  # RFC 6749 section 5.1: the issued scope differs from the request
        return out, row

    def access_only(self, client_id: str, who: Holder, resource: str, *,
                    act: dict[str, Any] | None = None,
                    not_after: float | None = None) -> dict[str, Any]:
        """An access token and no refresh token (client credentials, an identity assertion,
        a token exchange: the client asks again, with what it asked with), for `who`; `act`
        names who acts for them (RFC 8693 section 4.1); it expires by `not_after` at the
        latest (a token exchanged from one that expires sooner)."""
        now = self._clock()
        self._keys.rotate_if_due(now)
        key = self._keys.current
        expires = now + self._cfg.access_token_ttl_s
        if not_after is not None:
            expires = min(expires, not_after)
        claims: dict[str, Any] = {
            "iss": self._issuer, "sub": who.subject, "aud": resource, "iat": int(now),
            "exp": int(expires), "jti": secrets.token_urlsafe(12), "client_id": client_id,
            "tollhouse_iss": who.issuer, "fam": secrets.token_urlsafe(12), "name": who.name,
            "groups": sorted(who.groups)}
        if who.user_id is not None:
            claims["uid"] = who.user_id
        if act is not None:
            claims["act"] = act
        access = jwt.encode(claims, key.private, algorithm="ES256", headers={"kid": key.kid})
        return {"access_token": access, "token_type": "Bearer",
                "expires_in": max(0, int(expires) - int(now))}

    def revoke_rows(self, family: str) -> None:
        """Revoke the family's refresh rows (those not revoked yet)."""
        with self._db.transaction() as conn:
            conn.execute(self._sql("UPDATE oauth_refresh SET revoked_at = ? WHERE family = ? "
                                   "AND revoked_at IS NULL"), (self._clock(), family))

    def families_of(self, user_id: str) -> list[str]:
        """The families of a person's refresh rows (their grants)."""
        with self._db.transaction() as conn:
            rows = conn.execute(self._sql("SELECT DISTINCT family FROM oauth_refresh WHERE "
                                          "user_id = ?"), (user_id,)).fetchall()
        return sorted(str(r[0]) for r in rows)

    def delete_rows_of(self, user_id: str) -> int:
        """Delete a person's refresh rows (deprovisioned: none of them may be used again);
        how many there were."""
        with self._db.transaction() as conn:
            cur = conn.execute(self._sql("DELETE FROM oauth_refresh WHERE user_id = ?"),
                               (user_id,))
        return int(cur.rowcount)

    def family_revoked(self, family: str, description: str) -> FamilyRevoked:
        """Revoke the family's rows; the caller raises the result, and the server's `refresh`
        revokes it in the live-state store too."""
        self.revoke_rows(family)
        return FamilyRevoked(family, OAuthError("invalid_grant", description))

    def owner(self, token: str) -> tuple[str, str] | None:
        """The family and client of a refresh token, if it is one."""
        with self._db.transaction() as conn:
            row = conn.execute(self._sql("SELECT family, client_id FROM oauth_refresh WHERE "
                                         "token_sha256 = ?"), (hashed(token),)).fetchone()
        return None if row is None else (row[0], row[1])
