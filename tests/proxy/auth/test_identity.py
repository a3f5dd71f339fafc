"""Identity and access against real loopback servers: a JWKS server the tests can break and
rotate, the demo MCP server as the upstream (with a recorder that counts what reaches it), and
the gateway with its real transport. Each attack is one test row."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jwt
import orjson
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from proxy.auth import keys as api_keys
from proxy.config import from_dict
from proxy.demo import demo_app
from tests import db_backends
from tests.conftest import MCP_HEADERS, running_gateway
from tests.helpers import Clock, token
from tests.servers import serve

ISSUER = "https://idp.test/"
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())


def jwk(key: Any, kid: str, alg: str) -> dict[str, Any]:
    algo = jwt.algorithms.RSAAlgorithm if alg.startswith("RS") else jwt.algorithms.ECAlgorithm
    return {**json.loads(algo.to_jwk(key.public_key())), "kid": kid, "alg": alg, "use": "sig"}


@dataclass
class Jwks:
    keys: list[dict[str, Any]] = field(default_factory=lambda: [jwk(RSA_KEY, "k1", "RS256"),
                                                                jwk(EC_KEY, "k2", "ES256")])
    up: bool = True
    paths: list[str] = field(default_factory=list)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.paths.append(scope["path"])
        status, body = (200, orjson.dumps({"keys": self.keys})) if self.up else (503, b"down")
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


class Recorder:
    """Wraps the demo upstream: every request's headers and JSON-RPC method."""

    def __init__(self) -> None:
        self.app = demo_app()
        self.requests: list[tuple[dict[str, str], str | None]] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        chunks: list[dict] = []
        while True:
            message = await receive()
            chunks.append(message)
            if not message.get("more_body"):
                break
        body = b"".join(m.get("body", b"") for m in chunks)
        try:
            method = orjson.loads(body).get("method") if body else None
        except orjson.JSONDecodeError:
            method = None
        self.requests.append((headers, method))

        async def replay() -> dict:
            return chunks.pop(0) if chunks else {"type": "http.disconnect"}

        await self.app(scope, replay, send)

    def calls(self, method: str = "tools/call") -> list[dict[str, str]]:
        return [h for h, m in self.requests if m == method]


@dataclass
class Env:
    url: str
    jwks: Jwks
    upstream: Recorder
    clock: Clock
    db: str
    client: httpx.AsyncClient
    upstream_url: str

    def endpoint(self, name: str = "a") -> str:
        return f"{self.url}/mcp/{name}"

    def token(self, key: Any = RSA_KEY, alg: str = "RS256", kid: str | None = "k1",
              endpoint: str = "a", **claims: Any) -> str:
        return token(key, alg, endpoint=endpoint, headers=None if kid is None else {"kid": kid},
                     **{"iss": ISSUER, "groups": ["eng"], "scope": "mcp:read", **claims})

    async def call(self, token: str | None, *, endpoint: str = "a", tool: str = "echo",
                   client: httpx.AsyncClient | None = None, method: str = "tools/call"
                   ) -> httpx.Response:
        headers = dict(MCP_HEADERS)
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        params = {"name": tool, "arguments": {"text": "hi"}} if method == "tools/call" else {}
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        return await (client or self.client).post(self.endpoint(endpoint),
                                                  content=orjson.dumps(body), headers=headers)


