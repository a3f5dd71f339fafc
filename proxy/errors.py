"""Every failure the gateway can answer, and the one function that renders it.

Code anywhere raises one of these; only the edge renders, through `render`. Each class states its
wire facts as ClassVars (seed 004 is normative for shapes, codes and statuses), and its audit
facts: whether it is a denial (`status: denied`, `denied_reason`) or an error (`error_message`).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import orjson

Surface = Literal["jsonrpc", "plain", "oauth", "tool_result"]
AuditStatus = Literal["denied", "error", "cancelled"]


class GatewayError(Exception):
    """Base of every answer that is not the upstream's own."""

    surface: ClassVar[Surface] = "jsonrpc"
    http_status: ClassVar[int] = 400
    code: ClassVar[int] = -32600
    message: ClassVar[str] = "Invalid Request"
    audit_status: ClassVar[AuditStatus] = "error"
    expose_detail: ClassVar[bool] = True
    oauth_error: ClassVar[str] = "invalid_request"
    with_id: ClassVar[bool] = True  # a JSON-RPC body carries "id" (null when unknown)

    def __init__(self, detail: str | None = None, *, data: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail or self.message)
        self.detail = detail
        self.data = data
        self.headers = headers or {}

    @property
    def wire_message(self) -> str:
        """The message the client sees; never an upstream body or a secret."""
        return (self.detail if self.expose_detail else None) or self.message

    @property
    def audit_reason(self) -> str:
        """What the audit log records as denied_reason or error_message."""
        return str(self)


# -- answered before any JSON-RPC parsing, HTTP-shaped (seed 004) ------------------------------

class EndpointNotFound(GatewayError):
    surface = "plain"
    http_status = 404
    message = "not found"


class SessionNotFound(GatewayError):
    surface = "plain"
    http_status = 404
    message = "session not found"
    audit_status = "denied"


class MethodNotAllowed(GatewayError):
    surface = "plain"
    http_status = 405
    message = "method not allowed"


# -- guards, JSON-RPC shaped ---------------------------------------------------------------------

class BodyTooLarge(GatewayError):
    http_status = 413
    code = -32600
    message = "Request body too large"
    audit_status = "denied"


class OriginNotAllowed(GatewayError):
    http_status = 403
    code = -32600
    message = "Forbidden: Origin not allowed"
    audit_status = "denied"


class Unauthenticated(GatewayError):
    """No, or a bad, credential. The wire never says which check failed; the audit does."""

    http_status = 401
    code = -32000
    message = "Unauthorized"
    audit_status = "denied"
    expose_detail = False


class Forbidden(GatewayError):
    """A valid credential without the right to this endpoint or operation."""

    http_status = 403
    code = -32000
    message = "Forbidden"
    audit_status = "denied"
    expose_detail = False


class LockedOut(GatewayError):
    """Too many failed credentials: seed 004 answers in the OAuth shape with Retry-After."""

    surface = "oauth"
    http_status = 429
    message = "too many failed authentication attempts; try again later"
    oauth_error = "too_many_requests"
    audit_status = "denied"

    def __init__(self, reason: str, retry_after_s: float) -> None:
        super().__init__(reason, headers={"Retry-After": str(max(1, math.ceil(retry_after_s)))})

    @property
    def wire_message(self) -> str:
        return self.message


class NotAcceptable(GatewayError):
    http_status = 406
    code = -32600
    message = "Not Acceptable: Accept must include application/json and text/event-stream"


class UnsupportedMediaType(GatewayError):
    http_status = 415
    code = -32600
    message = "Unsupported Media Type: Content-Type must be application/json"


# -- the message itself ----------------------------------------------------------------------------

class ParseError(GatewayError):
    code = -32700
    message = "Parse error"


class InvalidRequest(GatewayError):
    code = -32600
    message = "Invalid Request"


class InvalidParams(GatewayError):
    code = -32602
    message = "Invalid params"


class MethodNotFound(GatewayError):
    http_status = 404
    code = -32601
    message = "Method not found"


class HeaderMismatch(GatewayError):
    """A 2026-07-28 request whose mirrored header is missing, duplicated or disagrees."""

    code = -32020
    message = "Header mismatch"


class UnsupportedVersion(GatewayError):
    code = -32022
    message = "Unsupported protocol version"


class InvalidEnvelope(GatewayError):
    code = -32602
    message = "Invalid _meta envelope"


