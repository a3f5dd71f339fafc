"""The root of the tree, the surfaces a request can be on, and the errors every surface shares.

A *surface* is where a request arrived; it decides the shape an error takes there, unless the
error's class fixes its own shape (`shapes`): the MCP edge answers JSON-RPC, `/api/v1`
`{"detail": ...}`, and every other route Quart serves (the OAuth server, sign-in and connect,
discovery documents) `{"error", "error_description"}` (seed 004).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

Surface = Literal["mcp", "api", "oauth"]
Shape = Literal["jsonrpc", "plain", "detail", "validation", "oauth", "tool_result"]
AuditStatus = Literal["denied", "error", "cancelled"]

SURFACES: tuple[Surface, ...] = ("mcp", "api", "oauth")
NATIVE: Mapping[Surface, Shape] = {"mcp": "jsonrpc", "api": "detail", "oauth": "oauth"}
API_PREFIX = "/api/v1"


def surface_of(path: str) -> Surface:
    """The surface of a request Quart serves, the one place it is decided. By path, because a
    refusal before routing (an unknown path, a wrong method) has no route to ask. The MCP edge
    never reaches Quart: it renders on "mcp" itself."""
    return "api" if path.startswith(API_PREFIX) else "oauth"


def retry_after(seconds: float) -> dict[str, str]:
    """Retry-After in whole seconds, rounded up, at least 1."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


class GatewayError(Exception):
    """Base of every answer that is not the upstream's own.

    Each class states its wire facts as ClassVars: the surfaces it can be raised on, a shape
    where it is not the surface's own, the HTTP status, the JSON-RPC code and message (seed
    004), the OAuth error code; and its audit facts: a denial (`status: denied`,
    `denied_reason`) or an error (`error_message`). `detail` is the audit's reason on the MCP
    edge, shown only when `expose_detail`; on /api/v1 and the OAuth surface it is the text."""

    surfaces: ClassVar[frozenset[Surface]] = frozenset({"mcp"})
    shapes: ClassVar[Mapping[Surface, Shape]] = {}
    http_status: ClassVar[int] = 400
    code: ClassVar[int] = -32600
    message: ClassVar[str] = "Invalid Request"
    audit_status: ClassVar[AuditStatus] = "error"
    expose_detail: ClassVar[bool] = True
    oauth_error: ClassVar[str] = "invalid_request"
    with_id: ClassVar[bool] = True  # a JSON-RPC body carries "id" (null when unknown)
    # for metrics: what kind of upstream failure this is (None: not one), and the policy
    # that refused the call (set by the chain runner on the denial it raised)
    upstream_kind: ClassVar[str | None] = None
    decided_by: str | None = None
    # the policy decision's audit object (the Cedar gate's: version, decision, policies),
    # which the record keeps; never on the wire
    policy: dict[str, Any] | None = None

    def __init__(self, detail: str | None = None, *, data: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail or self.message)
        self.detail = detail
        self.data = data
        self.headers = headers or {}

    @classmethod
    def shape_on(cls, surface: Surface) -> Shape:
        return cls.shapes.get(surface, NATIVE[surface])

    @property
    def wire_status(self) -> int:
        return self.http_status

    @property
    def wire_message(self) -> str:
        """The JSON-RPC (and plain) message the client sees; never an upstream body or a
        secret."""
        return (self.detail if self.expose_detail else None) or self.message

    @property
    def description(self) -> str:
        """The text of `{"detail": ...}` and of `error_description`."""
        return self.detail or self.message

    @property
    def audit_reason(self) -> str:
        """What the audit log records as denied_reason or error_message."""
        return str(self)

    @property
    def error_type(self) -> str:
        """The OpenTelemetry MCP conventions' `error.type` of this answer on the MCP edge: the
        JSON-RPC code; `tool_error` for a tool result with isError; the HTTP status for an
        answer that is not JSON-RPC shaped."""
        shape = self.shape_on("mcp")
        if shape == "jsonrpc":
            return str(self.code)
        if shape == "tool_result":
            return "tool_error"
        return str(self.wire_status)


