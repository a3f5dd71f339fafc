"""The /api/v1 route table: every route, the module-level handler that serves it and who may
call it (administrators; `admin=False`: anyone signed in; `auditor=True`: auditors too, on a
read), and whether it reads audit records (each call then audited), in the order they are
registered. Each is served through `endpoint.view`; the
handlers reach the `Api` and the caller as arguments (see `endpoint`)."""

from __future__ import annotations

from quart import Quart

from proxy.api import (
    approvals,
    audit,
    caller,
    endpoints,
    evidence,
    group_roles,
    held,
    keys,
    mine,
    openapi,
    pins,
    policies,
    principals,
    roles,
    servers,
    status,
    summary,
    users,
)
from proxy.api.endpoint import Route, view

PREFIX = "/api/v1"

ROUTES: tuple[Route, ...] = (
    Route("/me", "GET", caller.me, admin=False),
    Route("/servers", "GET", servers.servers, query=True),
    Route("/servers", "POST", servers.create_server),
    Route("/servers/<name>", "GET", servers.server),
    Route("/servers/<name>", "PUT", servers.put_server),
    Route("/servers/<name>", "PATCH", servers.patch_server),
    Route("/servers/<name>", "DELETE", servers.delete_server),
    Route("/servers/<name>/status", "GET", status.server_status),
    Route("/server-status", "GET", status.server_statuses, query=True),
    Route("/sessions", "GET", status.sessions),
    Route("/endpoints", "GET", endpoints.endpoints),
    Route("/endpoints", "POST", endpoints.create_endpoint),
    Route("/endpoints/<name>", "GET", endpoints.endpoint),
    Route("/endpoints/<name>", "PUT", endpoints.put_endpoint),
    Route("/endpoints/<name>", "PATCH", endpoints.patch_endpoint),
    Route("/endpoints/<name>", "DELETE", endpoints.delete_endpoint),
    Route("/keys", "GET", keys.keys, query=True),
    Route("/keys", "POST", keys.create_key),
    Route("/keys/<key_id>", "GET", keys.key),
    Route("/keys/<key_id>", "PUT", keys.put_key),
    Route("/keys/<key_id>", "PATCH", keys.patch_key),
    Route("/keys/<key_id>", "DELETE", keys.revoke_key),
    Route("/users", "GET", users.users),
    Route("/users", "POST", users.create_user),
    Route("/users/<name>", "GET", users.user),
    Route("/users/<name>", "PUT", users.put_user),
    Route("/users/<name>", "PATCH", users.patch_user),
    Route("/users/<name>", "DELETE", users.delete_user),
    # what a person holds open, and "end all sessions" (issue 43): the person stays active
    Route("/users/<name>/sessions", "GET", held.person_sessions),
    Route("/users/<name>/sessions", "DELETE", held.end_person_sessions, names_change=True),
    Route("/policies", "GET", policies.policies, auditor=True),
    Route("/policies", "POST", policies.create_policy, names_change=True),
    Route("/policies/<policy_id>", "GET", policies.policy, auditor=True),
    Route("/policies/<policy_id>", "PUT", policies.put_policy, names_change=True),
    Route("/policies/<policy_id>", "DELETE", policies.delete_policy, names_change=True),
    Route("/roles", "GET", roles.roles),
    Route("/roles", "POST", roles.create_role),
    Route("/roles/<name>", "GET", roles.role),
    Route("/roles/<name>", "PUT", roles.put_role),
    Route("/roles/<name>", "PATCH", roles.patch_role),
    Route("/roles/<name>", "DELETE", roles.delete_role),
    Route("/group-roles", "GET", group_roles.group_roles),
    Route("/group-roles", "PUT", group_roles.put_group_role),
    Route("/group-roles", "DELETE", group_roles.delete_group_role, query=True),
    Route("/audit", "GET", audit.audit, query=True, auditor=True, reads_audit=True),
    Route("/usage", "GET", audit.usage_totals, query=True, auditor=True),
    Route("/pins", "GET", pins.pending),
    # calls held for a person's yes (issue 40): their approvers, with a browser session or
    # the bearer JWT the MCP edge accepts for them; administrators and auditors read them
    Route("/approvals", "GET", approvals.approvals, admin=False, query=True, approver=True),
    Route("/approvals/<approval_id>", "GET", approvals.approval, admin=False, approver=True),
    Route("/approvals/<approval_id>/approve", "POST", approvals.approve_approval, admin=False,
          approver=True),
    Route("/approvals/<approval_id>/deny", "POST", approvals.deny_approval, admin=False,
          approver=True),
    Route("/pins/<server>/<tool>/approve", "POST", pins.approve, names_change=True),
    Route("/pins/<server>/<tool>/reject", "POST", pins.reject, names_change=True),
    # -- the web console's (proxy.console), for scripts as much: a person's own keys, the
    # aggregates its charts read, and the audit export
    Route("/me/keys", "GET", mine.my_keys, admin=False),
    Route("/me/keys", "POST", mine.create_my_key, admin=False),
    Route("/me/keys/<key_id>", "DELETE", mine.revoke_my_key, admin=False),
    Route("/usage/series", "GET", summary.usage_series, query=True, auditor=True),
    Route("/usage/summary", "GET", summary.usage_summary, query=True, auditor=True),
    Route("/audit/export", "GET", summary.audit_export, query=True, auditor=True,
          reads_audit=True),
    # the audit evidence's status (issue 39): the chain's and each export's
    Route("/audit/chain", "GET", evidence.chain, auditor=True),
    Route("/audit/exports", "GET", evidence.exports, auditor=True),
    Route("/audit/<record_id>", "GET", summary.audit_record, auditor=True, reads_audit=True),
    # the names of the principals records hold (issue 43): people, keys, OAuth clients
    Route("/principals", "GET", principals.principals, query=True, auditor=True),
)


def register(app: Quart) -> None:
    for route in ROUTES:
        app.add_url_rule(PREFIX + route.rule, route.endpoint, view(route),
                         methods=[route.method])
    # unauthenticated: the document of the routes this app serves
    app.add_url_rule(PREFIX + "/openapi.json", "openapi", openapi.serve)
