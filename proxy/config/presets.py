"""Identity provider presets (issue 42 item 6): `preset = "entra" | "okta" | "keycloak" |
"google"` on an `[[auth.issuers]]` table or on `[auth.oidc]` fills what that provider's tokens
need and the table left at its default: the issuer, where its keys are published, the audience
its access tokens carry, and the claim that lists a person's groups. A key given in the table
always wins. docs/identity.md#identity-provider-presets says what each preset sets and why.

- Entra ID: `tenant` and `client_id` (the API's application id). Access tokens are v2.0 by
  default (`token_version = 2`: `iss` https://login.microsoftonline.com/<tenant>/v2.0, `aud`
  the application id GUID) or v1.0 (`token_version = 1`: `iss` https://sts.windows.net/<tenant>/,
  `aud` api://<application id>, the Application ID URI); keys at
  https://login.microsoftonline.com/<tenant>/discovery/v2.0/keys (the tenant's signing keys,
  for either version). Groups in `groups` (object ids, once the app's manifest asks for them;
  app roles in `roles`). Sign-in uses the v2.0 endpoint, which takes scopes and no `resource`.
- Okta: `issuer` is the authorization server's (https://<org>.okta.com/oauth2/default); keys
  at <issuer>/v1/keys; groups in `groups` (a groups claim added to the authorization server).
- Keycloak: `issuer` is the realm's (https://<host>/realms/<realm>); keys at
  <issuer>/protocol/openid-connect/certs; groups in `groups` (the Group Membership mapper), or
  realm roles with `groups_claim = "realm_access.roles"`.
- Google: issuer https://accounts.google.com, keys https://www.googleapis.com/oauth2/v3/certs,
  `aud` the OAuth client id (`client_id`; Google's access tokens are opaque, its ID tokens are
  the JWTs); no groups claim at all (groups come from SCIM or the API then).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from proxy.config.errors import ConfigError
from proxy.config.tables import Config, IssuerConfig, OidcConfig

PRESETS = ("entra", "okta", "keycloak", "google")
ENTRA_LOGIN = "https://login.microsoftonline.com"
GOOGLE_ISSUER = "https://accounts.google.com"
GOOGLE_JWKS = "https://www.googleapis.com/oauth2/v3/certs"
_ISSUER_DEFAULTS = IssuerConfig()
_OIDC_DEFAULTS = OidcConfig()


def apply(cfg: Config) -> Config:
    """`cfg` with every preset's defaults filled in."""
    auth = cfg.auth
    issuers = [issuer(iss, f"auth.issuers[{i}]") for i, iss in enumerate(auth.issuers)]
    oidc = sign_in(auth.oidc)
    if issuers == auth.issuers and oidc == auth.oidc:
        return cfg
    return dataclasses.replace(cfg, auth=dataclasses.replace(auth, issuers=issuers, oidc=oidc))


def issuer(iss: IssuerConfig, where: str) -> IssuerConfig:
    """One `[[auth.issuers]]` with its preset's defaults."""
    if not iss.preset:
        return iss
    _known(iss.preset, f"{where}.preset")
    fill: dict[str, Any] = {}
    if iss.preset == "entra":
        if iss.token_version not in (1, 2):
            raise ConfigError(f"config: '{where}.token_version' must be 1 or 2 (Entra ID's "
                              "access token versions)")
        tenant, app = iss.tenant, iss.client_id
        _needs(where, tenant=tenant, client_id=app)
        fill = {"issuer": f"https://sts.windows.net/{tenant}/" if iss.token_version == 1
                else f"{ENTRA_LOGIN}/{tenant}/v2.0",
                "jwks_url": f"{ENTRA_LOGIN}/{tenant}/discovery/v2.0/keys",
                "audience": f"api://{app}" if iss.token_version == 1 else app}
    elif iss.preset in ("okta", "keycloak"):
        _needs(where, issuer=iss.issuer)
        path = "/v1/keys" if iss.preset == "okta" else "/protocol/openid-connect/certs"
        fill = {"jwks_url": iss.issuer.rstrip("/") + path}
    elif iss.preset == "google":
        _needs(where, client_id=iss.client_id)
        fill = {"issuer": GOOGLE_ISSUER, "jwks_url": GOOGLE_JWKS, "audience": iss.client_id,
                "groups_claim": ""}
    if iss.public_key_pem or iss.hs256_secret:  # a key given: no JWKS to fill in
        fill.pop("jwks_url", None)
    return _filled(iss, _ISSUER_DEFAULTS, fill)


def sign_in(oidc: OidcConfig) -> OidcConfig:
    """`[auth.oidc]` with its preset's defaults."""
    if not oidc.preset:
        return oidc
    _known(oidc.preset, "auth.oidc.preset")
    fill: dict[str, Any] = {}
    if oidc.preset == "entra":
        _needs("auth.oidc", tenant=oidc.tenant)
        fill = {"issuer": f"{ENTRA_LOGIN}/{oidc.tenant}/v2.0"}
    elif oidc.preset in ("okta", "keycloak"):
        _needs("auth.oidc", issuer=oidc.issuer)
        if oidc.preset == "okta":  # Okta's groups claim is asked for by its scope
            fill = {"scopes": ["openid", "profile", "email", "groups"]}
    elif oidc.preset == "google":
        fill = {"issuer": GOOGLE_ISSUER, "groups_claim": ""}
    return _filled(oidc, _OIDC_DEFAULTS, fill)


def claim(claims: Mapping[str, Any], name: str) -> Any:
    """The claim `name`, or a nested one by dots (`realm_access.roles`); None if absent."""
    if name in claims or "." not in name:
        return claims.get(name)
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


T = TypeVar("T", IssuerConfig, OidcConfig)


def _filled(table: T, defaults: T, fill: dict[str, Any]) -> T:
    """`table` with each of `fill`'s keys it left at the default set."""
    kept = {k: v for k, v in fill.items() if getattr(table, k) == getattr(defaults, k)}
    return dataclasses.replace(table, **kept) if kept else table


def _known(preset: str, key: str) -> None:
    if preset not in PRESETS:
        raise ConfigError(f"config: '{key}' must be one of {', '.join(PRESETS)}")


def _needs(where: str, **values: str) -> None:
    for key, value in values.items():
        if not value:
            raise ConfigError(f"config: '{where}.{key}' is required by its preset")