@asynccontextmanager
async def environment(tmp_path: Path, **access: Any) -> AsyncIterator[Env]:
    jwks, upstream, clock = Jwks(), Recorder(), Clock()
    db = db_backends.url()
    async with serve(jwks) as jwks_url, serve(upstream) as upstream_url:
        # calls go without initialize: the demo upstream serves sessionless requests
        upstream_mcp = f"{upstream_url}/mcp"
        cfg = from_dict({
            "database": {"url": db},
            "auth": {"mode": "jwt", "lockout": {"max_failures": 3, "window_s": 60,
                                                "lockout_s": 120},
                     "authorization_servers": ["https://idp.test/"],
                     "issuers": [{"issuer": ISSUER, "jwks_url": f"{jwks_url}/jwks",
                                  "algorithms": ["RS256", "ES256"]}]},
            "upstreams": [
                {"name": "a", "url": upstream_mcp, "access": access,
                 "headers": {"Authorization": "Bearer upstream-static"}},
                {"name": "b", "url": upstream_mcp, "identity": "headers"},
                {"name": "c", "url": upstream_mcp, "identity": "jwt"},
            ],
        }, env={})
        async with running_gateway(cfg, clock=clock, resolver=None) as gw:
            yield Env(gw.url, jwks, upstream, clock, db, gw.client, upstream_mcp)


def rpc_error(response: httpx.Response) -> dict[str, Any]:
    return response.json()["error"]


# -- the attack table ------------------------------------------------------------------------

def _hs256_with_rsa_public_key() -> str:
    import base64
    import hashlib
    import hmac

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    pem = RSA_KEY.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    header = b64(json.dumps({"alg": "HS256", "kid": "k1"}).encode())
    claims = b64(json.dumps({"iss": ISSUER, "aud": "http://127.0.0.1:8080/mcp/a",
                             "sub": "mallory", "exp": int(time.time()) + 300}).encode())
    sig = hmac.new(pem, f"{header}.{claims}".encode(), hashlib.sha256).digest()
    return f"{header}.{claims}.{b64(sig)}"


ATTACKS = {
    "alg none": lambda env: jwt.encode({"iss": ISSUER, "sub": "x", "exp": 9999999999,
                                        "aud": "http://127.0.0.1:8080/mcp/a"}, None,
                                       algorithm="none", headers={"kid": "k1"}),
    "HS256 signed with the RSA public key": lambda env: _hs256_with_rsa_public_key(),
    "expired": lambda env: env.token(exp=int(time.time()) - 3600),
    "not yet valid": lambda env: env.token(nbf=int(time.time()) + 3600),
    "wrong iss": lambda env: env.token(iss="https://evil.test/"),
    "wrong aud": lambda env: env.token(aud="https://elsewhere/mcp/a"),
    "unknown kid": lambda env: env.token(kid="k9"),
    "kid with path characters": lambda env: env.token(kid="../../etc/passwd?x=/jwks#"),
    "no kid": lambda env: env.token(kid=None),
    "token for endpoint b used on a": lambda env: env.token(endpoint="b"),
    "EC key id with RSA algorithm": lambda env: env.token(kid="k2"),
    "signed by another key": lambda env: env.token(
        key=rsa.generate_private_key(public_exponent=65537, key_size=2048)),
    "garbage": lambda env: "eyJhbGciOi.not-a-token",
}


@pytest.mark.parametrize("attack", list(ATTACKS))
async def test_attack_is_401_and_never_reaches_the_upstream(tmp_path: Path, attack: str) -> None:
    async with environment(tmp_path) as env:
        response = await env.call(ATTACKS[attack](env))
        assert response.status_code == 401, attack
        assert response.json() == {"jsonrpc": "2.0", "id": None,
                                   "error": {"code": -32000, "message": "Unauthorized"}}
        challenge = response.headers["www-authenticate"]
        assert challenge.startswith('Bearer resource_metadata="http://127.0.0.1:8080/'
                                    '.well-known/oauth-protected-resource/mcp/a"')
        assert env.upstream.calls() == []
        assert set(env.jwks.paths) <= {"/jwks"}


