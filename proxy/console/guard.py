"""What every /console/ response and change passes: the person signed in (else 303 to
/signin?next=...), administrators only on the administrators' pages (auditors too on those
they may read), no change at all by an auditor, a CSRF token and this gateway's Origin on every
POST, and the headers (a strict CSP with no inline script or style,
no framing, no caching, no sniffing)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any, Literal
from urllib.parse import urlencode

from quart import Response, render_template, request

from proxy.people.accounts import User
from proxy.people.signin import COOKIE, Web, see_other

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Frame-Options": "DENY",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
           "Cache-Control": "no-store"}
View = Callable[..., Awaitable[Any]]
# who may see a page: administrators; administrators and auditors; anyone signed in
Who = Literal["admin", "auditor", "anyone"]


def secure(response: Response) -> Response:
    """Every response under /console/ (pages, redirects, errors, static files)."""
    for name, value in HEADERS.items():
        if name == "Cache-Control" and request.path.startswith("/console/static/"):
            continue
        response.headers[name] = value
    return response


def csrf_token(cookie: str) -> str:
    """Bound to the browser session: a page of another site cannot read it, and a new sign-in
    makes a new one. (The session id is unguessable and HttpOnly; this is a one-way digest.)"""
    return hmac.new(b"tollhouse console csrf", cookie.encode(), hashlib.sha256).hexdigest()


async def refuse(web: Web, status: int, title: str, message: str,
                 user: User | None = None) -> Response:
    body = await render_template("message.html", title=title, message=message, me=user,
                                 csrf=csrf_token(request.cookies.get(COOKIE, "")))
    return Response(body, status, {"Content-Type": "text/html; charset=utf-8"})


def allowed(user: User, who: Who) -> bool:
    """Whether `user` may see a page for `who` (a change is refused to an auditor anyway)."""
    if who == "admin":
        return user.is_admin
    if who == "auditor":
        return user.is_admin or user.is_auditor
    return True


def page(web_of: Callable[[], Web], *, who: Who) -> Callable[[View], View]:
    """A console view: signed in (and one of `who`); a POST also needs this gateway's Origin
    (or Referer) and the session's CSRF token, and is refused to an auditor who is not an
    administrator. The view gets the user."""

    def wrap(view: View) -> View:
        @wraps(view)
        async def guarded(**path: Any) -> Any:
            web = web_of()
            cookie = request.cookies.get(COOKIE)
            user = await web.user(cookie) if cookie else None
            if user is None or cookie is None:
                target = request.full_path.rstrip("?") if request.method == "GET" \
                    else "/console/"
                return see_other("/signin?" + urlencode({"next": target}))
            if request.method == "POST" and user.reads_only:  # whatever the page
                return await refuse(web, 403, "Auditors change nothing",
                                    "An auditor's account reads the audit evidence and "
                                    "changes nothing.", user)
            if not allowed(user, who):
                return await refuse(web, 403, "Administrators only",
                                    "This page is for the gateway's administrators.", user)
            if request.method == "POST":
                form = await request.form
                if not web.same_origin(request.headers):
                    return await refuse(web, 403, "Forbidden",
                                        "This form must be sent from this gateway.", user)
                if not hmac.compare_digest(form.get("csrf", ""), csrf_token(cookie)):
                    return await refuse(web, 403, "Forbidden",
                                        "The form expired: reload the page and try again.",
                                        user)
            return await view(user, **path)

        return guarded

    return wrap
