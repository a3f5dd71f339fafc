"""The /api/v1 routes. Callers are a signed-in person (browser cookie) or a script with an
API key (`Authorization: Bearer th_...`). 401: no or bad credential; 403: a person who is not
an administrator, an endpoint-kind API key, or a cookie-authenticated change without this
gateway's Origin/Referer (seed 004); 429: an auth-failure lockout, in the OAuth shape
{"error", "error_description"} as at the edge (seed 004)."""

from __future__ import annotations

import asyncio
import base64
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from quart import Quart, Response, request

from proxy import db
from proxy.accounts import (
    Accounts,
    BuiltinRole,
    LastAdmin,
    NotLocal,
    RoleExists,
    RoleInUse,
    UnknownRoles,
    User,
    UserExists,
)
from proxy.accounts import Role as StoredRole
from proxy.api.audit_view import page as audit_page
from proxy.api.errors import JSON, ApiError, Invalid, LockedOut
from proxy.api.models import (
    KEY_ID,
    NAME,
    KeyCreated,
    KeyIn,
    KeyOut,
    KeyPatch,
    KeyPut,
    Me,
    Role,
    RoleIn,
    RolePatch,
    ServerIn,
    ServerPatch,
    UserIn,
    UserOut,
    UserPatch,
    UserPut,
)
from proxy.api.openapi import document
from proxy.api.registry import Registry
from proxy.audit.sqlite import usage
from proxy.auth import keys as api_keys
from proxy.auth.lockout import Attempt, Locked, LockoutStore
from proxy.edge.routes import nul_in_body
from proxy.egress import IPNetwork
from proxy.signin import COOKIE, Web, client_address

M = TypeVar("M", bound=BaseModel)
PREFIX = "/api/v1"
READS = frozenset({"GET", "HEAD", "OPTIONS"})  # not changes: no Origin/Referer check
CONNECTIONS = PREFIX + "/me/connections"  # served by proxy.connect with a per_user upstream


@dataclass(frozen=True)
class Caller:
    subject: str
    issuer: str
    name: str
    admin: bool
    via: str  # cookie | api_key


@dataclass
class Api:
    registry: Registry
    keys: api_keys.KeyIndex | None
    db_path: db.Target  # the Database
    web: Web | None
    lockouts: LockoutStore
    max_body: int
    clock: Callable[[], float] = time.monotonic
    accounts: Accounts | None = None  # built at start-up (it opens the database)
    # drops what the gateway keeps in memory of a person (their upstream tokens), by
    # principal key, when their user is deleted
    forget_person: Callable[[str], None] | None = None
    trusted_proxies: tuple[IPNetwork, ...] = ()

    def users(self) -> Accounts:
        assert self.accounts is not None
        return self.accounts


def _json(body: Any, status: int = 200) -> Response:
    if isinstance(body, BaseModel):
        payload = body.model_dump_json().encode()
    else:
        payload = orjson.dumps(body, default=_dump)
    return Response(payload, status, JSON)


