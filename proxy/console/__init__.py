"""The web console at /console/: server-rendered pages over /api/v1 (proxy.console.api), for
administrators (proxy.console.admin) and for every signed-in person (proxy.console.mine).
Static files (the stylesheet the sign-in, consent and connect pages share, and a small
script) are shipped in this package; nothing is built or fetched from elsewhere."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from quart import Blueprint, Quart, Response, request

from proxy.console import admin, approvals, evidence, mine, names, people, policies, records, times
from proxy.console.guard import Who, page, secure
from proxy.people.accounts import User
from proxy.people.signin import Web
from proxy.web.paths import segment

STYLESHEET = "/console/static/console.css"


def _bind(view: Callable[..., Awaitable[Response]], web: Web
          ) -> Callable[..., Awaitable[Response]]:
    async def bound(user: User, **path: Any) -> Response:
        return await view(web, user, **path)

    bound.__name__ = view.__name__
    return bound


async def _home(web: Web, user: User) -> Response:
    if user.is_admin or user.is_auditor:  # the overview reads aggregates an auditor may read
        return await admin.overview(web, user)
    return await mine.home(web, user)


def _timestamp(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(ts)))


async def _headers(response: Response) -> Response:
    return secure(response) if request.path == "/console" or \
        request.path.startswith("/console/") else response


def _named(view: Callable[..., Awaitable[Response]], name: str
           ) -> Callable[..., Awaitable[Response]]:
    async def named(web: Web, user: User, **path: Any) -> Response:
        return await view(web, user, **path)

    named.__name__ = name
    return named


# (rule, method, view, who may see it: "admin", "auditor" (administrators and auditors) or
# "anyone" signed in; an auditor changes nothing, whatever the page)
PAGES: tuple[tuple[str, str, Callable[..., Awaitable[Response]], Who], ...] = (
    ("/", "GET", _home, "anyone"),
    ("/servers", "GET", admin.servers, "admin"),
    ("/servers", "POST", admin.create_server, "admin"),
    ("/servers/<name>", "GET", admin.server, "admin"),
    ("/servers/<name>", "POST", admin.change_server, "admin"),
    ("/servers/<name>/delete", "POST", admin.delete_server, "admin"),
    ("/servers/<name>/groups", "POST", admin.restrict_group, "admin"),
    ("/policies", "GET", policies.policies, "auditor"),
    ("/keys", "GET", admin.keys, "admin"),
    ("/keys", "POST", _named(partial(admin.make_key, api_path="/keys", admin=True,
                                     listing=admin.keys), "create_key"), "admin"),
    ("/keys/<key_id>/revoke", "POST",
     _named(partial(admin.revoke_at, api_path="/keys"), "revoke_key"), "admin"),
    ("/users", "GET", people.users, "admin"),
    ("/users", "POST", people.create_user, "admin"),
    ("/users/<name>", "GET", people.person, "admin"),
    ("/users/<name>", "POST", people.change_user, "admin"),
    ("/users/<name>/delete", "POST", people.delete_user, "admin"),
    ("/users/<name>/keys/revoke", "POST", people.revoke_keys, "admin"),
    ("/users/<name>/sessions/end", "POST", people.end_sessions, "admin"),
    ("/roles", "POST", admin.create_role, "admin"),
    ("/roles/<name>/delete", "POST", admin.delete_role, "admin"),
    ("/audit", "GET", records.audit, "auditor"),
    ("/audit/<int:record_id>", "GET", records.audit_record, "auditor"),
    ("/usage", "GET", records.usage, "auditor"),
    ("/evidence", "GET", evidence.evidence, "auditor"),
    ("/me/connections", "GET", mine.connections, "anyone"),
    ("/me/connections/<upstream>/disconnect", "POST", mine.disconnect, "anyone"),
    ("/me/keys", "GET", mine.my_keys, "anyone"),
    ("/me/keys", "POST", _named(partial(admin.make_key, api_path="/me/keys", admin=False,
                                        listing=mine.my_keys), "create_my_key"), "anyone"),
    ("/me/keys/<key_id>/revoke", "POST",
     _named(partial(admin.revoke_at, api_path="/me/keys"), "revoke_my_key"), "anyone"),
    ("/me/connect", "GET", mine.connect_client, "anyone"),
    # calls held for a person's yes: /api/v1/approvals decides who sees and decides which
    ("/approvals", "GET", approvals.approvals, "anyone"),
    ("/approvals/<approval_id>", "GET", approvals.approval, "anyone"),
    ("/approvals/<approval_id>/approve", "POST", approvals.approve, "anyone"),
    ("/approvals/<approval_id>/deny", "POST", approvals.deny, "anyone"),
)


def register(app: Quart, web: Web) -> None:
    bp = Blueprint("console", __name__, url_prefix="/console", template_folder="templates",
                   static_folder="static", static_url_path="/static")
    for rule, method, view, who in PAGES:
        endpoint = f"{view.__name__}_{method.lower()}"
        bp.add_url_rule(rule, endpoint, page(lambda: web, who=who)(_bind(view, web)),
                        methods=[method])
    bp.add_app_template_filter(_timestamp, "timestamp")
    bp.add_app_template_filter(times.iso, "iso")
    bp.add_app_template_global(names.detail, "detail")  # a principal's issuer or id
    bp.add_app_template_filter(segment, "segment")  # every name in a URL the pages build
    app.register_blueprint(bp)
    app.after_request(_headers)  # every answer under /console/, a 404 or 405 too

    async def bare() -> Response:
        return Response(b"", 308, {"Location": "/console/"})

    app.add_url_rule("/console", "console_bare", bare)
