"""Tollhouse's authorization server with the official TypeScript SDK's OAuth client (issue 45):
calls in flight when a token expires, many people behind one address, IDE redirect URIs, and
the dead ends a client must be told about. The person signs in and consents over plain HTTP
(test_oauth_sdk.Browser); the client is the SDK under Node (tests/e2e/ts_sdk.py)."""

from __future__ import annotations

import base64
import secrets
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import jwt
import orjson
import pytest

from proxy.oauth.keys import KeyRing
from proxy.storage.db import Database
from tests.e2e.test_oauth_sdk import (
    INITIALIZE,
    MCP_HEADERS,
    REDIRECT_URI,
    Browser,
    Gw,
    browser,
    flow,
    oauth_gateway,
    query,
)
from tests.e2e.ts_sdk import TsClient, ts_client

CURSOR = "cursor://anysphere.cursor-retrieval/oauth/callback"
REVERSE_DOMAIN = "com.example.app:/oauth2redirect"


async def signed_in(ts: TsClient, person: Browser, url: str) -> None:
    """The SDK connects to `url`; the person consents; the SDK is connected."""
    await ts.send(op="connect", url=url)
    location = await person.consent(await ts.authorize_event())
    answer = await ts.ask(op="code", location=location)
    assert answer.get("ok") == "connected", answer


def expired_copy(gw: Gw, access_token: str) -> str:
    """The same token, signed by the gateway's key, that expired two minutes ago (past the
    30 s leeway): a token the SDK holds when its calls are in flight at expiry."""
    claims = jwt.decode(access_token, options={"verify_signature": False})
    now = int(time.time())
    claims.update(iat=now - 800, exp=now - 120, jti=secrets.token_urlsafe(12))
    database = Database(gw.db_path)
    try:
        key = KeyRing(database, "test-secret", 86400, 600).current
    finally:
        database.close()
    return jwt.encode(claims, key.private, algorithm="ES256", headers={"kid": key.kid})


# -- item 1: calls in flight at expiry -----------------------------------------------------------


@pytest.mark.parametrize("grace_s", [10])
async def test_three_calls_in_flight_at_expiry_refresh_without_losing_the_grant(
        tmp_path: Path, grace_s: int) -> None:
    """Each of three calls meets a 401 and the SDK refreshes once per 401 with the same
    refresh token: every refresh is answered with the same new tokens, every call is
    answered, and the person is not asked to consent again. (With refresh_grace_s = 0, the
    code before the grace, the second refresh revoked the family and all three failed.)"""
    async with oauth_gateway(tmp_path, oauth={"refresh_grace_s": grace_s}) as gw, \
            browser(gw.url) as person, ts_client(REDIRECT_URI) as ts:
        await signed_in(ts, person, gw.endpoint())
        first = await ts.ask(op="calls", n=1, text="warm")
        assert first["ok"] == [{"text": "warm-0"}], first
        tokens = (await ts.ask(op="tokens"))["ok"]
        assert (await ts.ask(op="set_access", token=expired_copy(gw, tokens["access_token"])))[
            "ok"] is True
        answer = await ts.ask(op="calls", n=3, text="expiry", refreshes=3)
        assert answer.get("ok") == [{"text": f"expiry-{i}"} for i in range(3)], answer
        assert ts.grants("refresh_token") == [(200, "")] * 3
        assert (await ts.ask(op="authorizations"))["ok"] == 1  # the first consent only
        rotated = (await ts.ask(op="tokens"))["ok"]
        assert rotated["refresh_token"] != tokens["refresh_token"]
        again = await ts.ask(op="calls", n=1, text="after")
        assert again["ok"] == [{"text": "after-0"}], again


# -- item 2: expiry is not an attack -------------------------------------------------------------


