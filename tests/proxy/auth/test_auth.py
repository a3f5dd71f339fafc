"""Bearer JWTs from configured issuers with static keys: who is calling, or 401."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.conftest import make_config, mock_upstream, running_gateway
from tests.helpers import ISSUER, SECRET, audience, jwt_auth, token

AUD = audience()
CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t"}}
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwt_config(tmp_path: Path, rsa_key: rsa.RSAPrivateKey):
    pem = rsa_key.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "idp.pem").write_bytes(pem)
    auth = jwt_auth()
    auth["issuers"] = [*auth["issuers"],  # type: ignore[misc]
                       {"issuer": "https://rsa.test/", "public_key_pem": str(tmp_path / "idp.pem"),
                        "algorithms": ["RS256"]}]
    return make_config(auth=auth)


async def test_valid_tokens_pass_and_bad_ones_are_401(tmp_path: Path, rsa_key) -> None:
    up = mock_upstream()
    rsa_pem_public = (tmp_path / "idp.pem")
    async with running_gateway(jwt_config(tmp_path, rsa_key), up.transport) as gw:
        ok = await gw.post(CALL, headers={"Authorization": f"Bearer {token()}"})
        assert ok.status_code == 200
        rs = token(rsa_key, "RS256", iss="https://rsa.test/")
        assert (await gw.post(CALL, headers={"Authorization": f"Bearer {rs}"})).status_code == 200
        assert len(up.seen) == 2
        assert all("authorization" not in r.headers for r in up.seen)

        bad = {
            "missing": None,
            "not bearer": "Basic YWxpY2U6cHc=",
            "garbage": "Bearer not.a.jwt",
            "expired": f"Bearer {token(exp=int(time.time()) - 3600)}",
            "not yet": f"Bearer {token(nbf=int(time.time()) + 3600)}",
            "wrong audience": f"Bearer {token(aud='http://other/mcp/e')}",
            "unknown issuer": f"Bearer {token(iss='https://evil.test/')}",
            "wrong key": f"Bearer {token('another-secret-of-sufficient-length!!')}",
            "no subject": f"Bearer {token(sub='')}",
            "alg none": "Bearer " + jwt.encode({"iss": ISSUER, "aud": AUD,
                                                 "sub": "a", "exp": 9999999999}, None,
                                                algorithm="none"),
            # an HS256 token whose secret is the RSA public key: key confusion
            "alg confusion": "Bearer " + _confused(rsa_pem_public.read_text()),
        }
        for case, header in bad.items():
            headers = {"Authorization": header} if header else {}
            response = await gw.post(CALL, headers=headers)
            assert response.status_code == 401, case
            body = response.json()
            assert body["error"]["code"] == -32000 and body["id"] is None, case
            assert body["error"]["message"].startswith("Unauthorized"), case
            assert response.headers["www-authenticate"].startswith("Bearer "), case
        assert len(up.seen) == 2
        records = await gw.audit.wait_for(2 + len(bad))
        denied = [r for r in records if r.status == "denied"]
        assert len(denied) == len(bad)
        for record in records:
            assert SECRET not in repr(record) and "Bearer" not in repr(record)


def _confused(public_pem: str) -> str:
    import base64
    import hashlib
    import hmac
    import json

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    header = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = b64(json.dumps({"iss": "https://rsa.test/", "aud": AUD, "sub": "mallory",
                             "exp": int(time.time()) + 300}).encode())
    sig = hmac.new(public_pem.encode(), f"{header}.{claims}".encode(), hashlib.sha256).digest()
    return f"{header}.{claims}.{b64(sig)}"


async def test_sessions_are_bound_to_the_principal(tmp_path: Path, rsa_key) -> None:
    up = mock_upstream()
    async with running_gateway(jwt_config(tmp_path, rsa_key), up.transport) as gw:
        alice = {"Authorization": f"Bearer {token(sub='alice')}"}
        bob = {"Authorization": f"Bearer {token(sub='bob')}"}
        sid = (await gw.post(INIT, headers=alice)).headers["mcp-session-id"]
        mine = await gw.post(CALL, headers={**alice, "Mcp-Session-Id": sid})
        theirs = await gw.post(CALL, headers={**bob, "Mcp-Session-Id": sid})
        assert mine.status_code == 200
        assert theirs.status_code == 404 and theirs.json() == {"error": "session not found"}
        gone = await gw.client.delete(gw.endpoint(), headers={**bob, "Mcp-Session-Id": sid})
        assert gone.status_code == 404
        assert await gw.gateway.sessions.get(sid) is not None


async def test_a_verified_token_is_checked_once_and_refused_once_it_expires(
        tmp_path: Path, rsa_key, monkeypatch: pytest.MonkeyPatch) -> None:
    """The verified-token cache saves the signature check of a token sent again, and never
    outlives the token: past its `exp` (plus the issuer's leeway) the cached entry is not used
    and the token is refused. The checks are counted at pyjwt's `decode` with a key (a
    decode that skips the signature only reads a claim)."""
    from proxy.auth import authenticator

    checks = 0
    decode = jwt.decode

    def counted(token_: str, *args: Any, **kwargs: Any) -> Any:
        nonlocal checks
        if (kwargs.get("options") or {}).get("verify_signature", True):
            checks += 1
        return decode(token_, *args, **kwargs)

    monkeypatch.setattr(jwt, "decode", counted)
    up = mock_upstream()
    now = time.time()
    expires = int(now) + 120
    bearer = {"Authorization": f"Bearer {token(exp=expires)}"}
    async with running_gateway(jwt_config(tmp_path, rsa_key), up.transport) as gw:
        for _ in range(3):
            assert (await gw.post(CALL, headers=bearer)).status_code == 200
        assert checks == 1
        later = expires + 3600.0  # past exp and any leeway: the cached entry is stale
        monkeypatch.setattr(authenticator.time, "time", lambda: later)
        monkeypatch.setattr(jwt.api_jwt, "datetime", _Frozen(later))
        response = await gw.post(CALL, headers=bearer)
        assert response.status_code == 401
        assert checks == 2  # checked again, not answered from the cache


class _Frozen:
    """Stands for `datetime` in pyjwt's module: its `now()` is a fixed moment."""

    def __init__(self, at: float) -> None:
        self._at = at

    def now(self, tz=None):
        import datetime as dt

        return dt.datetime.fromtimestamp(self._at, tz=tz)