async def test_valid_tokens_from_jwks_pass(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        ok_rs = await env.call(env.token())
        ok_es = await env.call(env.token(key=EC_KEY, alg="ES256", kid="k2"))
        assert (ok_rs.status_code, ok_es.status_code) == (200, 200), ok_rs.text
        assert ok_rs.json()["result"]["content"][0]["text"] == "hi"
        # one JWKS fetch served both, and the client's token never went upstream
        assert env.jwks.paths == ["/jwks"]
        for headers in env.upstream.calls():
            assert headers["authorization"] == "Bearer upstream-static"


async def test_unknown_kid_refetches_at_most_once_a_minute(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        assert (await env.call(env.token())).status_code == 200
        assert (await env.call(env.token(kid="k3"))).status_code == 401
        assert env.jwks.paths == ["/jwks"]  # fetched under a minute ago: no refetch yet
        env.clock.advance(61)
        for _ in range(3):
            assert (await env.call(env.token(kid="k3"))).status_code == 401
        assert env.jwks.paths == ["/jwks", "/jwks"]  # the first unknown kid refetched, once
        rotated = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        env.jwks.keys.append(jwk(rotated, "k3", "RS256"))
        env.clock.advance(121)  # past the refetch interval, and the lockout those failures caused
        assert (await env.call(env.token(key=rotated, kid="k3"))).status_code == 200


async def test_jwks_unreachable_at_start_then_recovers(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        env.jwks.up = False
        assert (await env.call(env.token())).status_code == 401
        env.jwks.up = True
        assert (await env.call(env.token())).status_code == 401  # not refetched yet
        env.clock.advance(61)
        assert (await env.call(env.token())).status_code == 200


async def test_keys_keep_working_through_a_jwks_outage(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        assert (await env.call(env.token())).status_code == 200
        env.jwks.up = False
        env.clock.advance(7200)  # past the refresh interval: the refetch fails, keys are kept
        assert (await env.call(env.token(sub="bob"))).status_code == 200
        assert env.jwks.paths == ["/jwks", "/jwks"]


async def test_revoked_api_key_fails_on_its_next_request(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        key, secret = api_keys.create(env.db, "ci-bot", [])
        assert (await env.call(secret)).status_code == 200
        assert api_keys.revoke(env.db, key.id)
        assert (await env.call(secret)).status_code == 401
        wrong = secret[:-4] + ("AAAA" if not secret.endswith("AAAA") else "BBBB")
        other, _ = api_keys.create(env.db, "other", [])
        assert (await env.call(wrong)).status_code == 401
        expired, expired_secret = api_keys.create(env.db, "old", [], expires_in_days=-1)
        assert (await env.call(expired_secret)).status_code == 401
        del other, expired


async def test_key_limited_to_a_is_403_on_b(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        _, secret = api_keys.create(env.db, "a-only", ["a"])
        assert (await env.call(secret, endpoint="a")).status_code == 200
        response = await env.call(secret, endpoint="b")
        assert response.status_code == 403
        assert rpc_error(response) == {"code": -32000, "message": "Forbidden"}


async def test_lockout_by_address_and_its_expiry(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        for _ in range(3):
            assert (await env.call(env.token(kid="nope"))).status_code == 401
        locked = await env.call(env.token())  # even a good token, from the locked address
        assert locked.status_code == 429
        assert locked.json() == {"error": "too_many_requests", "error_description":
                                 "too many failed authentication attempts; try again later"}
        assert locked.headers["retry-after"] == "120"
        # a caller from another address is unaffected
        transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
        async with httpx.AsyncClient(transport=transport, timeout=10) as other:
            assert (await env.call(env.token(), client=other)).status_code == 200
        env.clock.advance(121)
        assert (await env.call(env.token())).status_code == 200


async def test_bad_secrets_for_a_known_key_id_do_not_lock_its_owner_out(tmp_path: Path
                                                                        ) -> None:
    """Key ids are public (listed, audited): failures lock out the addresses that sent them,
    never the key, which anyone could otherwise shut off; its secret cannot be guessed."""
    async with environment(tmp_path) as env:
        key, secret = api_keys.create(env.db, "bot", [])
        bad = f"th_{key.id}_{'x' * 43}"
        transports = [httpx.AsyncHTTPTransport(local_address=f"127.0.0.{i}")
                      for i in range(3, 6)]
        for transport in transports:  # three addresses, one key id, each over the limit
            async with httpx.AsyncClient(transport=transport, timeout=10) as c:
                for _ in range(3):
                    assert (await env.call(bad, client=c)).status_code == 401
                assert (await env.call(secret, client=c)).status_code == 429  # the address
        async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(
                local_address="127.0.0.9"), timeout=10) as fresh:
            assert (await env.call(secret, client=fresh)).status_code == 200


async def test_missing_credentials_do_not_lock_anyone_out(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        for _ in range(5):
            assert (await env.call(None)).status_code == 401
        assert (await env.call(env.token())).status_code == 200


# -- access rules ---------------------------------------------------------------------------

async def test_callers_outside_the_rules_get_403(tmp_path: Path) -> None:
    async with environment(tmp_path, allow_groups=["ops"], allow_scopes=["mcp:admin"]) as env:
        denied = await env.call(env.token())
        assert denied.status_code == 403
        assert rpc_error(denied) == {"code": -32000, "message": "Forbidden"}
        assert 'error="insufficient_scope", scope="mcp:admin"' in denied.headers[
            "www-authenticate"]
        assert (await env.call(env.token(groups=["ops"]))).status_code == 200
        assert (await env.call(env.token(scope="mcp:read mcp:admin"))).status_code == 200
        assert len(env.upstream.calls()) == 2


async def test_hidden_tools_are_unknown_and_filtered_from_the_list(tmp_path: Path) -> None:
    async with environment(tmp_path, tools_allow=["echo", "count"], tools_deny=["count"],
                           group_tools={"math": {"tools_allow": ["add"]}}) as env:
        listed = await env.call(env.token(), method="tools/list")
        assert [t["name"] for t in listed.json()["result"]["tools"]] == ["echo"]
        for tool in ("add", "count", "never-heard-of"):
            hidden = await env.call(env.token(), tool=tool)
            assert hidden.status_code == 400
            assert rpc_error(hidden) == {"code": -32602, "message": f"Unknown tool: {tool}"}
        assert env.upstream.calls() == []
        math = env.token(groups=["eng", "math"])
        listed = await env.call(math, method="tools/list")
        assert [t["name"] for t in listed.json()["result"]["tools"]] == ["echo", "add"]
        assert (await env.call(math, tool="add")).status_code == 200


async def test_identity_forwarding_modes(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        assert (await env.call(env.token(endpoint="b", sub="bob\r\nX-Evil: 1"),
                               endpoint="b")).status_code == 200
        assert (await env.call(env.token(endpoint="c"), endpoint="c")).status_code == 200
        plain, signed = env.upstream.calls()
        assert plain["x-tollhouse-subject"] == "bob%0D%0AX-Evil:%201"
        assert plain["x-tollhouse-groups"] == "eng"
        assert "x-evil" not in plain and "authorization" not in plain
        jwks = (await env.client.get(f"{env.url}/.well-known/jwks.json")).json()
        key = jwt.PyJWK(jwks["keys"][0])
        claims = jwt.decode(signed["x-tollhouse-identity"], key, algorithms=["ES256"],
                            audience=env.upstream_url)
        assert claims["sub"] == "alice" and claims["groups"] == ["eng"]
        assert "authorization" not in signed


async def test_protected_resource_metadata(tmp_path: Path) -> None:
    async with environment(tmp_path, allow_scopes=["mcp:admin"]) as env:
        doc = (await env.client.get(
            f"{env.url}/.well-known/oauth-protected-resource/mcp/a")).json()
        assert doc == {"resource": "http://127.0.0.1:8080/mcp/a", "resource_name": "a",
                       "authorization_servers": ["https://idp.test/"],
                       "scopes_supported": ["mcp:admin"], "bearer_methods_supported": ["header"]}
        missing = await env.client.get(f"{env.url}/.well-known/oauth-protected-resource/mcp/zz")
        assert missing.status_code == 404 and missing.json() == {"error": "not found"}
