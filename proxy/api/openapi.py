"""The OpenAPI document of /api/v1, built from the same pydantic models the routes validate
with, so it cannot drift from what the routes accept; and the route that serves it."""

from __future__ import annotations

from functools import cache
from typing import Any

import orjson
from pydantic import BaseModel
from quart import Response, current_app

from proxy import __version__
from proxy.api.approvals import DecisionIn
from proxy.api.group_roles import GroupRole, GroupRoleIn
from proxy.api.models import (
    KeyCreated,
    KeyIn,
    KeyOut,
    KeyPatch,
    KeyPut,
    Me,
    MyKeyIn,
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
from proxy.api.policies import PolicyIn, PolicyOut
from proxy.api.status import MAX_NAMES
from proxy.virtual.schema import EndpointIn, EndpointOut, EndpointPatch

MODELS: tuple[type[BaseModel], ...] = (ServerIn, ServerPatch, ServerOut, KeyIn, MyKeyIn,
                                       KeyPut, KeyPatch, KeyOut, KeyCreated, UserIn, UserPut,
                                       UserOut, UserPatch, Me, UsageRow, Role, RoleIn,
                                       RolePatch, EndpointIn, EndpointPatch, EndpointOut,
                                       PolicyIn, PolicyOut, DecisionIn, GroupRoleIn,
                                       GroupRole)
ERRORS = {
    "400": "A precondition of the operation does not hold.",
    "401": "No credential, or an invalid or expired one.",
    "403": "Not an administrator (auditors may read the audit log, usage, policies and the "
           "audit evidence's status), an auditor's change, an endpoint-kind API key, or a "
           "cookie change without this gateway's Origin.",
    "404": "The named resource does not exist.",
    "409": "A name already in use, a built-in role, a role someone holds, a server API keys "
           "name, or a revoked key.",
    "413": "The body is over max_request_bytes.",
    "422": "Request validation: every problem found.",
    "429": "An auth-failure lockout (Retry-After), in the OAuth shape (seed 004).",
    "503": "The database is busy or unreachable (Retry-After).",
}
# every authenticated operation can answer these (seed 004)
AUTHENTICATED = ("401", "403", "429", "503")
RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying",
                               "schema": {"type": "integer", "minimum": 1}}}
TIME = {"type": "number", "description": "a Unix time, as a plain decimal number (no "
                                         "exponent), such as 1700000000.5"}
QUERY: dict[str, dict[str, Any]] = {
    "status": {"type": "string", "enum": ["ok", "denied", "error", "cancelled"]},
    "since": TIME,
    "until": TIME,
    "limit": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50},
    "offset": {"type": "integer", "minimum": 0, "maximum": 999_999_999, "default": 0},
    "bucket_s": {"type": "integer", "minimum": 1, "maximum": 86400, "default": 60},
    "format": {"type": "string", "enum": ["csv", "jsonl"], "default": "csv"},
}
CONNECTIONS = "/api/v1/me/connections"  # served by proxy.connect with a per_user upstream
CONNECTION_STATUSES = ["connected", "needs_reconnect", "not_connected"]


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _list_of(model: type[BaseModel]) -> dict[str, Any]:
    return {"type": "object", "required": ["items"],
            "properties": {"items": {"type": "array", "items": _ref(model)}}}


def _error(code: str) -> dict[str, Any]:
    schema = {"422": "ValidationDetail", "429": "OAuthError"}.get(code, "Detail")
    answer: dict[str, Any] = {"description": ERRORS[code], "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{schema}"}}}}
    if code in ("429", "503"):
        answer["headers"] = RETRY_AFTER
    return answer


