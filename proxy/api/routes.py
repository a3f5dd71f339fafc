"""The /api/v1 routes. Callers are a signed-in person (browser cookie) or a script with an
API key (`Authorization: Bearer th_...`). 401: no or bad credential; 403: a person who is not
an administrator, an endpoint-kind API key, or a cookie-authenticated change without this
gateway's Origin/Referer (seed 004); 429: an auth-failure lockout."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from quart import Quart, Response, request

from proxy import db
from proxy.accounts import Accounts, UserExists
from proxy.api.audit_view import page as audit_page
from proxy.api.errors import JSON, ApiError, Invalid
from proxy.api.models import (
    KeyCreated,
    KeyIn,
    KeyOut,
    Me,
    Role,
    ServerIn,
    ServerPatch,
    UserIn,
    UserOut,
    UserPatch,
)
from proxy.api.openapi import document
from proxy.api.registry import Registry
from proxy.audit.sqlite import usage
from proxy.auth import keys as api_keys
from proxy.auth.lockout import LockoutStore
from proxy.signin import COOKIE, Web

M = TypeVar("M", bound=BaseModel)
PREFIX = "/api/v1"


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


async def _body(model: type[M]) -> M:
    raw = await request.get_data()
    try:
        data = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        raise Invalid([{"loc": ["body"], "msg": "the body is not JSON",
                        "type": "json_invalid"}]) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise Invalid.from_pydantic(exc) from None


def register(app: Quart, api: Callable[[], Api]) -> None:
    async def caller(*, admin: bool = True, changes: bool = False) -> Caller:
        a = api()
        authorization = request.headers.get("Authorization", "")
        peer = request.remote_addr or "?"
        if authorization.lower().startswith("bearer "):
            token = authorization[7:].strip()
            watch = [f"api-ip:{peer}"]
            key_id = api_keys.key_id_of(token)
            if key_id:
                watch.append(f"key:{key_id}")
            retry = await a.lockouts.locked(watch, a.clock())
            if retry is not None:
                raise ApiError(429, "too many failed authentications; try again later",
                               {"Retry-After": str(max(1, int(retry) + 1))})
            key = await a.keys.lookup(token) if a.keys is not None else None
            if key is None:
                await a.lockouts.failed(watch, a.clock())
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

    def route(rule: str, methods: list[str], *, admin: bool = True
              ) -> Callable[[Callable[..., Awaitable[Response]]], Any]:
        def wrap(handler: Callable[..., Awaitable[Response]]) -> Any:
            async def endpoint(**kwargs: Any) -> Response:
                try:
                    who = await caller(admin=admin, changes=request.method != "GET")
                    return await handler(who, **kwargs)
                except ApiError as exc:
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

    @route("/roles", ["GET"])
    async def roles(who: Caller) -> Response:
        return _json({"items": [
            Role(name="admin", description="manages the gateway through /api/v1"),
            Role(name="user", description="uses the endpoints their access rules allow")]})

    @route("/me", ["GET"], admin=False)
    async def me(who: Caller) -> Response:
        return _json(Me(subject=who.subject, issuer=who.issuer, name=who.name, admin=who.admin,
                        via=who.via))  # type: ignore[arg-type]

    # -- servers ----------------------------------------------------------------------------

    @route("/servers", ["GET"])
    async def servers(who: Caller) -> Response:
        return _json({"items": api().registry.list()})

    @route("/servers", ["POST"])
    async def create_server(who: Caller) -> Response:
        return _json(await api().registry.create(await _body(ServerIn)), 201)

    @route("/servers/<name>", ["GET"])
    async def server(who: Caller, name: str) -> Response:
        return _json(api().registry.get(name))

    @route("/servers/<name>", ["PUT"])
    async def put_server(who: Caller, name: str) -> Response:
        body = await _body(ServerIn)
        if body.name != name:
            raise Invalid([{"loc": ["body", "name"], "msg": "the name differs from the path",
                            "type": "value_error"}])
        return _json(await api().registry.replace(name, body))

    @route("/servers/<name>", ["PATCH"])
    async def patch_server(who: Caller, name: str) -> Response:
        patch = await _body(ServerPatch)
        data = api().registry.current(name).model_dump(mode="json")
        data.update(patch.model_dump(mode="json", exclude_none=True))
        try:
            merged = ServerIn.model_validate(data)
        except ValidationError as exc:
            raise Invalid.from_pydantic(exc) from None
        return _json(await api().registry.replace(name, merged))

    @route("/servers/<name>", ["DELETE"])
    async def delete_server(who: Caller, name: str) -> Response:
        await api().registry.delete(name)
        return Response(b"", 204)

    # -- API keys ---------------------------------------------------------------------------

    @route("/keys", ["GET"])
    async def keys(who: Caller) -> Response:
        found = await asyncio.to_thread(api_keys.list_keys, api().db_path)
        return _json({"items": [KeyOut(**k.public()) for k in found]})

    @route("/keys", ["POST"])
    async def create_key(who: Caller) -> Response:
        body = await _body(KeyIn)
        unknown = [e for e in body.endpoints if e not in {s.name for s in api().registry.list()}]
        if unknown:
            raise Invalid([{"loc": ["body", "endpoints"], "msg": f"no server named {n}",
                            "type": "value_error"} for n in unknown])
        key, secret = await asyncio.to_thread(api_keys.create, api().db_path, body.name,
                                              body.endpoints, body.role, body.expires_in_days)
        return _json(KeyCreated(**key.public(), key=secret), 201)

    @route("/keys/<key_id>", ["DELETE"])
    async def revoke_key(who: Caller, key_id: str) -> Response:
        if not await asyncio.to_thread(api_keys.revoke, api().db_path, key_id):
            raise ApiError(404, f"API key '{key_id}' not found or already revoked")
        return Response(b"", 204)

    # -- users ------------------------------------------------------------------------------

    @route("/users", ["GET"])
    async def users(who: Caller) -> Response:
        found = await asyncio.to_thread(api().users().list)
        return _json({"items": [UserOut(id=u.id, name=u.name, issuer=u.issuer,
                                        subject=u.subject, admin=u.is_admin) for u in found]})

    @route("/users", ["POST"])
    async def create_user(who: Caller) -> Response:
        body = await _body(UserIn)
        try:
            user = await asyncio.to_thread(api().users().create_local, body.name, body.password,
                                           body.admin)
        except UserExists:
            raise ApiError(409, f"user '{body.name}' already exists") from None
        return _json(UserOut(id=user.id, name=user.name, issuer=user.issuer,
                             subject=user.subject, admin=user.is_admin), 201)

    def _user_out(u: Any) -> UserOut:
        return UserOut(id=u.id, name=u.name, issuer=u.issuer, subject=u.subject,
                       admin=u.is_admin)

    @route("/users/<name>", ["GET"])
    async def user(who: Caller, name: str) -> Response:
        found = await asyncio.to_thread(api().users().by_name, name)
        if found is None:
            raise ApiError(404, f"user '{name}' not found")
        return _json(_user_out(found))

    @route("/users/<name>", ["PATCH"])
    async def patch_user(who: Caller, name: str) -> Response:
        body = await _body(UserPatch)
        changed = await asyncio.to_thread(lambda: api().users().update(
            name, admin=body.admin, password=body.password))
        if changed is None:
            raise ApiError(404, f"user '{name}' not found")
        return _json(_user_out(changed))

    @route("/users/<name>", ["DELETE"])
    async def delete_user(who: Caller, name: str) -> Response:
        if who.via == "cookie" and who.name == name:
            raise ApiError(400, "an administrator cannot delete their own account")
        if not await asyncio.to_thread(api().users().delete, name):
            raise ApiError(404, f"user '{name}' not found")
        return Response(b"", 204)

    @route("/keys/<key_id>", ["GET"])
    async def key(who: Caller, key_id: str) -> Response:
        found = [k for k in await asyncio.to_thread(api_keys.list_keys, api().db_path)
                 if k.id == key_id]
        if not found:
            raise ApiError(404, f"API key '{key_id}' not found")
        return _json(KeyOut(**found[0].public()))

    # -- audit and usage --------------------------------------------------------------------

    @route("/audit", ["GET"])
    async def audit(who: Caller) -> Response:
        args = request.args
        problems = []
        numbers: dict[str, float | None] = {}
        for key in ("since", "until"):
            try:
                numbers[key] = float(args[key]) if key in args else None
            except ValueError:
                problems.append({"loc": ["query", key], "msg": "must be a Unix time",
                                 "type": "float_parsing"})
        try:
            limit = int(args.get("limit", "50"))
            if not 1 <= limit <= 500:
                raise ValueError
        except ValueError:
            problems.append({"loc": ["query", "limit"], "msg": "must be 1 to 500",
                             "type": "value_error"})
            limit = 50
        status = args.get("status")
        if status is not None and status not in ("ok", "denied", "error", "cancelled"):
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

    @route("/usage", ["GET"])
    async def usage_totals(who: Caller) -> Response:
        try:
            since = float(request.args.get("since", time.time() - 86400))
        except ValueError:
            raise Invalid([{"loc": ["query", "since"], "msg": "must be a Unix time",
                            "type": "float_parsing"}]) from None
        rows = await asyncio.to_thread(usage, api().db_path, since=since)
        return _json({"items": rows, "since": since})

    @app.route(PREFIX + "/openapi.json")
    async def openapi() -> Response:
        return Response(orjson.dumps(document()), 200, {"Content-Type": "application/json"})


def _audit_page(path: db.Target, **kwargs: Any) -> list[dict[str, Any]]:
    return audit_page(path, **kwargs)


def _cursor(value: str | None, problems: list[dict[str, Any]]) -> tuple[float, int] | None:
    if not value:
        return None
    try:
        ts, row_id = orjson.loads(base64.urlsafe_b64decode(value.encode() + b"=="))
        return float(ts), int(row_id)
    except (ValueError, TypeError, orjson.JSONDecodeError):
        problems.append({"loc": ["query", "cursor"], "msg": "not a cursor this API gave",
                         "type": "value_error"})
        return None


def _encode_cursor(row: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([row["ts"], row["id"]])).rstrip(b"=").decode()
