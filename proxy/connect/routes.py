"""The connect pages and the person's connections: /connect/<upstream> (with `?link=`: a
connect link, proxy.connect.links), its callback,
/connections, and /api/v1/me/connections (cookie-authenticated; a change must come from this
gateway's own pages): module-level handlers over one `ConnectRoutes`, bound to them by
`register`."""

from __future__ import annotations

import html
import logging
from dataclasses import dataclass
from functools import partial
from urllib.parse import urlencode

import orjson
from quart import Quart, Response, request

from proxy.api.caller import READS_ONLY
from proxy.api.endpoint import AUDIT_ENDPOINT, audited
from proxy.audit.record import AuditRecord
from proxy.connect.links import LinkRefused, tag
from proxy.connect.manager import ConnectFailed, Connections
from proxy.errors import GatewayError, NotFound, NotPermitted, NotSignedIn, StoreUnavailable
from proxy.held import held
from proxy.people.accounts import User
from proxy.people.signin import COOKIE, Web, page, see_other
from proxy.web.paths import segment

JSON = {"Content-Type": "application/json", "Cache-Control": "no-store"}
log = logging.getLogger("tollhouse.connect")


@dataclass(frozen=True)
class ConnectRoutes:
    """What the connect pages work with, bound to each handler when it is registered."""

    connections: Connections
    web: Web


def register(app: Quart, connections: Connections, web: Web) -> None:
    here = ConnectRoutes(connections, web)
    app.add_url_rule("/connect/<upstream>", "connect", partial(connect, here))
    app.add_url_rule("/connect/<upstream>/callback", "callback", partial(callback, here))
    app.add_url_rule("/connections", "connections_page", partial(connections_page, here))
    app.add_url_rule("/connections/<upstream>/disconnect", "disconnect_form",
                     partial(disconnect_form, here), methods=["POST"])
    app.add_url_rule("/api/v1/me/connections", "api_list", partial(api_list, here))
    app.add_url_rule("/api/v1/me/connections/<upstream>", "api_disconnect",
                     partial(api_disconnect, here), methods=["DELETE"])


async def _signed_in(here: ConnectRoutes) -> tuple[User | None, str | None]:
    cookie = request.cookies.get(COOKIE)
    return await here.web.user(cookie), cookie


def _unreachable(upstream: str, exc: GatewayError, title: str = "Cannot connect") -> Response:
    """One message whatever went wrong on the way to the authorization server: refused by
    the egress policy, unresolvable or unreachable would tell which addresses answer."""
    log.info("connect %s: %s", upstream, exc)
    return page(title, f"<p>Tollhouse could not reach the authorization server of "
                       f"{html.escape(upstream)}. Try again later, or ask your "
                       "administrator.</p>", 502)


async def connect(here: ConnectRoutes, upstream: str) -> Response:
    if upstream not in here.connections.upstreams:
        return page("Not found", "<p>No upstream by that name needs a connection.</p>", 404)
    user, cookie = await _signed_in(here)
    token = request.args.get("link")  # a connect link (proxy.connect.links): never logged
    here_path = f"/connect/{segment(upstream)}"
    if token is not None:
        here_path += "?" + urlencode({"link": token})
    if user is None or cookie is None:
        return see_other("/signin?" + urlencode({"next": here_path}))
    starting = request.args.get("start") == "1"
    if token is not None:
        refused = await _link(here, upstream, token, user, use=starting)
        if refused is not None:
            return refused
    if not starting:
        go = here_path + ("&" if token is not None else "?") + "start=1"
        body = (f"<p>Connect your <strong>{html.escape(upstream)}</strong> account to the "
                f"Tollhouse identity <strong>{html.escape(user.name)}</strong>.</p>"
                f"<p>Calls you make through Tollhouse to {html.escape(upstream)} will use "
                "that account.</p>"
                f"<p><a href='{html.escape(go, quote=True)}'>Continue to "
                f"{html.escape(upstream)}</a></p>")
        return page(f"Connect {upstream}", body)
    try:
        location = await here.connections.begin(upstream, user.principal().key, cookie)
    except ConnectFailed as exc:
        return page("Cannot connect", f"<p>{html.escape(str(exc))}</p>", 502)
    except StoreUnavailable:
        raise  # the app's error handler: 503 with Retry-After, not "unreachable"
    except GatewayError as exc:
        return _unreachable(upstream, exc)
    return see_other(location)


