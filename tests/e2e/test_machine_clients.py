"""Machine clients, enterprise-managed authorization and delegation (issue 42 items 4 and 5),
on a real gateway on loopback: a test identity provider (its own keys, its JWKS served on
loopback beside a registered client's) mints Identity Assertion JWT Authorization Grants with
pyjwt; registered confidential clients get tokens by client credentials (a secret, and
private_key_jwt), by an ID-JAG (the JWT bearer grant) and by token exchange (an agent acting
for a person: `act`); the calls they make reach the upstream, show in the audit as the client,
or as the person with the agent as actor, and a Cedar policy tells the two apart. Every
refusal is RFC 6749 section 5.2's shape, never a 500."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt
import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from proxy.oauth.grants import ACCESS_TOKEN_TYPE, JWT_BEARER, TOKEN_EXCHANGE
from proxy.oauth.machines import ASSERTION_TYPE
from tests.policies.cedar.test_gateway import Bank
from tests.stack import Site, gateway_stack

MCP = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
REPORTER_SECRET = secrets.token_urlsafe(32)
AGENT_SECRET = secrets.token_urlsafe(32)
IDE_SECRET = secrets.token_urlsafe(32)
POLICY = """
@id("anything")
permit(principal, action, resource);

@id("no-agent-transfers")
@reason("an agent may not transfer money for a person")
forbid(principal, action == Tollhouse::Action::"tools/call",
       resource == Tollhouse::Tool::"up/transfer")
