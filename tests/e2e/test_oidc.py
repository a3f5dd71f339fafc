"""Federated sign-in end to end: the gateway and a local OpenID provider on loopback, a browser
played by hand with httpx (each browser its own cookie jar, every redirect followed explicitly).
The happy path, the same principal on a second sign-in, admin by group, and the attacks: a state
missing, unknown, replayed or carried into another browser, an injected code (PKCE), a bad ID
token of every kind, and the provider down."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx
import pytest
from quart import Quart

from proxy.config import LockoutConfig, OidcConfig
from proxy.people import oidc, signin
from proxy.people.accounts import Accounts, User
from proxy.people.signin import COOKIE, Web
from proxy.state.browser import MemoryBrowserSessions
from proxy.state.flows import MemoryFlowStore
from proxy.state.lockouts import MemoryLockoutStore
from tests import db_backends
from tests.e2e.oidc_provider import OidcProvider, running_provider
from tests.helpers import Clock
from tests.servers import serve

ADMINS = "tollhouse-admins"


@dataclass
class Stack:
    gateway: str
    provider: OidcProvider
    accounts: Accounts
    clock: Clock
    exits: AsyncExitStack
    browsers: list[httpx.AsyncClient] = field(default_factory=list)

    async def browser(self) -> httpx.AsyncClient:
        client = httpx.AsyncClient(follow_redirects=False, trust_env=False, timeout=10)
        await self.exits.enter_async_context(client)
        return client

    async def start(self, browser: httpx.AsyncClient, next_url: str = "/signin/done") -> str:
        """The gateway sends the browser to the provider; the provider's URL."""
        response = await browser.get(f"{self.gateway}/signin/oidc", params={"next": next_url})
        assert response.status_code == 303, response.text
        location = response.headers["location"]
        assert location.startswith(f"{self.provider.base}/authorize?")
        return location

    async def authorize(self, browser: httpx.AsyncClient, url: str) -> str:
        """The provider signs the test identity in and sends the browser back; that URL."""
        response = await browser.get(url)
        assert response.status_code == 302, response.text
        location = response.headers["location"]
        assert location.startswith(f"{self.gateway}/signin/oidc/callback?")
        return location

    async def callback_url(self, browser: httpx.AsyncClient, next_url: str = "/signin/done"
                           ) -> str:
        return await self.authorize(browser, await self.start(browser, next_url))

    async def sign_in(self, browser: httpx.AsyncClient, next_url: str = "/signin/done"
                      ) -> httpx.Response:
        """The whole flow; the callback's response (a 303 on success)."""
        return await browser.get(await self.callback_url(browser, next_url))

    def users(self) -> list[User]:
        return self.accounts.list()


@contextmanager
def closed_port() -> Iterator[str]:
    """A loopback address that refuses connections (bound, never listening)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


@asynccontextmanager
async def oidc_stack(tmp_path: Path, provider: OidcProvider | None = None,
                     issuer: str | None = None, **oidc_cfg: Any) -> AsyncIterator[Stack]:
    """The provider and a gateway with sign-in and OIDC sign-in on loopback.

    Only the browser-facing part of the app, with an injected clock and the provider's knobs:
    `signin.register` and `oidc.register` over one `Web`, as create_app wires them (the last
    test goes through create_app itself). The routes are added once the server has its port
    (so the redirect URI is known) and before any request."""
    provider = provider or OidcProvider()
    async with AsyncExitStack() as exits:
        url = issuer or await exits.enter_async_context(running_provider(provider))
        cfg = OidcConfig(**{"issuer": url, "client_id": provider.client_id,
                            "client_secret": provider.client_secret, "admin_group": ADMINS,
                            "scopes": ["openid", "profile", "email", "groups"], **oidc_cfg})
        http = await exits.enter_async_context(httpx.AsyncClient(trust_env=False))
        clock = Clock()
        accounts = Accounts(db_backends.open_database())
        app = Quart("tollhouse-oidc-test")
        gateway = await exits.enter_async_context(serve(app, graceful_timeout=1))
        web = Web(accounts, MemoryBrowserSessions(clock=clock),
                  MemoryLockoutStore(LockoutConfig(), clock), gateway, clock, oidc_enabled=True,
                  signin_flows=MemoryFlowStore(clock=clock))
        signin.register(app, web)
        oidc.register(app, lambda: web, cfg, lambda: http, gateway)
        provider.redirect_uris = {f"{gateway}/signin/oidc/callback"}
        yield Stack(gateway, provider, accounts, clock, exits)


def set_cookies(response: httpx.Response) -> list[str]:
    return response.headers.get_list("set-cookie")


def refused(response: httpx.Response, status: int, words: str, stack: Stack) -> None:
    """A plain failure page: the status, what failed, no session, no token or secret shown."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("text/html")
    assert words in response.text
    assert not any(c.startswith(f"{COOKIE}=") for c in set_cookies(response))
    for secret in [*stack.provider.issued, stack.provider.client_secret]:
        assert secret not in response.text