def _op(summary: str, ok: str, ok_schema: dict[str, Any] | None, body: type[BaseModel] | None
        = None, params: list[str] | None = None, query: list[str] | None = None, *,
        conflict: bool = False, precondition: bool = False) -> dict[str, Any]:
    """An operation, with only the error statuses it can answer: those of every
    authenticated operation; 422 where there is input (a body, a path or a query), 404 where
    the path names something, 413 where there is a body, and 409 (`conflict`) and 400
    (`precondition`) where the operation says so."""
    errors = [*AUTHENTICATED]
    errors += ["422"] if body is not None or params or query else []
    errors += ["404"] if params else []
    errors += ["413"] if body is not None else []
    errors += ["409"] if conflict else []
    errors += ["400"] if precondition else []
    responses: dict[str, Any] = {code: _error(code) for code in sorted(errors)}
    responses[ok] = {"description": "OK"} if ok_schema is None else {
        "description": "OK", "content": {"application/json": {"schema": ok_schema}}}
    op: dict[str, Any] = {"summary": summary, "responses": responses,
                          "security": [{"bearer": []}, {"cookie": []}]}
    parameters = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                  for p in params or []]
    parameters += [{"name": q, "in": "query", "required": False,
                    "schema": QUERY.get(q, {"type": "string"})} for q in query or []]
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = {"required": True,
                             "content": {"application/json": {"schema": _ref(body)}}}
    return op


def _connections() -> dict[str, Any]:
    """/api/v1/me/connections (proxy.connect): the signed-in person's own upstream
    connections, served beside a per_user upstream; a browser session only."""
    item = {"type": "object", "required": ["upstream", "status", "connect_url"], "properties": {
        "upstream": {"type": "string"},
        "status": {"type": "string", "enum": CONNECTION_STATUSES},
        "connect_url": {"type": "string"}}}
    cookie: list[dict[str, list[str]]] = [{"cookie": []}]
    return {
        "/api/v1/me/connections": {"get": {
            "summary": "The signed-in person's connection to each per_user upstream",
            "security": cookie, "responses": {
                "200": {"description": "OK", "content": {"application/json": {"schema": {
                    "type": "object", "required": ["items"],
                    "properties": {"items": {"type": "array", "items": item}}}}}},
                "401": _error("401"), "503": _error("503")}}},
        "/api/v1/me/connections/{upstream}": {"delete": {
            "summary": "Disconnect the signed-in person from an upstream",
            "security": cookie,
            "parameters": [{"name": "upstream", "in": "path", "required": True,
                            "schema": {"type": "string"}}],
            "responses": {"204": {"description": "OK"}, "401": _error("401"),
                          "403": _error("403"), "404": _error("404"),
                          "503": _error("503")}}},
    }


def _schemas() -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for model in MODELS:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    schemas["Detail"] = {"type": "object", "required": ["detail"],
                         "properties": {"detail": {"type": "string"}}}
    schemas["OAuthError"] = {"type": "object", "required": ["error", "error_description"],
                             "properties": {"error": {"type": "string"},
                                            "error_description": {"type": "string"}}}
    schemas["ValidationDetail"] = {"type": "object", "required": ["detail"], "properties": {
        "detail": {"type": "array", "items": {"type": "object", "required": ["loc", "msg", "type"],
                                              "properties": {"loc": {"type": "array",
                                                                     "items": {}},
                                                             "msg": {"type": "string"},
                                                             "type": {"type": "string"}}}}}}
    return schemas


def _roles_and_me() -> dict[str, Any]:
    return {
        "/api/v1/roles": {
            "get": _op("The roles: built in (admin, user) and custom", "200", _list_of(Role)),
            "post": _op("Create a custom role (a group its holders are in)", "201", _ref(Role),
                        RoleIn, conflict=True)},
        "/api/v1/roles/{name}": {
            "get": _op("One role", "200", _ref(Role), params=["name"]),
            "put": _op("Replace a custom role's description", "200", _ref(Role), RoleIn,
                       ["name"], conflict=True),
            "patch": _op("Change a custom role's description", "200", _ref(Role), RolePatch,
                         ["name"], conflict=True),
            "delete": _op("Delete a custom role no user holds", "204", None, params=["name"],
                          conflict=True)},
        "/api/v1/group-roles": _group_roles(),
        "/api/v1/me": {"get": _op("Who is calling, and whether they are an administrator",
                                  "200", _ref(Me))},
    }