when { principal.actor != "" };
"""


def sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class Keys:
    """A signer and its JWKS (one key, `kid`)."""

    def __init__(self, kid: str, alg: str) -> None:
        self.kid, self.alg = kid, alg
        self.private: Any = (rsa.generate_private_key(65537, 2048) if alg.startswith("RS")
                             else ec.generate_private_key(ec.SECP256R1()))

    def jwks(self) -> dict[str, Any]:
        algo = jwt.algorithms.RSAAlgorithm if self.alg.startswith("RS") \
            else jwt.algorithms.ECAlgorithm
        public = json.loads(algo.to_jwk(self.private.public_key()))
        return {"keys": [{**public, "kid": self.kid, "alg": self.alg, "use": "sig"}]}

    def sign(self, claims: dict[str, Any], typ: str = "JWT") -> str:
        return jwt.encode(claims, self.private, algorithm=self.alg,
                          headers={"kid": self.kid, "typ": typ})


IDP = Keys("idp-1", "RS256")
STRANGER = Keys("idp-1", "RS256")  # same kid, another key: a forged assertion
SIGNER = Keys("signer-1", "ES256")


async def key_server(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The test IdP's JWKS at /jwks and the `signer` client's at /signer."""
    if scope["type"] != "http":
        return
    body = {"/jwks": IDP.jwks(), "/signer": SIGNER.jwks()}.get(scope["path"])
    await send({"type": "http.response.start", "status": 200 if body else 404,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": orjson.dumps(body or {})})


@dataclass
class World:
    site: Site
    idp: str  # the test IdP's issuer (its key server's URL)

    @property
    def issuer(self) -> str:
        return self.site.url

    @property
    def resource(self) -> str:
        return f"{self.site.url}/mcp/up"

    async def token(self, data: dict[str, str], auth: tuple[str, str] | None = None
                    ) -> httpx.Response:
        return await self.site.client.post("/oauth/token", data=data, auth=auth)

    def id_jag(self, **over: Any) -> str:
        now = int(time.time())
        claims = {"iss": self.idp, "sub": "U-alice", "aud": self.issuer, "client_id": "ide",
                  "jti": secrets.token_urlsafe(12), "iat": now, "exp": now + 300,
                  "resource": self.resource, "name": "Alice Example",
                  "email": "alice@example.com", "groups": ["staff"]}
        claims.update(over)
        return IDP.sign({k: v for k, v in claims.items() if v is not None},
                        typ="oauth-id-jag+jwt")

    async def person_token(self) -> str:
        r = await self.token({"grant_type": JWT_BEARER, "assertion": self.id_jag()},
                             auth=("ide", IDE_SECRET))
        assert r.status_code == 200, r.text
        return str(r.json()["access_token"])

    async def call(self, token: str, tool: str, **arguments: Any) -> dict[str, Any]:
        """initialize, then one tools/call, with `token`: the JSON-RPC answer of the call."""
        bearer = {**MCP, "Authorization": f"Bearer {token}"}
        init = await self.site.client.post("/mcp/up", headers=bearer, content=orjson.dumps({
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"}}}))
        assert init.status_code == 200, init.text
        session = {"mcp-session-id": init.headers["mcp-session-id"]} \
            if "mcp-session-id" in init.headers else {}
        await self.site.client.post("/mcp/up", headers={**bearer, **session}, content=orjson.dumps(
            {"jsonrpc": "2.0", "method": "notifications/initialized"}))
        r = await self.site.client.post("/mcp/up", headers={**bearer, **session},
                                        content=orjson.dumps({
                                            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                            "params": {"name": tool, "arguments": arguments}}))
        return _answer(r)

    async def audited(self) -> list[tuple[str, str | None, str, str | None]]:
        """(principal, actor, status, tool) of every tools/call record, oldest first."""
        gateway = self.site.services.gateway
        assert gateway is not None
        await gateway.audit.settled()
        database = self.site.services.database
        with database.transaction() as conn:
            rows = conn.execute(database.sql(
                "SELECT principal, actor, status, tool FROM audit WHERE method = ? ORDER BY ts"),
                ("tools/call",)).fetchall()
        return [(str(r[0]), r[1], str(r[2]), r[3]) for r in rows]


def _answer(r: httpx.Response) -> dict[str, Any]:
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        for line in r.text.splitlines():
            if line.startswith("data:"):
                message: dict[str, Any] = orjson.loads(line[5:])
                if "id" in message:
                    return message
    answer: dict[str, Any] = r.json()
    return answer


@asynccontextmanager
async def world(tmp_path: Path, **extra: Any) -> AsyncIterator[World]:
    (tmp_path / "agents.cedar").write_text(POLICY)
    bank = Bank()
    async with gateway_stack(lambda urls: {
            "server": {"public_url": urls.gateway},
            "auth": {"mode": "jwt"},
            "oauth_server": {"enabled": True, "clients": [
                {"client_id": "reporter", "name": "Nightly report",
                 "secret_sha256": sha(REPORTER_SECRET), "roles": ["reporting"],
                 "endpoints": ["up"]},
                {"client_id": "signer", "jwks_url": f"{urls.upstreams['keys']}/signer",
                 "roles": ["reporting"]},
                {"client_id": "ide", "secret_sha256": sha(IDE_SECRET),
                 "grant_types": [JWT_BEARER]},
                {"client_id": "agent", "name": "Travel agent",
                 "secret_sha256": sha(AGENT_SECRET), "grant_types": [TOKEN_EXCHANGE]},
                {"client_id": "elsewhere", "secret_sha256": sha(AGENT_SECRET),
                 "endpoints": ["other"]}],
                "enterprise_idps": [{"issuer": urls.upstreams["keys"],
                                     "jwks_url": f"{urls.upstreams['keys']}/jwks"}]},
            "policy": {"files": [str(tmp_path / "*.cedar")]},
            "upstreams": [{"name": "up", "url": f"{urls.upstreams['bank']}/mcp",
                           "access": {"allow_groups": ["reporting", "staff"]}},
                          {"name": "other", "url": f"{urls.upstreams['bank']}/mcp"}],
            **extra},
            upstreams={"bank": bank.app(json=True), "keys": key_server},
            secret_key="test-secret") as site:
        yield World(site, site.upstreams["keys"])


def oauth_error(r: httpx.Response, status: int, error: str) -> str:
    """The answer is RFC 6749 section 5.2's: the status, `error`, a description."""
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["error"] == error, body
    assert set(body) <= {"error", "error_description"}, body
    return str(body.get("error_description", ""))


# -- item 4: client credentials ------------------------------------------------------------------


async def test_client_credentials_with_a_secret_name_the_client_with_its_roles(
        tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        r = await w.token({"grant_type": "client_credentials", "resource": w.resource},
                          auth=("reporter", REPORTER_SECRET))
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["token_type"] == "Bearer" and "refresh_token" not in answer
        claims = jwt.decode(answer["access_token"], options={"verify_signature": False})
        assert claims["sub"] == "client:reporter" and claims["aud"] == w.resource
        assert claims["groups"] == ["reporting"] and "act" not in claims
        # client_secret_post works too
        posted = await w.token({"grant_type": "client_credentials", "resource": w.resource,
                                "client_id": "reporter", "client_secret": REPORTER_SECRET})
        assert posted.status_code == 200, posted.text
        # the role opens the endpoint (allow_groups), the call reaches the bank
        result = await w.call(answer["access_token"], "balance")
        assert result["result"]["content"][0]["text"] == "42", result
        assert await w.audited() == [("client:reporter", None, "ok", "balance")]


async def test_client_credentials_refusals(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        wrong = await w.token({"grant_type": "client_credentials", "resource": w.resource},
                              auth=("reporter", "not-the-secret"))
        oauth_error(wrong, 401, "invalid_client")
        assert wrong.headers["www-authenticate"].startswith("Basic")
        assert REPORTER_SECRET not in wrong.text
        other = await w.token({"grant_type": "client_credentials",
                               "resource": f"{w.site.url}/mcp/other"},
                              auth=("reporter", REPORTER_SECRET))
        assert "other" in oauth_error(other, 400, "invalid_target")
        for resource in ("", "https://elsewhere.example/mcp/up", f"{w.site.url}/mcp/nope"):
            r = await w.token({"grant_type": "client_credentials", "resource": resource},
                              auth=("reporter", REPORTER_SECRET))
            oauth_error(r, 400, "invalid_target")
        # a client not given the grant, and a dynamically registered one
        oauth_error(await w.token({"grant_type": "client_credentials", "resource": w.resource},
                                  auth=("ide", IDE_SECRET)), 400, "unauthorized_client")
        registered = await w.site.client.post("/oauth/register", json={
            "redirect_uris": ["http://127.0.0.1:1/cb"],
            "token_endpoint_auth_method": "client_secret_post"})
        dyn = registered.json()
        oauth_error(await w.token({"grant_type": "client_credentials", "resource": w.resource,
                                   "client_id": dyn["client_id"],
                                   "client_secret": dyn["client_secret"]}),
                    400, "unauthorized_client")
        # the token of a client for one endpoint is refused on another
        token = (await w.token({"grant_type": "client_credentials", "resource": w.resource},
                               auth=("reporter", REPORTER_SECRET))).json()["access_token"]
        elsewhere = await w.site.client.post("/mcp/other", headers={
            **MCP, "Authorization": f"Bearer {token}"}, content=b"{}")
        assert elsewhere.status_code == 401


def assertion(w: World, keys: Keys = SIGNER, **over: Any) -> str:
    now = int(time.time())
    claims = {"iss": "signer", "sub": "signer", "aud": f"{w.issuer}/oauth/token",
              "jti": secrets.token_urlsafe(12), "iat": now, "exp": now + 60}
    claims.update(over)
    return keys.sign(claims)


async def test_client_credentials_with_private_key_jwt(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        signed = assertion(w)
        form = {"grant_type": "client_credentials", "resource": w.resource,
                "client_assertion_type": ASSERTION_TYPE, "client_assertion": signed}
        r = await w.token(form)
        assert r.status_code == 200, r.text
        token = r.json()["access_token"]
        assert jwt.decode(token, options={"verify_signature": False})["sub"] == "client:signer"
        assert (await w.call(token, "balance"))["result"]["content"][0]["text"] == "42"
        assert await w.audited() == [("client:signer", None, "ok", "balance")]
        # used once; a key the client does not publish; another audience; a long life;
        # another client's name; not a JWT
        assert "used already" in oauth_error(await w.token(form), 401, "invalid_client")
        for bad in (assertion(w, keys=Keys("signer-1", "ES256")),
                    assertion(w, aud="https://elsewhere.example"),
                    assertion(w, exp=int(time.time()) + 3600),
                    assertion(w, iss="reporter", sub="reporter"),
                    assertion(w, exp=int(time.time()) - 120), "not-a-jwt"):
            r = await w.token({**form, "client_assertion": bad})
            oauth_error(r, 401, "invalid_client")
        oauth_error(await w.token({**form, "client_assertion_type": "urn:other"}), 401,
                    "invalid_client")


# -- item 5: identity assertions (ID-JAG) --------------------------------------------------------


async def test_an_id_jag_gives_the_person_a_token_without_consent(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        r = await w.token({"grant_type": JWT_BEARER, "assertion": w.id_jag()},
                          auth=("ide", IDE_SECRET))
        assert r.status_code == 200, r.text
        claims = jwt.decode(r.json()["access_token"], options={"verify_signature": False})
        assert (claims["sub"], claims["tollhouse_iss"]) == ("U-alice", w.idp)
        assert claims["aud"] == w.resource and claims["client_id"] == "ide"
        assert claims["groups"] == ["staff"] and "act" not in claims
        result = await w.call(r.json()["access_token"], "balance")
        assert result["result"]["content"][0]["text"] == "42", result
        assert await w.audited() == [("U-alice", None, "ok", "balance")]


async def test_id_jag_refusals(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        now = int(time.time())
        cases = {
            "expired": w.id_jag(iat=now - 900, exp=now - 600),
            "another audience": w.id_jag(aud="https://other-as.example"),
            "unknown issuer": w.id_jag(iss="https://unknown-idp.example"),
            "another client": w.id_jag(client_id="agent"),
            "forged": STRANGER.sign({"iss": w.idp, "sub": "U-alice", "aud": w.issuer,
                                     "client_id": "ide", "jti": "x", "iat": now,
                                     "exp": now + 60}, typ="oauth-id-jag+jwt"),
            "plain JWT typ": IDP.sign({"iss": w.idp, "sub": "U-alice", "aud": w.issuer,
                                       "client_id": "ide", "jti": "y", "iat": now,
                                       "exp": now + 60}),
            "too long": w.id_jag(exp=now + 7200),
            "no jti": w.id_jag(jti=None),
            "not a JWT": "garbage",
        }
        for case, token in cases.items():
            r = await w.token({"grant_type": JWT_BEARER, "assertion": token},
                              auth=("ide", IDE_SECRET))
            assert r.status_code == 400, (case, r.text)
            assert r.json()["error"] == "invalid_grant", (case, r.json())
        # another resource than the assertion's; one the IdP did not name and the client
        # asks for is fine
        oauth_error(await w.token({"grant_type": JWT_BEARER, "assertion": w.id_jag(),
                                   "resource": f"{w.site.url}/mcp/other"},
                                  auth=("ide", IDE_SECRET)), 400, "invalid_target")
        asked = await w.token({"grant_type": JWT_BEARER, "assertion": w.id_jag(resource=None),
                               "resource": w.resource}, auth=("ide", IDE_SECRET))
        assert asked.status_code == 200, asked.text
        # used once
        once = w.id_jag()
        first = await w.token({"grant_type": JWT_BEARER, "assertion": once},
                              auth=("ide", IDE_SECRET))
        assert first.status_code == 200
        oauth_error(await w.token({"grant_type": JWT_BEARER, "assertion": once},
                                  auth=("ide", IDE_SECRET)), 400, "invalid_grant")
        # a client not given the grant
        oauth_error(await w.token({"grant_type": JWT_BEARER, "assertion": w.id_jag()},
                                  auth=("agent", AGENT_SECRET)), 400, "unauthorized_client")


# -- item 5: token exchange, an agent acting for a person ----------------------------------------


async def test_token_exchange_carries_act_into_the_audit_and_the_policies(
        tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        person = await w.person_token()
        r = await w.token({"grant_type": TOKEN_EXCHANGE, "subject_token": person,
                           "subject_token_type": ACCESS_TOKEN_TYPE},
                          auth=("agent", AGENT_SECRET))
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["issued_token_type"] == ACCESS_TOKEN_TYPE
        delegated = answer["access_token"]
        claims = jwt.decode(delegated, options={"verify_signature": False})
        assert claims["sub"] == "U-alice" and claims["client_id"] == "agent"
        assert claims["act"] == {"sub": "client:agent", "client_id": "agent"}
        assert claims["exp"] <= jwt.decode(person, options={"verify_signature": False})["exp"]
        # the agent reads for her; the policy forbids it a transfer she may make herself
        read = await w.call(delegated, "balance")
        assert read["result"]["content"][0]["text"] == "42", read
        refused = await w.call(delegated, "transfer", amount=5, to="bob")
        assert "error" in refused or refused["result"].get("isError"), refused
        mine = await w.call(person, "transfer", amount=5, to="bob")
        assert mine["result"]["content"][0]["text"] == "sent 5 to bob", mine
        assert await w.audited() == [("U-alice", "client:agent", "ok", "balance"),
                                     ("U-alice", "client:agent", "denied", "transfer"),
                                     ("U-alice", None, "ok", "transfer")]


async def test_token_exchange_refusals(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        person = await w.person_token()
        base = {"grant_type": TOKEN_EXCHANGE, "subject_token": person,
                "subject_token_type": ACCESS_TOKEN_TYPE}
        agent = ("agent", AGENT_SECRET)
        oauth_error(await w.token({**base, "subject_token_type": "urn:x"}, auth=agent), 400,
                    "invalid_request")
        oauth_error(await w.token({**base, "actor_token": person,
                                   "actor_token_type": ACCESS_TOKEN_TYPE}, auth=agent),
                    400, "invalid_request")
        oauth_error(await w.token({**base, "subject_token": "garbage"}, auth=agent), 400,
                    "invalid_grant")
        oauth_error(await w.token({**base, "subject_token": person[:-6] + "AAAAAA"},
                                  auth=agent), 400, "invalid_grant")
        machine = (await w.token({"grant_type": "client_credentials", "resource": w.resource},
                                 auth=("reporter", REPORTER_SECRET))).json()["access_token"]
        oauth_error(await w.token({**base, "subject_token": machine}, auth=agent), 400,
                    "invalid_grant")
        oauth_error(await w.token(base, auth=("reporter", REPORTER_SECRET)), 400,
                    "unauthorized_client")
        oauth_error(await w.token({**base, "resource": "https://x.example/mcp/up"},
                                  auth=agent), 400, "invalid_target")
        oauth_error(await w.token({"grant_type": "urn:nope"}, auth=agent), 400,
                    "unsupported_grant_type")


async def test_the_metadata_advertises_the_grants(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        meta = (await w.site.client.get("/.well-known/oauth-authorization-server")).json()
        assert {"client_credentials", JWT_BEARER, TOKEN_EXCHANGE} <= set(
            meta["grant_types_supported"])
        assert "private_key_jwt" in meta["token_endpoint_auth_methods_supported"]


@pytest.mark.parametrize("key", ["actor", "actor_endpoint"])
async def test_a_rate_limit_keyed_on_the_actor(tmp_path: Path, key: str) -> None:
    """A rule keyed on the actor counts the agent's calls, whoever it acts for, and not the
    person's own."""
    async with world(tmp_path, rate_limits=[{"name": "agents", "key": key, "rate": "1/h"}]) as w:
        person = await w.person_token()
        delegated = (await w.token({"grant_type": TOKEN_EXCHANGE, "subject_token": person,
                                    "subject_token_type": ACCESS_TOKEN_TYPE},
                                   auth=("agent", AGENT_SECRET))).json()["access_token"]
        assert "result" in await w.call(delegated, "balance")
        limited = await w.call(delegated, "balance")
        assert "error" in limited, limited
        for _ in range(3):
            assert "result" in await w.call(person, "balance")
