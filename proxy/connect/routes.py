"""The connect pages and the person's connections: /connect/<upstream>, its callback,
/connections, and /api/v1/me/connections (cookie-authenticated; a change must come from this
gateway's own pages)."""

from __future__ import annotations

import html
import logging
from collections.abc import Callable
from urllib.parse import urlencode

import orjson
from quart import Quart, Response, request

from proxy.accounts import User
from proxy.connect.manager import ConnectFailed, Connections
from proxy.errors import GatewayError
from proxy.signin import COOKIE, Web, page, see_other

JSON = {"Content-Type": "application/json", "Cache-Control": "no-store"}
log = logging.getLogger("tollhouse.connect")


def _detail(message: str, status: int) -> Response:
    return Response(orjson.dumps({"detail": message}), status, JSON)


def _unreachable(upstream: str, exc: GatewayError, title: str = "Cannot connect") -> Response:
    """One message whatever went wrong on the way to the authorization server: refused by
    the egress policy, unresolvable or unreachable would tell which addresses answer."""
    log.info("connect %s: %s", upstream, exc)
    return page(title, f"<p>Tollhouse could not reach the authorization server of "
                       f"{html.escape(upstream)}. Try again later, or ask your "
                       "administrator.</p>", 502)


def register(app: Quart, connections: Callable[[], Connections], web: Callable[[], Web]) -> None:
    async def signed_in() -> tuple[User | None, str | None]:
        cookie = request.cookies.get(COOKIE)
        return await web().user(cookie), cookie

    @app.route("/connect/<upstream>")
    async def connect(upstream: str) -> Response:
        c = connections()
        if upstream not in c.upstreams:
            return page("Not found", "<p>No upstream by that name needs a connection.</p>", 404)
        user, cookie = await signed_in()
        if user is None or cookie is None:
            return see_other("/signin?" + urlencode({"next": f"/connect/{upstream}"}))
        if request.args.get("start") != "1":
            body = (f"<p>Connect your <strong>{html.escape(upstream)}</strong> account to the "
                    f"Tollhouse identity <strong>{html.escape(user.name)}</strong>.</p>"
                    f"<p>Calls you make through Tollhouse to {html.escape(upstream)} will use "
                    "that account.</p>"
                    f"<p><a href='/connect/{html.escape(upstream)}?start=1'>Continue to "
                    f"{html.escape(upstream)}</a></p>")
            return page(f"Connect {upstream}", body)
        try:
            location = await c.begin(upstream, user.principal().key, cookie)
        except ConnectFailed as exc:
            return page("Cannot connect", f"<p>{html.escape(str(exc))}</p>", 502)
        except GatewayError as exc:
            return _unreachable(upstream, exc)
        return see_other(location)

    @app.route("/connect/<upstream>/callback")
    async def callback(upstream: str) -> Response:
        c = connections()
        if upstream not in c.upstreams:
            return page("Not found", "<p>No upstream by that name.</p>", 404)
        user, cookie = await signed_in()
        if user is None or cookie is None:
            return page("Sign in first", "<p>Sign in to Tollhouse, then connect again.</p>",
                        401)
        error = request.args.get("error")
        if error:
            return page("Not connected", f"<p>{html.escape(upstream)} said: "
                                         f"{html.escape(error[:100])}.</p>", 400)
        state, code = request.args.get("state", ""), request.args.get("code", "")
        try:
            await c.finish(upstream, state, code, user.principal().key, cookie)
        except ConnectFailed as exc:
            return page("Not connected", f"<p>{html.escape(str(exc))}</p>", 400)
        except GatewayError as exc:
            return _unreachable(upstream, exc, "Not connected")
        return page("Connected", f"<p>Your {html.escape(upstream)} account is connected to "
                                 f"{html.escape(user.name)}.</p>"
                                 "<p><a href='/connections'>Your connections</a></p>")

    @app.route("/connections")
    async def connections_page() -> Response:
        user, _ = await signed_in()
        if user is None:
            return see_other("/signin?next=/connections")
        rows = []
        for name, status in (await connections().statuses(user.principal().key)).items():
            action = (f"<form method='post' action='/connections/{html.escape(name)}/disconnect'>"
                      "<button type='submit'>Disconnect</button></form>"
                      if status != "not_connected" else
                      f"<a href='/connect/{html.escape(name)}'>Connect</a>")
            rows.append(f"<tr><td>{html.escape(name)}</td><td>{status}</td><td>{action}</td></tr>")
        return page("Your connections", "<table><tr><th>upstream</th><th>status</th><th></th>"
                                        f"</tr>{''.join(rows)}</table>")

    @app.route("/connections/<upstream>/disconnect", methods=["POST"])
    async def disconnect_form(upstream: str) -> Response:
        user, _ = await signed_in()
        if user is None:
            return see_other("/signin?next=/connections")
        if not web().same_origin(request.headers):
            return page("Forbidden", "<p>This form must be sent from this gateway.</p>", 403)
        if upstream in connections().upstreams:
            await connections().disconnect(upstream, user.principal().key)
        return see_other("/connections")

    @app.route("/api/v1/me/connections")
    async def api_list() -> Response:
        user, _ = await signed_in()
        if user is None:
            return _detail("not signed in", 401)
        c = connections()
        items = [{"upstream": name, "status": status, "connect_url": c.connect_url(name)}
                 for name, status in (await c.statuses(user.principal().key)).items()]
        return Response(orjson.dumps({"items": items}), 200, JSON)

    @app.route("/api/v1/me/connections/<upstream>", methods=["DELETE"])
    async def api_disconnect(upstream: str) -> Response:
        user, _ = await signed_in()
        if user is None:
            return _detail("not signed in", 401)
        if not web().same_origin(request.headers):
            return _detail("a cookie-authenticated change must come from this gateway", 403)
        if upstream not in connections().upstreams:
            return _detail(f"upstream '{upstream}' not found", 404)
        await connections().disconnect(upstream, user.principal().key)
        return Response(b"", 204)