def _group_roles() -> dict[str, Any]:
    put = _op("Map a group (SCIM or a token's groups claim) to a built-in or custom role: 201 "
              "added, 200 already there", "201", _ref(GroupRole), GroupRoleIn)
    put["responses"]["200"] = put["responses"]["201"]
    delete = _op("Take one of the API's mappings away (one of the config's is a 409)", "204",
                 None, query=["group", "role"], conflict=True)
    delete["responses"]["404"] = _error("404")
    return {"get": _op("Groups mapped to roles: the config's ([[auth.group_roles]]) and the "
                       "API's", "200", _list_of(GroupRole)), "put": put, "delete": delete}


def _policies() -> dict[str, Any]:
    return {
        "/api/v1/policies": {
            "get": _op("List the Cedar policies: the config file's, then the API's, by id, "
                       "and the version each decided call's audit record names", "200",
                       {**_list_of(PolicyOut), "required": ["items", "version"],
                        "properties": {**_list_of(PolicyOut)["properties"],
                                       "version": {"type": ["string", "null"]}}}),
            "post": _op("Create a Cedar policy (validated with the others before it is "
                        "stored)", "201", _ref(PolicyOut), PolicyIn, conflict=True)},
        "/api/v1/policies/{policy_id}": {
            "get": _op("One policy", "200", _ref(PolicyOut), params=["policy_id"]),
            "put": _op("Replace a policy of the API's (its version moves)", "200",
                       _ref(PolicyOut), PolicyIn, ["policy_id"], conflict=True),
            "delete": _op("Delete a policy of the API's", "204", None, params=["policy_id"],
                          conflict=True)},
    }


def _paged(op: dict[str, Any], what: str) -> dict[str, Any]:
    """A list operation whose `limit` is optional: without it, every one of `what`."""
    for parameter in op["parameters"]:
        if parameter["name"] == "limit":
            parameter["schema"] = {"type": "integer", "minimum": 1, "maximum": 500}
            parameter["description"] = f"a page of at most this many; every {what} if not given"
    return op


def _keys_listed() -> dict[str, Any]:
    listed = _list_of(KeyOut)
    listed["properties"]["endpoints"] = {"type": "array", "items": {"type": "string"},
                                         "description": "the server names a key may name"}
    return listed


