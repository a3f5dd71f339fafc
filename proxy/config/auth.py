"""`[auth]` and `[oauth_server]`'s checks: who callers are (none, or JWTs from the issuers),
the sign-in (OIDC), the lockout, and the gateway's own authorization server."""

from __future__ import annotations

import re
import typing
from pathlib import Path

from proxy.config.errors import ConfigError
from proxy.config.values import is_loopback, positive, url

if typing.TYPE_CHECKING:
    from proxy.config.tables import Config, IssuerConfig

_AUTH_MODES = ("none", "jwt")
_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512",
               "EdDSA", "HS256", "HS384", "HS512")
# a private-use redirect scheme an app claims, never one a browser handles itself
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
_BROWSER_SCHEMES = ("http", "https", "javascript", "data", "file", "blob", "about", "vbscript")


def check(cfg: Config, base_dir: Path) -> None:
    if cfg.auth.mode not in _AUTH_MODES:
        raise ConfigError(f"config: 'auth.mode' must be one of {', '.join(_AUTH_MODES)}")
    if cfg.auth.mode == "none" and not is_loopback(cfg.server.host):
        raise ConfigError("config: 'auth.mode' = \"none\" is refused on a non-loopback "
                          f"listen address ({cfg.server.host}); configure auth")
    for i, iss in enumerate(cfg.auth.issuers):
        _issuer(iss, f"auth.issuers[{i}]", base_dir)
    _group_roles(cfg)
    _scim(cfg)
    for i, server_url in enumerate(cfg.auth.authorization_servers):
        url(server_url, f"auth.authorization_servers[{i}]")
    oidc = cfg.auth.oidc
    if oidc.enabled:
        url(oidc.issuer, "auth.oidc.issuer")
        if not oidc.client_id:
            raise ConfigError("config: 'auth.oidc.client_id' is required with auth.oidc.issuer")
        if "openid" not in oidc.scopes:
            raise ConfigError("config: 'auth.oidc.scopes' must include openid")
    _oauth_server(cfg)
    lock = cfg.auth.lockout
    positive(lock.max_failures, "auth.lockout.max_failures")
    positive(lock.window_s, "auth.lockout.window_s")
    positive(lock.lockout_s, "auth.lockout.lockout_s")
    positive(lock.max_tracked, "auth.lockout.max_tracked")


def _oauth_server(cfg: Config) -> None:
    oauth = cfg.oauth_server
    for key in ("access_token_ttl_s", "refresh_token_ttl_s", "code_ttl_s", "key_rotation_s",
                "browser_session_ttl_s"):
        positive(getattr(oauth, key), f"oauth_server.{key}")
    if not 0 <= oauth.refresh_grace_s <= 60:
        raise ConfigError("config: 'oauth_server.refresh_grace_s' must be between 0 (off) and "
                          "60 seconds")
    for scheme in oauth.private_use_schemes:
        if not _SCHEME.fullmatch(scheme) or scheme in _BROWSER_SCHEMES:
            raise ConfigError(f"config: 'oauth_server.private_use_schemes' holds {scheme!r}: "
                              "a lower-case URI scheme an app claims, never one a browser "
                              "handles itself")
    if oauth.enabled and cfg.auth.mode != "jwt":
        raise ConfigError("config: 'oauth_server.enabled' needs auth.mode = \"jwt\"")
    _clients(cfg)
    for i, idp in enumerate(oauth.enterprise_idps):
        where = f"oauth_server.enterprise_idps[{i}]"
        url(idp.issuer, f"{where}.issuer")
        url(idp.jwks_url, f"{where}.jwks_url")
        if not idp.algorithms or any(a not in _ALGORITHMS or a.startswith("HS")
                                     for a in idp.algorithms):
            raise ConfigError(f"config: '{where}.algorithms' must list public-key algorithms "
                              f"({', '.join(a for a in _ALGORITHMS if not a.startswith('HS'))})")
        for key in ("max_lifetime_s", "jwks_refresh_s", "jwks_min_refetch_s"):
            positive(getattr(idp, key), f"{where}.{key}")
    issuers = [idp.issuer for idp in oauth.enterprise_idps]
    if len(set(issuers)) != len(issuers):
        raise ConfigError("config: 'oauth_server.enterprise_idps' names an issuer twice")


