"""The MCP edge's own errors, in the order a request meets them: refused before any JSON-RPC
parsing (plain), by the guards, for the message itself, by a policy, by the upstream, cancelled.
They render in JSON-RPC unless a class says otherwise (seed 004)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from proxy.errors.base import GatewayError, Shape, Surface, retry_after

# -- answered before any JSON-RPC parsing, HTTP-shaped (seed 004) ------------------------------

class EndpointNotFound(GatewayError):
    """An endpoint that does not exist; also a discovery document for one (the OAuth
    surface), in the same plain shape."""

    surfaces = frozenset({"mcp", "oauth"})
    shapes: ClassVar[Mapping[Surface, Shape]] = {"mcp": "plain", "oauth": "plain"}
    http_status = 404
    message = "not found"


class SessionNotFound(GatewayError):
    shapes: ClassVar[Mapping[Surface, Shape]] = {"mcp": "plain"}
    http_status = 404
    message = "session not found"
    audit_status = "denied"


class MethodNotAllowed(GatewayError):
    shapes: ClassVar[Mapping[Surface, Shape]] = {"mcp": "plain"}
    http_status = 405
    message = "method not allowed"


# -- guards, JSON-RPC shaped (and BodyTooLarge, LockedOut: .base) --------------------------------


class Unauthenticated(GatewayError):
    """No, or a bad, credential. The MCP edge never says which check failed; the audit does."""

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


class OriginNotAllowed(GatewayError):
    http_status = 403
    code = -32600
    message = "Forbidden: Origin not allowed"
    audit_status = "denied"


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
        super().__init__(reason, headers=retry_after(retry_after_s))
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
                    "gateway.internal": True, "gateway.guardrail.blocked": False,
                    "gateway.policy.denied": False,
                    # approvals (proxy/approvals.py): refused by a person; not decided in time
                    # (retry the same call: it runs once approved); too many pending already
                    "gateway.approval.denied": False, "gateway.approval.pending": True,
                    "gateway.approval.too_many": True}


class ToolResultDenial(PolicyDenied):
    """A tools/call refusal a person should read: a tool result with isError and seed 001's
    structured content (error_id, code, message, retryable, trace_id, details, created_at)."""

    shapes: ClassVar[Mapping[Surface, Shape]] = {"mcp": "tool_result"}
    http_status = 200

    def __init__(self, reason: str, user_message: str, code: str,
                 retry_after_ms: int | None = None) -> None:
        super().__init__(reason, user_message[:500])
        self.tool_code = code
        self.retry_after_ms = retry_after_ms
        # a 2026-07-28 result names its kind ("complete"): the gateway sets it for such a call
        self.result_type: str | None = None
        self.details: dict[str, Any] = {}  # seed 001's `details` (an approval's id and URL)


class ApprovalRequired(ToolResultDenial):
    """A call an `[[approvals]]` rule holds for a person's yes (policies.approvals): the
    spine holds it (proxy/approvals.py) and answers it as below when no decision comes within
    the rule's `wait_s`: `gateway.approval.pending`, retryable, the approval's id and URL in
    `details`. `approval` is the store's `Approval`."""

    def __init__(self, approval: Any, url: str, new: bool = False) -> None:
        super().__init__(f"approval pending: {approval.id} ({approval.rule})",
                         "This call needs approval before it runs; it was not decided in "
                         "time. Retry the same call once it is approved.",
                         "gateway.approval.pending", retry_after_ms=5000)
        self.approval = approval
        self.new = new  # asked for by this call (announced on the approvals webhook)
        self.details = {"approval_id": approval.id, "approval_url": url,
                        "rule": approval.rule}


class PolicyBlocked(PolicyDenied):
    """A prompts/get's or resources/read's arguments a Cedar policy refuses (a tools/call's
    answers as a `ToolResultDenial`, `gateway.policy.denied`): invalid params, naming the
    policy's reason, never an argument's value."""

    http_status = 400
    code = -32602
    message = "Invalid params"


class GuardrailBlocked(PolicyDenied):
    """A prompts/get's or resources/read's arguments a guardrail refuses (a tools/call's
    answers as a `ToolResultDenial`): invalid params, naming the rule and kinds, not values."""

    http_status = 400
    code = -32602
    message = "Invalid params"


# -- after routing: HTTP 200, the call's own answer (seed 004) -----------------------------------

class GuardrailResultBlocked(PolicyDenied):
    """A prompts/get's or resources/read's result a guardrail refuses (a tools/call's answers
    as a `ToolResultDenial`): the routed call's -32000 at HTTP 200 (the last event of a
    stream), its message naming the rule and the kinds, never a value; no data."""

    http_status = 200
    code = -32000



class UpstreamFailure(GatewayError):
    """The upstream call failed; the message is short free text with no upstream body."""

    http_status = 200
    code = -32000
    message = "upstream failure"
    upstream_kind = "failure"


class UpstreamUnavailable(UpstreamFailure):
    message = "upstream unavailable"
    upstream_kind = "unavailable"


class UpstreamTimeout(UpstreamFailure):
    message = "upstream timed out"
    upstream_kind = "timeout"


class UpstreamHTTPError(UpstreamFailure):
    upstream_kind = "http_status"

    def __init__(self, status: int) -> None:
        super().__init__(f"upstream answered HTTP {status}")
        self.status = status


class UpstreamProtocolError(UpstreamFailure):
    message = "upstream sent an invalid MCP response"
    upstream_kind = "protocol"


class UpstreamStreamCut(UpstreamFailure):
    message = "upstream stream ended before the response"
    upstream_kind = "stream_cut"


class ResponseTooLarge(UpstreamFailure):
    """An answer the gateway must hold whole to rewrite it (a filtered list, a bridged
    result) grew past `server.max_response_bytes`; an answer nobody rewrites streams through
    at any size."""

    message = "upstream answer over server.max_response_bytes"
    upstream_kind = "too_large"

    def __init__(self, limit: int | None = None) -> None:
        super().__init__(None if limit is None else
                         f"upstream answer over server.max_response_bytes ({limit} bytes)")


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
    upstream_kind = "bad_gateway"


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

    @property
    def wire_status(self) -> int:
        return self.status

    @property
    def error_type(self) -> str:
        return str(self.error["code"])


class Cancelled(GatewayError):
    http_status = 200
    code = -32800
    message = "Request cancelled"
    audit_status = "cancelled"


class BodyTimeout(GatewayError):
    http_status = 408
    code = -32600
    message = "Request body not received in time"