def _servers_and_keys() -> dict[str, Any]:
    return {
        "/api/v1/servers": {
            "get": _paged(_op("List servers (config and API) by name: every one, or a page of "
                              "them with limit and offset", "200", _list_of(ServerOut),
                              query=["limit", "offset"]), "server"),
            "post": _op("Register a server", "201", _ref(ServerOut), ServerIn, conflict=True,
                        precondition=True)},
        "/api/v1/servers/{name}": {
            "get": _op("One server", "200", _ref(ServerOut), params=["name"]),
            "put": _op("Replace a server", "200", _ref(ServerOut), ServerIn, ["name"],
                       precondition=True),
            "patch": _op("Change some fields", "200", _ref(ServerOut), ServerPatch, ["name"],
                         precondition=True),
            "delete": _op("Remove a server no live API key names", "204", None,
                          params=["name"], conflict=True, precondition=True)},
        "/api/v1/endpoints": {
            "get": _op("List virtual endpoints (config and API)", "200",
                       _list_of(EndpointOut)),
            "post": _op("Create a virtual endpoint", "201", _ref(EndpointOut), EndpointIn,
                        conflict=True)},
        "/api/v1/endpoints/{name}": {
            "get": _op("One virtual endpoint", "200", _ref(EndpointOut), params=["name"]),
            "put": _op("Replace a virtual endpoint", "200", _ref(EndpointOut), EndpointIn,
                       ["name"], conflict=True, precondition=True),
            "patch": _op("Change some of a virtual endpoint's fields", "200",
                         _ref(EndpointOut), EndpointPatch, ["name"], conflict=True,
                         precondition=True),
            "delete": _op("Remove a virtual endpoint", "204", None, params=["name"],
                          precondition=True)},
        "/api/v1/keys": {
            "get": _paged(_op("List API keys (never their secrets), oldest first; a page of "
                              "them with limit and offset; name_prefix: those whose name "
                              "starts with it (a person's own: me:<user id>:); endpoints: "
                              "the server names a key may name", "200",
                              _keys_listed(), query=["limit", "offset", "name_prefix"]),
                      "key"),
            "post": _op("Create an API key; the secret is shown once", "201",
                        _ref(KeyCreated), KeyIn)},
        "/api/v1/keys/{key_id}": {
            "get": _op("One API key (never its secret)", "200", _ref(KeyOut),
                       params=["key_id"]),
            "put": _op("Replace a key's name, endpoints, role and expiry (not its secret)",
                       "200", _ref(KeyOut), KeyPut, ["key_id"], conflict=True),
            "patch": _op("Change some of a key's name, endpoints, role and expiry", "200",
                         _ref(KeyOut), KeyPatch, ["key_id"], conflict=True),
            "delete": _op("Revoke an API key", "204", None, params=["key_id"])},
    }


def _users() -> dict[str, Any]:
    return {
        "/api/v1/users/{name}": {
            "get": _op("One user", "200", _ref(UserOut), params=["name"]),
            "put": _op("Replace a user's admin flag, roles and attributes (and password, if "
                       "sent)", "200",
                       _ref(UserOut), UserPut, ["name"], precondition=True, conflict=True),
            "patch": _op("Change a user's admin flag, roles, attributes or password", "200",
                         _ref(UserOut),
                         UserPatch, ["name"], precondition=True, conflict=True),
            "delete": _op("Remove a user (not oneself, not the last administrator)", "204",
                          None, params=["name"], precondition=True, conflict=True)},
        "/api/v1/users": {
            "get": _op("List users", "200", _list_of(UserOut)),
            "post": _op("Create a local user", "201", _ref(UserOut), UserIn, conflict=True)},
        **_held(),
    }


def _held() -> dict[str, Any]:
    """What a person holds open, and ending it all (proxy.api.held)."""
    count = {"type": "integer", "minimum": 0}
    session = {"type": "object", "required": ["id_hash", "endpoint", "created_at"],
               "properties": {"id_hash": {"type": "string", "description": "the session's "
                                          "hash, as its audit records hold it"},
                              "endpoint": {"type": "string"}, "created_at": TIME,
                              "protocol_version": {"type": ["string", "null"]}}}
    account = {"type": "object", "required": ["upstream", "status"], "properties": {
        "upstream": {"type": "string"},
        "status": {"type": "string", "enum": ["connected", "needs_reconnect"]}}}
    listed = {"type": "object", "required": ["user", "browser_sessions", "mcp_sessions",
                                             "upstream_accounts"], "properties": {
        "user": {"type": "string"}, "browser_sessions": count,
        "mcp_sessions": {"type": "array", "items": session},
        "upstream_accounts": {"type": "array", "items": account}}}
    ended = {"type": "object", "required": ["user", "browser_sessions", "oauth_grants",
                                            "mcp_sessions", "upstream_accounts"],
             "properties": {"user": {"type": "string"}, "browser_sessions": count,
                            "oauth_grants": count, "mcp_sessions": count,
                            "upstream_accounts": count}}
    return {"/api/v1/users/{name}/sessions": {
        "get": _op("What a person holds open: browser sessions (how many), MCP sessions, "
                   "connected upstream accounts", "200", listed, params=["name"]),
        "delete": _op("End all of a person's sessions: browser (but the caller's own), MCP, "
                      "OAuth grants, and revoke their upstream accounts; the person stays "
                      "active and keeps their API keys", "200", ended, params=["name"])}}


