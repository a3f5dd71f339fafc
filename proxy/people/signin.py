"""Sign-in and sign-out pages for people (no JavaScript needed), and the browser session cookie.

The cookie names a server-side session (HttpOnly, SameSite=Lax, Secure when the gateway's public
URL is https). A cookie-authenticated request that changes state must carry an Origin, or else a
Referer, of this gateway: anything else is 403 (seed 004).
"""

from __future__ import annotations

import asyncio
import html
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from quart import Quart, Response, request

from proxy.auth.lockout import Attempt
from proxy.auth.peer import client_address
from proxy.destinations import IPNetwork
from proxy.people.accounts import Accounts, User
from proxy.state.browser import BrowserSessions
from proxy.state.flows import FlowStore
from proxy.state.lockouts import LockoutStore

COOKIE = "tollhouse_session"


@dataclass
class Web:
    """What the browser-facing routes share."""

    accounts: Accounts
    sessions: BrowserSessions
    lockouts: LockoutStore
    public_url: str
    clock: Callable[[], float] = time.monotonic
    oidc_enabled: bool = False
    # server.trusted_proxies: behind one of them the client is the nearest untrusted
    # X-Forwarded-For hop; without any, X-Forwarded-For is never read
    trusted_proxies: tuple[IPNetwork, ...] = ()
    # pending OIDC sign-ins (proxy.people.oidc), between the redirect and the provider's callback
    signin_flows: FlowStore = field(kw_only=True)

    def client_address(self, remote_addr: str | None, headers: Any) -> str:
        return client_address(remote_addr, headers, self.trusted_proxies)

    @property
    def secure(self) -> bool:
        return self.public_url.startswith("https://")

    @property
    def origin(self) -> str:
        parts = urlsplit(self.public_url)
        return f"{parts.scheme}://{parts.netloc}".lower()

    def same_origin(self, headers: Any) -> bool:
        """A state-changing browser request came from one of our own pages."""
        origin = headers.get("Origin")
        if origin:
            return bool(origin.rstrip("/").lower() == self.origin)
        referer = headers.get("Referer")
        if referer:
            parts = urlsplit(referer)
            return f"{parts.scheme}://{parts.netloc}".lower() == self.origin
        return False

    async def user(self, cookie: str | None) -> User | None:
        if not cookie:
            return None
        user_id = await self.sessions.user_id(cookie)
        if user_id is None:
            return None
        user = await asyncio.to_thread(self.accounts.get, user_id)
        return user if user is not None and user.active else None  # deprovisioned: nobody

    async def sign_in(self, user: User, next_url: str) -> Response:
        session_id = await self.sessions.create(user.id)
        response = see_other(safe_next(next_url))
        response.set_cookie(COOKIE, session_id, httponly=True, samesite="Lax",
                            secure=self.secure, path="/")
        return response


def see_other(location: str, status: int = 303) -> Response:
    return Response(b"", status, {"Location": location, "Cache-Control": "no-store"})


DEFAULT_NEXT = "/signin/done"


def safe_next(value: str | None) -> str:
    """Only a path on this gateway: never an open redirect. Browsers drop tabs and newlines
    from a URL and read a backslash as a slash (`/\t/evil.example` becomes `//evil.example`),
    and a control character would break the Location header: any of them, any whitespace or
    other character outside visible ASCII, a backslash, a scheme or a host sends the person to
    the default page instead."""
    if not value or not value.startswith("/") or value.startswith(("//", "/\\")):
        return DEFAULT_NEXT
    # visible ASCII only: no whitespace, no control character, nothing a header cannot carry
    if "\\" in value or not all("!" <= c <= "~" for c in value):
        return DEFAULT_NEXT
    try:
        parts = urlsplit(value)
    except ValueError:
        return DEFAULT_NEXT
    if parts.scheme or parts.netloc:
        return DEFAULT_NEXT
    return value