class PolicyDenied(GatewayError):
    """Base for denials raised by policies; `reason` names the policy and the rule."""

    http_status = 403
    code = -32003
    message = "Forbidden"
    audit_status = "denied"

    def __init__(self, reason: str, detail: str | None = None, **kw: Any) -> None:
        super().__init__(detail, **kw)
        self.reason = reason

    @property
    def audit_reason(self) -> str:
        return self.reason


class HiddenTool(PolicyDenied):
    """A tool the caller may not use answers exactly as an unknown tool would (seed 003)."""

    http_status = 400
    code = -32602

    def __init__(self, reason: str, tool: str) -> None:
        super().__init__(reason, f"Unknown tool: {tool}")


class RateLimited(PolicyDenied):
    """Seed 000's body at HTTP 429; Retry-After says when the caller may try again."""

    http_status = 429
    code = -32000
    message = "Too many requests"

    def __init__(self, reason: str, retry_after_s: float) -> None:
        seconds = max(1, math.ceil(retry_after_s))
        super().__init__(reason, headers={"Retry-After": str(seconds)})
        self.retry_after_s = retry_after_s


class MeteringDenied(PolicyDenied):
    """The metering hook refused the call without a message for the person: seed 004 answers
    -32000 at HTTP 200 with the hook's reason verbatim, and audits the same string."""

    http_status = 200
    code = -32000

    def __init__(self, reason: str) -> None:
        super().__init__(reason, reason[:500])


# seed 001's closed registry for denials a person should read: code -> retryable
TOOL_ERROR_CODES = {"gateway.metering.denied": False, "gateway.metering.unavailable": True,
                    "gateway.internal": True}


class ToolResultDenial(PolicyDenied):
    """A tools/call refusal a person should read: a tool result with isError and seed 001's
    structured content (error_id, code, message, retryable, trace_id, details, created_at)."""

    surface = "tool_result"
    http_status = 200

    def __init__(self, reason: str, user_message: str, code: str,
                 retry_after_ms: int | None = None) -> None:
        super().__init__(reason, user_message[:500])
        self.tool_code = code
        self.retry_after_ms = retry_after_ms


# -- after routing: HTTP 200, the call's own answer (seed 004) -----------------------------------

class UpstreamFailure(GatewayError):
    """The upstream call failed; the message is short free text with no upstream body."""

    http_status = 200
    code = -32000
    message = "upstream failure"


class UpstreamUnavailable(UpstreamFailure):
    message = "upstream unavailable"


class UpstreamTimeout(UpstreamFailure):
    message = "upstream timed out"


class UpstreamHTTPError(UpstreamFailure):
    def __init__(self, status: int) -> None:
        super().__init__(f"upstream answered HTTP {status}")
        self.status = status


class UpstreamProtocolError(UpstreamFailure):
    message = "upstream sent an invalid MCP response"


class UpstreamStreamCut(UpstreamFailure):
    message = "upstream stream ended before the response"


class UpstreamBadGateway(GatewayError):
    """An upstream failure where there is no call to answer: a notification or a response the
    client posted, the GET stream, a DELETE. The 2025-11-25 Streamable HTTP transport answers
    input it cannot accept with an HTTP error status whose body MAY be a JSON-RPC error
    response that has no id (its schema makes `id` optional there): 502, -32000, no `id`,
    never the upstream's body or headers, so it cannot pass for the client's own 401 or 403."""

    http_status = 502
    code = -32000
    message = "upstream failure"
    with_id = False


NO_ID = object()  # an upstream error that carried no id at all