def _audit_and_usage() -> dict[str, Any]:
    audit = {"type": "object", "required": ["items", "next_cursor"], "properties": {
        "items": {"type": "array", "items": {"type": "object"}},
        "next_cursor": {"type": ["string", "null"]}}}
    usage = {"type": "object", "required": ["items", "since", "until"], "properties": {
        "items": {"type": "array", "items": _ref(UsageRow)},
        "since": {"type": "number"}, "until": {"type": ["number", "null"]}}}
    return {
        "/api/v1/audit": {"get": _op("Audit records, newest first", "200", audit, query=[
            "status", "endpoint", "principal", "tool", "since", "until", "cursor", "limit"])},
        "/api/v1/usage": {"get": _paged(_op(
            "tools/call totals per principal, endpoint and tool, busiest first", "200", usage,
            query=["since", "until", "endpoint", "principal", "limit"]),
            "total")},
    }


def _pins() -> dict[str, Any]:
    pending = {"type": "object", "required": ["items"], "properties": {"items": {
        "type": "array", "items": {"type": "object", "required": [
            "server", "tool", "approved", "pending", "diff", "updated_at"], "properties": {
            "server": {"type": "string"}, "tool": {"type": "string"},
            "approved": {"type": "string"}, "pending": {"type": "string"},
            "diff": {"type": "string"}, "updated_at": {"type": "number"}}}}}}
    decided = {"type": "object", "required": ["server", "tool", "approved", "rejected"],
               "properties": {"server": {"type": "string"}, "tool": {"type": "string"},
                              "approved": {"type": "string"},
                              "rejected": {"type": ["string", "null"]}}}
    return {
        "/api/v1/pins": {"get": _op("Tool definitions changed since pinned, with a diff",
                                    "200", pending)},
        "/api/v1/pins/{server}/{tool}/approve": {"post": _op(
            "Approve a changed tool definition: it becomes the pin", "200", decided,
            params=["server", "tool"], conflict=True)},
        "/api/v1/pins/{server}/{tool}/reject": {"post": _op(
            "Reject a changed tool definition: it stays hidden", "200", decided,
            params=["server", "tool"], conflict=True)},
    }


def _approvals() -> dict[str, Any]:
    """/api/v1/approvals (proxy.api.approvals): calls held for a person's yes. An approver
    calls with a browser session or the bearer JWT the MCP edge accepts for them."""
    text, when = {"type": "string"}, {"type": "number"}
    maybe = {"type": ["string", "null"]}
    approval = {"type": "object", "required": [
        "id", "rule", "status", "caller", "endpoint", "tool", "arguments_digest", "approvers",
        "created_at", "expires_at", "url"], "properties": {
        "id": text, "rule": text,
        "status": {"type": "string", "enum": ["pending", "approved", "denied", "used",
                                              "expired"]},
        "caller": text, "endpoint": text, "tool": text, "arguments_digest": text,
        "arguments": {"type": "object", "description": "the call's arguments, as shown to "
                                                      "approvers"},
        "approvers": {"type": "array", "items": text}, "created_at": when,
        "expires_at": when, "decided_by": maybe, "decided_at": {"type": ["number", "null"]},
        "comment": maybe, "url": {"type": "string", "description": "its console page"}}}
    jwt: list[dict[str, list[str]]] = [{"bearer": []}, {"cookie": []}, {"jwt": []}]
    ops = {
        "/api/v1/approvals": {"get": _op(
            "The pending approvals the caller may see (approvers theirs; administrators and "
            "auditors all), oldest first", "200", {
                "type": "object", "required": ["items"], "properties": {
                    "items": {"type": "array", "items": approval}}}, query=["endpoint"])},
        "/api/v1/approvals/{approval_id}": {"get": _op(
            "One approval, with the arguments shown to approvers", "200", approval,
            params=["approval_id"])},
        "/api/v1/approvals/{approval_id}/approve": {"post": _op(
            "Approve a held call (an approver named by the rule only)", "200", approval,
            DecisionIn, params=["approval_id"], conflict=True)},
        "/api/v1/approvals/{approval_id}/deny": {"post": _op(
            "Deny a held call; the comment is shown to the caller", "200", approval,
            DecisionIn, params=["approval_id"], conflict=True)},
    }
    for path in ops.values():
        for op in path.values():
            op["security"] = jwt
    return ops


