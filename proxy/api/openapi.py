"""The OpenAPI document of /api/v1, built from the same pydantic models the routes validate
with, so it cannot drift from what the routes accept."""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel

from proxy import __version__
from proxy.api.models import (
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
    ServerOut,
    ServerPatch,
    UsageRow,
    UserIn,
    UserOut,
    UserPatch,
    UserPut,
)

MODELS: tuple[type[BaseModel], ...] = (ServerIn, ServerPatch, ServerOut, KeyIn, KeyPut,
                                       KeyPatch, KeyOut, KeyCreated, UserIn, UserPut, UserOut,
                                       UserPatch, Me, UsageRow, Role, RoleIn, RolePatch)
ERRORS = {
    "400": "A precondition of the operation does not hold.",
    "401": "No credential, or an invalid or expired one.",
    "403": "Not an administrator, an endpoint-kind API key, or a cookie change without this "
           "gateway's Origin.",
    "404": "The named resource does not exist.",
    "409": "A name already in use, a built-in role, a role someone holds, or a revoked key.",
    "413": "The body is over max_request_bytes.",
    "422": "Request validation: every problem found.",
    "429": "An auth-failure lockout (Retry-After).",
    "503": "The database is busy or unreachable (Retry-After).",
}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _list_of(model: type[BaseModel]) -> dict[str, Any]:
    return {"type": "object", "properties": {"items": {"type": "array", "items": _ref(model)}}}


def _op(summary: str, ok: str, ok_schema: dict[str, Any] | None, body: type[BaseModel] | None
        = None, params: list[str] | None = None, query: list[str] | None = None
        ) -> dict[str, Any]:
    responses: dict[str, Any] = {code: {"description": text, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/Detail" if code != "422"
                   else "#/components/schemas/ValidationDetail"}}}} for code, text in
        ERRORS.items()}
    responses[ok] = {"description": "OK"} if ok_schema is None else {
        "description": "OK", "content": {"application/json": {"schema": ok_schema}}}
    op: dict[str, Any] = {"summary": summary, "responses": responses,
                          "security": [{"bearer": []}, {"cookie": []}]}
    parameters = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                  for p in params or []]
    parameters += [{"name": q, "in": "query", "required": False, "schema": {"type": "string"}}
                   for q in query or []]
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = {"required": True,
                             "content": {"application/json": {"schema": _ref(body)}}}
    return op


@cache
def document() -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for model in MODELS:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    schemas["Detail"] = {"type": "object", "required": ["detail"],
                         "properties": {"detail": {"type": "string"}}}
    schemas["ValidationDetail"] = {"type": "object", "required": ["detail"], "properties": {
        "detail": {"type": "array", "items": {"type": "object", "required": ["loc", "msg", "type"],
                                              "properties": {"loc": {"type": "array",
                                                                     "items": {}},
                                                             "msg": {"type": "string"},
                                                             "type": {"type": "string"}}}}}}
    audit = {"type": "object", "properties": {
        "items": {"type": "array", "items": {"type": "object"}},
        "next_cursor": {"type": ["string", "null"]}}}
    paths = {
        "/api/v1/roles": {
            "get": _op("The roles: built in (admin, user) and custom", "200", _list_of(Role)),
            "post": _op("Create a custom role (a group its holders are in)", "201", _ref(Role),
                        RoleIn)},
        "/api/v1/roles/{name}": {
            "get": _op("One role", "200", _ref(Role), params=["name"]),
            "put": _op("Replace a custom role's description", "200", _ref(Role), RoleIn,
                       ["name"]),
            "patch": _op("Change a custom role's description", "200", _ref(Role), RolePatch,
                         ["name"]),
            "delete": _op("Delete a custom role no user holds", "204", None, params=["name"])},
        "/api/v1/me": {"get": _op("Who is calling, and whether they are an administrator",
                                  "200", _ref(Me))},
        "/api/v1/servers": {
            "get": _op("List servers (config and API)", "200", _list_of(ServerOut)),
            "post": _op("Register a server", "201", _ref(ServerOut), ServerIn)},
        "/api/v1/servers/{name}": {
            "get": _op("One server", "200", _ref(ServerOut), params=["name"]),
            "put": _op("Replace a server", "200", _ref(ServerOut), ServerIn, ["name"]),
            "patch": _op("Change some fields", "200", _ref(ServerOut), ServerPatch, ["name"]),
            "delete": _op("Remove a server", "204", None, params=["name"])},
        "/api/v1/keys": {
            "get": _op("List API keys (never their secrets)", "200", _list_of(KeyOut)),
            "post": _op("Create an API key; the secret is shown once", "201",
                        _ref(KeyCreated), KeyIn)},
        "/api/v1/keys/{key_id}": {
            "get": _op("One API key (never its secret)", "200", _ref(KeyOut),
                       params=["key_id"]),
            "put": _op("Replace a key's name, endpoints, role and expiry (not its secret)",
                       "200", _ref(KeyOut), KeyPut, ["key_id"]),
            "patch": _op("Change some of a key's name, endpoints, role and expiry", "200",
                         _ref(KeyOut), KeyPatch, ["key_id"]),
            "delete": _op("Revoke an API key", "204", None, params=["key_id"])},
        "/api/v1/users/{name}": {
            "get": _op("One user", "200", _ref(UserOut), params=["name"]),
            "put": _op("Replace a user's admin flag and roles (and password, if sent)", "200",
                       _ref(UserOut), UserPut, ["name"]),
            "patch": _op("Change a user's admin flag, roles or password", "200", _ref(UserOut),
                         UserPatch, ["name"]),
            "delete": _op("Remove a user", "204", None, params=["name"])},
        "/api/v1/users": {
            "get": _op("List users", "200", _list_of(UserOut)),
            "post": _op("Create a local user", "201", _ref(UserOut), UserIn)},
        "/api/v1/audit": {"get": _op("Audit records, newest first", "200", audit, query=[
            "status", "endpoint", "principal", "tool", "since", "until", "cursor", "limit"])},
        "/api/v1/usage": {"get": _op("tools/call totals per principal, endpoint and tool",
                                     "200", _list_of(UsageRow),
                                     query=["since", "until", "endpoint", "principal"])},
    }
    return {"openapi": "3.1.0",
            "info": {"title": "Tollhouse management API", "version": __version__},
            "paths": paths,
            "components": {"schemas": schemas, "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer",
                           "description": "an admin API key (th_...)"},
                "cookie": {"type": "apiKey", "in": "cookie", "name": "tollhouse_session"}}}}