GRANT_TYPES = ("client_credentials", "urn:ietf:params:oauth:grant-type:jwt-bearer",
               "urn:ietf:params:oauth:grant-type:token-exchange")
_CLIENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _clients(cfg: Config) -> None:
    """Confidential clients: a plain id, one way to authenticate, known grants. Their
    endpoints are not checked here: one added through /api/v1 may be named."""
    seen: set[str] = set()
    for i, client in enumerate(cfg.oauth_server.clients):
        where = f"oauth_server.clients[{i}]"
        if not _CLIENT_ID.fullmatch(client.client_id):
            raise ConfigError(f"config: '{where}.client_id' must be 1-100 letters, digits, "
                              "'.', '_' or '-' (never a URL: those are metadata documents)")
        if client.client_id in seen:
            raise ConfigError(f"config: '{where}.client_id' {client.client_id!r} is repeated")
        seen.add(client.client_id)
        if bool(client.secret_sha256) == bool(client.jwks_url):
            raise ConfigError(f"config: '{where}' needs exactly one of secret_sha256 "
                              "(client_secret_basic/post) or jwks_url (private_key_jwt)")
        if client.secret_sha256 and not _SHA256.fullmatch(client.secret_sha256):
            raise ConfigError(f"config: '{where}.secret_sha256' must be 64 lower-case hex "
                              "digits: the SHA-256 of the secret, never the secret")
        if client.jwks_url:
            url(client.jwks_url, f"{where}.jwks_url")
        if not client.grant_types or any(g not in GRANT_TYPES for g in client.grant_types):
            raise ConfigError(f"config: '{where}.grant_types' must list some of "
                              f"{', '.join(GRANT_TYPES)}")
        for role in client.roles:
            if not role.strip() or ":" in role:
                raise ConfigError(f"config: '{where}.roles' holds {role!r}: a role's name is "
                                  "not empty and has no ':'")


def _issuer(iss: IssuerConfig, where: str, base_dir: Path) -> None:
    if not iss.issuer:
        raise ConfigError(f"config: '{where}.issuer' must not be empty")
    if sum(map(bool, (iss.jwks_url, iss.public_key_pem, iss.hs256_secret))) != 1:
        raise ConfigError(f"config: '{where}' needs exactly one of jwks_url, public_key_pem or "
                          "hs256_secret")
    if iss.jwks_url:
        url(iss.jwks_url, f"{where}.jwks_url")
    if not iss.algorithms:
        raise ConfigError(f"config: '{where}.algorithms' must not be empty")
    for alg in iss.algorithms:
        if alg not in _ALGORITHMS:
            raise ConfigError(f"config: '{where}.algorithms' has an unsupported algorithm "
                              f"'{alg}' (allowed: {', '.join(_ALGORITHMS)})")
        if (alg.startswith("HS")) != bool(iss.hs256_secret):
            raise ConfigError(f"config: '{where}.algorithms' has '{alg}', which does not fit "
                              "the key type configured")
    if iss.public_key_pem and "-----BEGIN" not in iss.public_key_pem:
        pem_path = base_dir / iss.public_key_pem
        if not pem_path.is_file():
            raise ConfigError(f"config: '{where}.public_key_pem' names a file that does not "
                              f"exist: {pem_path}")


_SCIM_TOKEN_MIN = 32  # characters: a token a provisioning client holds, never guessable


def _scim(cfg: Config) -> None:
    if cfg.scim.enabled and len(cfg.scim.token) < _SCIM_TOKEN_MIN:
        raise ConfigError(f"config: 'scim.token' must be at least {_SCIM_TOKEN_MIN} characters "
                          "when scim.enabled (use ${TOLLHOUSE_SCIM_TOKEN})")


def _group_roles(cfg: Config) -> None:
    seen: set[tuple[str, str]] = set()
    for i, mapping in enumerate(cfg.auth.group_roles):
        where = f"auth.group_roles[{i}]"
        if not mapping.group.strip():
            raise ConfigError(f"config: '{where}.group' must not be empty")
        if not mapping.role.strip() or ":" in mapping.role:
            raise ConfigError(f"config: '{where}.role' must name a built-in role (admin, user, "
                              "auditor) or a custom role")
        if (mapping.group, mapping.role) in seen:
            raise ConfigError(f"config: '{where}' repeats group {mapping.group!r} -> role "
                              f"{mapping.role!r}")
        seen.add((mapping.group, mapping.role))