def page(title: str, body: str, status: int = 200) -> Response:
    """A sign-in, consent or connect page, in the console's look (its one stylesheet,
    proxy/console/static/console.css: no inline style)."""
    document = (f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
                "<meta name='viewport' content='width=device-width, initial-scale=1'>"
                f"<title>{html.escape(title)}</title>"
                "<link rel='stylesheet' href='/console/static/console.css'></head>"
                "<body class='plain'><header class='top'><span class='brand'>Tollhouse</span>"
                f"</header><main><h1>{html.escape(title)}</h1>{body}</main></body></html>")
    return Response(document, status, {"Content-Type": "text/html; charset=utf-8",
                                       "Cache-Control": "no-store",
                                       "X-Frame-Options": "DENY",
                                       "Content-Security-Policy": "default-src 'none'; "
                                       "form-action 'self' *; style-src 'self'; "
                                       "frame-ancestors 'none'"})


def _form(next_url: str, error: str = "", oidc: bool = False) -> str:
    notice = f"<p role='alert'>{html.escape(error)}</p>" if error else ""
    federated = (f"<p><a href='/signin/oidc?next={html.escape(next_url, quote=True)}'>"
                 "Sign in with your organization</a></p>") if oidc else ""
    return (f"{notice}<form method='post' action='/signin'>"
            f"<input type='hidden' name='next' value='{html.escape(next_url, quote=True)}'>"
            "<p><label>Name <input name='name' autocomplete='username' required></label></p>"
            "<p><label>Password <input type='password' name='password' "
            "autocomplete='current-password' required></label></p>"
            f"<p><button type='submit'>Sign in</button></p></form>{federated}")


def register(app: Quart, web: Web) -> None:
    """The sign-in and sign-out pages, over `web` (bound to each handler)."""
    app.add_url_rule("/signin", "signin_page", partial(signin_page, web), methods=["GET"])
    app.add_url_rule("/signin", "signin_post", partial(signin_post, web), methods=["POST"])
    app.add_url_rule("/signout", "signout", partial(signout, web), methods=["POST"])
    app.add_url_rule("/signout", "signout_page", signout_page, methods=["GET"])
    app.add_url_rule("/signin/done", "signed_in", partial(signed_in, web))


async def signin_page(w: Web) -> Response:
    return page("Sign in to Tollhouse", _form(safe_next(request.args.get("next")),
                                              oidc=w.oidc_enabled))


async def signin_post(w: Web) -> Response:
    if not w.same_origin(request.headers):
        return page("Forbidden", "<p>This form must be sent from this gateway.</p>", 403)
    form = await request.form
    name, password = form.get("name", ""), form.get("password", "")
    next_url = safe_next(form.get("next"))
    peer = w.client_address(request.remote_addr, request.headers)
    watch = (f"signin-ip:{peer}", f"signin-user:{name[:100]}")
    async with Attempt(w.lockouts, watch, "signin: locked out after repeated failures") \
            as attempt:  # locked out: LockedOut, answered by the app's error handler
        user = await asyncio.to_thread(w.accounts.verify_local, name, password)
        attempt.failed = user is None
    if user is None:
        return page("Sign in to Tollhouse",
                    _form(next_url, "Wrong name or password.", w.oidc_enabled), 401)
    return await w.sign_in(user, next_url)


async def signout(w: Web) -> Response:
    if not w.same_origin(request.headers):
        return page("Forbidden", "<p>This form must be sent from this gateway.</p>", 403)
    cookie = request.cookies.get(COOKIE)
    if cookie:
        await w.sessions.delete(cookie)
    response = see_other("/signin")
    response.delete_cookie(COOKIE, path="/")
    return response


async def signout_page() -> Response:
    return page("Sign out", "<form method='post' action='/signout'>"
                            "<button type='submit'>Sign out</button></form>")


async def signed_in(w: Web) -> Response:
    user = await w.user(request.cookies.get(COOKIE))
    if user is None:
        return see_other("/signin")
    return page("Signed in", f"<p>You are signed in as {html.escape(user.name)}.</p>"
                             "<form method='post' action='/signout'>"
                             "<button type='submit'>Sign out</button></form>")


