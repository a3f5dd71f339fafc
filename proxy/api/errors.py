"""The management API's errors, which live in `proxy.errors` with every other surface's:
`{"detail": "<message>"}` for a domain rule (`BadRequest`, `NotSignedIn`, `NotPermitted`,
`NotFound`, `Conflict`); 422 with a list of {"loc", "msg", "type"}
for request validation (`Invalid`); an auth-failure lockout in the OAuth shape with
Retry-After (`LockedOut`, seed 004). Raised, they are rendered by the app's one error handler
(proxy.edge.routes).

Transitional, until every /api/v1 module raises the named classes: `ApiError(status, detail)`
by status, and `.response()`, for code that answers an error itself."""

from __future__ import annotations

from quart import Response

from proxy import errors
from proxy.edge.routes import respond
from proxy.errors import (
    BadRequest,
    Conflict,
    DatabaseUnavailable,
    NotFound,
    NotPermitted,
    NotSignedIn,
    StoreUnavailable,
)

JSON = {"Content-Type": "application/json", "Cache-Control": "no-store"}

__all__ = ["JSON", "ApiError", "BadRequest", "Conflict", "DatabaseUnavailable", "Invalid",
           "LockedOut", "NotFound", "NotPermitted", "NotSignedIn", "StoreUnavailable"]


class ApiError(errors.ApiError):
    """A domain rule raised by its HTTP status (transitional: raise the named classes)."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail, headers=headers)
        self.status = status

    @property
    def wire_status(self) -> int:
        return self.status

    def response(self) -> Response:
        return respond(self, "api")


class LockedOut(errors.LockedOut):
    def __init__(self, retry_after_s: float) -> None:
        super().__init__("api: locked out after repeated failures", retry_after_s)

    def response(self) -> Response:
        return respond(self, "api")


class Invalid(errors.Invalid):
    def response(self) -> Response:
        return respond(self, "api")