# the happy path


async def test_first_sign_in_creates_the_user_and_a_session(tmp_path: Path) -> None:
    async with oidc_stack(tmp_path) as s:
        browser = await s.browser()
        response = await browser.get(f"{s.gateway}/signin/oidc", params={"next": "/signin/done"})
        assert response.status_code == 303
        [binding] = set_cookies(response)
        assert binding.startswith("tollhouse_oidc=")
        attributes = {a.strip().lower() for a in binding.split(";")[1:]}
        assert {"httponly", "samesite=lax", "path=/signin/oidc", "max-age=600"} <= attributes
        assert "secure" not in attributes  # the gateway is plain http here
        to_provider = urlsplit(response.headers["location"])
        params = {k: v[0] for k, v in parse_qs(to_provider.query).items()}
        assert params["response_type"] == "code"
        assert params["client_id"] == s.provider.client_id
        assert params["redirect_uri"] == f"{s.gateway}/signin/oidc/callback"
        assert params["scope"] == "openid profile email groups"
        assert params["code_challenge_method"] == "S256"
        assert len(params["code_challenge"]) == 43
        assert len(params["state"]) >= 43 and len(params["nonce"]) >= 43

        back = await s.authorize(browser, response.headers["location"])
        assert parse_qs(urlsplit(back).query)["state"] == [params["state"]]
        response = await browser.get(back)
        assert response.status_code == 303
        assert response.headers["location"] == "/signin/done"
        [session] = [c for c in set_cookies(response) if c.startswith(f"{COOKIE}=")]
        assert "httponly" in session.lower() and "samesite=lax" in session.lower()
        assert s.provider.refusals == []
        assert s.provider.client_auth_used == ["client_secret_basic"]

        done = await browser.get(urljoin(s.gateway, response.headers["location"]))
        assert done.status_code == 200
        assert "You are signed in as ada." in done.text

        [user] = s.users()
        assert (user.name, user.issuer, user.subject) == ("ada", s.provider.base, "user-123")
        assert user.groups == frozenset({"staff"}) and not user.is_admin
        principal = user.principal()  # the same principal an external JWT from this IdP maps to
        assert (principal.issuer, principal.subject) == (s.provider.base, "user-123")


async def test_a_second_sign_in_is_the_same_user_and_follows_the_groups(tmp_path: Path) -> None:
    async with oidc_stack(tmp_path) as s:
        first = await s.browser()
        assert (await s.sign_in(first)).status_code == 303
        [user] = s.users()
        assert not user.is_admin

        s.provider.sign_in_as("user-123", "ada", [ADMINS, "staff"])
        second = await s.browser()
        assert (await s.sign_in(second)).status_code == 303
        [again] = s.users()
        assert again.id == user.id and again.name == "ada"
        assert again.is_admin and again.groups == frozenset({ADMINS, "staff"})

        s.provider.sign_in_as("user-123", "ada", "staff")  # a space-separated string
        assert (await s.sign_in(second)).status_code == 303
        [demoted] = s.users()
        assert demoted.id == user.id and not demoted.is_admin
        assert demoted.groups == frozenset({"staff"})
        assert s.provider.hits["discovery"] == 1  # discovery is cached
        assert s.provider.hits["jwks"] == 1


async def test_admin_by_group_and_names_falling_back(tmp_path: Path) -> None:
    async with oidc_stack(tmp_path) as s:
        s.provider.sign_in_as("root-1", "root", f"ops {ADMINS}")
        assert (await s.sign_in(await s.browser())).status_code == 303
        s.provider.sign_in_as("mail-2", email="bo@example.test", groups=[ADMINS + "-not"])
        assert (await s.sign_in(await s.browser())).status_code == 303
        s.provider.sign_in_as("bare-3")
        assert (await s.sign_in(await s.browser())).status_code == 303
        users = {u.subject: u for u in s.users()}
        assert users["root-1"].is_admin and users["root-1"].groups == {"ops", ADMINS}
        assert (users["mail-2"].name, users["mail-2"].is_admin) == ("bo@example.test", False)
        assert (users["bare-3"].name, users["bare-3"].groups) == ("bare-3", frozenset())


async def test_no_admin_group_configured_means_no_admin(tmp_path: Path) -> None:
    async with oidc_stack(tmp_path, admin_group="") as s:
        s.provider.sign_in_as("root-1", "root", [ADMINS])
        assert (await s.sign_in(await s.browser())).status_code == 303
        [user] = s.users()
        assert not user.is_admin


