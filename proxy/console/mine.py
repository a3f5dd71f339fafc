"""Every signed-in person's pages: their connections to per_user upstreams, their own API
keys (/api/v1/me/keys) and "connect a client" for each endpoint they may use."""

from __future__ import annotations

from quart import Response, request

from proxy.console import clients
from proxy.console.api import call
from proxy.console.render import after, render
from proxy.people.accounts import User
from proxy.people.signin import Web
from proxy.web.paths import segment

CONNECT_PAGE = 10


async def home(web: Web, user: User) -> Response:
    keys = await call(web, "GET", "/me/keys")
    return await render("home.html", user,
                        endpoints=keys.body.get("endpoints", []) if keys.ok else [])


async def connections(web: Web, user: User) -> Response:
    answer = await call(web, "GET", "/me/connections")
    items = answer.body.get("items", []) if answer.ok else []
    return await render("connections.html", user, items=items)


async def disconnect(web: Web, user: User, upstream: str) -> Response:
    answer = await call(web, "DELETE", f"/me/connections/{segment(upstream)}")
    return await after(answer, user, "/console/me/connections", "disconnected")


async def my_keys(web: Web, user: User, created: dict[str, object] | None = None,
                  status: int = 200) -> Response:
    answer = await call(web, "GET", "/me/keys")
    body = answer.body if answer.ok else {}
    return await render("keys.html", user, status, keys=body.get("items", []),
                        endpoints=body.get("endpoints", []), created=created, who={},
                        action="/console/me/keys", own=True)


async def connect_client(web: Web, user: User) -> Response:
    """Every endpoint the person may use, a page of CONNECT_PAGE at a time (by name)."""
    answer = await call(web, "GET", "/me/keys")
    names = answer.body.get("endpoints", []) if answer.ok else []
    shown = request.args.get("endpoint")
    if shown in names:
        names = [shown]
    page = request.args.get("page", "1")
    at = int(page) - 1 if page.isdigit() and 0 < len(page) < 7 and int(page) > 0 else 0
    endpoints = [(name, f"{web.public_url}/mcp/{segment(name)}",
                  clients.configs(name, f"{web.public_url}/mcp/{segment(name)}"))
                 for name in names[at * CONNECT_PAGE:(at + 1) * CONNECT_PAGE]]
    return await render("connect.html", user, endpoints=endpoints, page=at + 1,
                        more=len(names) > (at + 1) * CONNECT_PAGE, total=len(names))