def _dump(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError


Problems = list[dict[str, Any]]
# A check of the raw body (a JSON object) beside the model: the problems it finds
Check = Callable[[dict[str, Any]], Awaitable[Problems]]


async def _body(model: type[M], *checks: Check) -> M:
    """The request body validated by `model`, or one 422 listing every problem found: the
    model's first, then each check's, in order. The checks see the raw JSON object and run
    even when the model failed (so a body name that differs from the path is listed beside a
    bad field); they are skipped when the body is no JSON object (the model says so). A check
    looks only at values of the right type, and leaves the wrong ones to the model."""
    raw = await request.get_data()
    try:
        data = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        raise Invalid([{"loc": ["body"], "msg": "the body is not JSON",
                        "type": "json_invalid"}]) from None
    problems: Problems = []
    try:
        body = model.model_validate(data)
    except ValidationError as exc:
        problems = Invalid.from_pydantic(exc).problems
    if isinstance(data, dict):
        for check in checks:
            problems += await check(data)
    if problems:
        raise Invalid(problems)
    return body


def same_as_path(field: str, value: str) -> Check:
    """A check for `_body`: the body's `field`, if it is a string, is the path's `value` (a
    PUT cannot rename). Left out or null, it is the model's to require or allow."""

    async def check(data: dict[str, Any]) -> Problems:
        sent = data.get(field)
        return _mismatch(field, field).problems if isinstance(sent, str) and sent != value \
            else []

    return check


def register(app: Quart, api: Callable[[], Api]) -> None:
    async def caller(*, admin: bool = True, changes: bool = False) -> Caller:
        a = api()
        authorization = request.headers.get("Authorization", "")
        if authorization.lower().startswith("bearer "):
            token = authorization[7:].strip()
            # by the caller's address (through trusted proxies) only: a key's secret cannot
            # be guessed, and its id is public, so locking the id out would let anyone
            # shut the key's owner out
            client = client_address(request.remote_addr, request.headers, a.trusted_proxies)
            try:
                async with Attempt(a.lockouts, (f"api-ip:{client}",)) as attempt:
                    key = await a.keys.lookup(token) if a.keys is not None else None
                    attempt.failed = key is None
            except Locked as locked:
                raise LockedOut(locked.retry_after_s) from None
            if key is None:
                raise ApiError(401, "invalid or expired credential",
                               {"WWW-Authenticate": "Bearer"})
            if key.endpoints:
                raise ApiError(403, "an endpoint-kind API key cannot use the management API")
            who = Caller(f"key:{key.id}", "tollhouse:api-key", key.name, key.role == "admin",
                         "api_key")
        else:
            cookie = request.cookies.get(COOKIE)
            user = await a.web.user(cookie) if a.web is not None and cookie else None
            if user is None:
                raise ApiError(401, "not signed in", {"WWW-Authenticate": "Bearer"})
            if changes and not a.web.same_origin(request.headers):  # type: ignore[union-attr]
                raise ApiError(403, "a cookie-authenticated change must come from this "
                                    "gateway (Origin or Referer)")
            who = Caller(user.subject, user.issuer, user.name, user.is_admin, "cookie")
        if admin and not who.admin:
            raise ApiError(403, "administrators only")
        return who

    def route(rule: str, methods: list[str], *, admin: bool = True, query: bool = False
              ) -> Callable[[Callable[..., Awaitable[Response]]], Any]:
        """`query`: the route reads its query string (the others ignore theirs)."""

        def wrap(handler: Callable[..., Awaitable[Response]]) -> Any:
            async def endpoint(**kwargs: Any) -> Response:
                try:
                    who = await caller(admin=admin, changes=request.method not in READS)
                    await _refuse_nul(kwargs, query)
                    return await handler(who, **kwargs)
                except ApiError as exc:  # LockedOut too, in its own shape
                    return exc.response()
                except Invalid as exc:
                    return exc.response()
                except db.resolve(api().db_path).unavailable:  # busy or unreachable: retry
                    return ApiError(503, "the database is busy; retry",
                                    {"Retry-After": "1"}).response()

            endpoint.__name__ = f"api_{handler.__name__}"
            app.add_url_rule(PREFIX + rule, endpoint.__name__, endpoint, methods=methods)
            return handler

        return wrap

    @route("/me", ["GET"], admin=False)
    async def me(who: Caller) -> Response:
        return _json(Me(subject=who.subject, issuer=who.issuer, name=who.name, admin=who.admin,
                        via=who.via))  # type: ignore[arg-type]

    # -- servers ----------------------------------------------------------------------------

    @route("/servers", ["GET"])
    async def servers(who: Caller) -> Response:
        return _json({"items": await api().registry.list()})

    @route("/servers", ["POST"])
    async def create_server(who: Caller) -> Response:
        return _json(await api().registry.create(await _body(ServerIn)), 201)

    @route("/servers/<name>", ["GET"])
    async def server(who: Caller, name: str) -> Response:
        return _json(await api().registry.get(name))

    @route("/servers/<name>", ["PUT"])
    async def put_server(who: Caller, name: str) -> Response:
        body = await _body(ServerIn, same_as_path("name", name))
        return _json(await api().registry.replace(name, body))

    @route("/servers/<name>", ["PATCH"])
    async def patch_server(who: Caller, name: str) -> Response:
        patch = await _body(ServerPatch)
        return _json(await api().registry.patch(
            name, patch.model_dump(mode="json", exclude_none=True)))

    @route("/servers/<name>", ["DELETE"])
    async def delete_server(who: Caller, name: str) -> Response:
        await api().registry.delete(name)
        return Response(b"", 204)

    # -- API keys ---------------------------------------------------------------------------
    # PUT and PATCH change a key's name, endpoints, role and expiry; the secret never changes
    # and is shown only by POST. A revoked key is final: changing it is a 409. The gateway's
    # key index sees a change on its next lookup (the next /mcp request).

    def _key_id(key_id: str) -> str:
        if not re.fullmatch(KEY_ID, key_id):  # ids are generated: no query for anything else
            raise ApiError(404, f"API key '{key_id}' not found")
        return key_id

    async def _known_endpoints(data: dict[str, Any]) -> Problems:
        """A check for `_body`: each of the body's endpoints names a server."""
        endpoints = data.get("endpoints")
        if not isinstance(endpoints, list):
            return []
        known = await api().registry.names()
        return [{"loc": ["body", "endpoints", i], "msg": f"no server named {name}",
                 "type": "value_error"} for i, name in enumerate(endpoints)
                if isinstance(name, str) and name not in known]

    async def _change_key(key_id: str, changes: dict[str, Any]) -> Response:
        try:
            changed = await asyncio.to_thread(
                lambda: api_keys.update(api().db_path, _key_id(key_id), **changes))
        except api_keys.KeyNotFound:
            raise ApiError(404, f"API key '{key_id}' not found") from None
        except api_keys.KeyRevoked:
            raise ApiError(409, f"API key '{key_id}' is revoked; a revoked key cannot be "
                                "changed") from None
        return _json(KeyOut(**changed.public()))

    @route("/keys", ["GET"])
    async def keys(who: Caller) -> Response:
        found = await asyncio.to_thread(api_keys.list_keys, api().db_path)
        return _json({"items": [KeyOut(**k.public()) for k in found]})

    @route("/keys", ["POST"])
    async def create_key(who: Caller) -> Response:
        body = await _body(KeyIn, _known_endpoints)
        key, secret = await asyncio.to_thread(api_keys.create, api().db_path, body.name,
                                              body.endpoints, body.role, body.expires_in_days)
        return _json(KeyCreated(**key.public(), key=secret), 201)

    @route("/keys/<key_id>", ["GET"])
    async def key(who: Caller, key_id: str) -> Response:
        found = await asyncio.to_thread(api_keys.get, api().db_path, _key_id(key_id))
        if found is None:
            raise ApiError(404, f"API key '{key_id}' not found")
        return _json(KeyOut(**found.public()))

    @route("/keys/<key_id>", ["PUT"])
    async def put_key(who: Caller, key_id: str) -> Response:
        body = await _body(KeyPut, same_as_path("id", key_id), _known_endpoints)
        return await _change_key(key_id, {"name": body.name, "endpoints": body.endpoints,
                                          "role": body.role, "expires_at": body.expires_at})

    @route("/keys/<key_id>", ["PATCH"])
    async def patch_key(who: Caller, key_id: str) -> Response:
        body = await _body(KeyPatch, same_as_path("id", key_id), _known_endpoints)
        sent = body.model_fields_set - {"id"}
        return await _change_key(key_id, {field: getattr(body, field) for field in sent})

    @route("/keys/<key_id>", ["DELETE"])
    async def revoke_key(who: Caller, key_id: str) -> Response:
        if not await asyncio.to_thread(api_keys.revoke, api().db_path, _key_id(key_id)):
            raise ApiError(404, f"API key '{key_id}' not found or already revoked")
        return Response(b"", 204)

    # -- users ------------------------------------------------------------------------------
    # `roles` are custom roles (see /roles), each of which must exist; the built-in ones are
    # `admin` (the admin field) and `user` (everyone). PUT replaces admin and roles and keeps
    # the password unless one is sent; a federated user has no password here (400).

    def _user_name(name: str) -> str:
        if "\x00" in name or len(name) > 1000:  # never a stored name: no query
            raise ApiError(404, f"user '{name}' not found")
        return name

    async def _known_roles(data: dict[str, Any]) -> Problems:
        """A check for `_body`: each of the body's roles (well-formed ones: the model names
        the others) is a custom role."""
        roles = data.get("roles")
        if not isinstance(roles, list):
            return []
        named = [r for r in roles if isinstance(r, str) and re.fullmatch(NAME, r)]
        if not named:
            return []
        known = {r.name for r in await asyncio.to_thread(api().users().roles)
                 if not r.builtin}
        return _unknown_roles(UnknownRoles([r for r in named if r not in known]),
                              roles).problems

    def _last_admin(name: str) -> ApiError:
        return ApiError(409, f"user '{name}' is the last administrator; make another user "
                             "an administrator first")

    async def _change_user(name: str, roles: list[str] | None, **changes: Any) -> Response:
        try:
            changed = await asyncio.to_thread(
                lambda: api().users().update(_user_name(name), roles=roles, **changes))
        except NotLocal:
            raise ApiError(400, f"user '{name}' signs in through an identity provider and "
                                "has no password here") from None
        except UnknownRoles as exc:  # deleted since the request was checked
            raise _unknown_roles(exc, roles or []) from None
        except LastAdmin:
            raise _last_admin(name) from None
        if changed is None:
            raise ApiError(404, f"user '{name}' not found")
        web = api().web
        if changes.get("password") is not None and web is not None:
            # a new password ends the person's other browser sessions (one stolen with the
            # old password among them); the caller's own session, if it is theirs, stays
            await web.sessions.end_for(changed.id, keep=request.cookies.get(COOKIE))
        return _json(_user_out(changed))

    @route("/users", ["GET"])
    async def users(who: Caller) -> Response:
        found = await asyncio.to_thread(api().users().list)
        return _json({"items": [_user_out(u) for u in found]})

    @route("/users", ["POST"])
    async def create_user(who: Caller) -> Response:
        body = await _body(UserIn, _known_roles)
        try:
            user = await asyncio.to_thread(api().users().create_local, body.name, body.password,
                                           body.admin, body.roles)
        except UserExists:
            raise ApiError(409, f"user '{body.name}' already exists") from None
        except UnknownRoles as exc:
            raise _unknown_roles(exc, body.roles) from None
        return _json(_user_out(user), 201)

    @route("/users/<name>", ["GET"])
    async def user(who: Caller, name: str) -> Response:
        found = await asyncio.to_thread(api().users().by_name, _user_name(name))
        if found is None:
            raise ApiError(404, f"user '{name}' not found")
        return _json(_user_out(found))

    @route("/users/<name>", ["PUT"])
    async def put_user(who: Caller, name: str) -> Response:
        body = await _body(UserPut, same_as_path("name", name), _known_roles)
        return await _change_user(name, body.roles, admin=body.admin, password=body.password)

    @route("/users/<name>", ["PATCH"])
    async def patch_user(who: Caller, name: str) -> Response:
        body = await _body(UserPatch, _known_roles)
        return await _change_user(name, body.roles, admin=body.admin, password=body.password)

    @route("/users/<name>", ["DELETE"])
    async def delete_user(who: Caller, name: str) -> Response:
        if who.via == "cookie" and who.name == name:
            raise ApiError(400, "an administrator cannot delete their own account")
        try:
            gone = await asyncio.to_thread(api().users().delete, _user_name(name))
        except LastAdmin:
            raise _last_admin(name) from None
        if gone is None:
            raise ApiError(404, f"user '{name}' not found")
        web, forget = api().web, api().forget_person
        if web is not None:
            await web.sessions.end_for(gone.id)
        if forget is not None:
            forget(gone.principal().key)
        return Response(b"", 204)

    # -- roles ------------------------------------------------------------------------------
    # `admin` and `user` are built in (source: builtin): changing or deleting one is a 409.
    # A custom role (source: api) is a group its holders are in; deleting one that someone
    # holds is a 409 that says how many do.

    def _role_name(name: str) -> str:
        if not re.fullmatch(NAME, name):  # never a role's name: no query
            raise ApiError(404, f"role '{name}' not found")
        return name

    def _builtin(name: str) -> ApiError:
        return ApiError(409, f"role '{name}' is built in and cannot be changed or deleted")

    async def _change_role(name: str, description: str | None) -> Response:
        users = api().users()
        try:
            if description is None:
                found = await asyncio.to_thread(users.role, _role_name(name))
                if found is not None and found.builtin:
                    raise BuiltinRole(name)
            else:
                found = await asyncio.to_thread(users.update_role, _role_name(name),
                                                description)
        except BuiltinRole:
            raise _builtin(name) from None
        if found is None:
            raise ApiError(404, f"role '{name}' not found")
        return _json(_role_out(found))

    @route("/roles", ["GET"])
    async def roles(who: Caller) -> Response:
        found = await asyncio.to_thread(api().users().roles)
        return _json({"items": [_role_out(r) for r in found]})

    @route("/roles", ["POST"])
    async def create_role(who: Caller) -> Response:
        body = await _body(RoleIn)
        try:
            made = await asyncio.to_thread(api().users().create_role, body.name,
                                           body.description)
        except RoleExists:
            raise ApiError(409, f"role '{body.name}' already exists") from None
        return _json(_role_out(made), 201)

    @route("/roles/<name>", ["GET"])
    async def role(who: Caller, name: str) -> Response:
        found = await asyncio.to_thread(api().users().role, _role_name(name))
        if found is None:
            raise ApiError(404, f"role '{name}' not found")
        return _json(_role_out(found))

    @route("/roles/<name>", ["PUT"])
    async def put_role(who: Caller, name: str) -> Response:
        body = await _body(RoleIn, same_as_path("name", name))
        return await _change_role(name, body.description)

    @route("/roles/<name>", ["PATCH"])
    async def patch_role(who: Caller, name: str) -> Response:
        body = await _body(RolePatch)
        return await _change_role(name, body.description)

    @route("/roles/<name>", ["DELETE"])
    async def delete_role(who: Caller, name: str) -> Response:
        try:
            deleted = await asyncio.to_thread(api().users().delete_role, _role_name(name))
        except BuiltinRole:
            raise _builtin(name) from None
        except RoleInUse as exc:
            holders = f"{exc.holders} user" + ("s" if exc.holders != 1 else "")
            raise ApiError(409, f"role '{name}' is held by {holders}; take it from them "
                                "first") from None
        if not deleted:
            raise ApiError(404, f"role '{name}' not found")
        return Response(b"", 204)

    # -- audit and usage --------------------------------------------------------------------

    @route("/audit", ["GET"], query=True)
    async def audit(who: Caller) -> Response:
        args = request.args
        problems: Problems = []
        numbers = _period(args, problems)
        limit = _limit(args.get("limit"), problems)
        status = args.get("status")
        if status is not None and status not in AUDIT_STATUSES:
            problems.append({"loc": ["query", "status"],
                             "msg": "must be ok, denied, error or cancelled",
                             "type": "literal_error"})
        cursor = _cursor(args.get("cursor"), problems)
        if problems:
            raise Invalid(problems)
        rows = await asyncio.to_thread(
            _audit_page, api().db_path, status=status, endpoint=args.get("endpoint"),
            since=numbers["since"], until=numbers["until"], principal=args.get("principal"),
            tool=args.get("tool"), before=cursor, limit=limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        next_cursor = _encode_cursor(rows[-1]) if more and rows else None
        return _json({"items": rows, "next_cursor": next_cursor})

    @route("/usage", ["GET"], query=True)
    async def usage_totals(who: Caller) -> Response:
        args = request.args
        problems: Problems = []
        times = _period(args, problems)
        if problems:
            raise Invalid(problems)
        since = times["since"] if times["since"] is not None else time.time() - 86400
        rows = await asyncio.to_thread(usage, api().db_path, since=since, until=times["until"],
                                       endpoint=args.get("endpoint"),
                                       principal=args.get("principal"))
        return _json({"items": rows, "since": since, "until": times["until"]})

    @app.route(PREFIX + "/openapi.json")
    async def openapi() -> Response:
        # the document of the routes this app serves: /me/connections only beside a per_user
        # upstream (proxy.connect registers them; the app may do so after this)
        connections = any(r.rule == CONNECTIONS for r in app.url_map.iter_rules())
        return Response(orjson.dumps(document(connections=connections)), 200,
                        {"Content-Type": "application/json"})


def _mismatch(field: str, what: str) -> Invalid:
    return Invalid([{"loc": ["body", field], "msg": f"the {what} differs from the path",
                     "type": "value_error"}])


def _unknown_roles(exc: UnknownRoles, roles: list[str]) -> Invalid:
    """422 naming each role that is not a custom role, at its place in the body's list."""
    problems = []
    for i, name in enumerate(roles):
        if name not in exc.names:
            continue
        msg = (f"'{name}' is a built-in role: every user holds 'user', and 'admin' is the "
               "admin field" if name in ("admin", "user") else f"no role named {name}")
        problems.append({"loc": ["body", "roles", i], "msg": msg, "type": "value_error"})
    return Invalid(problems)


def _user_out(u: User) -> UserOut:
    return UserOut(id=u.id, name=u.name, issuer=u.issuer, subject=u.subject, admin=u.is_admin,
                   roles=sorted(u.roles))


def _role_out(r: StoredRole) -> Role:
    return Role(name=r.name, description=r.description,
                source="builtin" if r.builtin else "api")


async def _refuse_nul(path: dict[str, Any], query: bool) -> None:
    """A NUL anywhere in what the route reads is a validation error (seed 004: 422): nothing
    this API stores or looks up may hold one (PostgreSQL's text cannot). A route that reads
    no query string ignores it, NULs and all."""
    problems = [{"loc": ["path", k], "msg": "holds a NUL character", "type": "value_error"}
                for k, v in path.items() if isinstance(v, str) and "\x00" in v]
    if query:
        problems += [{"loc": ["query", k], "msg": "holds a NUL character",
                      "type": "value_error"}
                     for k, v in request.args.items(multi=True) if "\x00" in k or "\x00" in v]
    if request.method in ("POST", "PUT", "PATCH") and nul_in_body(await request.get_data(),
                                                                  "application/json"):
        problems.append({"loc": ["body"], "msg": "holds a NUL character",
                         "type": "value_error"})
    if problems:
        raise Invalid(problems)


def _audit_page(path: db.Target, **kwargs: Any) -> list[dict[str, Any]]:
    return audit_page(path, **kwargs)


# A Unix time in a query: a plain decimal number (no exponent, sign +, _, or other digits)
DECIMAL = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
AUDIT_STATUSES = ("ok", "denied", "error", "cancelled")
MAX_LIMIT = 500
MAX_ROW_ID = 2**63 - 1  # a row id either database can hold


def _period(args: Any, problems: Problems) -> dict[str, float | None]:
    """`since` and `until`, each a finite plain decimal Unix time if given, `since` not after
    `until`; every problem is added to `problems`."""
    times: dict[str, float | None] = {"since": None, "until": None}
    for key in times:
        value = args.get(key)
        if value is None:
            continue
        number = float(value) if DECIMAL.fullmatch(value) else math.nan
        if math.isfinite(number):
            times[key] = number
        else:
            problems.append({"loc": ["query", key], "msg": "must be a Unix time: a plain "
                             "decimal number such as 1700000000.5", "type": "float_parsing"})
    since, until = times["since"], times["until"]
    if since is not None and until is not None and since > until:
        problems.append({"loc": ["query", "since"], "msg": "must not be after until",
                         "type": "value_error"})
    return times


def _limit(value: str | None, problems: Problems) -> int:
    """A page size: ASCII digits, 1 to MAX_LIMIT (50 if not given)."""
    if value is None:
        return 50
    if re.fullmatch(r"[0-9]{1,3}", value) and 1 <= int(value) <= MAX_LIMIT:
        return int(value)
    problems.append({"loc": ["query", "limit"], "msg": f"must be a whole number from 1 to "
                     f"{MAX_LIMIT}", "type": "value_error"})
    return 50


def _cursor(value: str | None, problems: Problems) -> tuple[float, int] | None:
    """A cursor this API gave: [ts, id], a finite float time and a row id 0..2**63-1."""
    if not value:
        return None
    try:
        decoded = orjson.loads(base64.urlsafe_b64decode(value.encode() + b"=="))
    except (ValueError, orjson.JSONDecodeError):
        decoded = None
    if isinstance(decoded, list) and len(decoded) == 2:
        ts, row_id = decoded
        if type(ts) is float and math.isfinite(ts) and type(row_id) is int \
                and 0 <= row_id <= MAX_ROW_ID:
            return ts, row_id
    problems.append({"loc": ["query", "cursor"], "msg": "not a cursor this API gave",
                     "type": "value_error"})
    return None


def _encode_cursor(row: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([row["ts"], row["id"]])).rstrip(b"=").decode()