async def test_next_is_kept_and_never_leaves_the_gateway(tmp_path: Path) -> None:
    async with oidc_stack(tmp_path) as s:
        browser = await s.browser()
        response = await s.sign_in(browser, "/admin/users?page=2")
        assert response.headers["location"] == "/admin/users?page=2"
        for target in ("//evil.example/steal", "/\t/evil.example", "/\n/evil.example",
                       "/\\evil.example", "https://evil.example/"):
            response = await s.sign_in(browser, target)
            assert response.headers["location"] == "/signin/done", target


async def test_the_sign_in_page_offers_the_provider_without_javascript(tmp_path: Path) -> None:
    async with oidc_stack(tmp_path) as s:
        browser = await s.browser()
        response = await browser.get(f"{s.gateway}/signin", params={"next": "/x"})
        assert "href='/signin/oidc?next=/x'" in response.text
        assert "<script" not in response.text


async def test_client_secret_post_when_the_provider_only_takes_that(tmp_path: Path) -> None:
    provider = OidcProvider(auth_methods=("client_secret_post",))
    async with oidc_stack(tmp_path, provider) as s:
        assert (await s.sign_in(await s.browser())).status_code == 303
        assert s.provider.client_auth_used == ["client_secret_post"]


async def test_two_tabs_in_one_browser_both_finish(tmp_path: Path) -> None:
    async with oidc_stack(tmp_path) as s:
        browser = await s.browser()
        first = await s.callback_url(browser)
        second = await s.callback_url(browser)
        assert (await browser.get(second)).status_code == 303
        assert (await browser.get(first)).status_code == 303


# the state


async def test_state_missing_unknown_or_replayed_is_refused(tmp_path: Path) -> None:
    async with oidc_stack(tmp_path) as s:
        browser = await s.browser()
        await s.start(browser)  # the browser holds a binding cookie
        response = await browser.get(f"{s.gateway}/signin/oidc/callback?code=abc")
        refused(response, 400, "no state", s)
        response = await browser.get(f"{s.gateway}/signin/oidc/callback?code=abc&state=made-up")
        refused(response, 400, "unknown, has expired or was already used", s)

        back = await s.callback_url(browser)
        assert (await browser.head(back)).status_code == 200  # a prefetch does not use it up
        assert (await browser.get(back)).status_code == 303
        replay = await browser.get(back)
        refused(replay, 400, "unknown, has expired or was already used", s)
        assert s.provider.hits["token"] == 1  # the replay never reached the provider


async def test_a_state_carried_into_another_browser_is_refused(tmp_path: Path) -> None:
    async with oidc_stack(tmp_path) as s:
        victim, attacker = await s.browser(), await s.browser()
        back = await s.callback_url(attacker)  # login CSRF: the attacker's own code and state
        refused(await victim.get(back), 400, "started in another browser", s)
        await s.start(victim)  # with a binding cookie of its own it is still refused
        refused(await victim.get(back), 400, "started in another browser", s)
        assert s.users() == [] and s.provider.hits["token"] == 0
        assert (await attacker.get(back)).status_code == 303  # the starter can still finish


async def test_a_flow_expires_after_ten_minutes(tmp_path: Path) -> None:
    async with oidc_stack(tmp_path) as s:
        browser = await s.browser()
        back = await s.callback_url(browser)
        s.clock.advance(601)
        refused(await browser.get(back), 400, "has expired", s)


async def test_an_injected_code_fails_pkce_at_the_provider(tmp_path: Path) -> None:
    async with oidc_stack(tmp_path) as s:
        victim, attacker = await s.browser(), await s.browser()
        stolen = parse_qs(urlsplit(await s.callback_url(victim)).query)["code"][0]
        own = urlsplit(await s.callback_url(attacker))
        state = parse_qs(own.query)["state"][0]
        response = await attacker.get(f"{s.gateway}/signin/oidc/callback",
                                      params={"code": stolen, "state": state})
        refused(response, 400, "refused to complete the sign-in (invalid_grant)", s)
        assert s.provider.refusals == ["pkce"]
        assert s.users() == []
        assert len(set(s.provider.challenges)) == 2  # a fresh verifier per sign-in


async def test_the_provider_refusing_the_sign_in(tmp_path: Path) -> None:
    async with oidc_stack(tmp_path) as s:
        s.provider.deny = True
        browser = await s.browser()
        refused(await s.sign_in(browser), 400, "did not sign you in (access_denied)", s)
        url = urlsplit(await s.authorize(browser, await s.start(browser)))
        state = parse_qs(url.query)["state"][0]
        response = await browser.get(f"{s.gateway}/signin/oidc/callback", params={
            "state": state, "error": "<script>alert(1)</script>"})
        refused(response, 400, "(unspecified)", s)  # the provider's free text is never shown
        assert "<script>" not in response.text