def _console() -> dict[str, Any]:
    """The routes the web console (proxy.console) reads and writes beside the others."""
    counts = {s: {"type": "integer"} for s in ("ok", "denied", "error", "cancelled")}
    series = {"type": "object", "required": ["items", "since", "until", "bucket_s"],
              "properties": {"items": {"type": "array", "items": {
                  "type": "object", "properties": {"start": {"type": "number"}, **counts}}},
                  "since": {"type": "number"}, "until": {"type": "number"},
                  "bucket_s": {"type": "integer"}}}
    endpoint = {"type": "object", "properties": {
        "endpoint": {"type": "string"}, "calls": {"type": "integer"}, **counts,
        "error_rate": {"type": "number"},
        "p95_ms": {"type": ["number", "null"], "description": "the latency histogram bound "
                                                               "(5 ms ... 30 s) the p95 is in"}}}
    summary = {"type": "object", "required": ["endpoints", "tools", "denials",
                                              "outbox_backlog"], "properties": {
        "since": {"type": "number"}, "until": {"type": ["number", "null"]},
        "endpoints": {"type": "array", "items": endpoint},
        "tools": {"type": "array", "items": {"type": "object"}},
        "denials": {"type": "array", "items": {"type": "object"}},
        "outbox_backlog": {"type": "integer"}}}
    mine = _list_of(KeyOut)
    mine["properties"]["endpoints"] = {"type": "array", "items": {"type": "string"}}
    export = _op("The filtered audit records, newest first, as CSV or JSON lines", "200", None,
                 query=["status", "endpoint", "principal", "tool", "since", "until",
                        "format"])
    export["responses"]["200"] = {"description": "OK", "content": {
        "text/csv": {"schema": {"type": "string"}},
        "application/x-ndjson": {"schema": {"type": "string"}}}}
    return {
        "/api/v1/me/keys": {
            "get": _op("The signed-in person's own API keys, and the endpoints they may use",
                       "200", mine),
            "post": _op("Create an API key of one's own for endpoints one may use; the secret "
                        "is shown once", "201", _ref(KeyCreated), MyKeyIn)},
        "/api/v1/me/keys/{key_id}": {
            "delete": _op("Revoke one of one's own API keys", "204", None,
                          params=["key_id"])},
        "/api/v1/usage/series": {"get": _op(
            "Calls per time bucket and status (the last hour unless since/until)", "200",
            series, query=["since", "until", "bucket_s", "endpoint", "principal"])},
        "/api/v1/usage/summary": {"get": _op(
            "Per endpoint calls, error rate and p95; top tools; denials by reason; the usage "
            "outbox backlog", "200", summary, query=["since", "until"])},
        "/api/v1/audit/export": {"get": export},
        "/api/v1/audit/{record_id}": {"get": _op("One audit record, by the id /api/v1/audit "
                                                 "gives", "200", {"type": "object"},
                                                 params=["record_id"])},
    }