# -- on every surface --------------------------------------------------------------------------

class LockedOut(GatewayError):
    """Too many failed credentials: seed 004 answers in the OAuth shape with Retry-After, on
    every surface, with one text. `reason` is the audit's."""

    surfaces = frozenset({"mcp", "api", "oauth"})
    shapes: ClassVar[Mapping[Surface, Shape]] = {"mcp": "oauth", "api": "oauth"}
    http_status = 429
    message = "too many failed authentication attempts; try again later"
    oauth_error = "too_many_requests"
    audit_status = "denied"

    def __init__(self, reason: str, retry_after_s: float) -> None:
        super().__init__(reason, headers=retry_after(retry_after_s))
        self.retry_after_s = retry_after_s

    @property
    def wire_message(self) -> str:
        return self.message

    @property
    def description(self) -> str:
        return self.message


class BodyTooLarge(GatewayError):
    """Over a body cap, declared or streamed. On the MCP edge seed 004's -32600; elsewhere
    the detail names the limit."""

    surfaces = frozenset({"mcp", "api", "oauth"})
    http_status = 413
    code = -32600
    message = "Request body too large"
    audit_status = "denied"

    @classmethod
    def over(cls, limit: int) -> BodyTooLarge:
        return cls(f"request body exceeds the {limit}-byte limit")


class StoreUnavailable(GatewayError):
    """A store this request needs cannot answer (a shared store down or out of reach): 503
    with Retry-After, nothing forwarded. On the MCP edge seed 000's boundary message for a
    missing runtime dependency; on /api/v1 `{"detail": ...}`; on the OAuth surface
    `temporarily_unavailable`. `detail` says what is unavailable (the audit log, /api/v1)."""

    surfaces = frozenset({"mcp", "api", "oauth"})
    http_status = 503
    code = -32000
    message = "Resident runtime unavailable"
    expose_detail = False
    oauth_error = "temporarily_unavailable"

    def __init__(self, detail: str | None = None, retry_after_s: float = 1.0) -> None:
        super().__init__(detail, headers=retry_after(retry_after_s))

    @property
    def description(self) -> str:
        return self.detail or "the live-state store is unavailable; retry"

    @property
    def audit_reason(self) -> str:
        """One fixed word, so an outage is easy to count in the audit log; which store and
        why is in the gateway's log (proxy.web.routes, proxy.mcp.gateway)."""
        return "state_store_unavailable"


class DatabaseUnavailable(StoreUnavailable):
    """The database is locked past its busy timeout, or unreachable: worth a retry shortly."""

    surfaces = frozenset({"api", "oauth"})

    def __init__(self, detail: str = "the database is busy; retry") -> None:
        super().__init__(detail)

    @property
    def audit_reason(self) -> str:
        return str(self)


class Draining(GatewayError):
    """The gateway is stopping (SIGTERM): a new session, call or GET stream is refused so the
    client retries on another replica, while the calls it already runs finish. The wire is
    StoreUnavailable's (503, Retry-After, seed 000's boundary message on the MCP edge); the
    audit says `draining`. Only the MCP edge refuses: the management API and the OAuth
    server keep answering while the process drains."""

    http_status = 503
    code = -32000
    message = "Resident runtime unavailable"
    expose_detail = False

    def __init__(self, retry_after_s: float = 1.0) -> None:
        super().__init__("draining", headers=retry_after(retry_after_s))

    @property
    def description(self) -> str:
        return "the gateway is shutting down; retry"


class InternalError(GatewayError):
    """A bug or an unexpected failure: fail closed, say nothing about it on the wire."""

    surfaces = frozenset({"mcp", "api", "oauth"})
    http_status = 500
    code = -32603
    message = "Internal error"
    expose_detail = False
    oauth_error = "server_error"

    @property
    def description(self) -> str:
        return "internal error"