class UpstreamRejected(GatewayError):
    """The upstream's own JSON-RPC error, relayed: its verdict on the request, not a failure to
    reach it. Code, message and data are the upstream's (so codes beyond seed 004's list can
    reach the client); the HTTP status is chosen by `status_for`, never the upstream's 401, 403
    or 404, which would pass for the gateway's own answer about the caller's credential or
    session. Audited as an error with the upstream's code."""

    http_status = 200
    code = -32000
    message = "upstream error"

    def __init__(self, error: dict[str, Any], status: int, *, call: bool = True,
                 upstream_id: Any = NO_ID, retry_after: str | None = None) -> None:
        super().__init__(f"upstream error {error['code']}",
                         headers={"Retry-After": retry_after} if retry_after else None)
        self.error = error
        self.status = status
        self.call = call  # answers the client's request: the error carries its id
        self.upstream_id = upstream_id  # otherwise the id the upstream gave, if any

    @staticmethod
    def status_for(upstream_status: int, code: int, *, modern: bool, call: bool) -> int | None:
        """The status a relayed error keeps, or None when it is not relayed at all. For a call:
        400 and 429 stay; a 2026-07-28 request's 404 `-32601` stays 404 (that revision says
        so); anything else is 200. Where there is no call to answer, the client's mistake keeps
        its 4xx, except 401, 403 and 407: those refuse the gateway's own upstream credential,
        which is an upstream failure (502), never the client's."""
        if call:
            if upstream_status in (400, 429):
                return upstream_status
            if upstream_status == 404 and modern and code == -32601:
                return 404
            return 200
        if upstream_status in (401, 403, 407):
            return None
        return upstream_status

    def body(self, request_id: Any) -> bytes:
        if self.call:
            return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "error": self.error})
        if self.upstream_id is NO_ID:
            return orjson.dumps({"jsonrpc": "2.0", "error": self.error})
        return orjson.dumps({"jsonrpc": "2.0", "id": self.upstream_id, "error": self.error})


class Cancelled(GatewayError):
    http_status = 200
    code = -32800
    message = "Request cancelled"
    audit_status = "cancelled"


class InternalError(GatewayError):
    """A bug or an unexpected failure: fail closed, say nothing about it on the wire."""

    http_status = 500
    code = -32603
    message = "Internal error"
    expose_detail = False


def jsonrpc_error_body(code: int, message: str, request_id: Any = None,
                       data: dict[str, Any] | None = None, *, with_id: bool = True) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    if not with_id:
        return orjson.dumps({"jsonrpc": "2.0", "error": error})
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "error": error})


def render(exc: GatewayError, request_id: Any = None) -> tuple[int, dict[str, str], bytes]:
    """Return (HTTP status, headers, body) for `exc` on the MCP edge."""
    if isinstance(exc, UpstreamRejected):
        body = exc.body(request_id)
        return exc.status, {"Content-Type": "application/json", **exc.headers}, body
    if exc.surface == "plain":
        body = orjson.dumps({"error": exc.wire_message})
    elif exc.surface == "oauth":
        body = orjson.dumps({"error": exc.oauth_error, "error_description": exc.wire_message})
    elif isinstance(exc, ToolResultDenial):
        body = orjson.dumps({"jsonrpc": "2.0", "id": request_id,
                             "result": tool_error_result(exc)})
    else:
        body = jsonrpc_error_body(exc.code, exc.wire_message, request_id, exc.data,
                                  with_id=exc.with_id)
    return exc.http_status, {"Content-Type": "application/json", **exc.headers}, body


def tool_error_result(exc: ToolResultDenial) -> dict[str, Any]:
    import datetime as dt
    import secrets

    structured: dict[str, Any] = {
        "error_id": f"err_{secrets.token_hex(10)}",
        "code": exc.tool_code,
        "message": exc.wire_message,
        "retryable": TOOL_ERROR_CODES.get(exc.tool_code, False),
        "trace_id": f"trc_{secrets.token_hex(10)}",
        "details": {},
        "created_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if exc.retry_after_ms is not None:
        structured["retry_after_ms"] = exc.retry_after_ms
    return {"content": [{"type": "text", "text": exc.wire_message}], "isError": True,
            "structuredContent": structured}


def sse_event(body: bytes) -> bytes:
    """One SSE `message` event carrying a JSON-RPC message."""
    return b"event: message\ndata: " + body + b"\n\n"


class BodyTimeout(GatewayError):
    http_status = 408
    code = -32600
    message = "Request body not received in time"


class StoreUnavailable(GatewayError):
    """A live-state store this request needs cannot answer (a shared store down or out of
    reach): 503 with Retry-After, nothing forwarded. On the MCP edge seed 000's boundary
    message for a missing runtime dependency; on /api/v1 `{"detail": ...}`; on /oauth/
    `temporarily_unavailable`. `detail` says what is unavailable (the audit log, /api/v1)."""

    http_status = 503
    code = -32000
    message = "Resident runtime unavailable"
    expose_detail = False
    oauth_error = "temporarily_unavailable"

    def __init__(self, detail: str | None = None, retry_after_s: float = 1.0) -> None:
        super().__init__(detail, headers={"Retry-After": str(max(1, math.ceil(retry_after_s)))})
