"""Identity provider presets (issue 42 item 6): each preset loaded as a config file would be, and
a real gateway that trusts a fake provider of that shape (its keys at the path the preset names,
tokens carrying its issuer, audience and groups claim): Entra ID's v1 and v2 access tokens, Okta's
authorization server, Keycloak's realm (groups, or realm roles), and Google's ID tokens, which
carry no groups; and a person's sign-in through each sign-in preset but Entra's (whose issuer is
the fixed v2.0 endpoint: only loaded here)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import jwt
import orjson
import pytest
from jwt.algorithms import RSAAlgorithm

from proxy.config import ConfigError
from proxy.config.load import from_dict
from proxy.config.tables import OidcConfig
from proxy.people.accounts import Accounts
from proxy.people.oidc import map_claims
from tests.e2e.oidc_provider import OidcProvider, rsa_key, running_provider
from tests.e2e.upstreams import stateless_json_app
from tests.servers import serve
from tests.stack import gateway_stack

TENANT = "7f1c6a52-0d3e-4c1b-9a53-1f2e3d4c5b6a"
APP = "0a1b2c3d-4e5f-6789-abcd-ef0123456789"
SRE = "3b2f0c1e-aaaa-4bbb-8ccc-123456789abc"  # an Entra group's object id


def loaded(auth: dict[str, Any]) -> Any:
    """The `[auth]` a config file with this table loads to."""
    return from_dict({"server": {"public_url": "https://gw.example"},
                      "auth": {"mode": "jwt", **auth}}).auth


def test_each_issuer_preset_fills_what_its_tokens_need() -> None:
    v2 = loaded({"issuers": [{"preset": "entra", "tenant": TENANT, "client_id": APP}]})
    (iss,) = v2.issuers
    assert (iss.issuer, iss.audience, iss.jwks_url, iss.groups_claim) == (
        f"https://login.microsoftonline.com/{TENANT}/v2.0", APP,
        f"https://login.microsoftonline.com/{TENANT}/discovery/v2.0/keys", "groups")
    (v1,) = loaded({"issuers": [{"preset": "entra", "tenant": TENANT, "client_id": APP,
                                 "token_version": 1}]}).issuers
    assert (v1.issuer, v1.audience) == (f"https://sts.windows.net/{TENANT}/", f"api://{APP}")
    (roles,) = loaded({"issuers": [{"preset": "entra", "tenant": TENANT, "client_id": APP,
                                    "groups_claim": "roles"}]}).issuers
    assert roles.groups_claim == "roles"  # a key given wins
    (okta,) = loaded({"issuers": [{"preset": "okta", "audience": "api://default",
                                   "issuer": "https://acme.okta.com/oauth2/default"}]}).issuers
    assert (okta.jwks_url, okta.audience, okta.groups_claim) == (
        "https://acme.okta.com/oauth2/default/v1/keys", "api://default", "groups")
    (kc,) = loaded({"issuers": [{"preset": "keycloak",
                                 "issuer": "https://sso.acme.test/realms/acme"}]}).issuers
    assert kc.jwks_url == "https://sso.acme.test/realms/acme/protocol/openid-connect/certs"
    assert kc.audience == ""  # the endpoint's resource URL: Keycloak's audience mapper sets it
    (google,) = loaded({"issuers": [{"preset": "google", "client_id": "123.apps"}]}).issuers
    assert (google.issuer, google.jwks_url, google.audience, google.groups_claim) == (
        "https://accounts.google.com", "https://www.googleapis.com/oauth2/v3/certs",
        "123.apps", "")


def test_each_sign_in_preset_fills_what_its_id_tokens_need() -> None:
    entra = loaded({"oidc": {"preset": "entra", "tenant": TENANT, "client_id": APP}}).oidc
    assert entra.issuer == f"https://login.microsoftonline.com/{TENANT}/v2.0"
    assert entra.groups_claim == "groups"
    google = loaded({"oidc": {"preset": "google", "client_id": "123.apps"}}).oidc
    assert (google.issuer, google.groups_claim) == ("https://accounts.google.com", "")
    okta = loaded({"oidc": {"preset": "okta", "client_id": "c",
                            "issuer": "https://acme.okta.com"}}).oidc
    assert "groups" in okta.scopes
    # Keycloak's realm roles, nested in realm_access, as groups
    keycloak = OidcConfig(issuer="https://sso/realms/a", client_id="c",
                          groups_claim="realm_access.roles")
    _, _, groups, _ = map_claims({"sub": "s", "realm_access": {"roles": ["sre", "dev"]}},
                                 keycloak)
    assert groups == {"sre", "dev"}


@pytest.mark.parametrize(("table", "message"), [
    ({"preset": "ping", "issuer": "https://x"}, "auth.issuers[0].preset' must be one of"),
    ({"preset": "entra", "client_id": APP}, "auth.issuers[0].tenant' is required"),
    ({"preset": "entra", "tenant": TENANT}, "auth.issuers[0].client_id' is required"),
    ({"preset": "entra", "tenant": TENANT, "client_id": APP, "token_version": 3},
     "token_version' must be 1 or 2"),
    ({"preset": "okta"}, "auth.issuers[0].issuer' is required"),
    ({"preset": "google"}, "auth.issuers[0].client_id' is required"),
])
def test_a_preset_without_what_it_needs_is_refused(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        loaded({"issuers": [table]})


# -- a fake provider of each shape, and a gateway that trusts it ------------------------------


@dataclass
class Provider:
    """Publishes one RSA key at every path (a JWKS), counting which paths were asked."""

    base: str = ""
    asked: Counter[str] = field(default_factory=Counter)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.asked[scope["path"]] += 1
        jwk = RSAAlgorithm.to_jwk(rsa_key(0).public_key(), as_dict=True)
        body = orjson.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]})
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    def mint(self, **claims: Any) -> str:
        return jwt.encode({"iat": 1, "exp": 4_000_000_000, **claims}, rsa_key(0),
                          algorithm="RS256", headers={"kid": "k1"})


@asynccontextmanager
async def trusting(issuers: list[dict[str, Any]], provider: Provider, **auth: Any
                   ) -> AsyncIterator[str]:
    app, _ = stateless_json_app()
    async with serve(app, graceful_timeout=1) as up_url:
        def config(urls: Any) -> dict[str, Any]:
            return {"server": {"public_url": urls.gateway},
                    "auth": {"mode": "jwt", "issuers": issuers, **auth},
                    "upstreams": [{"name": "up", "url": f"{up_url}/mcp",
                                   "access": {"allow_groups": ["deployers"]}},
                                  {"name": "open", "url": f"{up_url}/mcp"}]}

        async with gateway_stack(config) as site:
            yield site.url


async def call(url: str, token: str, endpoint: str = "up") -> int:
    """The status of an echo call (200 served; 401 refused; 403 not admitted)."""
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.post(f"{url}/mcp/{endpoint}", headers={
            "Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json", "MCP-Protocol-Version": "2025-11-25"},
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                  "params": {"name": "echo", "arguments": {"text": "hi"}}})
    if r.status_code == 200:
        assert r.json()["result"]["content"][0]["text"] == "hi", r.text
    return r.status_code


@pytest.fixture
async def provider() -> AsyncIterator[Provider]:
    p = Provider()
    async with serve(p, graceful_timeout=1) as url:
        p.base = url
        yield p


@pytest.mark.parametrize("version", [1, 2])
async def test_entra_access_tokens_of_either_version(provider: Provider, version: int) -> None:
    p = provider
    issuer = f"https://sts.windows.net/{TENANT}/" if version == 1 else \
        f"https://login.microsoftonline.com/{TENANT}/v2.0"
    # the fake provider stands in for login.microsoftonline.com's keys: the only key given
    table = {"preset": "entra", "tenant": TENANT, "client_id": APP, "token_version": version,
             "jwks_url": f"{p.base}/{TENANT}/discovery/v2.0/keys"}
    aud = f"api://{APP}" if version == 1 else APP
    other = APP if version == 1 else f"api://{APP}"

    def entra(**claims: Any) -> str:  # an Entra access token's shape
        return p.mint(**{"iss": issuer, "aud": aud, "sub": "pairwise-sub", "oid": "oid-1",
                         "tid": TENANT, "ver": f"{version}.0", **claims})

    async with trusting([table], p, group_roles=[{"group": SRE, "role": "deployers"}]) as url:
        assert await call(url, entra(groups=[SRE])) == 200  # the group's object id, mapped
        assert await call(url, entra(groups=["other"])) == 403
        assert await call(url, entra(groups=[SRE], aud=other)) == 401  # the other version's
        assert await call(url, entra(roles=[SRE])) == 403  # app roles: groups_claim = "roles"
    assert p.asked[f"/{TENANT}/discovery/v2.0/keys"] >= 1


async def test_okta_keycloak_and_google_tokens(provider: Provider) -> None:
    p = provider
    okta_iss, kc_iss = f"{p.base}/oauth2/default", f"{p.base}/realms/acme"
    issuers = [
        {"preset": "okta", "issuer": okta_iss, "audience": "api://default"},
        {"preset": "keycloak", "issuer": kc_iss},
        # Google's fixed issuer and keys, stood in for by the provider
        {"preset": "google", "client_id": "123.apps.googleusercontent.com",
         "jwks_url": f"{p.base}/oauth2/v3/certs"},
    ]
    async with trusting(issuers, p) as url:
        okta = p.mint(iss=okta_iss, aud="api://default", sub="00u1", cid="0oa1",
                      groups=["deployers", "Everyone"])
        assert await call(url, okta) == 200
        assert await call(url, p.mint(iss=okta_iss, aud="api://default", sub="00u1",
                                      groups=["Everyone"])) == 403
        # Keycloak: the audience mapper names the endpoint; groups from the membership mapper
        kc = p.mint(iss=kc_iss, aud=[f"{url}/mcp/up", "account"], sub="f:1:bob",
                    azp="tollhouse", groups=["deployers"],
                    realm_access={"roles": ["offline_access"]})
        assert await call(url, kc) == 200
        # Google: an ID token for the client; no groups, so no group rule admits it
        google = p.mint(iss="https://accounts.google.com", aud="123.apps.googleusercontent.com",
                        sub="1098", email="ada@acme.test", email_verified=True, hd="acme.test")
        assert await call(url, google, "open") == 200
        assert await call(url, google) == 403
        assert await call(url, p.mint(iss="https://accounts.google.com", aud="other.apps",
                                      sub="1098")) == 401
    assert p.asked["/oauth2/default/v1/keys"] >= 1
    assert p.asked["/realms/acme/protocol/openid-connect/certs"] >= 1
    assert p.asked["/oauth2/v3/certs"] >= 1


async def test_keycloak_realm_roles_as_groups(provider: Provider) -> None:
    p = provider
    kc_iss = f"{p.base}/realms/acme"
    table = {"preset": "keycloak", "issuer": kc_iss, "groups_claim": "realm_access.roles"}
    async with trusting([table], p) as url:
        def kc(*roles: str) -> str:
            return p.mint(iss=kc_iss, aud=f"{url}/mcp/up", sub="bob",
                          realm_access={"roles": list(roles)}, groups=["deployers"])
        assert await call(url, kc("deployers")) == 200
        assert await call(url, kc("viewer")) == 403  # its groups claim is not read


@pytest.mark.parametrize(("preset", "claims", "groups"), [
    # Keycloak's realm roles through a dotted groups_claim; its groups claim is not read
    ("keycloak", {"realm_access": {"roles": ["sre", "dev"]}, "groups": ["/other"]},
     {"sre", "dev"}),
    # Okta: the groups claim, asked for by the groups scope
    ("okta", {"groups": ["sre", "Everyone"]}, {"sre", "Everyone"}),
    # Google: no groups claim is read (its ID tokens have none): groups are kept, not cleared
    ("google", {"groups": ["sre"]}, set()),
])
async def test_sign_in_with_a_preset(preset: str, claims: dict[str, Any], groups: set[str]
                                     ) -> None:
    idp = OidcProvider()
    async with running_provider(idp) as idp_url:
        oidc: dict[str, Any] = {"preset": preset, "issuer": idp_url,
                                "client_id": idp.client_id, "client_secret": idp.client_secret}
        if preset == "keycloak":
            oidc["groups_claim"] = "realm_access.roles"

        def config(urls: Any) -> dict[str, Any]:
            return {"server": {"public_url": urls.gateway},
                    "auth": {"mode": "jwt", "oidc": oidc}, "console": {"enabled": True}}

        async with gateway_stack(config) as site, \
                httpx.AsyncClient(follow_redirects=False, timeout=10) as browser:
            idp.sign_in_as(f"{preset}-1", name=f"{preset}-person", **claims)
            start = await browser.get(f"{site.url}/signin/oidc", params={"next": "/signin/done"})
            assert start.status_code == 303, start.text
            back = (await browser.get(start.headers["location"])).headers["location"]
            assert (await browser.get(back)).status_code == 303
            asked = idp.authorize_params[-1]["scope"].split()
            user = Accounts(site.services.database).by_subject(idp_url, f"{preset}-1")
    assert user is not None and user.groups == groups
    assert ("groups" in asked) == (preset == "okta")
