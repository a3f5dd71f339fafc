"""An audit record as an OCSF 1.x event of class API Activity (class_uid 6003, category
Application Activity, 6): `event(record)` from a record's native form (proxy.audit.exports.
queue.native). docs/audit-export.md lists the mapping field by field; a field of the record
OCSF has no place for is kept under `unmapped`, so nothing the audit log holds is left out.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from proxy import __version__

OCSF_VERSION = "1.3.0"
CLASS_UID = 6003
CATEGORY_UID = 6
# activity_id: a read of the upstream's catalogue or content is Read; a session's initialize
# Create; a session's DELETE Delete; every other MCP method (tools/call, a notification...)
# Other (99), named by activity_name
_READS = frozenset({"tools/list", "prompts/list", "prompts/get", "resources/list",
                    "resources/read", "resources/templates/list", "server/discover",
                    "tasks/get", "tasks/list", "tasks/result", "GET", "ping",
                    "completion/complete"})
_ACTIVITIES = {1: "Create", 2: "Read", 3: "Update", 4: "Delete", 99: "Other"}
# status: ok -> Success (1); denied, error -> Failure (2); cancelled -> Other (99)
_STATUS = {"ok": (1, "Success"), "denied": (2, "Failure"), "error": (2, "Failure"),
           "cancelled": (99, "Other")}
# severity: a refusal is Medium (3, what a SOC looks at), an error Low (2), the rest
# Informational (1)
_SEVERITY = {"denied": (3, "Medium"), "error": (2, "Low")}
_UNMAPPED = ("call_id", "note", "upstream", "bytes_in", "bytes_out", "era", "egress",
             "policy")


def activity(method: str | None) -> int:
    """The OCSF activity_id of an MCP method."""
    if method == "initialize":
        return 1
    if method == "DELETE":
        return 4
    if method in _READS:
        return 2
    return 99


def event(record: dict[str, Any]) -> dict[str, Any]:
    """The OCSF API Activity event of a record in its native form."""
    method = record.get("method")
    status = str(record.get("status") or "")
    activity_id = activity(method)
    status_id, status_name = _STATUS.get(status, (0, "Unknown"))
    severity_id, severity = _SEVERITY.get(status, (1, "Informational"))
    ts_ms = math.floor(float(record["ts"]) * 1000)
    duration = round(float(record.get("duration_ms") or 0.0))
    detail = record.get("denied_reason") or record.get("error_message")
    out: dict[str, Any] = {
        "class_uid": CLASS_UID, "class_name": "API Activity",
        "category_uid": CATEGORY_UID, "category_name": "Application Activity",
        "activity_id": activity_id, "activity_name": _ACTIVITIES[activity_id],
        "type_uid": CLASS_UID * 100 + activity_id,
        "type_name": f"API Activity: {_ACTIVITIES[activity_id]}",
        "severity_id": severity_id, "severity": severity,
        "status_id": status_id, "status": status_name, "status_code": status,
        "time": ts_ms, "start_time": ts_ms, "end_time": ts_ms + duration,
        "duration": duration,
        "message": _message(record, method, status),
        "metadata": {
            "version": OCSF_VERSION, "uid": record["event_id"], "log_name": "audit",
            "product": {"name": "Tollhouse", "vendor_name": "Tollhouse",
                        "version": __version__},
            "original_time": str(record["ts"]),
        },
        "actor": _actor(record),
        "api": _api(record, method, status, detail),
        "src_endpoint": _source(record),
        "dst_endpoint": {"svc_name": record.get("endpoint")},
    }
    if detail:
        out["status_detail"] = detail
    if record.get("tool"):
        out["resources"] = [{"type": "tool", "name": record["tool"]}]
    out["unmapped"] = {key: _json(record.get(key)) for key in _UNMAPPED
                       if record.get(key) is not None}
    return out


def _actor(record: dict[str, Any]) -> dict[str, Any]:
    principal = record.get("principal") or ""
    actor: dict[str, Any] = {"user": {"uid": principal, "name": principal}}
    if record.get("session_hash"):
        actor["session"] = {"uid": record["session_hash"]}
    if record.get("client_name"):
        actor["app_name"] = record["client_name"]
    return actor


def _api(record: dict[str, Any], method: str | None, status: str, detail: Any
         ) -> dict[str, Any]:
    api: dict[str, Any] = {"operation": method or "", "service": {"name": record.get("endpoint")},
                           "version": record.get("era")}
    if record.get("request_id") is not None:
        api["request"] = {"uid": record["request_id"]}
    if status in ("denied", "error") and detail:
        api["response"] = {"error": status, "error_message": detail}
    return api


def _source(record: dict[str, Any]) -> dict[str, Any]:
    """The caller as the record knows it: the audit log keeps no client address, so the MCP
    client's name and its session stand for it."""
    source: dict[str, Any] = {}
    if record.get("client_name"):
        source["name"] = record["client_name"]
    if record.get("session_hash"):
        source["uid"] = record["session_hash"]
    return source or {"name": "unknown"}


def _message(record: dict[str, Any], method: str | None, status: str) -> str:
    what = method or "request"
    if record.get("tool"):
        what = f"{what} {record['tool']}"
    return f"{what} on {record.get('endpoint')} by {record.get('principal') or '-'}: {status}"


def _json(value: Any) -> Any:
    """A JSON column (egress, policy) as the object it holds; any other value as it is."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value
