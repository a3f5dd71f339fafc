"""The errors of the routes Quart serves: the management API's domain rules and validation,
the OAuth server's RFC 6749 errors, and the refusals every route shares (a NUL, a framework
refusal such as an unknown path)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from proxy.errors.base import GatewayError, Shape, Surface

if TYPE_CHECKING:
    from pydantic import ValidationError


# -- /api/v1: {"detail": "<message>"} for a domain rule (seed 004's status table) ----------------

class ApiError(GatewayError):
    """A domain rule of the management API; the detail is the text."""

    surfaces = frozenset({"api"})
    message = "bad request"


class BadRequest(ApiError):
    """A precondition of the operation does not hold."""

    http_status = 400


class NotSignedIn(ApiError):
    """No credential, or an invalid or expired one (the MCP edge's is `Unauthenticated`)."""

    http_status = 401
    message = "not signed in"


class NotPermitted(ApiError):
    """A caller who may not do this: not an administrator, an endpoint-kind API key, a
    cookie-authenticated change from another origin (the MCP edge's is `Forbidden`)."""

    http_status = 403
    message = "forbidden"


class NotFound(ApiError):
    """The named resource does not exist."""

    http_status = 404
    message = "not found"


class Conflict(ApiError):
    """The write conflicts with an existing resource, such as a name already in use."""

    http_status = 409
    message = "conflict"


Problems = list[dict[str, Any]]


class Invalid(GatewayError):
    """422: every problem found, each {"loc": [...], "msg": "...", "type": "..."}."""

    surfaces = frozenset({"api"})
    shapes: ClassVar[Mapping[Surface, Shape]] = {"api": "validation"}
    http_status = 422
    message = "invalid request"

    def __init__(self, problems: Problems) -> None:
        super().__init__()
        self.problems = problems

    @classmethod
    def from_pydantic(cls, exc: ValidationError, where: str = "body") -> Invalid:
        return cls([{"loc": [where, *err["loc"]], "msg": err["msg"], "type": err["type"]}
                    for err in exc.errors(include_url=False)])


# -- the OAuth surface -------------------------------------------------------------------------

class OAuthError(GatewayError):
    """RFC 6749 section 5.2: {"error", "error_description"}, at `status`."""

    surfaces = frozenset({"oauth"})
    audit_status = "denied"

    def __init__(self, error: str, description: str, status: int = 400,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(description, headers=headers)
        self.error = error
        self.status = status

    @property
    def oauth_error(self) -> str:  # type: ignore[override]
        return self.error

    @property
    def wire_status(self) -> int:
        return self.status

    def as_params(self) -> dict[str, str]:
        """The error as a redirect back to the client carries it (RFC 6749 section 4.1.2.1)."""
        return {"error": self.error, "error_description": self.description}


class NulCharacter(GatewayError):
    """No name, token or text Tollhouse stores or looks up may hold a NUL (PostgreSQL's text
    cannot). /api/v1 answers its own 422 after authentication (`Invalid`)."""

    surfaces = frozenset({"oauth"})

    def __init__(self, where: str) -> None:
        super().__init__(f"the request's {where} holds a NUL character")


class HTTPRefusal(GatewayError):
    """A refusal of the web framework's own (an unknown path, a wrong method, a body over
    MAX_CONTENT_LENGTH), mapped once at the Quart error handler: its status, its name."""

    surfaces = frozenset({"api", "oauth"})
    shapes: ClassVar[Mapping[Surface, Shape]] = {"oauth": "plain"}

    def __init__(self, status: int, name: str) -> None:
        super().__init__(name.lower())
        self.status = status

    @property
    def wire_status(self) -> int:
        return self.status