async def test_twelve_expired_tokens_behind_one_address_do_not_lock_it_out(tmp_path: Path
                                                                          ) -> None:
    """Twelve people behind one NAT whose tokens expired (validly signed): each answered 401
    invalid_token, none counted as a failed login, and a fresh token from the same address
    (the SDK's) works. The default lockout is 10 failures a minute."""
    async with oauth_gateway(tmp_path) as gw, browser(gw.url) as person, \
            ts_client(REDIRECT_URI) as ts, httpx.AsyncClient(timeout=10) as http:
        await signed_in(ts, person, gw.endpoint())
        held = (await ts.ask(op="tokens"))["ok"]["access_token"]
        for _ in range(12):
            bearer = {"Authorization": f"Bearer {expired_copy(gw, held)}"}
            r = await http.post(gw.endpoint(), content=orjson.dumps(INITIALIZE),
                                headers={**MCP_HEADERS, **bearer})
            assert r.status_code == 401, r.text
            challenge = r.headers["www-authenticate"]
            assert 'error="invalid_token"' in challenge
            assert 'error_description="token expired"' in challenge
        answer = await ts.ask(op="calls", n=1, text="fresh")
        assert answer.get("ok") == [{"text": "fresh-0"}], answer
        # a token that does not verify still counts: ten of them lock the address out
        for _ in range(10):
            forged = await http.post(gw.endpoint(), content=orjson.dumps(INITIALIZE),
                                     headers={**MCP_HEADERS,
                                              "Authorization": f"Bearer {held[:-4]}AAAA"})
            assert forged.status_code in (401, 429)
        locked = await http.post(gw.endpoint(), content=orjson.dumps(INITIALIZE),
                                 headers={**MCP_HEADERS, "Authorization": f"Bearer {held}"})
        assert locked.status_code == 429, locked.text


# -- item 3: RFC 8252 redirect URIs --------------------------------------------------------------


@pytest.mark.parametrize("redirect_uri", [CURSOR, REVERSE_DOMAIN])
async def test_an_ide_with_a_private_use_scheme_registers_and_is_sent_back(
        tmp_path: Path, redirect_uri: str) -> None:
    async with oauth_gateway(tmp_path) as gw, browser(gw.url) as person, \
            ts_client(redirect_uri) as ts:
        await ts.send(op="connect", url=gw.endpoint())
        location = await person.consent(await ts.authorize_event())
        assert location.startswith(redirect_uri + "?")
        # the consent page lets the browser follow its form's redirect to that scheme
        assert person.page is not None
        csp = person.page.headers["content-security-policy"]
        scheme = urlsplit(redirect_uri).scheme
        assert f"form-action 'self' {scheme}:;" in csp, csp
        answer = await ts.ask(op="code", location=location)
        assert answer.get("ok") == "connected", answer
        assert (await ts.ask(op="calls", n=1, text="ide"))["ok"] == [{"text": "ide-0"}]


async def test_a_loopback_redirect_uri_matches_any_port_with_the_exact_path(tmp_path: Path
                                                                            ) -> None:
    async with flow(tmp_path) as f:
        r = await f.http.post(f"{f.gw.url}/oauth/register", json={
            "client_name": "native", "redirect_uris": ["http://127.0.0.1/cb", "http://[::1]/cb"]})
        assert r.status_code == 201, r.text
        f.client_id = r.json()["client_id"]
        for uri in ("http://127.0.0.1:53123/cb", "http://[::1]:4711/cb"):
            verifier = secrets.token_urlsafe(48)
            back = await f.person.consent(f.authorize_url(verifier, redirect_uri=uri))
            assert back.startswith(uri + "?"), back
            assert f"form-action 'self' {uri[:-3]};" in f.person.page.headers[
                "content-security-policy"]
            tokens = await f.token(grant_type="authorization_code", code=query(back)["code"],
                                   redirect_uri=uri, code_verifier=verifier)
            assert tokens.status_code == 200, tokens.text
        for uri in ("http://127.0.0.1:53123/other", "http://localhost:53123/cb",
                    "https://127.0.0.1:53123/cb", "http://127.0.0.2:53123/cb"):
            wrong = await f.http.get(f.authorize_url("x" * 43, redirect_uri=uri))
            assert wrong.status_code == 400 and "location" not in wrong.headers, uri