async def _link(here: ConnectRoutes, upstream: str, token: str, user: User, *,
                use: bool) -> Response | None:
    """A connect link, checked (shown) or used up (going on): None when this person may go
    on; a refusal page otherwise, audited. Another person's link is left for its owner."""
    issued = here.connections.links
    try:
        if issued is None:
            raise LinkRefused("unusable")
        if use:
            await issued.use(upstream, token, user.principal().key)
        else:
            await issued.check(upstream, token, user.principal().key)
        return None
    except LinkRefused as exc:
        reason = exc.reason
    record = AuditRecord(endpoint=AUDIT_ENDPOINT, method=f"GET /connect/{upstream}"[:300],
                         principal=user.principal().key, status="denied",
                         denied_reason=f"connect_link_{reason}", http_status=403,
                         note=f"link {tag(token)} for upstream {upstream}")
    api = held().api
    if api is not None and api.audit is not None:
        await api.audit.write(record)
    log.info("connect %s: a connect link (%s) was refused: %s", upstream, tag(token), reason)
    if reason == "foreign":
        return page("Not your link", "<p>This connect link was made for someone else: only "
                                     "the person whose call asked for it can use it. Sign in "
                                     "as that person, or make the call again yourself.</p>",
                    403)
    return page("Link expired", "<p>This connect link has been used or has expired. Make "
                                "the call again to get a new one, or connect from "
                                "<a href='/connections'>your connections</a>.</p>", 403)


async def callback(here: ConnectRoutes, upstream: str) -> Response:
    if upstream not in here.connections.upstreams:
        return page("Not found", "<p>No upstream by that name.</p>", 404)
    user, cookie = await _signed_in(here)
    if user is None or cookie is None:
        return page("Sign in first", "<p>Sign in to Tollhouse, then connect again.</p>", 401)
    error = request.args.get("error")
    if error:
        return page("Not connected", f"<p>{html.escape(upstream)} said: "
                                     f"{html.escape(error[:100])}.</p>", 400)
    state, code = request.args.get("state", ""), request.args.get("code", "")
    try:
        await here.connections.finish(upstream, state, code, user.principal().key, cookie)
    except ConnectFailed as exc:
        return page("Not connected", f"<p>{html.escape(str(exc))}</p>", 400)
    except StoreUnavailable:
        raise  # the app's error handler: 503 with Retry-After, not "unreachable"
    except GatewayError as exc:
        return _unreachable(upstream, exc, "Not connected")
    return page("Connected", f"<p>Your {html.escape(upstream)} account is connected to "
                             f"{html.escape(user.name)}.</p>"
                             "<p><a href='/connections'>Your connections</a></p>")


async def connections_page(here: ConnectRoutes) -> Response:
    user, _ = await _signed_in(here)
    if user is None:
        return see_other("/signin?next=/connections")
    rows = []
    for name, status in (await here.connections.statuses(user.principal().key)).items():
        action = (f"<form method='post' action='/connections/{segment(name)}/disconnect'>"
                  "<button type='submit'>Disconnect</button></form>"
                  if status != "not_connected" else
                  f"<a href='/connect/{segment(name)}'>Connect</a>")
        rows.append(f"<tr><td>{html.escape(name)}</td><td>{status}</td><td>{action}</td></tr>")
    return page("Your connections", "<table><tr><th>upstream</th><th>status</th><th></th>"
                                    f"</tr>{''.join(rows)}</table>")


async def disconnect_form(here: ConnectRoutes, upstream: str) -> Response:
    user, _ = await _signed_in(here)
    if user is None:
        return see_other("/signin?next=/connections")
    if not here.web.same_origin(request.headers):
        return page("Forbidden", "<p>This form must be sent from this gateway.</p>", 403)
    if upstream in here.connections.upstreams:
        await here.connections.disconnect(upstream, user.principal().key)
    return see_other("/connections")


async def api_list(here: ConnectRoutes) -> Response:
    user, _ = await _signed_in(here)
    if user is None:
        raise NotSignedIn("not signed in")
    items = [{"upstream": name, "status": status, "connect_url": here.connections.connect_url(name)}
             for name, status in (await here.connections.statuses(user.principal().key)).items()]
    return Response(orjson.dumps({"items": items}), 200, JSON)


async def api_disconnect(here: ConnectRoutes, upstream: str) -> Response:

    async def change(record: AuditRecord) -> Response:  # audited as every /api/v1 change
        user, _ = await _signed_in(here)
        if user is None:
            raise NotSignedIn("not signed in")
        record.principal = user.principal().key
        if not here.web.same_origin(request.headers):
            raise NotPermitted("a cookie-authenticated change must come from this gateway")
        if user.reads_only:
            raise NotPermitted(READS_ONLY)
        if upstream not in here.connections.upstreams:
            raise NotFound(f"upstream '{upstream}' not found")
        await here.connections.disconnect(upstream, user.principal().key)
        return Response(b"", 204)

    api = held().api
    return await audited(api.audit if api is not None else None, change)
