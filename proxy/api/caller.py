"""Who is calling /api/v1: a signed-in person (browser cookie) or a script with an API key
(`Authorization: Bearer th_...`); on the routes of approvals (`approver`), also a person with a
bearer JWT the MCP edge accepts for them (`BearerAuth.identify`). 401: no or bad credential; 403: a person who is not an
administrator (an auditor may read what the route table lets auditors read), an auditor's
change of any kind, an endpoint-kind API key, or a cookie-authenticated change without this
gateway's Origin/Referer (seed 004); 429: an auth-failure lockout, in the OAuth shape
{"error", "error_description"} as at the edge (seed 004)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from quart import Response, request

from proxy.api.bodies import json_response
from proxy.api.context import Api
from proxy.api.models import Me
from proxy.auth.authenticator import BearerAuth
from proxy.auth.keys import looks_like_key
from proxy.auth.lockout import Attempt
from proxy.auth.peer import client_address
from proxy.errors import NotPermitted, NotSignedIn, Unauthenticated
from proxy.people.signin import COOKIE

CHALLENGE = {"WWW-Authenticate": "Bearer"}
LOCKED_OUT = "api: locked out after repeated failures"  # the reason (the wire has one text)
READS_ONLY = "an auditor reads only: it cannot change anything"


@dataclass(frozen=True)
class Caller:
    subject: str
    issuer: str
    name: str
    admin: bool
    via: Literal["cookie", "api_key", "bearer"]
    auditor: bool = False  # a person holding the role `auditor`, or a key of role "auditor"
    groups: frozenset[str] = frozenset()  # a person's (approvers are named by group)

    @property
    def reads_only(self) -> bool:
        """An auditor who is not also an administrator: every change is refused."""
        return self.auditor and not self.admin


async def authenticate(api: Api, *, admin: bool, changes: bool, auditor: bool = False,
                       approver: bool = False) -> Caller:
    """The caller of this request; `admin`: only an administrator may call (or an auditor,
    with `auditor`), `changes`: the request changes something (a cookie must then come with
    this gateway's Origin; `proxy.api.endpoint` refuses an auditor's change, once the record
    names them); `approver`: a bearer JWT the MCP edge accepts is a caller too."""
    authorization = request.headers.get("Authorization", "")
    if authorization.lower().startswith("bearer "):
        token = authorization[7:].strip()
        if approver and not looks_like_key(token):
            who = await _by_edge(api, authorization)
        else:
            who = await _by_key(api, token)
    else:
        who = await _by_cookie(api, changes)
    if admin and not who.admin and not (auditor and who.auditor):
        raise NotPermitted("administrators only")
    return who


async def _by_key(api: Api, token: str) -> Caller:
    # by the caller's address (through trusted proxies) only: a key's secret cannot be
    # guessed, and its id is public, so locking the id out would let anyone shut the key's
    # owner out
    client = client_address(request.remote_addr, request.headers, api.trusted_proxies)
    async with Attempt(api.lockouts, (f"api-ip:{client}",), LOCKED_OUT,
                       unguessable=True) as attempt:
        key = await api.keys.lookup(token) if api.keys is not None else None
        attempt.failed = key is None
    if key is None:
        raise NotSignedIn("invalid or expired credential", headers=CHALLENGE)
    if key.endpoints:
        raise NotPermitted("an endpoint-kind API key cannot use the management API")
    return Caller(f"key:{key.id}", "tollhouse:api-key", key.name, key.role == "admin",
                  "api_key", key.role == "auditor")


async def _by_edge(api: Api, authorization: str) -> Caller:
    """A person by the bearer JWT the MCP edge accepts for them (never an administrator
    here: the JWT opens the approvals' routes only)."""
    edge = api.edge
    if not isinstance(edge, BearerAuth):
        raise NotSignedIn("invalid or expired credential", headers=CHALLENGE)
    client = client_address(request.remote_addr, request.headers, api.trusted_proxies)
    try:
        principal = await edge.identify(authorization, await api.endpoint_names(), client)
    except Unauthenticated:  # why is the audit's and the edge's log's, never the answer's
        raise NotSignedIn("invalid or expired credential", headers=CHALLENGE) from None
    return Caller(principal.subject, principal.issuer, principal.display_name, False, "bearer",
                  groups=principal.groups)


async def _by_cookie(api: Api, changes: bool) -> Caller:
    cookie = request.cookies.get(COOKIE)
    user = await api.web.user(cookie) if api.web is not None and cookie else None
    if user is None:
        raise NotSignedIn("not signed in", headers=CHALLENGE)
    if changes and not api.web.same_origin(request.headers):  # type: ignore[union-attr]
        raise NotPermitted("a cookie-authenticated change must come from this gateway "
                           "(Origin or Referer)")
    return Caller(user.subject, user.issuer, user.name, user.is_admin, "cookie",
                  user.is_auditor, user.groups)


async def me(who: Caller, api: Api) -> Response:
    return json_response(Me(subject=who.subject, issuer=who.issuer, name=who.name,
                            admin=who.admin, auditor=who.auditor, via=who.via))
