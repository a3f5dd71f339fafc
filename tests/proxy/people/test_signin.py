"""Sign-in pages: a local account signs in with a form and gets a session cookie; forms from
elsewhere are refused; failures lock out; no open redirects."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest

from proxy.config import from_dict
from proxy.people.accounts import Accounts, check_password, hash_password
from proxy.people.signin import safe_next
from tests import db_backends, state_backends
from tests.stack import gateway_client, gateway_stack

ORIGIN = "http://127.0.0.1:8080"


def make_cfg(**server: object):
    db = db_backends.url()
    Accounts(db_backends.open_database()).create_local("alice", "correct-horse", admin=True)
    return from_dict({"server": server, "auth": {"mode": "jwt", "lockout": {"max_failures": 3}},
                      "oauth_server": {"enabled": True}, "database": {"url": db},
                      "upstreams": [{"name": "e", "url": "http://127.0.0.1:9/mcp"}]}, env={})


@pytest.fixture
def cfg(tmp_path: Path):
    return make_cfg()


def test_passwords_are_scrypt_hashed_and_salted() -> None:
    one, two = hash_password("pw"), hash_password("pw")
    assert one != two and one.startswith("scrypt$") and "pw" not in one
    assert check_password("pw", one) and not check_password("nope", one)


async def test_sign_in_sets_a_session_cookie_and_signs_out(cfg) -> None:
    async with gateway_client(cfg, secret_key="k") as client:
        assert "<form" in (await client.get("/signin")).text
        ok = await client.post("/signin", data={"name": "alice", "password": "correct-horse",
                                                 "next": "/signin/done"},
                               headers={"Origin": ORIGIN})
        assert ok.status_code == 303 and ok.headers["location"] == "/signin/done"
        cookie = ok.headers["set-cookie"]
        assert "tollhouse_session=" in cookie and "HttpOnly" in cookie
        assert "SameSite=Lax" in cookie and "Secure" not in cookie  # plain http public URL
        assert "alice" in (await client.get("/signin/done")).text
        out = await client.post("/signout", headers={"Origin": ORIGIN})
        assert out.status_code == 303
        assert (await client.get("/signin/done")).status_code == 303


@pytest.mark.parametrize("headers", [{}, {"Origin": "https://evil.example"},
                                     {"Referer": "https://evil.example/page"}],
                         ids=["no origin", "foreign origin", "foreign referer"])
async def test_forms_from_elsewhere_are_403(cfg, headers: dict[str, str]) -> None:
    async with gateway_client(cfg, secret_key="k") as client:
        response = await client.post("/signin", data={"name": "alice",
                                                       "password": "correct-horse"},
                                     headers=headers)
        assert response.status_code == 403 and "set-cookie" not in response.headers
        referer = await client.post("/signin", data={"name": "alice",
                                                      "password": "correct-horse"},
                                    headers={"Referer": f"{ORIGIN}/signin"})
        assert referer.status_code == 303


# browsers drop tabs and newlines from a URL and read a backslash as a slash, so each of
# these would land on evil.example (or, with a control character, break the Location header)
OFF_SITE = ["//evil.example/x", "https://evil.example/", "/\\evil", "/\t/evil.example",
            "/\n/evil.example", "/\r/evil.example", "/\x0b/evil.example", "/ /evil.example",
            "\t//evil.example", "/\u3000/evil.example", "http:/x",
            "/a\r\nSet-Cookie: x=1"]


@pytest.mark.parametrize("target", OFF_SITE)
async def test_next_never_leaves_the_gateway(cfg, target: str) -> None:
    async with gateway_client(cfg, secret_key="k") as client:
        response = await client.post("/signin", data={"name": "alice",
                                                       "password": "correct-horse",
                                                       "next": target},
                                     headers={"Origin": ORIGIN})
        assert response.status_code == 303
        assert response.headers["location"] == "/signin/done"
        form = await client.get("/signin", params={"next": target})
        assert form.status_code == 200
        assert "name='next' value='/signin/done'" in form.text


@pytest.mark.parametrize("target", ["/connect/gh", "/oauth/authorize?client_id=c&state=a%20b",
                                    "/signin/done"])
def test_next_keeps_paths_on_the_gateway(target: str) -> None:
    assert safe_next(target) == target


async def test_failed_sign_ins_lock_out_the_address_and_the_account(cfg) -> None:
    async with gateway_stack(cfg, secret_key="k") as site:
        client = site.client
        for _ in range(3):
            wrong = await client.post("/signin", data={"name": "alice", "password": "guess"},
                                      headers={"Origin": ORIGIN})
            assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
        locked = await client.post("/signin", data={"name": "alice",
                                                     "password": "correct-horse"},
                                   headers={"Origin": ORIGIN})
        assert locked.status_code == 429 and int(locked.headers["retry-after"]) > 0
        assert locked.json()["error"] == "too_many_requests"
        # the account is locked from other addresses too
        other = httpx.AsyncHTTPTransport(local_address="127.0.0.3")
        async with httpx.AsyncClient(base_url=site.url, transport=other) as elsewhere:
            again = await elsewhere.post("/signin", data={"name": "alice",
                                                           "password": "correct-horse"},
                                         headers={"Origin": ORIGIN})
            assert again.status_code == 429


async def test_parallel_wrong_passwords_get_at_most_the_limit_of_answers(cfg) -> None:
    """Guesses sent at once all pass the first look while their passwords are hashed; only
    the limit of them (3) is told the password was wrong, the rest are locked out."""
    async with gateway_client(cfg, secret_key="k") as client:
        answers = await asyncio.gather(*(
            client.post("/signin", data={"name": "alice", "password": f"guess-{i}"},
                        headers={"Origin": ORIGIN}) for i in range(12)))
        statuses = sorted(a.status_code for a in answers)
        assert set(statuses) <= {401, 429} and statuses.count(401) <= 3, statuses
        right = await client.post("/signin", data={"name": "alice", "password": "correct-horse"},
                                  headers={"Origin": ORIGIN})
        assert right.status_code == 429


async def _fail_three_times(client: httpx.AsyncClient, forwarded_for: str) -> None:
    for i in range(3):  # three unknown names: only the address counter reaches the limit
        wrong = await client.post("/signin", data={"name": f"nobody{i}", "password": "guess"},
                                  headers={"Origin": ORIGIN, "X-Forwarded-For": forwarded_for})
        assert wrong.status_code == 401


async def test_behind_a_trusted_proxy_the_lockout_is_the_clients_not_the_proxys(tmp_path: Path
                                                                               ) -> None:
    cfg = make_cfg(trusted_proxies=["127.0.0.1"])
    async with gateway_client(cfg, secret_key="k") as client:
        await _fail_three_times(client, "203.0.113.9")
        right = {"name": "alice", "password": "correct-horse"}
        # another client behind the same proxy signs in
        other = await client.post("/signin", data=right,
                                  headers={"Origin": ORIGIN, "X-Forwarded-For": "198.51.100.7"})
        assert other.status_code == 303, other.text
        # the attacker's own address is locked out; a hop it wrote itself does not help
        attacker = await client.post("/signin", data=right, headers={
            "Origin": ORIGIN, "X-Forwarded-For": "198.51.100.7, 203.0.113.9"})
        assert attacker.status_code == 429


async def test_without_trusted_proxies_x_forwarded_for_is_ignored(cfg) -> None:
    async with gateway_client(cfg, secret_key="k") as client:
        await _fail_three_times(client, "203.0.113.9")
        spoofed = await client.post("/signin", data={"name": "alice",
                                                      "password": "correct-horse"},
                                    headers={"Origin": ORIGIN,
                                             "X-Forwarded-For": "198.51.100.7"})
        assert spoofed.status_code == 429  # the peer address is what is locked out



async def test_a_cookie_not_of_the_issued_form_is_a_signed_out_browser(
        caplog: pytest.LogCaptureFixture) -> None:
    """On the real Redis: a cookie naming another kind of key (`u:<user id>`, the index of a
    person's sessions) answers as any bogus cookie does, signed out; it used to read that set,
    answer 503 and log a Redis outage, telling whether the user id exists (#36 item 12)."""
    accounts = Accounts(db_backends.open_database())
    alice = accounts.create_local("alice", "correct-horse", admin=True)
    cfg = from_dict({"auth": {"mode": "jwt"}, "database": {"url": db_backends.url()},
                     "state": {"url": state_backends.REDIS_URL,
                               "key_prefix": state_backends.fresh_prefix()},
                     "upstreams": [{"name": "e", "url": "http://127.0.0.1:9/mcp"}]}, env={})
    async with gateway_client(cfg, secret_key="k") as client:
        signed = await client.post("/signin", data={"name": "alice", "password": "correct-horse",
                                                    "next": "/signin/done"},
                                   headers={"Origin": ORIGIN})
        assert signed.status_code == 303  # alice has a session: her index set exists
        client.cookies.clear()
        answers = {}
        for cookie in (f"u:{alice.id}", "u:nobody", "bogus", "x" * 43 + "!"):
            headers = {"Cookie": f"tollhouse_session={cookie}"}
            page = await client.get("/console/servers", headers=headers)
            api = await client.get("/api/v1/me", headers=headers)
            answers[cookie] = (page.status_code, page.headers.get("location"),
                               api.status_code, api.text)
        assert set(answers.values()) == {(303, "/signin?next=%2Fconsole%2Fservers", 401,
                                          '{"detail":"not signed in"}')}, answers
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