def _status() -> dict[str, Any]:
    """A server's status (proxy.api.status) and the live sessions."""
    when = {"type": ["number", "null"], "description": "a Unix time, or null: never"}
    text = {"type": ["string", "null"]}
    window = {"type": "object", "required": ["calls", "errors", "error_rate"], "properties": {
        "calls": {"type": "integer", "description": "audit records, denials left out"},
        "errors": {"type": "integer"}, "error_rate": {"type": "number"}}}
    tool = {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "title": text,
        "description": {**text, "description": "cut to 300 characters"}}}
    status = {"type": "object", "required": ["name", "state", "era", "health", "tools"],
              "properties": {
        "name": {"type": "string"},
        "state": {"type": "string", "enum": ["ok", "failing", "idle"], "description":
                  "idle: no call in the last 5 minutes; failing: half or more of them "
                  "errors, or the latest call of the hour an error; ok: otherwise"},
        "era": {**text, "description": "the protocol version last negotiated with the "
                                       "server (initialize, server/discover)"},
        "era_seen_at": when,
        "health": {"type": "object", "properties": {
            "last_5m": window, "last_hour": window, "last_ok_at": when,
            "last_error_at": when, "last_error": {**text, "description": "the last error's "
                                                  "audited message (of the hour)"}}},
        "tools": {"type": ["array", "null"], "items": tool, "description":
                  "the last tools/list the gateway relayed for the server, null: none yet"},
        "tools_seen_at": {**when, "description": "when the gateway first relayed the list "
                                                 "as it stands"},
        "at": {"type": "number"}}}
    sessions = {"type": "object", "required": ["total", "scope", "endpoints"], "properties": {
        "total": {"type": "integer"},
        "scope": {"type": "string", "enum": ["cluster", "process"], "description":
                  "cluster: every replica's (the Redis store); process: this process's"},
        "endpoints": {"type": "array", "items": {"type": "object", "properties": {
            "endpoint": {"type": "string"}, "sessions": {"type": "integer"}}}}}}
    statuses = {"type": "object", "required": ["items", "not_found"], "properties": {
        "items": {"type": "array", "items": status, "description": "in the order named, a "
                  "name given twice once"},
        "not_found": {"type": "array", "items": {"type": "string"},
                      "description": "the names given that name no server"}}}
    several = _op(f"The status of each of 1 to {MAX_NAMES} servers, as "
                  "/servers/{name}/status answers it, in one read", "200", statuses)
    several["parameters"] = [{
        "name": "name", "in": "query", "required": True, "style": "form", "explode": True,
        "description": "a server's name, once per server (name=a&name=b)",
        "schema": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                   "maxItems": MAX_NAMES}}]
    several["responses"]["422"] = _error("422")
    return {
        "/api/v1/servers/{name}/status": {"get": _op(
            "A server's era, health (from the audit log) and tools as last seen", "200",
            status, params=["name"])},
        "/api/v1/server-status": {"get": several},
        "/api/v1/sessions": {"get": _op("The live gateway sessions, in all and per endpoint",
                                        "200", sessions)},
    }