async def test_a_wrong_client_secret_is_refused_by_the_provider(tmp_path: Path) -> None:
    async with oidc_stack(tmp_path, client_secret="not-the-secret") as s:
        refused(await s.sign_in(await s.browser()), 400, "(invalid_client)", s)
        assert s.provider.refusals == ["client"]


# the ID token


@pytest.mark.parametrize(("knob", "value", "words"), [
    ("wrong_aud", True, "not issued for this gateway (audience)"),
    ("wrong_iss", True, "comes from another issuer"),
    ("wrong_nonce", True, "does not belong to this sign-in (nonce)"),
    ("expired", True, "has expired"),
    ("unknown_key", True, "a key the identity provider does not publish"),
    ("forged_signature", True, "signature does not verify"),
    ("alg", "none", "an algorithm this gateway does not accept"),
    ("alg", "HS256", "an algorithm this gateway does not accept"),
])
async def test_a_bad_id_token_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                         knob: str, value: object, words: str) -> None:
    caplog.set_level(logging.DEBUG)
    async with oidc_stack(tmp_path) as s:
        setattr(s.provider, knob, value)
        browser = await s.browser()
        refused(await s.sign_in(browser), 400, words, s)
        assert browser.cookies.get(COOKIE) is None
        assert s.users() == []
        assert s.provider.refusals == []  # the provider gave the token; the gateway refused it
        # everything logged, but the test browser's own request lines (its callback URL
        # carries the code, as a browser's address bar does)
        logged = "\n".join(r.getMessage() for r in caplog.records
                           if "/signin/oidc/callback?" not in r.getMessage())
        assert words in logged
        for secret in [*s.provider.issued, s.provider.client_secret]:
            assert secret not in logged


# the provider down


async def test_an_unreachable_provider_is_a_502(tmp_path: Path) -> None:
    with closed_port() as nowhere:
        async with oidc_stack(tmp_path, issuer=nowhere) as s:
            response = await (await s.browser()).get(f"{s.gateway}/signin/oidc")
            refused(response, 502, "could not be reached", s)
            assert not set_cookies(response)


async def test_a_provider_failing_at_the_token_endpoint_is_a_502(tmp_path: Path) -> None:
    async with oidc_stack(tmp_path) as s:
        s.provider.token_status = 503
        refused(await s.sign_in(await s.browser()), 502, "failed to complete the sign-in", s)


async def test_a_provider_gone_before_the_code_exchange_is_a_502(tmp_path: Path) -> None:
    provider = OidcProvider()
    async with AsyncExitStack() as provider_running:
        url = await provider_running.enter_async_context(running_provider(provider))
        async with oidc_stack(tmp_path, provider, issuer=url) as s:
            browser = await s.browser()
            back = await s.callback_url(browser)
            await provider_running.aclose()  # the provider stops; its port refuses
            refused(await browser.get(back), 502, "could not be reached to finish", s)
            assert s.users() == []


async def test_create_app_wires_oidc_sign_in(tmp_path: Path) -> None:
    """The same flow through the real app factory: [auth.oidc] in the config is all it takes."""
    from tests.stack import Urls, gateway_stack

    provider = OidcProvider()

    def config(urls: Urls) -> dict[str, Any]:
        provider.redirect_uris = {f"{urls.gateway}/signin/oidc/callback"}
        return {
            "server": {"public_url": urls.gateway},
            "auth": {"mode": "jwt", "oidc": {"issuer": issuer, "client_id": provider.client_id,
                                              "client_secret": provider.client_secret,
                                              "admin_group": ADMINS}},
            "database": {"url": db_backends.url()}, "state": {"url": "memory"},
            "upstreams": [{"name": "e", "url": "http://127.0.0.1:9/mcp"}]}

    async with running_provider(provider) as issuer, gateway_stack(config) as site, \
            httpx.AsyncClient(follow_redirects=False, trust_env=False) as browser:
        url = site.url
        start = await browser.get(f"{url}/signin/oidc", params={"next": "/signin/done"})
        assert start.status_code == 303
        back = (await browser.get(start.headers["location"])).headers["location"]
        done = await browser.get(back)
        assert done.status_code == 303 and done.headers["location"] == "/signin/done"
        page = await browser.get(f"{url}/signin/done")
        assert "You are signed in as ada." in page.text
        [user] = Accounts(db_backends.open_database()).list()
        assert (user.issuer, user.subject) == (provider.base, "user-123")