async def test_redirect_uris_that_stay_refused(tmp_path: Path) -> None:
    async with oauth_gateway(tmp_path, oauth={"private_use_schemes": []}) as gw, \
            httpx.AsyncClient(timeout=10) as http:
        for uri in ("http://evil.example/cb", "javascript://x/%0aalert(1)",
                    "data:text/html,x", "file:///etc/passwd", CURSOR,
                    "https://a.example;script-src/cb"):
            r = await http.post(f"{gw.url}/oauth/register",
                                json={"client_name": "x", "redirect_uris": [uri]})
            assert r.status_code == 400, (uri, r.text)
            assert r.json()["error"] == "invalid_redirect_uri"
        ok = await http.post(f"{gw.url}/oauth/register",
                             json={"client_name": "x", "redirect_uris": [REVERSE_DOMAIN]})
        assert ok.status_code == 201, ok.text


# -- item 4: dead ends ---------------------------------------------------------------------------


@pytest.mark.parametrize("subjects", [["local:bob"], ["alice"]])
async def test_a_person_the_endpoint_refuses_is_refused_at_consent(
        tmp_path: Path, subjects: list[str]) -> None:
    """No Allow button and no token: the client is sent access_denied, naming why (and, for
    a bare name, that allow_subjects needs local:alice)."""
    async with oauth_gateway(tmp_path, access={"allow_subjects": subjects}) as gw, \
            browser(gw.url) as person, ts_client(REDIRECT_URI) as ts:
        await ts.send(op="connect", url=gw.endpoint())
        location = await person.decide(await ts.authorize_event(), "deny")
        assert person.page is not None and "Allow</button>" not in person.page.text
        back = query(location)
        assert back["error"] == "access_denied"
        assert "local:alice is not in the access rules of endpoint up" in \
            back["error_description"]
        if subjects == ["alice"]:
            assert "names 'alice'" in back["error_description"]
        answer = await ts.ask(op="code", location=location)
        assert answer["ok"]["error"] == "access_denied", answer
        assert not [g for g in ts.wire if g[0] == "/oauth/token"]  # no token was issued


async def test_a_token_for_one_endpoint_at_another_names_the_resource(tmp_path: Path) -> None:
    async with oauth_gateway(tmp_path, endpoints=("up", "other")) as gw, \
            browser(gw.url) as person, ts_client(REDIRECT_URI) as ts, \
            httpx.AsyncClient(timeout=10) as http:
        await signed_in(ts, person, gw.endpoint("up"))
        token = (await ts.ask(op="tokens"))["ok"]["access_token"]
        r = await http.post(gw.endpoint("other"), content=orjson.dumps(INITIALIZE),
                            headers={**MCP_HEADERS, "Authorization": f"Bearer {token}"})
        assert r.status_code == 401
        challenge = r.headers["www-authenticate"]
        assert 'error="invalid_token"' in challenge
        assert f"this token is for {gw.resource('up')}, not {gw.resource('other')}" in challenge
        # the SDK, holding the first endpoint's tokens, refreshes for the second: told why
        answer = await ts.ask(op="connect", url=gw.endpoint("other"))
        assert answer["error"].startswith("InvalidTargetError"), answer
        assert f"this grant is for {gw.resource('up')}, not {gw.resource('other')}" in \
            answer["error"]


async def test_invalid_client_after_http_basic_carries_a_basic_challenge(tmp_path: Path) -> None:
    async with flow(tmp_path) as f:
        await f.register("client_secret_basic")
        wrong = base64.b64encode(f"{f.client_id}:wrong".encode()).decode()
        form = {"grant_type": "refresh_token", "refresh_token": "x"}
        r = await f.http.post(f"{f.gw.url}/oauth/token", data=form,
                              headers={"Authorization": f"Basic {wrong}"})
        assert r.status_code == 401 and r.json()["error"] == "invalid_client"
        assert r.headers["www-authenticate"] == 'Basic realm="tollhouse", charset="UTF-8"'
        posted = await f.http.post(f"{f.gw.url}/oauth/token",
                                   data={**form, "client_id": f.client_id,
                                         "client_secret": "wrong"})
        assert posted.status_code == 401 and "www-authenticate" not in posted.headers