def _evidence() -> dict[str, Any]:
    """The audit evidence's status (proxy.api.evidence): the chain's and each export's."""
    when = {"type": ["number", "null"], "description": "a Unix time, or null: none yet"}
    number = {"type": ["integer", "null"]}
    chain = {"type": "object", "required": ["enabled", "checkpoint_seq", "verified_by"],
             "properties": {
        "enabled": {"type": "boolean", "description": "[audit.chain] enabled"},
        "checkpoint_seq": {**number, "description": "the last signed checkpoint"},
        "checkpoint_at": when,
        "chains": {"type": "integer", "description": "the chain heads it names"},
        "verified_at": {**when, "description": "the last `tollhouse audit verify`"},
        "verified_by": {"type": ["string", "null"], "description": "who ran it"},
        "verified_ok": {"type": ["boolean", "null"]},
        "verified_detail": {"type": ["string", "null"], "description":
                            "what it verified, or the first problem it found"},
        "verified_checkpoint_seq": {**number, "description": "the last checkpoint it found "
                                                             "intact"},
        "verified_checkpoint_at": when}}
    export = {"type": "object", "required": ["name", "kind", "backlog", "lag_s", "sent",
                                             "failed", "dropped", "full"], "properties": {
        "name": {"type": "string"},
        "kind": {"type": "string", "enum": ["syslog", "otlp", "splunk_hec", "webhook"]},
        "format": {"type": "string", "enum": ["ocsf", "native"]},
        "backlog": {"type": "integer", "description": "records queued, not yet delivered"},
        "lag_s": {"type": "number", "description": "the age of the oldest of them (0: none)"},
        "sent": {"type": "integer"},
        "failed": {"type": "integer", "description": "records in sends that failed, once "
                                                     "per attempt"},
        "dropped": {"type": "integer", "description": "records not queued: the backlog was "
                                                      "full"},
        "full": {"type": "boolean"},
        "last_error": {"type": ["string", "null"]},
        "last_error_at": when, "last_sent_at": when}}
    return {
        "/api/v1/audit/chain": {"get": _op(
            "The audit chain: on or off, its last signed checkpoint, and the last "
            "verification (when, by whom, its outcome)", "200", chain)},
        "/api/v1/audit/exports": {"get": _op(
            "Each [[audit.exports]]: its backlog and lag, records sent, failed and dropped, "
            "its last error", "200", {"type": "object", "required": ["items"], "properties": {
                "items": {"type": "array", "items": export}}})},
    }


def _principals() -> dict[str, Any]:
    """The names of the principals audit records hold (proxy.api.principals)."""
    text = {"type": ["string", "null"]}
    item = {"type": "object", "required": ["principal", "kind", "name"], "properties": {
        "principal": {"type": "string", "description": "as asked: as a record holds it"},
        "kind": {"type": "string", "enum": ["person", "key", "client", "unknown"]},
        "name": {"type": "string", "description": "for people to read"},
        "issuer": text, "subject": {"type": "string"}, "key_id": {"type": "string"},
        "client_id": {"type": "string"},
        "user": {"type": ["string", "null"], "description": "the person's name (a person, "
                                                             "or a person's own key)"}}}
    op = _op("The names of principals as audit records and usage rows hold them (id: once "
             "per principal, 200 at most): a person's, a key's (and whose), an OAuth "
             "client's", "200", {"type": "object", "required": ["items"], "properties": {
                 "items": {"type": "array", "items": item}}}, query=["id"])
    return {"/api/v1/principals": {"get": op}}


@cache
def document(*, connections: bool = False) -> dict[str, Any]:
    """The document of the routes served: `connections` when the app serves
    /api/v1/me/connections (proxy.connect, with a per_user upstream)."""
    schemas = _schemas()
    paths = {**_roles_and_me(), **_servers_and_keys(), **_policies(), **_users(),
             **_audit_and_usage(), **_pins(), **_approvals(), **_console(), **_status(),
             **_evidence(), **_principals()}
    if connections:
        paths.update(_connections())
    return {"openapi": "3.1.0",
            "info": {"title": "Tollhouse management API", "version": __version__},
            "paths": paths,
            "components": {"schemas": schemas, "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer",
                           "description": "a management API key (th_...) of role admin, "
                                          "or auditor to read"},
                "cookie": {"type": "apiKey", "in": "cookie", "name": "tollhouse_session"},
                "jwt": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                        "description": "on /api/v1/approvals only: a JWT the MCP edge "
                                       "accepts for the approver (a configured issuer's, "
                                       "or this gateway's authorization server's)"}}}}


async def serve() -> Response:
    """GET /api/v1/openapi.json: the document of the routes this app serves, /me/connections
    only beside a per_user upstream (proxy.connect registers them, possibly after the API)."""
    connections = any(r.rule == CONNECTIONS for r in current_app.url_map.iter_rules())
    return Response(orjson.dumps(document(connections=connections)), 200,
                    {"Content-Type": "application/json"})
